"""Where a rank's stack stands (``place_of``): inside which collective, or at which line of
the program's own code; read from the snapshots ``flightrec attach`` takes (``stack_place``,
``attached_line``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from flightrec.analysis.model import FrameInfo, RankDump, ThreadInfo, user_frame
from flightrec.format import flightrec_pb2 as pb

_C10D = re.compile(r"(^|/)torch/distributed/(distributed_c10d|_functional_collectives)\.py$")
_CONTEXTS = (
    ("DDP", re.compile(r"(^|/)torch/nn/parallel/distributed\.py$")),
    ("FSDP", re.compile(r"(^|/)torch/distributed/fsdp/")),
    ("pipelining", re.compile(r"(^|/)torch/distributed/pipelining/")),
    ("DTensor", re.compile(r"(^|/)torch/distributed/tensor/")),
)
_BACKWARD = re.compile(r"(^|/)torch/autograd/(graph|__init__)\.py$")
BACKWARD = "backward"
"""The place of a rank in autograd's backward: where DDP's reducer and FSDP reduce gradients
(a backward that never ends is waiting for them)."""


@dataclass(frozen=True, slots=True)
class Place:
    """Where one rank's stack stands."""

    collective: str | None
    """``all_reduce``, ``all_gather_into_tensor (FSDP)``, ``DDP forward``, ``backward``; None
    outside any collective."""
    location: FrameInfo | None
    """The user's line (the innermost frame of the program's own code)."""


def _function(frame: FrameInfo) -> str:
    # py-spy names methods by their qualified name ("DistributedDataParallel.forward").
    return frame.function.rsplit(".", 1)[-1]


def place_of(stack: Sequence[FrameInfo]) -> Place:
    """The place of a stack (innermost frame first).

    The collective is the innermost public function of ``torch.distributed``'s collectives
    module the stack is in, named with the machinery around it (DDP, FSDP, pipelining,
    DTensor: the outermost of their frames); without such a call, that machinery's function,
    or autograd's backward.
    """
    location = user_frame(stack)
    op = next(
        (
            _function(f)
            for f in stack
            if _C10D.search(f.file.replace("\\", "/")) and not _function(f).startswith("_")
        ),
        None,
    )
    context: tuple[str, str] | None = None
    for f in stack:  # innermost first: the last match is the outermost
        file = f.file.replace("\\", "/")
        for name, pattern in _CONTEXTS:
            if pattern.search(file):
                context = (name, _function(f))
    if op is not None:
        return Place(f"{op} ({context[0]})" if context else op, location)
    if context is not None:
        return Place(f"{context[0]} {context[1]}", location)
    if any(_BACKWARD.search(f.file.replace("\\", "/")) for f in stack):
        return Place(BACKWARD, location)
    return Place(None, location)


def rank_thread(threads: Sequence[ThreadInfo]) -> ThreadInfo | None:
    """The thread that says where a rank is: its main thread, unless another thread of its
    own process is inside a collective and the main thread is not."""
    own = [t for t in threads if not t.pid]
    main = next((t for t in own if t.is_main), None)
    if main is not None and place_of(main.stack).collective is not None:
        return main
    busy = next((t for t in own if place_of(t.stack).collective is not None), None)
    return busy or main or (own[0] if own else None)


def is_stack_snapshot(header: pb.Header, entries: int) -> bool:
    """A snapshot ``flightrec attach`` took, with stacks and no ring."""
    return header.reason == pb.ATTACHED and entries == 0


def attached_line(d: RankDump) -> FrameInfo | None:
    """The user's line a snapshot ``flightrec attach`` took shows the rank at (ring or not),
    for a waiting entry whose own stack torch did not record; None for other dumps."""
    if d.header.reason != pb.ATTACHED:
        return None
    thread = rank_thread(d.threads())
    return place_of(thread.stack).location if thread is not None else None


def stack_place(d: RankDump) -> Place | None:
    """Where a rank of a stack-only snapshot stands; None for any other dump."""
    if not is_stack_snapshot(d.header, len(d)):
        return None
    thread = rank_thread(d.threads())
    return place_of(thread.stack) if thread is not None else Place(None, None)
