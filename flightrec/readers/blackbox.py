"""Reading a black box back into a dump: that rank's evidence when it wrote no dump itself.

The result is an ordinary ``pb.Dump`` with an honest header: ``source`` is
``"flightrec-blackbox"``, ``reason`` is ``BLACKBOX`` and ``reason_detail`` says how the
process ended as far as the file can tell. It has no thread stacks (nobody was there to take
them); the last entries' own stacks say where the rank last called into torch.distributed.

Slots are checked one by one, so a slot torn by a kill in the middle of its write is dropped,
never misread: its record id must be stored twice (first and last word) and agree with its
position, its state must be a real state, and every table index must resolve.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flightrec.errors import CorruptDumpError, NotADumpError, UnsupportedVersionError
from flightrec.format import flightrec_pb2 as pb
from flightrec.format.blackbox import (
    DIED,
    HEAD_FIELDS,
    HEADER,
    HEADER_SIZE,
    MAGIC,
    OFF_UNSEEN,
    RUNNING_NOW,
    SOURCE,
    TABLES_SUFFIX,
    UNSEEN_COUNT,
    UNSEEN_ROW,
    UNSEEN_ROWS,
    VERSION,
    Status,
    UnseenRow,
    text,
)
from flightrec.format.builder import DumpBuilder
from flightrec.format.ending import is_gone, process_end
from flightrec.format.schema import MAX_DUMP_BYTES
from flightrec.format.slot import SLOT, SLOT_SIZE, Slot


def died(header: pb.Header) -> bool:
    """Whether a dump is a black box whose process died hard (not exited, not still running)."""
    return header.source == SOURCE and process_end(header) == pb.END_DIED


def ended(header: pb.Header) -> bool:
    """Whether a dump is a black box whose process is gone (died, or exited without a dump)."""
    return header.source == SOURCE and is_gone(header)


def is_blackbox(path: str | Path) -> bool:
    """Whether ``path`` starts with the black-box magic bytes (False when unreadable)."""
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


ORIGINS = frozenset(pb.FrameOrigin.values())


class Tables:
    """The journal's tables: strings, tensor signatures, frames, stacks and groups."""

    def __init__(self) -> None:
        self.strings: dict[int, str] = {0: ""}
        self.tensors: dict[int, list[tuple[list[int], str]]] = {0: []}
        self.frames: dict[int, tuple[str, str, int]] = {}
        self.sources: dict[int, str] = {}
        """Frame id -> its source line, as the recording process read it."""
        self.origins: dict[int, int] = {}
        """Frame id -> its ``FrameOrigin``, as the recording process judged it."""
        self.stacks: dict[int, list[int]] = {0: []}
        self.groups: dict[int, tuple[str, str, list[int], str]] = {}
        self.exceptions: list[
            tuple[str, str, str, bool, int, str, list[tuple[str, str, int, str]]]
        ] = []
        """(type, message, thread, is_main, wall ns, via, frames) of each exception that
        ended a thread; frames are (file, function, line, source), raising frame first."""
        self.bad_lines = 0


def read_tables(path: Path) -> Tables:
    """Parse a ``.ring.tables`` journal; unparseable lines (a torn last write) are counted.

    At most ``MAX_DUMP_BYTES`` are read: a journal holds each distinct string, frame and stack
    once, far less than that; the rest of a larger file counts as one bad line.
    """
    t = Tables()
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_DUMP_BYTES + 1)
    except OSError:
        return t
    if len(data) > MAX_DUMP_BYTES:
        data = data[: data.rfind(b"\n", 0, MAX_DUMP_BYTES) + 1]
        t.bad_lines += 1
    for line in data.splitlines():
        try:
            rec = json.loads(line)
            kind, index = rec[0], int(rec[1])
            if kind == "s":
                t.strings[index] = str(rec[2])
            elif kind == "t":
                t.tensors[index] = [(list(map(int, s)), str(d)) for s, d in rec[2]]
            elif kind == "f":
                t.frames[index] = (str(rec[2]), str(rec[3]), int(rec[4]))
            elif kind == "c":
                if rec[2]:
                    t.sources[index] = str(rec[2])  # cut to length by the builder
                if len(rec) > 3 and int(rec[3]) in ORIGINS:  # (none before schema 1.6)
                    t.origins[index] = int(rec[3])
            elif kind == "k":
                t.stacks[index] = [int(f) for f in rec[2]]
            elif kind == "x":
                frames = [(str(f[0]), str(f[1]), int(f[2]), str(f[3])) for f in rec[8]]
                t.exceptions.append(
                    (str(rec[2]), str(rec[3]), str(rec[4]), bool(rec[5]), int(rec[6]),
                     str(rec[7]), frames)
                )  # fmt: skip
            elif kind == "g":
                t.groups[index] = (str(rec[2]), str(rec[3]), [int(r) for r in rec[4]], str(rec[5]))
            else:
                t.bad_lines += 1
        except (ValueError, TypeError, IndexError, KeyError, OverflowError, RecursionError):
            # A torn last write, or a crafted line (1e400 as an index, "[[[[..." nested past
            # the parser's recursion limit): one bad line, never the analysis.
            t.bad_lines += 1
    return t


