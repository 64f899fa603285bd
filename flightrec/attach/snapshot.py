"""One rank's snapshot as a flightrec dump: its threads' stacks over a few samples, its
children's, and torch's ring where one was read, marked as taken from outside (ATTACHED)."""

from __future__ import annotations

import linecache
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from flightrec import __version__
from flightrec.attach.processes import RankProcess
from flightrec.attach.pyspy import ThreadStack
from flightrec.format import flightrec_pb2 as pb
from flightrec.format.builder import MAX_SOURCE_CHARS, DumpBuilder
from flightrec.readers.native.convert import convert_columns
from flightrec.readers.native.groups import JobGroups
from flightrec.readers.native.model import NativeDump

SOURCE = "flightrec-attach"
"""``Header.source`` of a snapshot ``flightrec attach`` wrote."""


@dataclass(frozen=True, slots=True)
class Sample:
    """Every thread of one process at one instant."""

    mono_ns: int
    threads: tuple[ThreadStack, ...]
    cpu_ns: Mapping[int, int]
    """CPU time each thread (by kernel thread id) had used, read right after its stack."""


def stillness(samples: Sequence[Sample], thread: ThreadStack) -> tuple[int, int]:
    """(still_ms, cpu_ms) of ``thread``: over how many ms, up to the last sample, every
    sample showed it with its last stack (0 when the last two differ, or there is one), and
    the CPU time it used over that span.

    Args:
        samples: one process' samples, oldest first; ``thread`` is of the last.
        thread: the thread as the last sample saw it.
    """
    if not samples:
        return 0, 0
    last = first = samples[-1]
    for sample in reversed(samples[:-1]):
        same = next((t for t in sample.threads if t.native_id == thread.native_id), None)
        if same is None or same.frames != thread.frames:
            break
        first = sample
    tid = thread.native_id
    used = last.cpu_ns.get(tid, 0) - first.cpu_ns.get(tid, 0) if tid in first.cpu_ns else 0
    return (last.mono_ns - first.mono_ns) // 1_000_000, max(0, used) // 1_000_000


def _source(file: str, line: int) -> str:
    # attach runs on the rank's node: the files it runs are here (read now, so a file edited
    # since the job started shows its new line; the dump's code is for reading, not proof).
    return linecache.getline(file, line).strip()[:MAX_SOURCE_CHARS]


@dataclass(frozen=True, slots=True)
class Ring:
    """torch's ring of one rank, read as a native dump, and the job's groups rebuilt from
    the rings of the ranks attached together."""

    native: NativeDump
    groups: JobGroups


def build_snapshot(
    proc: RankProcess,
    samples: Sequence[Sample],
    children: Sequence[Sequence[Sample]],
    ring: Ring | None,
    detail: str,
    dump_index: int,
) -> pb.Dump:
    """The dump of one rank.

    Args:
        proc: the rank's process.
        samples: its own samples, oldest first (at least one).
        children: each child process' samples, oldest first.
        ring: torch's ring of the process, when one was read.
        detail: the header's ``reason_detail``: how it was taken.
        dump_index: the header's ``dump_index`` (snapshots of this process before it).

    Returns:
        The dump (reason ATTACHED, source ``SOURCE``).
    """
    columns = None
    if ring is not None:
        b, columns = convert_columns(ring.native, ring.groups)
        b.read_sources(_source)
        converted = b.header.reason_detail
    else:
        b, converted = DumpBuilder(_source), ""
    for sample_list in (samples, *children):
        if not sample_list:
            continue
        for t in sample_list[-1].threads:
            still, cpu = stillness(sample_list, t)
            b.thread(
                t.ident,
                t.name,
                t.frames,
                is_main=t.is_main and t.pid == proc.pid,
                pid=0 if t.pid == proc.pid else t.pid,
                still_ms=still,
                cpu_ms=cpu,
            )
    if columns is not None:
        b.entry_columns({name: list(column) for name, column in columns.items()})
    h = b.header
    h.rank = proc.rank
    h.world_size = proc.world_size
    h.hostname = proc.host
    h.pid = proc.pid
    h.local_rank = proc.local_rank
    h.job_id = proc.job_id
    h.flightrec_version = __version__
    h.reason = pb.ATTACHED
    h.source = SOURCE
    h.requested_by = -1
    h.dump_index = dump_index
    h.reason_detail = "; ".join(part for part in (detail, converted) if part)
    wall = time.time_ns()
    # torch's ring times entries by the wall clock: the dump's two clocks are then one, as in
    # a converted native dump. Without a ring, the monotonic clock of this host (the same in
    # every process on it) stands beside the wall clock.
    h.wall_time_ns = wall
    h.mono_time_ns = wall if ring is not None else time.monotonic_ns()
    return b.build()
