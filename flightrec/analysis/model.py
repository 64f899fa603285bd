"""The analysis model: nouns that every pass and renderer shares.

Per-rank data stays columnar: a ``RankDump`` keeps the entry columns as narrow typed arrays
(a few bytes per value, so 16,384 ranks of 2,000 entries fit in a few GB) and materialises a
``CollectiveRecord`` only for the few entries a pass looks at closely (a group's frontier, a
disagreement). Findings are frozen data; renderers format them.
"""

from __future__ import annotations

import enum
import hashlib
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import ClassVar, Literal, TypeAlias

from flightrec.format import flightrec_pb2 as pb
from flightrec.format.schema import ENTRY_COLUMNS
from flightrec.format.threads import issuing_thread, where_thread
from flightrec.format.view import DumpView, EntriesView, GroupView
from flightrec.frames import (
    FrameOrigin,
    call_name,
    called_index,
    fallback_index,
    origin_of,
    user_index,
    without_own_frames,
)
from flightrec.readers.native.convert import SOURCES as NATIVE_FORMS
from flightrec.readers.scrub import scrub
from flightrec.text import compress


class FindingKind(enum.StrEnum):
    """What a finding says went wrong. The value is the JSON ``kind``."""

    NOT_ARRIVED = "not_arrived"
    """Ranks never entered a collective that other ranks are blocked in."""
    DEAD_RANK = "dead_rank"
    """A rank's process exited (its own exit dump says so) while peers wait for it."""
    MISSING_DUMP = "missing_dump"
    """A rank left no dump; what its peers waited for from it is the evidence."""
    MISMATCH = "mismatch"
    """Ranks called the same (group, seq) with a different op, shape, dtype, reduce op, root..."""
    P2P_DEADLOCK = "p2p_deadlock"
    """A cycle of ranks waiting on each other through point-to-point operations."""
    DEADLOCK = "deadlock"
    """A cycle of ranks waiting on each other through collectives on different groups."""
    P2P_UNMATCHED = "p2p_unmatched"
    """Sends without the matching receive (or the reverse), nobody blocked in a cycle."""
    STUCK = "stuck"
    """Every member entered a collective and none completed it, with no disagreement seen;
    where some members' own call failed at once (a local error), those members alone."""
    STRAGGLER = "straggler"
    """A rank arrives last at collective after collective; nothing hangs, everyone waits."""
    DESYNC = "desync"
    """Ranks of one group issued different numbers of collectives, and nobody waits."""
    SLOW_STAGE = "slow_stage"
    """One pipeline stage spends longer outside communication than the others (stage
    imbalance): every rank of it, no single one; nothing hangs."""
    IMBALANCE = "imbalance"
    """Ranks that do the same work keep waiting for each other, and a different one is last
    each time (spread imbalance): time lost, no culprit; nothing hangs."""
    STACK_HANG = "stack_hang"
    """From stacks alone (``flightrec attach`` on an untraced job): ranks outside any
    collective, or in another one, while the others wait, still, in one; or no rank blamed
    where the stacks cannot tell."""


class Status(enum.StrEnum):
    """What a rank was doing when it dumped; for a culprit, why it ends a wait-for chain.

    A culprit is never ``WAITING`` (a waiting rank points further down the chain).
    """

    WAITING = "waiting"
    """Blocked inside a collective or P2P operation."""
    OUTSIDE = "outside"
    """Alive and not inside any operation the others wait on (computing, loading, stalled)."""
    EXITED = "exited"
    """Its process ended or was exiting (an exit dump, or a black box that says so)."""
    NO_DUMP = "no_dump"
    """No dump from this rank: its state is only known from its peers."""