def _header(path: Path, data: bytes) -> dict[str, Any]:
    if len(data) < HEADER_SIZE or not data.startswith(MAGIC):
        raise NotADumpError(path, "not a flightrec black-box file (no magic bytes)")
    head = dict(zip(HEAD_FIELDS, HEADER.unpack_from(data, 0), strict=True))
    if head["version"] != VERSION:
        raise UnsupportedVersionError(
            path,
            f"black-box format version {head['version']}; this flightrec reads version {VERSION}",
        )
    if head["slot_size"] != SLOT_SIZE or head["header_size"] != HEADER_SIZE:
        raise UnsupportedVersionError(
            path, f"black-box slots of {head['slot_size']} bytes; this flightrec uses {SLOT_SIZE}"
        )
    if len(data) < HEADER_SIZE + head["capacity"] * SLOT_SIZE:
        raise CorruptDumpError(path, "black-box file is shorter than its ring")
    for key in ("hostname", "job_id", "backend", "torch_version", "flightrec_version"):
        head[key] = text(head[key])
    return head


def _valid(s: Slot, tail: int, index: int, capacity: int, t: Tables) -> bool:
    return (
        s.record_id == tail
        and (s.record_id - 1) % capacity == index
        and 1 <= s.state <= 4
        and s.group in t.groups
        and all(i in t.strings for i in (s.op, s.reduce_op, s.thread, s.device))
        and s.stack in t.stacks
        and s.inputs in t.tensors
        and s.outputs in t.tensors
    )


def read_slots(path: Path, data: bytes, capacity: int, t: Tables) -> tuple[list[Slot], int]:
    """The ring's valid entries, oldest first, and the number of torn or unresolvable slots."""
    region = data[HEADER_SIZE : HEADER_SIZE + capacity * SLOT_SIZE]
    entries: list[Slot] = []
    dropped = 0
    for index, values in enumerate(SLOT.iter_unpack(region)):
        if not values[0]:
            continue
        s = Slot._make(values[:-1])
        if _valid(s, values[-1], index, capacity, t):
            entries.append(s)
        else:
            dropped += 1
    entries.sort(key=lambda s: s.record_id)
    return entries, dropped


def read_unseen(data: bytes, t: Tables) -> list[UnseenRow]:
    """The header's rows whose group the journal knows (``OFF_UNSEEN``)."""
    count, _ = UNSEEN_COUNT.unpack_from(data, OFF_UNSEEN)
    at = OFF_UNSEEN + UNSEEN_COUNT.size
    out: list[UnseenRow] = []
    for i in range(min(count, UNSEEN_ROWS)):
        group, flags, issued, pending, op, since = UNSEEN_ROW.unpack_from(
            data, at + i * UNSEEN_ROW.size
        )
        if group in t.groups and pending <= issued:
            out.append(UnseenRow(group, flags & pb.DDP_BUCKET, issued, pending, text(op), since))
    return out


def _alive(host: str, pid: int) -> bool:
    """Whether the process is still running (only knowable on the host that wrote the file)."""
    if host != socket.gethostname() or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


HEARTBEAT_FRESH_S = 10.0
"""A black box from another host whose heartbeat (written every watchdog tick, 0.1 s) is
younger than this is taken as a running process: its liveness cannot be checked from here,
and shared file systems and host clocks lag by a few seconds at most."""


def _heartbeat_age_s(head: dict[str, Any]) -> float:
    """Seconds since the process last noted it was alive, on this machine's wall clock."""
    beat = int(head["beat_wall_ns"] or head["start_wall_ns"])
    return (time.time_ns() - beat) / 1e9


