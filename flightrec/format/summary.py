"""A rank's state in a few hundred bytes: what the verdict in the job's log is computed from.

When a hang is declared, every rank publishes one ``Summary`` through the job's store (no
shared filesystem is needed) and one rank analyses them all. A summary holds what the analysis
needs to name the culprit, taken from the dump the rank just built:

- per process group: its members, the collectives issued (the counter), per-peer P2P
  counters, and the entries that had not completed (oldest first) with the newest completed
  one: op, sequence numbers, peer, state, shapes and dtypes, the user's call site;
- where the rank is now: the innermost frames of the thread that issues its collectives (the
  main thread in most jobs; ``flightrec.format.threads``), with their source lines;
- what ended its threads, when one died of an exception: type, message, the user's frames of
  the traceback (a rank that died publishes its summary on the way out, so the verdict names
  the crash and not a rank that left nothing);
- who it is (rank, host, pid, device) and where its full dump went.

On the wire: a serialized ``Summary`` message of ``proto/flightrec.proto`` (schema 1.4), its
``dump`` field the summary as a small ``Dump`` (``to_dump``), at most ``MAX_BYTES``. ``encode``
trims (source text first, then outer frames, then groups with nothing pending) until it fits.
``decode`` trusts nothing: anyone who can reach the store can write these keys, so the bytes go
through the dump validator (``flightrec.format.read.validate``) and the limits a summary keeps
are checked; any violation is one ``SummaryError`` line, never a traceback. The reporter reads
it as it comes (``flightrec.readers.summary.summary_view``): no per-entry Python objects.

What the reporter reads from every rank first is smaller still: ``flightrec.format.progress``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from flightrec.errors import DumpError, FlightrecError, printable
from flightrec.format import flightrec_pb2 as pb
from flightrec.format.builder import DumpBuilder, EntryValues
from flightrec.format.members import members_of
from flightrec.format.read import validate
from flightrec.format.schema import SUMMARY_SOURCE
from flightrec.format.threads import issuing_thread, where_thread
from flightrec.frames import FrameOrigin, called_index, keep_user_frames, origin_of, user_index

MAGIC = "flightrec.summary"
MAX_BYTES = 3072
"""Largest summary on the wire. The store holds one per rank (overwritten by the next)."""
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
"""Innermost frames kept of the thread that says where the rank is."""
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
REASONS = frozenset(pb.DumpReason.values())


class SummaryError(FlightrecError):
    """A summary read from the store is not one (one line: who sent it and what is wrong)."""


@dataclass(frozen=True, slots=True)
class Frame:
    """One Python frame: file, function, line, the source line's text ("" when unknown), and
    whose code it is (a ``FrameOrigin`` value, as the dump says)."""

    file: str
    function: str
    line: int
    code: str = ""
    origin: int = 0


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
    """The innermost frames at dump time of the thread that says where the rank is
    (``flightrec.format.threads``), innermost first."""
    exceptions: tuple[Raised, ...] = ()
    """Exceptions that ended threads of the process (the main thread's first)."""
    thread: str = "MainThread"
    """The name of the thread ``stack`` is from."""


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
        return Frame(
            s[f.file][:MAX_TEXT], s[f.name][:MAX_TEXT], f.line, s[f.code][:MAX_TEXT], f.origin
        )

    def stack(i: int, limit: int) -> tuple[Frame, ...]:
        """The innermost frame and the user's, within ``limit`` (``keep_user_frames``)."""
        ids = stacks[i].frames
        if len(ids) <= limit:
            return tuple(frame(f) for f in ids)
        origins = [_origin(frames[f].origin, s[frames[f].file]) for f in ids]
        functions = [s[frames[f].name] for f in ids]
        return tuple(frame(f) for f in keep_user_frames(ids, origins, functions, limit))

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
    issuer = issuing_thread(e.thread, s)
    where = where_thread(dump.threads, issuer, lambda t: bool(stacks[t.stack].frames))
    where_stack = stack(where.stack, MAX_STACK) if where else ()
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
        dump_path[:MAX_PATH], tuple(groups), where_stack, exceptions,
        where.name[:MAX_TEXT] if where else "MainThread",
    )  # fmt: skip


def _origin(value: int, file: str) -> FrameOrigin:
    """A frame's recorded origin, else the one this process gives its file."""
    return FrameOrigin(value) if value in _ORIGINS and value else origin_of(file)


_ORIGINS = frozenset(o.value for o in FrameOrigin)


def _cut(text: str) -> str:
    """``text`` within ``MAX_TEXT`` characters, ending in an ellipsis where it was cut."""
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…"


def members(ranks: Sequence[int]) -> Sequence[int]:
    """A member list as a ``range`` when it is an arithmetic progression, else a tuple.

    A ``range`` (what ``members_of`` gives for a one-dimensional grid: the world group, a
    data-parallel one) is kept as it is; a list is compared at C speed (the world group of a
    131,072-rank job, compared in Python, cost 25 ms of every rank's summary)."""
    if isinstance(ranks, range):
        return ranks
    seq = tuple(ranks)
    if len(seq) >= 2:
        step = seq[1] - seq[0]
        if step:
            span = range(seq[0], seq[-1] + (1 if step > 0 else -1), step)
            if len(span) == len(seq) and tuple(span) == seq:
                return span
    return seq


