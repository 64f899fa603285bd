"""Process-group identity and the sequence counters that let the analyzer match ranks.

Identity must be the same on every rank of a group: torch's group name, its description and
its global ranks. Collective sequence numbers count per group from 1; P2P operations count per
(group, peer, direction), so send #k from A to B matches receive #k on B from A. Counters live
here, outside the ring, so they survive the ring overwriting old entries.

A group's collective numbers are the ProcessGroup's own wherever the two could differ. torch
numbers every collective the group runs, flightrec only those its hooks see; DDP's reducer,
FSDP2, DTensor and ``torch.compile`` issue collectives from C++ that only torch counts, and an
object collective is two of torch's. Dumps renumber at dump time (``native.merge``), but a
rank that dies hard leaves only its ring, whose numbers must already agree with its peers'
dumps. So a group's counter follows the ProcessGroup's (``follow_native``) from the moment the
two differ: when flightrec first meets the group, and at every watchdog tick after. Until then
the numbers are equal and nothing is read; from then on each call reads torch's counter (about
0.1 us, a pybind11 method; benchmarks/bench_native_numbers.py), on that group only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from flightrec.recorder.hotpath.counters import new_counter


def is_gpu(backend: str) -> bool:
    """Whether a backend name means GPU work whose end only CUDA events can tell (completion
    tracking then polls CUDA events, ``completion.Tracker``)."""
    return "nccl" in backend or "cuda" in backend or "xccl" in backend


class GroupInfo:
    """Live state of one process group as this rank sees it (mutable: counters advance)."""

    __slots__ = (
        "_lock",
        "backend",
        "counter",
        "desc",
        "gpu",
        "index",
        "name",
        "native",
        "p2p",
        "ranks",
        "specs",
    )

    def __init__(
        self,
        index: int,
        name: str,
        desc: str,
        ranks: tuple[int, ...],
        backend: str,
        native: Callable[[], int] | None = None,
    ):
        self.index = index
        self.name = name
        self.desc = desc
        self.ranks = ranks
        self.backend = backend
        self.gpu = is_gpu(backend)
        """Completion is tracked through CUDA events, not on return."""
        # Numbers are handed out atomically under the GIL: two threads issuing collectives on
        # one group never get the same sequence number.
        self.counter = new_counter()
        self._lock = threading.Lock()
        self.specs: dict[Any, tuple[int, int]] = {}
        """(shape, dtype) -> (tensor signature index, device string index), for the hot path.

        Keyed per group: the device is taken from the first tensor of that shape and dtype
        seen on the group (a group's tensors live on one device in practice; reading
        ``tensor.device`` on every call would cost a fifth of the recording budget)."""
        self.p2p: dict[tuple[int, bool], int] = {}
        """(peer global rank, is_send) -> operations issued so far."""
        self.native = native
        """The ProcessGroup's ``_get_sequence_number_for_group``; None where it has none."""

    @property
    def seq(self) -> int:
        """Collectives issued on the group so far (the last sequence number used)."""
        return int(self.counter.value)

    def next_seq(self) -> int:
        """The sequence number of a new collective on this group (1, 2, ...): following the
        ProcessGroup's counter, its next number, or the next of ours where that is higher
        (threads issuing at once read torch's count alike: no number goes out twice)."""
        source = self.counter.source
        if source is None:
            return int(next(self.counter))
        try:
            n = int(source()) + 1
        except Exception:  # the group is gone, say: flightrec's own number
            n = 0
        with self._lock:
            mine = int(next(self.counter))
            if n > mine:
                self.counter.raise_to(n)
                return n
            return mine

    def native_seq(self) -> int:
        """The ProcessGroup's own last collective number (what PyTorch's recorder calls
        ``collective_seq_id``). gloo's counter also counts sends and receives, which torch's
        recorder does not number: those this rank issued are taken off.

        Raises:
            Exception: whatever torch raises (the group is destroyed, the backend has none).
        """
        read = self.native
        if read is None:
            raise LookupError("no sequence number")
        n = int(read())
        if not self._raw():
            n -= sum(list(self.p2p.values()))
        return n

    def follow_native(self) -> None:
        """Number this group's collectives from the ProcessGroup's counter from now on, if the
        two have parted (torch ran collectives flightrec did not see). Never raises."""
        if self.native is None or self.counter.source is not None:
            return
        try:
            n = self.native_seq()
            ours = self.counter.value
            # Torch ahead of ours, read twice around ours: a call between torch's count and
            # ours is no parting. Torch behind ours is never one: flightrec numbers a call
            # before torch does, so calls of other threads under way read that way.
            parted = n > ours and n == self.native_seq()
        except Exception:
            self.native = None  # unsupported, or the group is gone: nothing to follow
            return
        if parted:
            # torch's method itself where nothing is to be taken off: about 0.1 us a call,
            # against 0.3 us through ``native_seq`` (benchmarks/bench_native_numbers.py).
            self.counter.source = self.native if self._raw() else self.native_seq

    def _raw(self) -> bool:
        """Whether the ProcessGroup's counter is torch's recorder's numbering as it is."""
        return not ("gloo" in self.backend and "nccl" not in self.backend and self.p2p)

    def next_p2p(self, peer: int, send: bool) -> int:
        """The 1-based ordinal of a new send to (or receive from) ``peer``."""
        key = (peer, send)
        with self._lock:
            n = self.p2p.get(key, 0) + 1
            self.p2p[key] = n
        if self.counter.source is not None and self.counter.source is self.native:
            self.counter.source = self.native_seq  # gloo: sends and receives to take off
        return n

    @property
    def recorded(self) -> int:
        """Ring entries ever written for this group: each bumps exactly one counter."""
        return self.seq + sum(self.p2p.values())

    def p2p_counters(self) -> list[tuple[int, int, int]]:
        """(peer, sends, recvs) per peer, sorted by peer."""
        peers = sorted({peer for peer, _ in self.p2p})
        return [(p, self.p2p.get((p, True), 0), self.p2p.get((p, False), 0)) for p in peers]