def _ending(
    head: dict[str, Any], n: int, dropped: int, died_of: str = ""
) -> tuple[pb.ProcessEnd.ValueType, str]:
    """How the process ended (``Header.process_end``), and the header's ``reason_detail``."""
    who = f"pid {head['pid']} on {head['hostname'] or 'unknown host'}"
    status = head["status"]
    remote = head["hostname"] != socket.gethostname()
    age = _heartbeat_age_s(head)
    end = pb.END_EXITED
    if status == Status.EXITED and died_of:
        what = f"black box of {who}: the process exited of an uncaught {died_of}"
    elif status == Status.EXITED:
        what = (
            f"black box of {who}: the process exited with unfinished or failed operations "
            "and wrote no exit dump"
        )
    elif status == Status.CLEAN:
        what = f"black box of {who}: the process exited healthy"
    elif _alive(head["hostname"], head["pid"]):
        end, what = pb.END_RUNNING, f"black box of {who}: {RUNNING_NOW} (a live view of its ring)"
    elif remote and 0 <= age < HEARTBEAT_FRESH_S:
        end = pb.END_RUNNING
        what = (
            f"black box of {who}: {RUNNING_NOW} as far as another host can tell "
            f"(its heartbeat is {age:.1f} s old)"
        )
    else:
        end = pb.END_DIED
        what = (
            f"black box of {who}: {DIED} "
            "(SIGKILL, OOM killer, os._exit, or an abort inside the backend)"
        )
        if remote:  # judged from here by its heartbeat alone
            what += f"; its heartbeat stopped {age:.0f} s before this analysis"
    what += f"; {n} entries recovered"
    if dropped:
        what += f", {dropped} torn or unresolvable slots dropped"
    return end, what


def read_blackbox(path: str | Path) -> pb.Dump:
    """Turn a black-box file (and its ``.ring.tables`` journal) into a dump.

    Args:
        path: the ``.ring`` file.

    Returns:
        A dump whose header says ``source="flightrec-blackbox"``, ``reason=BLACKBOX``.

    Raises:
        NotADumpError: not a black-box file.
        UnsupportedVersionError: written by a flightrec with another slot layout.
        CorruptDumpError: the file is shorter than its header says.
    """
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > MAX_DUMP_BYTES:  # refused before reading: memory stays bounded
            raise CorruptDumpError(
                p, f"{size} bytes is larger than any black box ({MAX_DUMP_BYTES} max)"
            )
        data = p.read_bytes()
    except OSError as exc:
        raise CorruptDumpError(p, f"cannot read: {exc.strerror or exc}") from None
    head = _header(p, data)
    tables = read_tables(p.with_name(p.name.removesuffix(".ring") + TABLES_SUFFIX))
    entries, dropped = read_slots(p, data, head["capacity"], tables)
    unseen = read_unseen(data, tables)

    try:
        return _to_dump(head, tables, entries, dropped, unseen)
    except (ValueError, OverflowError) as exc:  # a damaged number past its field's range
        raise CorruptDumpError(p, f"a black-box value is out of range ({exc})") from None


def _to_dump(
    head: dict[str, Any],
    tables: Tables,
    entries: list[Slot],
    dropped: int,
    unseen: Sequence[UnseenRow] = (),
) -> pb.Dump:
    """The dump a black box's header, journal and slots make up (raises ValueError for a
    number that does not fit its field)."""
    # Each frame's source line from the journal (never from the files on this machine).
    by_site = {
        (f[0], f[2]): tables.sources[i] for i, f in tables.frames.items() if i in tables.sources
    }
    for x in tables.exceptions:
        by_site.update({(f[0], f[2]): f[3] for f in x[6] if f[3]})
    origins = {
        (f[0], f[2]): tables.origins[i] for i, f in tables.frames.items() if i in tables.origins
    }
    died_of = next((x[0] for x in tables.exceptions if x[3]), "")
    b = DumpBuilder(
        source=lambda file, line: by_site.get((file, line), ""),
        origin=lambda file, line: origins.get((file, line), 0),
    )
    _fill_header(b.header, head, entries, dropped, died_of)
    g_map, waits = _add_groups(b, tables, entries, unseen)
    _add_entries(b, tables, entries, g_map)
    device = "cpu" if "nccl" not in head["backend"] else ""
    for u in waits:
        b.entry_raw(
            record_id=0, group=g_map[u.group], seq=u.pending, p2p_seq=0, op=b.string(u.op),
            reduce_op=0, peer=-1, state=pb.ENQUEUED, enqueue_ns=u.since_ns, start_ns=0,
            complete_ns=0, thread=0, stack=0, inputs=0, outputs=0,
            flags=u.flags | pb.UNSEEN, device=b.string(device),
        )  # fmt: skip
    for kind, message, thread, is_main, wall_ns, via, traceback in tables.exceptions:
        b.exception(
            kind, message, [(f, n, line) for f, n, line, _ in traceback], thread=thread, is_main=is_main,
            wall_time_ns=wall_ns, via=via,
        )  # fmt: skip
    return b.build()


