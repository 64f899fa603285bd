"""A rank's state in a few hundred bytes: what the verdict in the job's log is computed from.

When a hang is declared, every rank publishes one ``Summary`` through the job's store (no
shared filesystem is needed) and one rank analyses them all. A summary holds what the analysis
needs to name the culprit, taken from the dump the rank just built:

- per process group: its members, the collectives issued (the counter), per-peer P2P
  counters, and the entries that had not completed (oldest first) with the newest completed
  one: op, sequence numbers, peer, state, shapes and dtypes, the user's call site;
- where the rank is now: the innermost frames of its main thread, with their source lines;
- what ended its threads, when one died of an exception: type, message, the user's frames of
  the traceback (a rank that died publishes its summary on the way out, so the verdict names
  the crash and not a rank that left nothing);
- who it is (rank, host, pid, device) and where its full dump went.

On the wire: ``MAGIC`` + zlib-compressed compact JSON, at most ``MAX_BYTES``. ``encode`` trims
(source text first, then outer frames, then groups with nothing pending) until it fits.
``decode`` trusts nothing: anyone who can reach the store can write these keys, so size,
structure, types, ranges and lengths are checked and any violation is one ``SummaryError``
line, never a traceback.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from flightrec.errors import FlightrecError, printable
from flightrec.format import flightrec_pb2 as pb
from flightrec.format.members import members_of
from flightrec.frames import keep_user_frames

MAGIC = b"FRS1"
MAX_BYTES = 2048
"""Largest summary on the wire: 16,384 ranks hold at most 32 MiB in the store at once."""
MAX_JSON_BYTES = 32 * 1024
"""Largest decompressed summary (a zlib bomb stops here)."""
MAX_GROUPS = 16
MAX_PENDING = 4
"""Incomplete entries kept per group, oldest first."""
HISTORY = 16
"""Newest entries of the ring kept whatever their group: the order of the last calls is what
tells a rank that skipped a call or left its loop from one that is merely behind."""
MAX_ENTRIES = HISTORY + MAX_PENDING + 1
"""Entries per group: history, the oldest incomplete ones, and the newest completed one."""
MAX_TENSORS = 4
MAX_DIMS = 8
MAX_STACK = 10
"""Innermost frames of the main thread kept."""
MAX_ENTRY_FRAMES = 3
"""Frames per entry (the user's call site first)."""
MAX_FRAMES = 64
MAX_MEMBERS = 64
"""Members listed one by one; a longer list must be a range (else it is marked unknown)."""
MAX_PEERS = 8
MAX_EXCEPTIONS = 2
"""Exceptions kept (the one that ended the main thread first, then the newest)."""
MAX_EXCEPTION_FRAMES = 4
"""Frames per exception's traceback (the raising frame and the user's)."""
MAX_TEXT = 160
MAX_PATH = 512
MAX_RANK = (1 << 24) - 1
MAX_INT = (1 << 63) - 1
STATES = frozenset(pb.State.values())
REASONS = frozenset(pb.DumpReason.keys())


class SummaryError(FlightrecError):
    """A summary read from the store is not one (one line: who sent it and what is wrong)."""


@dataclass(frozen=True, slots=True)
class Frame:
    """One Python frame: file, function, line, the source line's text ("" when unknown)."""

    file: str
    function: str
    line: int
    code: str = ""


@dataclass(frozen=True, slots=True)
class Tensor:
    """Shape and dtype of one tensor argument."""

    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True, slots=True)
class Entry:
    """One ring entry (the schema's ``Entries`` columns, one value each)."""

    record_id: int
    seq: int
    p2p_seq: int
    op: str
    reduce_op: str
    peer: int
    state: int
    flags: int
    enqueue_ns: int
    complete_ns: int
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    stack: tuple[Frame, ...]
    """Innermost first."""


@dataclass(frozen=True, slots=True)
class Group:
    """One process group as this rank sees it."""

    name: str
    desc: str
    backend: str
    ranks: Sequence[int]
    """Global ranks in group-rank order (a ``range`` when they form one)."""
    members_known: bool
    last_seq: int
    p2p: tuple[tuple[int, int, int], ...]
    """(peer, sends, recvs)."""
    entries: tuple[Entry, ...]