# -- the wire ---------------------------------------------------------------------------------
def _frames(s: Summary) -> list[Frame]:
    return [
        *s.stack,
        *(f for g in s.groups for en in g.entries for f in en.stack),
        *(f for x in s.exceptions for f in x.stack),
    ]


def _raw(f: Frame) -> tuple[str, str, int]:
    return (f.file, f.function, f.line)


def to_dump(s: Summary) -> pb.Dump:
    """The summary as a ``Dump``: what travels inside the ``Summary`` message and what the
    analysis reads (entries in ring order; earlier ones read as overwritten)."""
    code = {(f.file, f.line): f.code for f in _frames(s) if f.code}
    origin = {(f.file, f.line): f.origin for f in _frames(s) if f.origin}
    b = DumpBuilder(
        source=lambda file, line: code.get((file, line), ""),
        origin=lambda file, line: origin.get((file, line), 0),
    )
    h = b.header
    h.rank, h.world_size, h.hostname, h.pid = s.rank, s.world_size, s.host, s.pid
    h.local_rank, h.device, h.job_id, h.backend = s.local_rank, s.device, s.job_id, s.backend
    h.reason = pb.DumpReason.Value(s.reason)  # type: ignore[assignment]
    h.reason_detail = f"summary through the job's store, request {s.round}"
    h.wall_time_ns, h.mono_time_ns, h.timeout_s = s.wall_ns, s.mono_ns, s.timeout_s
    h.requested_by = -1
    h.source = SUMMARY_SOURCE
    entries: list[EntryValues] = []
    for g in s.groups:
        # An irregular member list too long to carry is sent as unknown (the analysis then
        # takes the members from the ranks that name the group).
        listed = isinstance(g.ranks, range) or len(g.ranks) <= MAX_MEMBERS
        index = b.group(
            g.name, g.ranks if listed else (), desc=g.desc, backend=g.backend,
            last_seq=g.last_seq, p2p=g.p2p, members_known=g.members_known and listed,
        )  # fmt: skip
        entries.extend(
            EntryValues(
                record_id=e.record_id, group=index, op=e.op, seq=e.seq, p2p_seq=e.p2p_seq,
                reduce_op=e.reduce_op, peer=e.peer, state=e.state, enqueue_ns=e.enqueue_ns,
                complete_ns=e.complete_ns, flags=e.flags, stack=[_raw(f) for f in e.stack],
                inputs=[(t.shape, t.dtype) for t in e.inputs],
                outputs=[(t.shape, t.dtype) for t in e.outputs],
            )
            for e in g.entries
        )  # fmt: skip
    # Ring order. Entries only PyTorch's recorder saw (DDP's C++ reducer, functional
    # collectives) were merged in by time and carry record id 0: order by enqueue time.
    entries.sort(key=lambda e: (e.enqueue_ns, e.record_id))
    for values in entries:
        b.entry(values)
    h.entries_recorded = max((e.record_id for e in entries), default=0)
    pending = any(e.state != pb.COMPLETED for e in entries)
    # The one thread of the summary is where the rank is, whichever thread that was.
    b.thread(1, s.thread, [_raw(f) for f in s.stack], is_main=True, holds_recorder=pending)
    for x in s.exceptions:
        b.exception(
            x.type, x.message, [_raw(f) for f in x.stack], thread=x.thread, is_main=x.is_main,
            wall_time_ns=x.wall_ns, via="summary",
        )  # fmt: skip
    return b.build()


def _trimmed(s: Summary, step: int) -> Summary:
    """``s`` with less detail, more at each step; the last step keeps only who the rank is."""
    no_code = {f: replace(f, code="") for f in _frames(s)}
    if step == 1:  # source text only for the innermost frames
        return replace(s, stack=s.stack[:2] + tuple(no_code[f] for f in s.stack[2:]))
    if step == 2:  # groups with nothing pending go
        busy = tuple(g for g in s.groups if any(en.state != pb.COMPLETED for en in g.entries))
        return replace(_trimmed(s, 1), groups=busy)
    if step == 3:  # the user's frame per entry (and its call), four on the stack, no text
        groups = tuple(
            replace(g, entries=tuple(replace(en, stack=_call_site(en.stack)) for en in g.entries))
            for g in s.groups
        )
        return replace(s, groups=groups, stack=tuple(no_code[f] for f in _kept(s.stack, 4)))
    exceptions = tuple(
        replace(x, stack=tuple(no_code[f] for f in x.stack[:1])) for x in s.exceptions
    )
    return replace(
        s, groups=(), stack=_kept(s.stack, 1), dump_path=s.dump_path[-200:], exceptions=exceptions
    )