def _fill_header(
    h: pb.Header, head: dict[str, Any], entries: list[Slot], dropped: int, died_of: str
) -> None:
    """The dump's header from the black box's: who, why (``BLACKBOX``) and when it last lived."""
    h.rank, h.world_size = head["rank"], head["world_size"]
    h.hostname, h.pid = head["hostname"], head["pid"]
    h.local_rank = -1
    h.device = "cpu" if "nccl" not in head["backend"] else ""
    h.job_id, h.backend = head["job_id"], head["backend"]
    h.torch_version, h.flightrec_version = head["torch_version"], head["flightrec_version"]
    h.reason = pb.BLACKBOX
    h.process_end, h.reason_detail = _ending(head, len(entries), dropped, died_of)
    # The last sign of life: the newest heartbeat or entry time, on the monotonic clock.
    last = max(
        [head["beat_mono_ns"], head["start_mono_ns"]]
        + [max(e.enqueue_ns, e.complete_ns) for e in entries]
    )
    h.mono_time_ns = last
    h.wall_time_ns = head["start_wall_ns"] + (last - head["start_mono_ns"])
    h.buffer_capacity = head["capacity"]
    h.entries_recorded = entries[-1].record_id if entries else 0
    h.stack_depth, h.timeout_s = head["stack_depth"], head["timeout_s"]
    h.dump_index = 0
    h.requested_by = -1
    h.source = SOURCE


def _add_groups(
    b: DumpBuilder, tables: Tables, entries: list[Slot], unseen: Sequence[UnseenRow]
) -> tuple[dict[int, int], list[UnseenRow]]:
    """Add the journal's groups; returns each journal group's index in the dump, and the
    collectives the ring never held that the rank waits in."""
    # Unfinished collectives the ring never held, past everything it holds of their group:
    # where the rank waits when only torch's recorder saw the call (a DDP bucket all-reduce).
    newest = {i: max((e.seq for e in entries if e.group == i), default=0) for i in tables.groups}
    issued = {u.group: u.issued for u in unseen}
    waits = [u for u in unseen if u.pending > newest[u.group]]
    g_map: dict[int, int] = {}
    for index, (name, desc, ranks, backend) in sorted(tables.groups.items()):
        mine = [e for e in entries if e.group == index]
        g_map[index] = b.group(
            name, ranks, desc=desc, backend=backend,
            last_seq=max(newest[index], issued.get(index, 0)),
            p2p=_p2p_counters(mine), members_known=bool(ranks),
        )  # fmt: skip
    return g_map, waits


def _add_entries(
    b: DumpBuilder, tables: Tables, entries: list[Slot], g_map: dict[int, int]
) -> None:
    """Add the ring's slots, with their strings, stacks and tensors."""
    s_map = {i: b.string(s) for i, s in tables.strings.items()}
    k_map = {0: 0}
    t_map = {0: 0}
    for e in entries:
        if e.stack not in k_map:
            frames = [tables.frames[f] for f in tables.stacks[e.stack] if f in tables.frames]
            k_map[e.stack] = b.stack(frames)
        for ti in (e.inputs, e.outputs):
            if ti not in t_map:
                t_map[ti] = b.tensors((tuple(shape), dtype) for shape, dtype in tables.tensors[ti])
        b.entry_raw(
            record_id=e.record_id, group=g_map[e.group], seq=e.seq, p2p_seq=e.p2p_seq,
            op=s_map[e.op], reduce_op=s_map[e.reduce_op], peer=e.peer, state=e.state,
            enqueue_ns=e.enqueue_ns, start_ns=0, complete_ns=e.complete_ns,
            thread=s_map[e.thread], stack=k_map[e.stack], inputs=t_map[e.inputs],
            outputs=t_map[e.outputs], flags=e.flags, device=s_map[e.device],
        )  # fmt: skip


def _p2p_counters(entries: list[Slot]) -> list[tuple[int, int, int]]:
    """(peer, sends, recvs) from the highest P2P ordinals still in the ring."""
    from flightrec.format.builder import IS_P2P, SEND

    sends: dict[int, int] = {}
    recvs: dict[int, int] = {}
    for e in entries:
        if e.flags & IS_P2P:
            side = sends if e.flags & SEND else recvs
            side[e.peer] = max(side.get(e.peer, 0), e.p2p_seq)
    peers = sorted(set(sends) | set(recvs))
    return [(p, sends.get(p, 0), recvs.get(p, 0)) for p in peers]