@dataclass(frozen=True, slots=True)
class Raised:
    """An exception that ended one of the rank's threads."""

    type: str
    message: str
    thread: str
    is_main: bool
    """It ended the main thread: the process died of it."""
    wall_ns: int
    stack: tuple[Frame, ...]
    """The traceback, raising frame first."""


@dataclass(frozen=True, slots=True)
class Summary:
    """What one rank publishes for one round of the exchange."""

    round: int
    """The dump request this answers: every rank answering one hang names the same number."""
    rank: int
    world_size: int
    host: str
    pid: int
    local_rank: int
    device: str
    job_id: str
    backend: str
    reason: str
    """Why the rank dumped (a ``DumpReason`` name)."""
    wall_ns: int
    mono_ns: int
    timeout_s: float
    dump_path: str
    """Where the rank's full dump went on its host; "" when it could not be written."""
    groups: tuple[Group, ...]
    stack: tuple[Frame, ...]
    """The main thread's innermost frames at dump time, innermost first."""
    exceptions: tuple[Raised, ...] = ()
    """Exceptions that ended threads of the process (the main thread's first)."""


# -- building ---------------------------------------------------------------------------------
def summarize(dump: pb.Dump, round_: int, dump_path: str = "") -> Summary:
    """The summary of a dump the recorder just built.

    Args:
        dump: the dump (entries oldest first).
        round_: the request number this summary answers.
        dump_path: where the dump was written ("" when it was not).
    """
    h = dump.header
    s = dump.strings
    e = dump.entries
    frames = dump.frames
    stacks = dump.stacks
    specs = dump.tensor_specs

    def frame(i: int) -> Frame:
        f = frames[i]
        return Frame(s[f.file][:MAX_TEXT], s[f.name][:MAX_TEXT], f.line, s[f.code][:MAX_TEXT])

    def stack(i: int, limit: int) -> tuple[Frame, ...]:
        """The innermost frame and the user's, within ``limit`` (``keep_user_frames``)."""
        ids = stacks[i].frames
        files = [s[frames[f].file] for f in ids] if len(ids) > limit else []
        return tuple(frame(f) for f in keep_user_frames(ids, files, limit))

    def tensors(i: int) -> tuple[Tensor, ...]:
        spec = specs[i]
        out: list[Tensor] = []
        pos = 0
        for nd, dt in zip(spec.ndim, spec.dtype, strict=True):
            if len(out) < MAX_TENSORS:
                out.append(Tensor(tuple(spec.dims[pos : pos + min(nd, MAX_DIMS)]), s[dt][:32]))
            pos += nd
        return tuple(out)

    def entry(i: int) -> Entry:
        return Entry(
            e.record_id[i], e.seq[i], e.p2p_seq[i], s[e.op[i]][:MAX_TEXT],
            s[e.reduce_op[i]][:32], e.peer[i], e.state[i], e.flags[i], e.enqueue_ns[i],
            e.complete_ns[i], tensors(e.inputs[i]), tensors(e.outputs[i]),
            stack(e.stack[i], MAX_ENTRY_FRAMES),
        )  # fmt: skip

    pending: dict[int, list[int]] = {}
    completed: dict[int, int] = {}
    newest: dict[int, int] = {}
    for i, (g, state) in enumerate(zip(e.group, e.state, strict=True)):
        newest[g] = i
        if state == pb.COMPLETED:
            completed[g] = i
        else:
            pending.setdefault(g, []).append(i)
    keep = set(range(max(0, len(e.group) - HISTORY), len(e.group)))
    keep.update(i for ps in pending.values() for i in ps[:MAX_PENDING])
    keep.update(completed.values())
    by_group: dict[int, list[int]] = {}
    for i in sorted(keep):
        by_group.setdefault(e.group[i], []).append(i)
    # Groups with something pending first (the oldest pending first), then the most recent.
    order = sorted(
        range(len(dump.groups)),
        key=lambda g: (g not in pending, pending[g][0] if g in pending else -newest.get(g, -1)),
    )
    groups: list[Group] = []
    for g in order[:MAX_GROUPS]:
        pg = dump.groups[g]
        picked = by_group.get(g, [])[-MAX_ENTRIES:]
        groups.append(
            Group(
                pg.name[:MAX_TEXT],
                pg.desc[:MAX_TEXT],
                pg.backend[:32],
                members(members_of(pg)),
                pg.members_known,
                pg.last_seq,
                tuple((p.peer, p.sends, p.recvs) for p in pg.p2p[:MAX_PEERS]),
                tuple(entry(i) for i in picked),
            )
        )
    main = next((t for t in dump.threads if t.is_main), None)
    main = main or next((t for t in dump.threads if t.holds_recorder), None)
    main_stack = stack(main.stack, MAX_STACK) if main else ()
    raised = sorted(dump.exceptions, key=lambda x: not x.is_main)[:MAX_EXCEPTIONS]
    exceptions = tuple(
        Raised(x.type[:MAX_TEXT], _cut(x.message), x.thread[:MAX_TEXT], x.is_main,
               x.wall_time_ns, stack(x.stack, MAX_EXCEPTION_FRAMES))
        for x in raised
    )  # fmt: skip
    return Summary(
        round_, h.rank, h.world_size, h.hostname[:MAX_TEXT], h.pid, h.local_rank,
        h.device[:MAX_TEXT], h.job_id[:MAX_TEXT], h.backend[:32],
        pb.DumpReason.Name(h.reason), h.wall_time_ns, h.mono_time_ns, h.timeout_s,
        dump_path[:MAX_PATH], tuple(groups), main_stack, exceptions,
    )  # fmt: skip