def _describe(pg: Any, index: int) -> GroupInfo:
    import torch.distributed as dist

    try:
        ranks = tuple(dist.get_process_group_ranks(pg))
    except Exception:  # a group this rank is not part of, or an exotic PG object
        ranks = ()
    name = str(getattr(pg, "group_name", "") or "")
    desc = str(getattr(pg, "group_desc", "") or "")
    try:
        backend = str(dist.get_backend(pg))
    except Exception:
        backend = ""
    native = getattr(pg, "_get_sequence_number_for_group", None)
    return GroupInfo(index, name or f"unnamed-{index}", desc, ranks, backend, native)


class GroupRegistry:
    """Per-group info keyed by the ProcessGroup object, so the hot path does one dict lookup.

    The registry keeps the PG objects alive; jobs create a handful of groups, and a destroyed
    group's counters are still wanted in dumps.
    """

    def __init__(self, on_new: Callable[[GroupInfo], None] | None = None) -> None:
        self.by_pg: dict[Any, GroupInfo] = {}
        self.groups: list[GroupInfo] = []
        self._lock = threading.Lock()
        self.on_new = on_new
        """Told of each new group under the lock (the black box's journal)."""

    def get(self, pg: Any) -> GroupInfo:
        """The info of ``pg``, created on first sight."""
        info = self.by_pg.get(pg)
        if info is None:
            with self._lock:
                info = self.by_pg.get(pg)
                if info is None:
                    info = _describe(pg, len(self.groups))
                    info.follow_native()  # torch may have run collectives on it already
                    self.groups.append(info)
                    self.by_pg[pg] = info
                    if self.on_new is not None:
                        self.on_new(info)
        return info

    def follow_native(self) -> None:
        """Each group's ``follow_native`` (the watchdog's tick). Never raises."""
        for info in list(self.groups):
            info.follow_native()

    def forget_native(self) -> None:
        """Let go of the ProcessGroups' counters (their bound methods hold the groups): at
        ``destroy_process_group``, after which the numbers stay as they were."""
        for info in list(self.groups):
            info.counter.source = None
            info.native = None
