"""Small factories that build a whole job's dumps through ``DumpBuilder``.

A ``Job`` plays a script: every call issues one operation on the ranks that take part, with
per-rank counters, record ids, clocks and stacks kept the way the recorder keeps them. Tests
then ``write`` the dumps (or hand them to the analyzer) and assert on the findings.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from flightrec.analysis.loading.loader import Run
from flightrec.analysis.model import RankDump
from flightrec.format import flightrec_pb2 as pb
from flightrec.format.builder import (
    IS_P2P,
    SEND,
    DumpBuilder,
    EntryValues,
    FrameTuple,
    SourceReader,
)
from flightrec.format.schema import dump_filename
from flightrec.format.write import write_dump

TORCH_FRAME: FrameTuple = (
    "/venv/lib/python3.11/site-packages/torch/distributed/c10d.py",
    "all_reduce",
    2500,
)


def user_stack(function: str, line: int, file: str = "/job/train.py") -> list[FrameTuple]:
    """A stack with one torch frame above a user frame, innermost first."""
    return [TORCH_FRAME, (file, function, line), (file, "main", 90)]


@dataclass
class _Rank:
    entries: list[EntryValues] = field(default_factory=list)
    seq: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    p2p: dict[tuple[str, int, bool], int] = field(default_factory=lambda: defaultdict(int))
    threads: list[tuple[str, list[FrameTuple], bool, bool]] = field(default_factory=list)
    clock: int = 1_000_000_000


class Job:
    """A scripted job of ``world_size`` ranks with a default group ``"0"`` of every rank."""

    def __init__(self, world_size: int = 4, job_id: str = "job-1") -> None:
        self.world_size = world_size
        self.job_id = job_id
        self.groups: dict[str, tuple[list[int], str]] = {
            "0": (list(range(world_size)), "default_pg")
        }
        self.ranks = {r: _Rank() for r in range(world_size)}
        self.reason: dict[int, int] = {}
        self.source: SourceReader | None = None
        """Reads each frame's source line into the dumps, as the recorder does."""
        self.device = "cpu"
        """Every rank's device ("cuda" makes it an NCCL job on GPUs)."""

    def group(self, name: str, ranks: Sequence[int], desc: str = "") -> str:
        """Declare a subgroup (known to every rank, as ``new_group`` makes it)."""
        self.groups[name] = (list(ranks), desc)
        return name

    def collective(
        self,
        op: str = "all_reduce",
        group: str = "0",
        *,
        ranks: Iterable[int] | None = None,
        complete: Iterable[int] | bool = True,
        shape: tuple[int, ...] = (4, 4),
        out_shape: tuple[int, ...] | None = None,
        dtype: str = "float32",
        reduce_op: str = "SUM",
        root: int = -1,
        line: int = 22,
        function: str = "step",
        override: Mapping[int, Mapping[str, object]] | None = None,
        flags: int = 0,
    ) -> None:
        """Issue one collective on ``ranks`` (default: every member), with entry ``flags``.

        ``complete`` is True (all), False (none) or the ranks that complete. ``override`` maps a
        rank to fields that differ on it: ``op``, ``shape``, ``out_shape``, ``dtype``,
        ``reduce_op``, ``root``, ``line``. ``out_shape`` is the output's (default: ``shape``).
        """
        members = self.groups[group][0]
        takers = list(members if ranks is None else ranks)
        done = set(takers) if complete is True else set() if complete is False else set(complete)
        for r in takers:
            o = dict((override or {}).get(r, {}))
            st = self.ranks[r]
            st.seq[group] += 1
            shp = tuple(o.get("shape", shape))  # type: ignore[call-overload]
            dt = str(o.get("dtype", dtype))
            st.clock += 1_000_000
            st.entries.append(
                EntryValues(
                    record_id=len(st.entries),
                    group=list(self.groups).index(group),
                    op=str(o.get("op", op)),
                    seq=st.seq[group],
                    reduce_op=str(o.get("reduce_op", reduce_op)),
                    peer=int(o.get("root", root)),  # type: ignore[call-overload]
                    state=pb.COMPLETED if r in done else pb.STARTED,
                    enqueue_ns=st.clock,
                    complete_ns=st.clock + 500_000 if r in done else 0,
                    thread="MainThread",
                    stack=user_stack(str(o.get("function", function)), int(o.get("line", line))),  # type: ignore[call-overload]
                    inputs=[(shp, dt)] if shp is not None else [],
                    outputs=[(tuple(o.get("out_shape", out_shape or shp)), dt)]  # type: ignore[call-overload]
                    if shp is not None
                    else [],
                    flags=flags,
                    device=self.device,
                )
            )

    def p2p(
        self,
        sender: int | None,
        receiver: int | None,
        *,
        peer_of: tuple[int, int] | None = None,
        complete: bool = True,
        group: str = "0",
        line: int = 40,
    ) -> None:
        """One P2P op. ``sender`` sends to ``receiver``; pass only one side (the other None) with
        ``peer_of=(sender, receiver)`` to issue just that side."""
        s, rcv = peer_of if peer_of else (sender, receiver)
        assert s is not None and rcv is not None
        sides = (
            [(s, True)]
            if receiver is None
            else [(rcv, False)]
            if sender is None
            else [(s, True), (rcv, False)]
        )
        for rank, sending in sides:
            st = self.ranks[rank]
            peer = rcv if sending else s
            st.p2p[(group, peer, sending)] += 1
            st.clock += 1_000_000
            st.entries.append(
                EntryValues(
                    record_id=len(st.entries),
                    group=list(self.groups).index(group),
                    op="send" if sending else "recv",
                    p2p_seq=st.p2p[(group, peer, sending)],
                    peer=peer,
                    state=pb.COMPLETED if complete else pb.STARTED,
                    enqueue_ns=st.clock,
                    complete_ns=st.clock + 1000 if complete else 0,
                    thread="MainThread",
                    stack=user_stack("exchange", line),
                    inputs=[((8,), "float32")],
                    flags=IS_P2P | (SEND if sending else 0),
                    device=self.device,
                )
            )

    def stall(self, rank: int, function: str = "load_batch", line: int = 18) -> None:
        """At dump time, ``rank``'s main thread is in user code outside any collective."""
        self.ranks[rank].threads = [("MainThread", user_stack(function, line)[1:], True, False)]

    def exited(self, rank: int) -> None:
        """``rank`` dumped because its process exited."""
        self.reason[rank] = pb.PROCESS_EXIT

    def build(
        self, rank: int, *, dump_index: int = 0, reason: int | None = None, wall_offset_s: float = 0
    ) -> pb.Dump:
        """The dump of one rank."""
        st = self.ranks[rank]
        b = DumpBuilder(source=self.source)
        h = b.header
        h.rank, h.world_size, h.hostname, h.pid = (
            rank,
            self.world_size,
            f"node{rank // 2}",
            1000 + rank,
        )
        gpu = self.device == "cuda"
        h.local_rank, h.job_id = rank % 2, self.job_id
        h.device, h.backend = (f"cuda:{rank % 2}", "nccl") if gpu else (self.device, "gloo")
        h.reason = reason if reason is not None else self.reason.get(rank, pb.WATCHDOG_TIMEOUT)
        h.mono_time_ns = st.clock + 30_000_000_000
        h.wall_time_ns = 1_700_000_000_000_000_000 + h.mono_time_ns + int(wall_offset_s * 1e9)
        h.dump_index = dump_index
        h.source = "flightrec"
        for name, (members, desc) in self.groups.items():
            peers = {(p, snd) for (g, p, snd) in st.p2p if g == name}
            counters = [
                (p, st.p2p.get((name, p, True), 0), st.p2p.get((name, p, False), 0))
                for p in sorted({p for p, _ in peers})
            ]
            b.group(name, members, desc=desc, backend="gloo", last_seq=st.seq[name], p2p=counters)
        for e in st.entries:
            b.entry(e)
        threads = st.threads
        if not threads:
            last = st.entries[-1] if st.entries else None
            inside = last is not None and last.state != pb.COMPLETED
            stack = list(last.stack) if (last and inside) else user_stack("train_loop", 60)[1:]
            threads = [("MainThread", stack, True, inside)]
        for i, (name, frames, is_main, holds) in enumerate(threads):
            b.thread(100 + i, name, frames, is_main=is_main, holds_recorder=holds)
        return b.build()

    def write(self, directory: Path, ranks: Iterable[int] | None = None) -> list[Path]:
        """Write one dump file per rank (default: every rank) into ``directory``."""
        out = []
        for r in self.ranks if ranks is None else ranks:
            d = self.build(r)
            name = dump_filename(r, 0, pb.DumpReason.Name(d.header.reason), d.header.pid)
            out.append(write_dump(d, directory, name))
        return out

    def run(self, ranks: Iterable[int] | None = None) -> Run:
        """The dumps as a loaded ``Run``, without touching the disk."""
        chosen = {
            r: RankDump(f"<rank {r}>", self.build(r))
            for r in (self.ranks if ranks is None else ranks)
        }
        return Run(chosen, self.world_size, (), ())


