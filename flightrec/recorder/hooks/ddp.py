"""DistributedDataParallel: its gradient all-reduces, recorded by a hook of flightrec's.

DDP's reducer issues its bucket all-reduces from C++, where no Python wrapper sees them.
PyTorch's own recorder (on by default, merged into every dump by ``native.merge``) records
them inside the ProcessGroup, but on gloo with no completion time, and a failed one reads
like a finished one: a hang inside a bucket all-reduce then shows in no pending-operation
metric, the slow check has no times to compare, and the watchdog sees it only once torch's
counters stand still. So by default (``Config.ddp_hook``; FLIGHTREC_DDP_HOOK=0 turns it off)
flightrec registers a communication hook at the model's first forward that does exactly what
DDP's default does (divide the bucket by the group size, all-reduce it, hand the result back)
but through ``torch.distributed.all_reduce``, which the recorder wraps: each bucket becomes an
ordinary ``all_reduce`` entry with the bucket's flat size and dtype and the ``DDP_BUCKET`` flag,
numbered on the DDP group's own counter like every other collective, with a stack that runs
through autograd up to the user's ``backward()`` call, and a completion time (or its failure)
on gloo too.

What it costs: any Python communication hook takes the GIL once per bucket on the backward
pass and again on the backend's thread when the all-reduce completes (an untraced Python hook,
torch's own ``allreduce_hook``, costs about as much as ours); per-bucket figures in
docs/benchmarks.md ("DDP"). With the hook off, the groups of DDP models are remembered
(``bucket_groups``) so that a dump labels the reducer's all-reduces as DDP gradient buckets.

It waits for the first forward because DDP accepts only one hook: a user who registers their
own hook (or a built-in one) before that keeps theirs, and the model's gradient all-reduces
are then recorded only if that hook calls ``torch.distributed`` functions (torch's Python
hooks such as PowerSGD do; the built-in C++ hooks do not). Mixed-precision DDP is left alone.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

from flightrec.format.builder import DDP_BUCKET as DDP_BUCKET_FLAG

USER_HOOK = "_flightrec_user_hook"
DDP_BUCKET = DDP_BUCKET_FLAG
"""Entry flag of the all-reduce of a DDP gradient bucket: entries recorded through this
module's hook carry it (the report labels them)."""


def _no_flagged() -> Any:
    return None


_bucket_groups: set[str] = set()
"""Names of the process groups of DDP models left on DDP's own C++ hook."""


def bucket_groups() -> frozenset[str]:
    """Groups whose all-reduces issued by C++ during a backward pass are DDP gradient buckets
    (models built while tracing, without flightrec's Python hook)."""
    return frozenset(_bucket_groups)


def _remember_group(model: Any) -> None:
    with contextlib.suppress(Exception):  # a label only: never a reason to fail
        import torch.distributed as dist

        pg: Any = getattr(model, "process_group", None) or dist.group.WORLD
        _bucket_groups.add(str(pg.group_name))


_flagged: Callable[[], Any] = _no_flagged
"""Returns the recorded all_reduce that flags its entry as a DDP bucket
(``Hooks.ddp_all_reduce``), None when tracing is off; set by ``DDPHooks.install``."""


class Completion(Protocol):
    """How the hook settles its bucket's entry itself (``completion.Tracker``)."""

    def adopting(self) -> AbstractContextManager[list[int]]: ...

    def settler(self, rids: list[int]) -> Callable[[Any], None]: ...


_completion: Callable[[], Completion | None] = _no_flagged
"""Returns the recorder's completion tracker, None when tracing is off; set by
``DDPHooks.install``."""


def _all_reduce() -> Any:
    import torch.distributed as dist

    fn = _flagged()
    return fn if fn is not None else dist.all_reduce