def _cut(text: str) -> str:
    """``text`` within ``MAX_TEXT`` characters, ending in an ellipsis where it was cut."""
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…"


def members(ranks: Sequence[int]) -> Sequence[int]:
    """A member list as a ``range`` when it is an arithmetic progression, else a tuple."""
    if len(ranks) >= 2:
        step = ranks[1] - ranks[0]
        if step:
            span = range(ranks[0], ranks[-1] + (1 if step > 0 else -1), step)
            if len(span) == len(ranks) and all(a == b for a, b in zip(span, ranks, strict=True)):
                return span
    return tuple(ranks)


# -- the wire ---------------------------------------------------------------------------------
def _frame_table(s: Summary) -> tuple[list[Frame], dict[Frame, int]]:
    table: list[Frame] = []
    index: dict[Frame, int] = {}
    for f in [
        *s.stack,
        *(f for g in s.groups for en in g.entries for f in en.stack),
        *(f for x in s.exceptions for f in x.stack),
    ]:
        if f not in index:
            index[f] = len(table)
            table.append(f)
    return table, index


def _ranks_json(ranks: Sequence[int], known: bool) -> dict[str, Any]:
    if isinstance(ranks, range):
        return {"r": [ranks.start, ranks.stop, ranks.step]}
    if len(ranks) <= MAX_MEMBERS:
        return {"m": list(ranks)} if known else {"m": list(ranks), "u": 1}
    return {"u": 1}  # too long to list and not a range: the reader treats members as unknown


def _to_json(s: Summary) -> bytes:
    table, index = _frame_table(s)

    def spec(ts: tuple[Tensor, ...]) -> list[Any]:
        return [[list(t.shape), t.dtype] for t in ts]

    groups = []
    for g in s.groups:
        entries = [
            [en.record_id, en.seq, en.p2p_seq, en.op, en.reduce_op, en.peer, en.state, en.flags,
             en.enqueue_ns, en.complete_ns, spec(en.inputs), spec(en.outputs),
             [index[f] for f in en.stack]]
            for en in g.entries
        ]  # fmt: skip
        groups.append(
            {"n": g.name, "d": g.desc, "b": g.backend, **_ranks_json(g.ranks, g.members_known),
             "s": g.last_seq, "p": [list(p) for p in g.p2p], "e": entries}
        )  # fmt: skip
    doc = {
        "round": s.round, "rank": s.rank, "world": s.world_size, "host": s.host, "pid": s.pid,
        "lr": s.local_rank, "dev": s.device, "job": s.job_id, "be": s.backend, "why": s.reason,
        "wall": s.wall_ns, "mono": s.mono_ns, "to": s.timeout_s, "dump": s.dump_path,
        "f": [[f.file, f.function, f.line, f.code] for f in table],
        "st": [index[f] for f in s.stack], "g": groups,
        "x": [[x.type, x.message, x.thread, int(x.is_main), x.wall_ns, [index[f] for f in x.stack]]
              for x in s.exceptions],
    }  # fmt: skip
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def _trimmed(s: Summary, step: int) -> Summary:
    """``s`` with less detail, more at each step; the last step keeps only who the rank is."""
    no_code = {f: replace(f, code="") for f in _frame_table(s)[0]}
    if step == 1:  # source text only for the innermost frames
        return replace(s, stack=s.stack[:2] + tuple(no_code[f] for f in s.stack[2:]))
    if step == 2:  # groups with nothing pending go
        busy = tuple(g for g in s.groups if any(en.state != pb.COMPLETED for en in g.entries))
        return replace(_trimmed(s, 1), groups=busy)
    if step == 3:  # one frame per entry, four on the stack, no source text
        groups = tuple(
            replace(g, entries=tuple(replace(en, stack=en.stack[:1]) for en in g.entries))
            for g in s.groups
        )
        return replace(s, groups=groups, stack=tuple(no_code[f] for f in s.stack[:4]))
    exceptions = tuple(
        replace(x, stack=tuple(no_code[f] for f in x.stack[:1])) for x in s.exceptions
    )
    return replace(
        s, groups=(), stack=s.stack[:1], dump_path=s.dump_path[-200:], exceptions=exceptions
    )