@dataclass(frozen=True, slots=True)
class FrameInfo:
    """One Python frame: file, function, line, and the source line when the dump carries it."""

    file: str
    function: str
    line: int
    code: str = field(default="", compare=False)
    """The line's source text as the recording process read it (schema 1.1); "" when unknown.
    Not part of equality: a black box's frames (no text) equal a dump's frames of the same line."""
    origin: FrameOrigin = field(
        default=FrameOrigin.UNKNOWN, compare=False, metadata={"json": False}
    )
    """Whose code it is, as the recording process judged it (schema 1.6); ``UNKNOWN`` when the
    dump does not say (``origin`` then judges it from the path)."""
    called: str = field(default="", compare=False)
    """For the user's line of a stack: the framework function it called on the way to the
    collective (``Accelerator.gather``); "" when it called torch directly."""

    def where(self) -> str:
        """``file:line`` with the file shortened to its last two path components, and the
        framework call made there when there is one (``train.py:42 via Accelerator.gather``)."""
        parts = self.file.replace("\\", "/").split("/")
        at = f"{'/'.join(parts[-2:]) if len(parts) > 2 else self.file}:{self.line}"
        return f"{at} via {self.called}" if self.called else at

    def judged_origin(self) -> FrameOrigin:
        """The recorded origin, else the one ``flightrec.frames`` gives its path here."""
        return self.origin if self.origin is not FrameOrigin.UNKNOWN else origin_of(self.file)


def without_recorder_frames(stack: tuple[FrameInfo, ...]) -> tuple[FrameInfo, ...]:
    """``stack`` without a leading run of flightrec's own frames (and the ``threading`` calls
    its handlers make): dumps of older versions show them where the exit dump or a signal
    handler ran. Empty when nothing else is left: at exit, the program had returned."""
    return tuple(without_own_frames(stack, [f.file for f in stack], own_thread=False))


def op_label(op: str, flags: int) -> str:
    """The op as a report names it: a DDP gradient bucket's all_reduce says so, since its
    stack ends in flightrec's pass-through hook rather than in the training code."""
    return f"DDP gradient-bucket {op}" if flags & pb.DDP_BUCKET else op


def is_library_frame(frame: FrameInfo) -> bool:
    """True for frames of torch, flightrec, the standard library or any installed package
    rather than the user's code (``flightrec.frames``)."""
    return frame.judged_origin() is not FrameOrigin.USER