def ddp_allreduce_passthrough_recorded_by_flightrec(process_group: Any, bucket: Any) -> Any:
    """DDP's own gradient all-reduce, unchanged; flightrec only writes it down.

    DDP's reducer issues its bucket all-reduces from C++, where flightrec cannot see them, so
    flightrec registers this hook in place of DDP's default one. It does what the default does
    (divide the bucket by the group size, all-reduce it, hand the result back) and nothing
    else, through a recorded ``all_reduce`` whose entry is flagged as a DDP gradient bucket.

    A traceback that ends in this module (for example a gloo timeout raised in DDP's
    ``backward()``) means the gradient all-reduce itself failed or never completed, typically
    because another rank did not reach it: run ``flightrec analyze`` on the dumps to see which.

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
    completion = _completion()
    if completion is None:
        work = _all_reduce()(tensor, group=group, async_op=True)
        return work.get_future().then(ddp_bucket_result_passed_through_unchanged)
    with completion.adopting() as rids:
        work = _all_reduce()(tensor, group=group, async_op=True)
    fut = work.get_future()
    if not rids:  # not recorded (or on a GPU: the watchdog polls it)
        return fut.then(ddp_bucket_result_passed_through_unchanged)
    settle = completion.settler(rids)
    return fut.then(functools.partial(ddp_bucket_result_passed_through_unchanged, settle=settle))


def ddp_bucket_result_passed_through_unchanged(
    fut: Any, settle: Callable[[Any], None] | None = None
) -> Any:
    """Hand DDP the reduced bucket, exactly as DDP's default hook does (first marking the
    bucket's entry completed or failed, where flightrec's tracker left that to this callback:
    one callback per bucket on the backend's thread, not two).

    An error raised here (a timeout, a closed connection) is the gradient all-reduce's own,
    reported by torch when DDP waits for it; flightrec only recorded the call.
    """
    if settle is not None:
        settle(fut)  # (never raises)
    return fut.value()[0]


# DDP checks a hook's annotations against torch's own classes; ours are strings here
# (``from __future__ import annotations``) and would be refused, so DDP sees none.
ddp_allreduce_passthrough_recorded_by_flightrec.__annotations__ = {}
ddp_bucket_result_passed_through_unchanged.__annotations__ = {}


class DDPHooks:
    """Wraps ``DistributedDataParallel`` so models built while tracing get the recording hook."""

    def __init__(self) -> None:
        self._saved: dict[str, Callable[..., Any]] = {}
        self._cls: Any = None

    @property
    def installed(self) -> bool:
        return bool(self._saved)

    def install(
        self,
        enabled: Callable[[], bool],
        flagged: Callable[[], Any] = _no_flagged,
        python_hook: bool = True,
        completion: Callable[[], Completion | None] = _no_flagged,
    ) -> None:
        """Wrap DDP's constructor and hook registration (no-op when DDP is unavailable).

        Args:
            enabled: whether tracing is on (models built while it is off are left alone).
            flagged: gives the recorded all_reduce the hook calls (None: plain all_reduce).
            python_hook: register the Python hook (the default); False leaves DDP's C++ hook,
                whose all-reduces PyTorch's recorder sees, and remembers the model's group for
                their label.
            completion: gives the recorder's completion tracker (None: the tracker follows
                the bucket's work with a callback of its own).
        """
        global _flagged, _completion
        if self.installed:
            return
        _flagged, _completion = flagged, completion
        try:
            from torch.nn.parallel import DistributedDataParallel as DDP
        except Exception:  # torch.nn is still loading (tracing starts inside `import torch`)
            return
        init, register = DDP.__init__, DDP.register_comm_hook
        builtin = getattr(DDP, "_register_builtin_comm_hook", None)

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **kwargs)
            if not enabled():
                return
            if python_hook and getattr(self, "mixed_precision", None) is None:
                _arm(self, register)
            else:
                _remember_group(self)

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
            register(module, module.process_group, ddp_allreduce_passthrough_recorded_by_flightrec)

    handle = model.register_forward_pre_hook(first_forward)