def encode(s: Summary) -> bytes:
    """The summary on the wire, trimmed until it fits ``MAX_BYTES``."""
    for cut in (s, _trimmed(s, 1), _trimmed(s, 2), _trimmed(_trimmed(s, 2), 3), _trimmed(s, 4)):
        data = MAGIC + zlib.compress(_to_json(cut), 9)
        if len(data) <= MAX_BYTES:
            return data
    raise ValueError("summary does not fit even without groups")  # pragma: no cover


# -- reading (untrusted) ----------------------------------------------------------------------
class _Bad(Exception):
    pass


def _int(v: object, lo: int = -MAX_INT, hi: int = MAX_INT) -> int:
    if type(v) is not int or not lo <= v <= hi:
        raise _Bad(f"expected an integer in {lo}..{hi}, got {_show(v)}")
    return v


def _str(v: object, limit: int = MAX_TEXT) -> str:
    if type(v) is not str or len(v) > limit:
        raise _Bad(f"expected text of at most {limit} characters, got {_show(v)}")
    return v


def _list(v: object, limit: int) -> list[Any]:
    if type(v) is not list or len(v) > limit:
        raise _Bad(f"expected a list of at most {limit} items, got {_show(v)}")
    return v


def _show(v: object) -> str:
    return printable(repr(v)[:40])


def _tensors(v: object) -> tuple[Tensor, ...]:
    out = []
    for t in _list(v, MAX_TENSORS):
        shape, dtype = _fixed(t, 2)
        dims = tuple(_list(shape, MAX_DIMS))
        if not all(type(d) is int and 0 <= d <= MAX_INT for d in dims):
            raise _Bad(f"a tensor shape holds {_show(shape)}")
        out.append(Tensor(dims, _str(dtype, 32)))
    return tuple(out)


def _ranks(doc: dict[str, Any], world: int) -> tuple[Sequence[int], bool]:
    if "r" in doc:
        start, stop, step = (_int(x, -1, MAX_RANK + 1) for x in _fixed(doc["r"], 3))
        if step == 0:
            raise _Bad("a member range has step 0")
        ranks: Sequence[int] = range(start, stop, step)
        if len(ranks) > max(world, 1) or (ranks and not 0 <= min(ranks) <= max(ranks) < world):
            raise _Bad("a member range lies outside the world")
        return ranks, "u" not in doc
    listed = tuple(_int(r, 0, max(world - 1, 0)) for r in _list(doc.get("m", []), MAX_MEMBERS))
    return listed, "u" not in doc


def _fixed(v: object, n: int) -> list[Any]:
    items = _list(v, n)
    if len(items) != n:
        raise _Bad(f"expected {n} items, got {len(items)}")
    return items