def user_frame(stack: Sequence[FrameInfo]) -> FrameInfo | None:
    """The innermost frame of the user's code, carrying in ``called`` the framework call it
    made, if any; where the stack has no user frame, its innermost framework frame (the
    framework's call into torch), else its innermost frame."""
    origins = [f.judged_origin() for f in stack]
    at = user_index(origins)
    if at is None:
        fallback = fallback_index(origins)
        return None if fallback is None else stack[fallback]
    callee = called_index(origins, [f.function for f in stack], at)
    if callee is None:
        return stack[at]
    return replace(stack[at], called=call_name(stack[callee].file, stack[callee].function))


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """Shape and dtype of one tensor argument."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        """Number of elements."""
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True, slots=True)
class CollectiveRecord:
    """One ring entry of one rank, materialised for close inspection."""

    rank: int
    group: str
    """Group key (the group's name, identical on every member)."""
    seq: int
    p2p_seq: int
    op: str
    reduce_op: str
    peer: int
    state: int
    flags: int
    enqueue_ns: int
    complete_ns: int
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    stack: tuple[FrameInfo, ...]

    @property
    def completed(self) -> bool:
        """True when the entry completed successfully."""
        return self.state == pb.COMPLETED

    @property
    def is_p2p(self) -> bool:
        """True for point-to-point sends and receives."""
        return bool(self.flags & pb.IS_P2P)

    @property
    def call(self) -> str:
        """``all_reduce #4``; for P2P, the per-peer ordinal and the peer: ``send #4 to rank 2``."""
        if not self.is_p2p:
            return f"{self.op} #{self.seq}"
        direction = "to" if self.flags & pb.SEND else "from"
        peer = f" {direction} rank {self.peer}" if self.peer >= 0 else ""
        return f"{self.op} #{self.p2p_seq}{peer}"

    @property
    def state_name(self) -> str:
        """``ENQUEUED``, ``STARTED``, ``COMPLETED``, ``FAILED`` or ``STATE_UNKNOWN``."""
        return pb.State.Name(self.state) if self.state in pb.State.values() else str(self.state)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class ThreadInfo:
    """A thread's Python stack when the rank dumped."""

    name: str
    is_main: bool
    holds_recorder: bool
    stack: tuple[FrameInfo, ...]
    pid: int = 0
    """The child process it runs in (a snapshot ``flightrec attach`` took); 0: the rank's own."""
    still_ms: int = 0
    """In a snapshot ``flightrec attach`` took: over how many ms its stack stayed the same."""
    cpu_ms: int = 0
    """In such a snapshot: the CPU time it used over those ``still_ms``."""


_State: TypeAlias = (
    "tuple[str, bytes, tuple[GroupView, ...], tuple[str, int, bytes], int, bytes | None]"
)
_Caches: TypeAlias = "tuple[dict[int, FrameInfo], dict[int, tuple[FrameInfo, ...]], dict[int, tuple[TensorInfo, ...]]]"

# Frame, stack and tensor-signature lookups, shared by the dumps whose interned tables are
# the same bytes (``DumpView.tables``), keyed by a digest of those bytes: the ranks of one job
# mostly intern the same tables (a few dozen variants among 16,384 ranks), so each frame is
# resolved once per variant, not once per rank. Per process, bounded.
_SHARED_CACHES: dict[bytes, _Caches] = {}
_ORIGINS = frozenset(o.value for o in FrameOrigin)
_MAX_SHARED_CACHES = 1024


def _caches(key: bytes | None) -> _Caches:
    if key is None:
        return ({}, {}, {})
    found = _SHARED_CACHES.get(key)
    if found is None:
        if len(_SHARED_CACHES) >= _MAX_SHARED_CACHES:
            _SHARED_CACHES.clear()  # (dumps keep the caches they hold)
        found = _SHARED_CACHES[key] = ({}, {}, {})
    return found


class _Columns(dict[str, "array[int]"]):
    """Entry columns by name, each taken from its ``EntriesView`` on its first lookup (a dict
    of those looked up so far: read it by name, not by iterating)."""

    __slots__ = ("_entries",)

    def __init__(self, entries: EntriesView) -> None:
        super().__init__()
        self._entries = entries

    def __missing__(self, name: str) -> array[int]:
        if name not in ENTRY_COLUMNS:
            raise KeyError(name)
        column: array[int] = getattr(self._entries, name)
        self[name] = column
        return column


class RankDump:
    """One rank's chosen dump: its tables as parsed, its entry columns as narrow arrays.

    Picklable (compactly) so that loader processes can hand it to the analysing process.

    Attributes:
        path: the file it came from.
        dump: the dump; ``dump.entries`` holds typed arrays instead of protobuf columns.
        header: ``dump.header``, kept: looking a message field up makes a new wrapper each
            time, and the loader reads every rank's header a few dozen times.
    """

    def __init__(self, path: str, dump: pb.Dump | DumpView) -> None:
        self.path = path
        if not isinstance(dump, DumpView):
            dump = DumpView.of(dump)
        self.dump = scrub(dump)
        self.header = self.dump.header
        tables = self.dump.tables
        self._tables_key = (
            None if tables is None else hashlib.blake2b(tables, digest_size=16).digest()
        )
        self._frame_cache, self._stack_cache, self._spec_cache = _caches(self._tables_key)

    def __getstate__(self) -> _State:
        d = self.dump
        return (
            self.path,
            d.meta.SerializeToString(),
            d.groups,
            d.entries.packed(),
            d.older,
            self._tables_key,
        )

    def __setstate__(self, state: _State) -> None:
        path, meta_bytes, groups, columns, older, key = state
        meta = pb.Dump()
        meta.ParseFromString(meta_bytes)
        # Scrubbed where it was pickled (the constructor's work; a tenth of unpickling).
        self.path = path
        self.dump = DumpView(meta, groups, EntriesView.unpack(*columns), older)
        self.header = meta.header
        self._tables_key = key
        self._frame_cache, self._stack_cache, self._spec_cache = _caches(key)

    @property
    def rank(self) -> int:
        """Global rank."""
        return self.header.rank

    def describe_process(self, sep: str = ", ") -> str:
        """``host, pid 123``; what the dump does not record says so (native dumps carry neither)."""
        h = self.header
        host = h.hostname or "host not recorded"
        return f"{host}{sep}{f'pid {h.pid}' if h.pid > 0 else 'pid not recorded'}"

    def describe(self) -> str:
        """``host, pid 123, cuda:2`` for verdicts."""
        h = self.header
        parts = [self.describe_process()]
        if h.device:
            parts.append(h.device + (f" {h.device_name}" if h.device_name else ""))
        return ", ".join(parts)

    @cached_property
    def group_keys(self) -> tuple[str, ...]:
        """Group key per local group index (the group's name, else its ranks)."""
        return tuple(g.name or ",".join(map(str, g.ranks)) for g in self.dump.groups)

    @cached_property
    def columns(self) -> Mapping[str, array[int]]:
        """The entry columns by name (typed arrays). Filled as they are looked up: most
        callers read two or three of the 17, once per rank."""
        return _Columns(self.dump.entries)

    def __len__(self) -> int:
        return len(self.dump.entries.record_id)

    @cached_property
    def converted(self) -> bool:
        """Whether the dump was converted from PyTorch's own recorder (``flightrec convert``,
        or read from a native dump)."""
        return self.header.source in NATIVE_FORMS.values()

    @cached_property
    def records_gpu_start(self) -> bool:
        """Whether a ``STARTED`` entry says its GPU work began: PyTorch's recorder watches
        each collective's CUDA events (``scheduled``, ``started``, ``completed``); flightrec's
        own entries go from ``ENQUEUED`` to ``COMPLETED``."""
        return self.converted or any(self.dump.entries.start_ns)

    @cached_property
    def completion_times(self) -> bool:
        """Whether entries record when they completed. PyTorch's recorder without timing
        enabled says which completed, not when; converted gloo dumps say neither."""
        return any(self.dump.entries.complete_ns)

    @cached_property
    def tracks_completion(self) -> bool:
        """Whether entry states are real. Converted gloo dumps leave every entry ``ENQUEUED``."""
        e = self.dump.entries
        return e.state.count(pb.ENQUEUED) != len(e.state) or any(e.complete_ns)

    def string(self, index: int) -> str:
        """String table lookup."""
        return self.dump.strings[index]

    def frame(self, index: int) -> FrameInfo:
        """Frame table lookup (cached)."""
        f = self._frame_cache.get(index)
        if f is None:
            raw = self.dump.frames[index]
            strings = self.dump.strings
            f = FrameInfo(
                strings[raw.file], strings[raw.name], raw.line, strings[raw.code],
                FrameOrigin(raw.origin) if raw.origin in _ORIGINS else FrameOrigin.UNKNOWN,
            )  # fmt: skip
            self._frame_cache[index] = f
        return f

    def stack(self, index: int) -> tuple[FrameInfo, ...]:
        """Stack table lookup, innermost frame first (cached)."""
        s = self._stack_cache.get(index)
        if s is None:
            s = tuple(self.frame(i) for i in self.dump.stacks[index].frames)
            self._stack_cache[index] = s
        return s

    def tensors(self, index: int) -> tuple[TensorInfo, ...]:
        """Tensor signature lookup (cached)."""
        t = self._spec_cache.get(index)
        if t is None:
            spec = self.dump.tensor_specs[index]
            out: list[TensorInfo] = []
            pos = 0
            for nd, dt in zip(spec.ndim, spec.dtype, strict=True):
                out.append(TensorInfo(tuple(spec.dims[pos : pos + nd]), self.dump.strings[dt]))
                pos += nd
            t = tuple(out)
            self._spec_cache[index] = t
        return t

    def record(self, i: int) -> CollectiveRecord:
        """Materialise entry ``i``."""
        e = self.dump.entries
        return CollectiveRecord(
            rank=self.rank,
            group=self.group_keys[e.group[i]],
            seq=e.seq[i],
            p2p_seq=e.p2p_seq[i],
            op=self.dump.strings[e.op[i]],
            reduce_op=self.dump.strings[e.reduce_op[i]],
            peer=e.peer[i],
            state=e.state[i],
            flags=e.flags[i],
            enqueue_ns=e.enqueue_ns[i],
            complete_ns=e.complete_ns[i],
            inputs=self.tensors(e.inputs[i]),
            outputs=self.tensors(e.outputs[i]),
            stack=self.stack(e.stack[i]),
        )

    def threads(self) -> tuple[ThreadInfo, ...]:
        """Every thread's stack at dump time, main thread first."""
        out = [
            ThreadInfo(
                t.name,
                t.is_main,
                t.holds_recorder,
                self.stack(t.stack)
                if t.name.startswith("flightrec-")
                else without_recorder_frames(self.stack(t.stack)),
                t.pid,
                t.still_ms,
                t.cpu_ms,
            )
            for t in self.dump.threads
        ]
        out.sort(key=lambda t: (not t.is_main, not t.holds_recorder))
        return tuple(out)

    def current_stack(self) -> tuple[FrameInfo, ...]:
        """Where the rank was at dump time: the stack of the thread that issues its
        collectives (``flightrec.format.threads``), the main thread's where they name none."""
        d = self.dump
        issuer = issuing_thread(d.entries.thread, d.strings)
        thread = where_thread(self.threads(), issuer, lambda t: bool(t.stack))
        return thread.stack if thread is not None else ()

    def wall_ns(self, mono_ns: int) -> int:
        """Convert this rank's monotonic ns to wall-clock ns using the header's anchor."""
        h = self.header
        return mono_ns + (h.wall_time_ns - h.mono_time_ns)

    def age_s(self, mono_ns: int) -> float:
        """Seconds between ``mono_ns`` and this rank's dump."""
        return max(0.0, (self.header.mono_time_ns - mono_ns) / 1e9) if mono_ns else 0.0


@dataclass(frozen=True, slots=True)
class GroupProgress:
    """One rank's progress on one group at dump time."""

    last_seq: int
    """Collectives issued (the counter at dump time)."""
    last_completed: int
    """Highest seq such that every collective up to it completed (overwritten ones count);
    -1 when the dump does not track completion."""
    first_in_ring: int
    """Lowest seq of this group still in the ring; 0 when none is."""


@dataclass(frozen=True, slots=True)
class ProcessGroupInfo:
    """A process group merged over the ranks that know it."""

    key: str
    desc: str
    ranks: tuple[int, ...]
    backend: str
    progress: Mapping[int, GroupProgress]
    """Per global rank with a dump that holds this group."""

    def label(self) -> str:
        """``group 3 (tp)``; ``group 4 [ranks 2-3]`` for a group without a description."""
        if self.desc:
            return f"group {self.key} ({self.desc})"
        return f"group {self.key} [ranks {compress(self.ranks)}]"


@dataclass(frozen=True, slots=True)
class Consequence:
    """Ranks waiting, directly or through a chain, on a root cause."""

    process_group: str
    pg_ranks: tuple[int, ...]
    seq: int
    op: str
    waiting: tuple[int, ...]
    waited_s: float
    label: str = ""
    """The op as people read it (``op_label``); ``op`` when empty."""
    p2p: tuple[int, int] | None = None
    """(sender, receiver) global ranks of a point-to-point wait; ``pg_ranks`` is that pair."""
    ended: tuple[int, ...] = ()
    """Of ``waiting``, the ranks whose process has ended since (died or exited): they waited
    there, and are no longer waiting anywhere (``fold.fold_consequences``)."""


@dataclass(frozen=True, slots=True)
class Folded:
    """A finding a root cause explains, kept as one of its consequences rather than a finding
    of its own that would blame the ranks it held up (``fold.fold_consequences``)."""

    kind: FindingKind
    ranks: tuple[int, ...]
    """The ranks the folded finding was about (not blamed: the root cause is)."""
    summary: str
    process_group: str | None = None
    seq: int | None = None


@dataclass(frozen=True, slots=True)
class Evidence:
    """Base of the facts behind one kind of finding; each kind's pass defines a subclass.

    Subclasses are frozen dataclasses whose field names are the keys of the finding's JSON
    ``evidence`` object, in order. A field with a default is an optional fact: written only
    when it differs from its default (None: it does not apply to this finding). Nested values
    may be dataclasses under the same rule, mappings (keys written as strings) and tuples.
    """

    HEADLINE: ClassVar[tuple[str, ...]] = ()
    """Fields also given at the top level of the finding's JSON, next to the verdict."""


@dataclass(frozen=True, slots=True)
class CallShift:
    """Where a rank's call sites start running one off its peers': a skipped or extra call."""

    seq: int
    """The first sequence number where the rank called from a different line than its peers."""
    kind: Literal["skipped", "extra"]
    """``skipped``: its calls run one ahead of its peers' from there; ``extra``: one behind."""
    peer_site: str
    """``file:line`` its peers called from at ``seq``."""
    rank_site: str
    """``file:line`` the rank called from at ``seq``."""
    op: str | None
    """The peers' operation at ``seq`` (None when not in the first peer's ring)."""


@dataclass(frozen=True, slots=True)
class ExceptionEvidence:
    """An exception that ended a thread of a rank's process, as a finding carries it."""

    rank: int
    type: str
    message: str
    thread: str
    main_thread: bool
    """Whether it ended the main thread (what the rank died of) or another thread."""
    seen_by: str
    """What recorded it: ``sys.excepthook``, ``threading.excepthook``, ``sys.exit``, ..."""
    dump: str
    """The dump file that holds it."""
    traceback: tuple[FrameInfo, ...]
    """Raising frame first."""
    location: FrameInfo | None = None
    """The innermost frame of the program's own code."""


@dataclass(frozen=True, slots=True)
class BelowTimeout:
    """A finding built on waits that a requested snapshot caught before the hang timeout."""

    confidence: Literal["low"]
    """Always ``low``: the job may still be progressing."""
    longest_wait_s: float
    """The longest wait behind the finding."""
    timeout_s: float
    """The job's hang timeout, which none of those waits reached."""


class Action(enum.StrEnum):
    """What to do about a finding. The value is the JSON ``recommendation.action``."""

    RESTART = "restart"
    """Restart the job, leaving out the node if it happens again: a rank stalled, died or
    left no dump, a GPU stopped completing work, a node is slow or gone. The code is fine."""
    FIX_CODE = "fix_code"
    """Stop and fix the code: ranks disagree about a collective, a rank skipped or added
    one, raised an exception, or the work is split unevenly; a restart fails the same way."""


@dataclass(frozen=True, slots=True)
class Advice:
    """The recommendation a finding carries, and how sure of it the analysis is."""

    action: Action
    confidence: Literal["high", "medium", "low"]
    """``high`` unless something the verdict rests on is missing (``lowered_by``)."""
    why: str
    """The reason for the action, in a few words."""
    lowered_by: tuple[str, ...] = ()
    """What lowered the confidence, one phrase each (dumps missing, rings wrapped past the
    fault, clocks that could not be aligned, a wait shorter than the timeout...)."""


@dataclass(frozen=True, slots=True)
class Finding:
    """One diagnosis with the evidence a person needs.

    ``kind``, ``ranks`` (global ranks blamed) and ``summary`` are always set; the other fields
    are set where they apply. ``evidence`` holds the facts particular to the kind.
    """

    kind: FindingKind
    ranks: tuple[int, ...]
    summary: str
    process_group: str | None = None
    pg_ranks: tuple[int, ...] = ()
    seq: int | None = None
    op: str | None = None
    field: str | None = None
    consequences: tuple[Consequence, ...] = ()
    evidence: Evidence | None = None
    call_shift: CallShift | None = None
    """The skipped or extra call behind it, where ``skips.annotate_shifts`` found one."""
    exception: ExceptionEvidence | None = None
    """What a blamed rank died of, when it died of an exception (JSON: ``evidence.exception``)."""
    thread_exceptions: tuple[ExceptionEvidence, ...] = ()
    """Other threads of a blamed rank that died of an exception (a data loader, say)."""
    below_timeout: BelowTimeout | None = None
    """Set where every wait behind it is shorter than the job's timeout (``waits``)."""
    explains: tuple[Folded, ...] = ()
    """Findings this one explains (deaths of its peers, desyncs and unmatched transfers of
    the ranks it held up), folded into it by ``fold.fold_consequences``."""
    held_by: tuple[int, ...] = ()
    """Ranks at the head of the chain of waits that made this finding's ranks late: the
    finding that blames them explains this one (``fold.fold_consequences``)."""
    advice: Advice | None = None
    """What to do next, and how sure (``advice.advise``, the last refinement)."""


@dataclass(frozen=True, slots=True)
class FileProblem:
    """A file that could not be used, with one line saying why."""

    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"
