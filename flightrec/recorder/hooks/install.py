"""Wrapping torch.distributed's collective and P2P functions, and putting them back.

Every traced function of ``torch.distributed.distributed_c10d`` is replaced by a wrapper
wherever the original is referenced as a module global: ``torch.distributed``,
``distributed_c10d`` itself, and every module in ``sys.modules`` holding the original by
identity. That last part is what traces ``from torch.distributed import all_reduce`` done
before tracing began. ``uninstall`` reverses exactly what ``install`` did.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import sys
from collections.abc import Callable
from typing import Any

from flightrec.recorder.hooks.codegen import generate
from flightrec.recorder.hooks.ddp import DDP_BUCKET
from flightrec.recorder.hooks.specs import BATCH, TRACED, OpSpec, spec_for

ORIGINAL_ATTR = "__flightrec_original__"
log = logging.getLogger("flightrec")


def _generate(spec: OpSpec, orig: Callable[..., Any], recorder: Any) -> Callable[..., Any]:
    wrapper = generate(spec, orig, recorder)
    functools.update_wrapper(wrapper, orig)
    setattr(wrapper, ORIGINAL_ATTR, orig)
    return wrapper


class _P2PWrapper:
    """isend/irecv wrapper that compares equal to the function it wraps.

    torch checks ``P2POp.op`` against its module globals (``op in [isend, irecv]``); with
    equality both a P2POp built from the original (captured before tracing) and one built from
    the wrapper pass that check. ``batch_isend_irecv``'s identity test is handled by
    normalizing ``P2POp.op`` to the current global before the call.
    """

    def __init__(self, inner: Callable[..., Any], orig: Callable[..., Any]) -> None:
        self._inner, self._orig = inner, orig
        functools.update_wrapper(self, orig)
        setattr(self, ORIGINAL_ATTR, orig)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._inner(*args, **kwargs)

    def __eq__(self, other: object) -> bool:
        return other is self or other is self._orig

    def __hash__(self) -> int:
        return hash(self._orig)


def _rebind(mapping: dict[int, tuple[Any, Any]]) -> None:
    """In every loaded module's globals, replace each ``old`` (by identity) with its ``new``."""
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for key, value in list(namespace.items()):
            pair = mapping.get(id(value))
            if pair is not None and pair[0] is value:
                namespace[key] = pair[1]


class Hooks:
    """The installed wrappers and the originals they replace."""

    def __init__(self) -> None:
        self.originals: dict[str, Callable[..., Any]] = {}
        self.wrappers: dict[str, Callable[..., Any]] = {}
        self.ddp_all_reduce: Callable[..., Any] | None = None
        """all_reduce recorded with the DDP_BUCKET flag, for the DDP comm hook (ddp.py)."""

    @property
    def installed(self) -> bool:
        return bool(self.wrappers)

    def install(
        self,
        recorder: Any,
        after_init: Callable[[], None],
        after_destroy: Callable[[], None] = lambda: None,
        before_destroy: Callable[[Any], None] = lambda group: None,
    ) -> None:
        """Wrap every traced function the installed torch has.

        Args:
            recorder: the ``Recorder`` the generated wrappers record into.
            after_init: run after ``init_process_group`` returns (starts the watchdog).
            after_destroy: run after ``destroy_process_group`` returns.
            before_destroy: run with the group argument before ``destroy_process_group``
                runs (None: every group, and with the default one, usually the store).
        """
        import torch.distributed.distributed_c10d as c10d

        if self.installed:
            return
        for name in TRACED:
            orig = getattr(c10d, name, None)
            if orig is None or not callable(orig):
                continue
            orig = getattr(orig, ORIGINAL_ATTR, orig)
            spec = spec_for(name, orig)
            if name == BATCH:
                self.wrappers[name] = self._wrap_batch(orig, recorder.call_batch, c10d)
            elif name in ("isend", "irecv"):
                self.wrappers[name] = _P2PWrapper(_generate(spec, orig, recorder), orig)
            else:
                self.wrappers[name] = _generate(spec, orig, recorder)
            if name == "all_reduce":
                ddp_spec = dataclasses.replace(spec, flags=spec.flags | DDP_BUCKET)
                self.ddp_all_reduce = _generate(ddp_spec, orig, recorder)
            self.originals[name] = orig

        def on_init() -> None:
            recorder.forget_default()
            after_init()

        def on_destroy() -> None:
            recorder.forget_default()
            after_destroy()

        # Not recorded, only watched: a new or destroyed default group changes what
        # ``group=None`` means, and creating one is when the background threads start.
        def before(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if name == "destroy_process_group":
                before_destroy(args[0] if args else kwargs.get("group"))

        for name, after in (
            ("init_process_group", on_init),
            ("destroy_process_group", on_destroy),
        ):
            orig = getattr(c10d, name, None)
            if orig is not None:
                orig = getattr(orig, ORIGINAL_ATTR, orig)
                self.originals[name] = orig
                self.wrappers[name] = self._wrap_around(orig, name, before, after)
        _rebind({id(o): (o, self.wrappers[n]) for n, o in self.originals.items()})

    def uninstall(self) -> None:
        """Put every original back wherever one of our wrappers is referenced."""
        if not self.installed:
            return
        _rebind({id(w): (w, self.originals[n]) for n, w in self.wrappers.items()})
        self.ddp_all_reduce = None
        self.wrappers.clear()
        self.originals.clear()

    @staticmethod
    def _wrap_batch(
        orig: Callable[..., Any], call_batch: Callable[..., Any], c10d: Any
    ) -> Callable[..., Any]:
        def canon(op: Any) -> None:
            # torch tests ``op.op is isend``: make a P2POp built from either the original or
            # the wrapper point at the current module global.
            for name in ("isend", "irecv"):
                current = getattr(c10d, name)
                if op.op is not current and op.op == current:
                    op.op = current

        @functools.wraps(orig)
        def batch_isend_irecv(*args: Any, **kwargs: Any) -> Any:
            return call_batch(orig, args, kwargs, canon)

        setattr(batch_isend_irecv, ORIGINAL_ATTR, orig)
        return batch_isend_irecv

    @staticmethod
    def _wrap_around(
        orig: Callable[..., Any],
        name: str,
        before: Callable[[str, tuple[Any, ...], dict[str, Any]], None],
        after: Callable[[], None],
    ) -> Callable[..., Any]:
        @functools.wraps(orig)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                before(name, args, kwargs)
            except Exception as exc:  # torch's call runs whatever happens here
                log.warning("flightrec: could not prepare for %s: %s", name, exc)
            try:
                return orig(*args, **kwargs)
            finally:
                try:
                    after()
                except Exception as exc:  # torch's result (or error) must reach the caller
                    log.warning("flightrec: tracing could not start its watchers: %s", exc)

        setattr(wrapper, ORIGINAL_ATTR, orig)
        return wrapper