def _parse(doc: object) -> Summary:
    if type(doc) is not dict:
        raise _Bad("not an object")
    world = _int(doc.get("world"), 1, MAX_RANK + 1)
    rank = _int(doc.get("rank"), 0, world - 1)
    raw_frames = _list(doc.get("f", []), MAX_FRAMES)
    table = []
    for f in raw_frames:
        file, func, line, code = _fixed(f, 4)
        table.append(Frame(_str(file), _str(func), _int(line, 0, 1 << 31), _str(code)))

    def stack(v: object, limit: int) -> tuple[Frame, ...]:
        return tuple(table[_int(i, 0, len(table) - 1)] for i in _list(v, limit))

    groups = []
    for g in _list(doc.get("g", []), MAX_GROUPS):
        if type(g) is not dict:
            raise _Bad("a group is not an object")
        ranks, known = _ranks(g, world)
        p2p = tuple(
            (_int(p, 0, world - 1), _int(sends, 0), _int(recvs, 0))
            for p, sends, recvs in (_fixed(x, 3) for x in _list(g.get("p", []), MAX_PEERS))
        )
        entries = []
        for en in _list(g.get("e", []), MAX_ENTRIES):
            rid, seq, p2p_seq, op, red, peer, state, flags, enq, comp, ins, outs, st = _fixed(
                en, 13
            )
            state = _int(state, 0, 255)
            if state not in STATES:
                raise _Bad(f"unknown entry state {state}")
            entries.append(
                Entry(
                    _int(rid, 0),  # 0: an entry only PyTorch's recorder saw (merged at dump)
                    _int(seq, 0),
                    _int(p2p_seq, 0),
                    _str(op),
                    _str(red, 32),
                    _int(peer, -1, world - 1),
                    state,
                    _int(flags, 0, 255),
                    _int(enq),
                    _int(comp),
                    _tensors(ins),
                    _tensors(outs),
                    stack(st, MAX_ENTRY_FRAMES),
                )
            )
        groups.append(
            Group(
                _str(g.get("n")),
                _str(g.get("d", "")),
                _str(g.get("b", ""), 32),
                ranks,
                known,
                _int(g.get("s"), 0),
                p2p,
                tuple(entries),
            )
        )
    exceptions = []
    for x in _list(doc.get("x", []), MAX_EXCEPTIONS):
        kind, message, thread, is_main, wall, st = _fixed(x, 6)
        exceptions.append(
            Raised(_str(kind), _str(message), _str(thread), bool(_int(is_main, 0, 1)),
                   _int(wall), stack(st, MAX_EXCEPTION_FRAMES))
        )  # fmt: skip
    reason = _str(doc.get("why"), 32)
    if reason not in REASONS:
        raise _Bad(f"unknown dump reason {_show(reason)}")
    timeout = doc.get("to")
    if type(timeout) not in (int, float) or not 0 <= timeout <= 1e7:  # type: ignore[operator]
        raise _Bad("timeout out of range")
    return Summary(
        _int(doc.get("round"), 0), rank, world, _str(doc.get("host")),
        _int(doc.get("pid"), 0, 1 << 31), _int(doc.get("lr"), -1, MAX_RANK),
        _str(doc.get("dev")), _str(doc.get("job")), _str(doc.get("be"), 32), reason,
        _int(doc.get("wall")), _int(doc.get("mono")), float(timeout),  # type: ignore[arg-type]
        _str(doc.get("dump"), MAX_PATH), tuple(groups), stack(doc.get("st", []), MAX_STACK),
        tuple(exceptions),
    )  # fmt: skip


def decode(data: bytes, source: str = "summary") -> Summary:
    """Read a summary that came from the store.

    Args:
        data: the value as read.
        source: names the value in errors ("rank 3's summary").

    Raises:
        SummaryError: one line saying what is wrong; nothing else escapes.
    """
    try:
        if len(data) > MAX_BYTES:
            raise _Bad(f"{len(data)} bytes, more than the {MAX_BYTES} a summary may have")
        if not data.startswith(MAGIC):
            raise _Bad("not a flightrec summary (wrong magic bytes)")
        z = zlib.decompressobj()
        text = z.decompress(data[len(MAGIC) :], MAX_JSON_BYTES)
        if z.unconsumed_tail or not z.eof:
            raise _Bad("damaged or larger than any summary once decompressed")
        return _parse(json.loads(text))
    except _Bad as exc:
        raise SummaryError(f"{source}: {exc}") from None
    except (zlib.error, ValueError, RecursionError) as exc:  # bad zlib, bad JSON, bad UTF-8
        raise SummaryError(f"{source}: unreadable ({printable(str(exc))[:80]})") from None