def healthy(job: Job, steps: int = 3) -> Job:
    """``steps`` completed all_reduces on the default group."""
    for _ in range(steps):
        job.collective()
    return job


def late_arrivals(job: Job, rank: int, steps: int, late_ms: float = 40.0) -> Job:
    """``steps`` completed all_reduces at which ``rank`` arrives ``late_ms`` after the others.

    Everyone completes together when the last one arrives, so the others' recorded waits are
    long and the late rank's is short, as on a real job.
    """
    for _ in range(steps):
        job.collective()
        for r, st in job.ranks.items():
            e = st.entries[-1]
            wait = 200_000 if r == rank else int(late_ms * 1e6) + 200_000
            st.entries[-1] = EntryValues(**{**_fields(e), "complete_ns": e.enqueue_ns + wait})
            st.clock = e.enqueue_ns + wait
    return job


def _fields(e: EntryValues) -> dict[str, object]:
    return {name: getattr(e, name) for name in EntryValues.__dataclass_fields__}


def as_native(job: Job) -> Job:
    """The job as PyTorch's gloo recorder keeps it: enqueue times only, every entry ENQUEUED,
    and each dump's reason CONVERTED."""
    for r, st in job.ranks.items():
        st.entries = [
            EntryValues(**{**_fields(e), "state": pb.ENQUEUED, "complete_ns": 0})
            for e in st.entries
        ]
        job.reason[r] = pb.CONVERTED
    return job


def gpu_progress(job: Job, not_started: Mapping[int, int] | None = None) -> Job:
    """The job as PyTorch's NCCL recorder sees its GPUs: every entry's GPU start recorded
    (``start_ns``) and every incomplete one ``started``, except the newest ``n`` incomplete
    entries of each rank in ``not_started`` (rank -> n), which stay ``scheduled``: issued by
    the CPU, never reached by the GPU."""
    skip = dict(not_started or {})
    for r, st in job.ranks.items():
        pending = [i for i, e in enumerate(st.entries) if e.state != pb.COMPLETED]
        queued = set(pending[len(pending) - skip.get(r, 0) :]) if skip.get(r) else set()
        for i, e in enumerate(st.entries):
            if i in queued:
                st.entries[i] = EntryValues(**{**_fields(e), "state": pb.ENQUEUED})
            else:
                state = pb.COMPLETED if e.state == pb.COMPLETED else pb.STARTED
                started = {"state": state, "start_ns": e.enqueue_ns}
                st.entries[i] = EntryValues(**{**_fields(e), **started})
    return job
