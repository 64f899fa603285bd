"""DistributedDataParallel: its gradient all-reduces go through a recorded Python hook.

DDP's reducer issues its bucket all-reduces from C++, where no Python wrapper sees them. For
every DDP model built while tracing is on, flightrec registers a communication hook at the
model's first forward that does exactly what DDP's default does (divide the bucket by the
group size, all-reduce it, hand the result back) but through ``torch.distributed.all_reduce``,
which the recorder wraps: each bucket becomes an ordinary ``all_reduce`` entry with the
bucket's flat size and dtype, numbered on the DDP group's own counter like every other
collective, with a stack that runs through autograd up to the user's ``backward()`` call.

It waits for the first forward because DDP accepts only one hook: a user who registers their
own hook (or a built-in one) before that keeps theirs, and the model's gradient all-reduces
are then recorded only if that hook calls ``torch.distributed`` functions (torch's Python
hooks such as PowerSGD do; the built-in C++ hooks do not). Mixed-precision DDP is left alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

USER_HOOK = "_flightrec_user_hook"


def recording_allreduce_hook(process_group: Any, bucket: Any) -> Any:
    """DDP's default all-reduce (mean over the group), issued through ``dist.all_reduce``.

    Args:
        process_group: the DDP model's group (None: the default group).
        bucket: the ``GradBucket`` DDP hands over.

    Returns:
        A future holding the reduced bucket, as DDP expects from a hook.
    """
    import torch.distributed as dist

    group: Any = process_group if process_group is not None else dist.group.WORLD
    tensor = bucket.buffer()
    tensor.div_(group.size())
    work = dist.all_reduce(tensor, group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


# DDP checks a hook's annotations against torch's own classes; ours are strings here
# (``from __future__ import annotations``) and would be refused, so DDP sees none.
recording_allreduce_hook.__annotations__ = {}


class DDPHooks:
    """Wraps ``DistributedDataParallel`` so models built while tracing get the recording hook."""

    def __init__(self) -> None:
        self._saved: dict[str, Callable[..., Any]] = {}
        self._cls: Any = None

    @property
    def installed(self) -> bool:
        return bool(self._saved)

    def install(self, enabled: Callable[[], bool]) -> None:
        """Wrap DDP's constructor and hook registration (no-op when DDP is unavailable)."""
        if self.installed:
            return
        try:
            from torch.nn.parallel import DistributedDataParallel as DDP
        except Exception:  # torch.nn is still loading (tracing starts inside `import torch`)
            return
        init, register = DDP.__init__, DDP.register_comm_hook
        builtin = getattr(DDP, "_register_builtin_comm_hook", None)

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **kwargs)
            if enabled() and getattr(self, "mixed_precision", None) is None:
                _arm(self, register)

        def register_comm_hook(self: Any, state: Any, hook: Callable[..., Any]) -> Any:
            object.__setattr__(self, USER_HOOK, True)
            return register(self, state, hook)

        self._cls = DDP
        self._saved = {"__init__": init, "register_comm_hook": register}
        DDP.__init__ = __init__  # type: ignore[method-assign]
        DDP.register_comm_hook = register_comm_hook  # type: ignore[method-assign]
        if builtin is not None:

            def _register_builtin_comm_hook(self: Any, comm_hook_type: Any) -> Any:
                object.__setattr__(self, USER_HOOK, True)
                return builtin(self, comm_hook_type)

            self._saved["_register_builtin_comm_hook"] = builtin
            DDP._register_builtin_comm_hook = _register_builtin_comm_hook  # type: ignore[method-assign]

    def uninstall(self) -> None:
        """Put DDP's own methods back (models already armed keep their hook)."""
        for name, method in self._saved.items():
            setattr(self._cls, name, method)
        self._saved.clear()


def _arm(model: Any, register: Callable[..., Any]) -> None:
    """Register the recording hook at the model's first forward, unless the user has one."""
    handle: Any = None

    def first_forward(module: Any, args: Any) -> None:
        handle.remove()
        if getattr(module, USER_HOOK, False):
            return
        # DDP may refuse (a hook got in some other way): then DDP is left as it is.
        with contextlib.suppress(Exception):
            register(module, module.process_group, recording_allreduce_hook)

    handle = model.register_forward_pre_hook(first_forward)