def _kept(stack: tuple[Frame, ...], limit: int) -> tuple[Frame, ...]:
    """``limit`` frames of a thread's stack, the user's first (``keep_user_frames``)."""
    if limit == 1:
        return _call_site(stack)[-1:]
    origins = [_origin(f.origin, f.file) for f in stack]
    return tuple(keep_user_frames(stack, origins, [f.function for f in stack], limit))


def _call_site(stack: tuple[Frame, ...]) -> tuple[Frame, ...]:
    """The frames of an entry's stack the verdict shows: the user's, with the framework call
    it made when it made one; the innermost frame when the stack has no user frame."""
    origins = [_origin(f.origin, f.file) for f in stack]
    at = user_index(origins)
    if at is None:
        return stack[:1]
    called = called_index(origins, [f.function for f in stack], at)
    return (stack[called], stack[at]) if called is not None else (stack[at],)


def encode(s: Summary) -> bytes:
    """The summary on the wire (a serialized ``Summary`` message), trimmed until it fits
    ``MAX_BYTES``."""
    for cut in (s, _trimmed(s, 1), _trimmed(s, 2), _trimmed(_trimmed(s, 2), 3), _trimmed(s, 4)):
        msg = pb.Summary(magic=MAGIC, round=cut.round, dump_path=cut.dump_path, dump=to_dump(cut))
        data = msg.SerializeToString()
        if len(data) <= MAX_BYTES:
            return data
    raise ValueError("summary does not fit even without groups")  # pragma: no cover


# -- reading (untrusted) ----------------------------------------------------------------------
def decode(data: bytes, source: str = "summary") -> pb.Summary:
    """Read a summary that came from the store, and check it.

    Anyone who can reach the store can write these keys: beyond what the one validator of
    dumps checks (``flightrec.format.read.validate``: tables, indices, members), the size and
    the limits a summary keeps are checked here.

    Args:
        data: the value as read.
        source: names the value in errors ("rank 3's summary").

    Returns:
        The message; its ``dump`` is what ``flightrec.readers.summary.summary_view`` reads.

    Raises:
        SummaryError: one line saying what is wrong; nothing else escapes.
    """
    try:
        if len(data) > MAX_BYTES:
            raise _Bad(f"{len(data)} bytes, more than the {MAX_BYTES} a summary may have")
        msg = pb.Summary()
        try:
            msg.ParseFromString(data)
        except Exception:  # protobuf's DecodeError, or worse on hostile bytes
            raise _Bad("not a flightrec summary (unparseable)") from None
        if msg.magic != MAGIC:
            raise _Bad("not a flightrec summary (wrong magic)")
        _check(msg)
        try:
            validate(msg.dump, source)
        except DumpError as exc:
            raise _Bad(str(exc).split(": ", 1)[-1]) from None
        return msg
    except _Bad as exc:
        raise SummaryError(f"{source}: {printable(str(exc))[:200]}") from None


class _Bad(Exception):
    pass


def _check(msg: pb.Summary) -> None:
    """The limits a summary keeps that a dump file need not (``validate`` does the rest)."""
    d = msg.dump
    h = d.header
    if h.source != SUMMARY_SOURCE:
        raise _Bad(f"source is {printable(h.source)[:40]!r}, not {SUMMARY_SOURCE!r}")
    if not 1 <= h.world_size <= MAX_RANK + 1 or not 0 <= h.rank < h.world_size:
        raise _Bad(f"rank {h.rank} of world size {h.world_size} is no rank")
    if h.reason not in REASONS:
        raise _Bad(f"unknown dump reason {h.reason}")
    if not 0 <= h.timeout_s <= 1e7:  # (NaN fails too)
        raise _Bad("timeout out of range")
    n = len(d.entries.record_id)
    if len(d.groups) > MAX_GROUPS or n > MAX_GROUPS * MAX_ENTRIES:
        raise _Bad(f"{len(d.groups)} groups and {n} entries, more than a summary keeps")
    if len(d.exceptions) > MAX_EXCEPTIONS or len(d.threads) > 1:
        raise _Bad("more exceptions or threads than a summary keeps")
    if any(s not in STATES for s in d.entries.state):
        raise _Bad("an entry has an unknown state")
    if any(p < -1 or p >= h.world_size for p in d.entries.peer):
        raise _Bad("an entry's peer lies outside the world")
    for g in d.groups:
        if any(not 0 <= p.peer < h.world_size for p in g.p2p) or len(g.p2p) > MAX_PEERS:
            raise _Bad(f"group {printable(g.name)[:40]!r} has a P2P peer outside the world")
        if len(g.ranks) > MAX_MEMBERS or any(not 0 <= r < h.world_size for r in g.ranks):
            raise _Bad(f"group {printable(g.name)[:40]!r} lists ranks outside the world")
    if any(len(s) > MAX_PATH for s in d.strings) or len(msg.dump_path) > MAX_PATH:
        raise _Bad("a text longer than a summary keeps")
