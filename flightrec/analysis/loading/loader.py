"""Find dump files under a folder, read each one, and pick one consistent view per rank.

Every file goes through ``flightrec.readers.read_views``, the one place that knows file
formats. A file that cannot be read becomes a ``FileProblem`` (one line) and the rest are
still analysed.
"""

from __future__ import annotations

import enum
import os
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from flightrec.analysis.fanout import can_fork, ordered_map
from flightrec.analysis.loading.depth import needs_depth
from flightrec.analysis.loading.rankindex import RankIndex, index_rank
from flightrec.analysis.model import FileProblem, RankDump
from flightrec.errors import DumpError, NoDumpsError, NotADumpError, UsageError
from flightrec.format import flightrec_pb2 as pb
from flightrec.format.blackbox import SOURCE as BLACKBOX_SOURCE
from flightrec.readers import discover, looks_like_dump, read_views
from flightrec.text import compress

NATIVE_SOURCE = "torch-native"
"""Prefix of ``header.source`` of dumps converted from PyTorch's native recorder."""


class View(enum.StrEnum):
    """Which dump to use for a rank that dumped more than once."""

    HANG = "hang"
    """The hang (default): the first hang event (the earliest watchdog or requested dump of
    any rank) picks each rank's snapshot, its first dump from then on (its answer to the
    request); a rank that wrote none then keeps its latest dump from before. Later dumps
    (timeouts, collective errors, SIGTERM, exit) are what happened next, never the snapshot.
    Without any hang event, the latest dump."""
    LATEST = "latest"
    """The most recent dump (by wall clock, then dump index): the state when the job ended."""
    EARLIEST = "earliest"
    """The first dump: the state when the hang was first noticed (watchdog dump)."""


@dataclass(frozen=True, slots=True)
class Run:
    """Everything loaded from a folder: one dump per rank plus what was set aside."""

    dumps: dict[int, RankDump]
    world_size: int
    problems: tuple[FileProblem, ...]
    notes: tuple[str, ...]
    indexes: dict[int, RankIndex] = field(default_factory=dict)
    """Per rank, its ring's index when the loader built it (else the analysis builds it)."""
    later: dict[int, tuple[RankDump, ...]] = field(default_factory=dict)
    """Per rank, the dumps its process wrote after the chosen one, oldest first: what
    happened next (an exit, the exception it died of)."""
    hang_wall_ns: int = 0
    """Wall-clock time of the first hang event when the hang view chose the dumps; else 0."""
    exited: frozenset[int] = frozenset()
    """Ranks without a dump known to have ended cleanly (the verdict in the log: they said so
    through the job's store as their process ended)."""
    seen: frozenset[int] = frozenset()
    """Ranks without a dump here that are not missing: the verdict in the log at scale read
    their progress and analyses the summaries of the ranks it implicates only."""

    @property
    def ranks_with_dump(self) -> tuple[int, ...]:
        """Sorted global ranks that have a dump."""
        return tuple(sorted(self.dumps))

    @property
    def missing_ranks(self) -> tuple[int, ...]:
        """Ranks below ``world_size`` without a dump."""
        if self.seen:
            return tuple(
                r for r in range(self.world_size) if r not in self.dumps and r not in self.seen
            )
        return tuple(r for r in range(self.world_size) if r not in self.dumps)


def _ranks(ranks: list[int]) -> str:
    """Say "rank 3" or "ranks 0-3,7"."""
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {compress(ranks)}"


def _order_key(d: RankDump) -> tuple[int, int, str]:
    return (d.header.wall_time_ns, d.header.dump_index, d.path)


DECLARED = frozenset({pb.WATCHDOG_TIMEOUT, pb.PEER_REQUEST})
"""Dumps of a hang flightrec declared: a watchdog's, and every rank's answer to a hang or a
death it asked about."""
HANG_REASONS = DECLARED | {pb.CLI_TRIGGER, pb.SIGNAL_USR1}
"""Dumps that see a hang as it happens: the declared ones, and every dump someone asked for."""
CLOCK_SLACK_NS = 2_000_000_000
"""Ranks on other hosts answer a hang event on clocks that disagree by this much at most."""


def _first_hang(per_rank: dict[int, list[RankDump]]) -> RankDump | None:
    """The first hang event: the earliest declared dump of any rank (a watchdog's, or an
    answer to one); without any, the earliest dump someone asked for (a trigger, SIGUSR1).

    A trigger or a signal before the watchdog fired caught the job on its way (healthy, or a
    hang not yet past its timeout); the hang the watchdog declared is what the job died of.
    """
    dumps = [d for ds in per_rank.values() for d in ds]
    for reasons in (DECLARED, HANG_REASONS):
        hang = [d for d in dumps if d.header.reason in reasons]
        if hang:
            return min(hang, key=_order_key)
    return None


def _pick(unique: list[RankDump], view: View, first: RankDump | None) -> int:
    """Index in ``unique`` (oldest first) of the dump that speaks for the rank."""
    if view is View.EARLIEST:
        return 0
    if view is View.LATEST or first is None:
        return len(unique) - 1
    hang_ns = first.header.wall_time_ns
    since = [i for i, d in enumerate(unique) if d.header.wall_time_ns >= hang_ns - CLOCK_SLACK_NS]
    if not since:  # nothing from the hang on (it exited or died before): its last word
        return len(unique) - 1
    # Its answer to the first hang event: a declared hang is answered by declared dumps only.
    reasons = DECLARED if first.header.reason in DECLARED else HANG_REASONS
    answer = [i for i in since if unique[i].header.reason in reasons]
    return answer[0] if answer else since[0]


def _clock(wall_ns: int) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(wall_ns / 1e9)) + " UTC"


def _prefer_dumps(candidates: list[RankDump], notes: list[str]) -> list[RankDump]:
    """Drop black boxes a real dump of the same process supersedes, and healthy leftovers.

    A black box is a rank's evidence only when its process wrote no dump of its own (it died
    hard, or exited without one); a process that dumped said more there (thread stacks).
    """
    dumped = {
        (d.header.hostname, d.header.pid) for d in candidates if d.header.source != BLACKBOX_SOURCE
    }
    kept: list[RankDump] = []
    superseded = 0
    for d in candidates:
        # An empty ring still counts where torch's counters say the process issued
        # collectives (DDP's reducer alone, say): where the others wait, it never arrived.
        empty = len(d) == 0 and not any(g.last_seq for g in d.dump.groups)
        if d.header.source == BLACKBOX_SOURCE and (
            (d.header.hostname, d.header.pid) in dumped or d.header.rank < 0 or empty
        ):
            superseded += 1
            continue
        kept.append(d)
    if superseded:
        notes.append(
            f"set aside {superseded} black-box file(s) of processes that also wrote a dump "
            "or recorded nothing"
        )
    # A flightrec dump holds what PyTorch's recorder held in that process (merged in at dump
    # time, numbered alike): a native dump of the same rank would count it all twice.
    ours = {d.rank for d in kept if d.header.source == "flightrec"}
    native = [d for d in kept if d.header.source.startswith(NATIVE_SOURCE) and d.rank in ours]
    if native:
        drop = {id(d) for d in native}
        kept = [d for d in kept if id(d) not in drop]
        notes.append(
            f"set aside {len(native)} PyTorch native dump(s) of ranks that also wrote a "
            "flightrec dump (it includes what the native recorder saw)"
        )
    return kept or candidates


def _one_identity_per_process(candidates: list[RankDump], notes: list[str]) -> None:
    """Give every dump of one process (host and pid) the rank, world size and job it had.

    A process is one rank of one job for its whole life. Dumps written by an older flightrec
    after ``destroy_process_group()`` fell back to ``RANK``/``WORLD_SIZE`` (absent under
    ``torch.multiprocessing.spawn``: "rank 0 of 1") and lost the job id with the store;
    the identity the process had while its group existed is in its other dumps (the black
    box is labelled as the group is created): the largest world size, then the most common
    rank among them. A dump without a job id takes its process's; two different job ids on
    one host and pid are two processes (a reused pid) and stay apart. Headers are corrected
    in place, and the report says so.
    """
    by_host_pid: dict[tuple[str, int], list[RankDump]] = defaultdict(list)
    for d in candidates:
        if d.header.pid > 0:
            by_host_pid[(d.header.hostname, d.header.pid)].append(d)
    fixed: list[str] = []
    for (host, pid), all_ds in by_host_pid.items():
        if len(all_ds) < 2:
            continue  # (one dump agrees with itself: most processes of a large job)
        jobs = {d.header.job_id for d in all_ds if d.header.job_id}
        # Two job ids on one host and pid: the pid was reused (a restarted container), two
        # processes; only a dump without a job id is then left alone.
        for job in jobs or {""}:
            ds = [
                d
                for d in all_ds
                if d.header.job_id == job or (len(jobs) == 1 and not d.header.job_id)
            ]
            if len({(d.header.rank, d.header.world_size, d.header.job_id) for d in ds}) < 2:
                continue
            world = max(d.header.world_size for d in ds)
            best = [d for d in ds if d.header.world_size == world]
            rank = Counter(d.header.rank for d in best).most_common(1)[0][0]
            changed = 0
            for d in ds:
                h = d.header
                if (h.rank, h.world_size, h.job_id) != (rank, world, job):
                    h.rank, h.world_size, h.job_id = rank, world, job
                    changed += 1
            if changed:
                fixed.append(f"pid {pid} on {host or 'unknown host'} ({changed} as rank {rank})")
    if fixed:
        notes.append(
            "read dumps of one process as one rank of one job: "
            + "; ".join(fixed)
            + " (written after destroy_process_group by an older flightrec)"
        )


def _one_job(
    candidates: list[RankDump], notes: list[str], job: str | None = None
) -> list[RankDump]:
    """Keep the dumps of one job: ``job`` when named, else the newest job id; a dump without
    one is kept.

    Only a job id that is present and different is evidence of another job (dumps of several
    runs in one folder cannot be merged); an empty id says nothing.

    Raises:
        UsageError: ``job`` is named and no dump belongs to it.
    """
    by_job: dict[str, list[RankDump]] = defaultdict(list)
    for d in candidates:
        by_job[d.header.job_id].append(d)
    named = sorted(
        (j for j in by_job if j), key=lambda j: -max(d.header.wall_time_ns for d in by_job[j])
    )
    if job is not None:
        if job not in by_job or not job:
            jobs = "; ".join(_job_phrase(j, by_job[j]) for j in named) or "none has a job id"
            raise UsageError(f"no dump of job {job!r}; its jobs: {jobs}")
        return by_job[job] + by_job.get("", []) if len(named) > 1 else candidates
    if len(named) < 2:
        return candidates
    newest = named[0]
    others = ", ".join(f"another job {_job_phrase(j, by_job[j])}" for j in named[1:])
    notes.append(
        f"this folder holds {len(named)} jobs: analysing the newest, "
        f"{_job_phrase(newest, by_job[newest])}; ignored {others}; choose one with --job ID"
    )
    return by_job[newest] + by_job.get("", [])


def _job_phrase(job: str, dumps: list[RankDump]) -> str:
    """``'ID' (4 ranks, last dump 12:03:04 UTC)``."""
    ranks = len({d.header.rank for d in dumps})
    last = max(d.header.wall_time_ns for d in dumps)
    return f"{job!r} ({ranks} rank{'s' if ranks != 1 else ''}, last dump {_clock(last)})"


def _only_black_boxes(chosen: dict[int, RankDump], notes: list[str]) -> None:
    """Say so when no rank wrote a dump: what a black box is, and how to get dumps."""
    if chosen and all(d.header.source == BLACKBOX_SOURCE for d in chosen.values()):
        notes.append(
            "no rank wrote a dump: this is each rank's black box (the ring a traced process "
            "keeps on disk while it runs; a process that ends normally deletes its own), "
            "so the job is still running or its processes were killed. Ranks dump on a hang, "
            "a crash, SIGUSR1 or `flightrec trigger`; FLIGHTREC_DUMP_ON_EXIT=1 adds a dump "
            "at every exit"
        )


def _nothing_readable(root: Path, files: int, problems: int, skipped: int) -> str:
    """Why a folder yields no dump, from what it holds."""
    if problems:
        return f"{problems} unreadable"
    if root.is_dir() and (root / ".flightrec-endpoint").is_file():
        return (
            "a traced job used this folder but wrote no dump: it has not hung, crashed or "
            "been asked for one, and its black boxes went when it ended normally. Ranks dump "
            "on a hang, SIGUSR1 or `flightrec trigger`; FLIGHTREC_DUMP_ON_EXIT=1 adds a dump "
            "at every exit"
        )
    if not files:
        return "the folder holds no files" if root.is_dir() else "empty"
    which = "its one file is not" if files == 1 else f"none of its {files} files is"
    return f"{which} a flightrec, black-box or PyTorch Flight Recorder dump"


Progress = Callable[[int, int], None]
"""Called as ``progress(files_done, files_total)`` while loading."""

# Below this many files a worker pool costs more than it saves.
_PARALLEL_FROM = 256
TAIL_FROM_FILES = 4096
"""Above this many files, read each ring's tail first (whole only where a peer is deeper).
Up to it, every ring is read whole, a few seconds at most: what only older entries show (a
mismatch that did not hang, a call skipped long before the hang, a longer straggler window)
is then never missed."""
_CHUNK = 32
_MAX_CHUNK = 512
"""Files per task of a loader process: from ``_CHUNK``, growing with the job up to this (a
quarter of each process's share at most, so that the processes stay busy to the end). A
task's answer is pickled as one message, where dumps that share groups and indexes share
them once: at 16,384 ranks, 512 files per task load in 3.2-3.5 s against 3.8-4.2 s with 32
(the analysing process's CPU 1.45-1.65 s against 1.8-2.0 s), runs alternating."""


@dataclass(frozen=True, slots=True)
class _Outcome:
    """What reading one file gave: dumps, or a problem, or a file that is not ours (skipped)."""

    dumps: tuple[RankDump, ...] = ()
    indexes: tuple[RankIndex, ...] = ()
    """Parallel to ``dumps``."""
    problem: FileProblem | None = None
    skipped: bool = False

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        # A constructor call, cheaper than the dataclass default (see ``RankIndex``).
        return (_Outcome, (self.dumps, self.indexes, self.problem, self.skipped))


def _read_one(file: str, root: Path, tail: bool) -> _Outcome:
    try:
        views = read_views(file, tail=tail)
    except NotADumpError as exc:
        if file == os.fspath(root) or looks_like_dump(Path(file)):
            return _Outcome(problem=FileProblem(str(file), exc.reason))
        return _Outcome(skipped=True)
    except DumpError as exc:
        return _Outcome(problem=FileProblem(str(file), exc.reason))
    except OSError as exc:
        return _Outcome(problem=FileProblem(str(file), f"cannot read: {exc.strerror or exc}"))
    # The compact form right away; the per-rank index is built here too, in the worker,
    # where the CPU time is parallel.
    compact = tuple(RankDump(str(file), v) for v in views)
    return _Outcome(dumps=compact, indexes=tuple(index_rank(d) for d in compact))


def _read_chunk(args: tuple[Sequence[str], Path, bool]) -> list[_Outcome]:
    files, root, tail = args
    return [_read_one(f, root, tail) for f in files]


def _read_all(
    files: list[str],
    root: Path,
    workers: int,
    progress: Progress | None,
    tail: bool = True,
) -> Iterator[_Outcome]:
    """Read every file, in worker processes when there are many; results in file order.

    With ``tail``, a flightrec dump with a tail section is read only that far (see
    ``read_views``); ``deepen`` reads further where the analysis needs it.
    """
    total = len(files)
    if progress:
        progress(0, total)
    if workers <= 1 or total < _PARALLEL_FROM or not can_fork():
        for i, f in enumerate(files, 1):
            yield _read_one(f, root, tail)
            if progress and (i % _CHUNK == 0 or i == total):
                progress(i, total)
        return
    size = max(_CHUNK, min(_MAX_CHUNK, total // (4 * workers)))
    chunks = [(files[i : i + size], root, tail) for i in range(0, total, size)]
    # Workers parse and validate at C speed and send back compact RankDumps (typed arrays
    # pickle as raw bytes), never protobuf objects. fork: no re-import, and the parent's
    # memory is still small at this point.
    done = 0
    for outcomes in ordered_map(_read_chunk, chunks, workers):
        yield from outcomes
        done += len(outcomes)
        if progress:
            progress(done, total)


def default_workers() -> int:
    """Loader processes to use: the CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _agree_on_world_size(dumps: list[RankDump], problems: list[FileProblem]) -> list[RankDump]:
    """Keep the dumps that agree on the job's world size; set the others aside.

    One damaged or foreign dump must not decide the size of the job (the analysis holds state
    per rank): the size most dumps state wins, the smaller on a tie, and a dump stating
    another, or a rank beyond it, costs one line. Dumps that do not know (0) are kept.
    """
    sizes = Counter(d.header.world_size for d in dumps if d.header.world_size > 0)
    if not sizes:
        return dumps
    world = max(sizes, key=lambda size: (sizes[size], -size))
    kept = []
    for d in dumps:
        size = d.header.world_size
        if size not in (0, world) or d.rank >= world:
            problems.append(
                FileProblem(
                    d.path,
                    f"rank {d.rank} of world size {size}, but {sizes[world]} dump(s) of this "
                    f"job say world size {world}; ignored",
                )
            )
        else:
            kept.append(d)
    return kept


def _deepen(
    chosen: dict[int, RankDump],
    indexes: dict[int, RankIndex],
    root: Path,
    workers: int,
    notes: list[str],
    shared: dict[bytes, RankIndex],
) -> None:
    """Read whole the rings whose tail does not reach where a peer is (``depth``), in place."""
    deep = needs_depth(chosen, indexes)
    if not deep:
        return
    files = [chosen[r].path for r in deep]
    for r, outcome in zip(deep, _read_all(files, root, workers, None, tail=False), strict=True):
        old = chosen[r]
        for d, ri in zip(outcome.dumps, outcome.indexes, strict=True):
            h, was = d.header, old.header
            if (h.pid, h.dump_index, h.wall_time_ns) != (was.pid, was.dump_index, was.wall_time_ns):
                continue  # (the file changed since: keep what was read)
            h.rank, h.world_size, h.job_id = was.rank, was.world_size, was.job_id
            chosen[r], indexes[r] = d, ri.intern(shared)
    notes.append(
        f"read the whole ring of {_ranks(deep)}: their newest entries do not reach back to where "
        "a peer in one of their groups is"
    )


@dataclass(frozen=True, slots=True)
class AnalysisOptions:
    """How to analyse.

    Attributes:
        view: which dump to use for ranks that dumped more than once.
        workers: processes that read dump files and run candidates beside each other (None:
            the usable CPUs; 1: this process only).
        progress: called as ``progress(files_done, files_total)`` while files are read.
        tail: read only the newest entries of dumps that allow it, deeper where needed
            (``load_dir``); False reads every file whole (a timeline of everything);
            None (the default) reads tails only in folders of more than
            ``TAIL_FROM_FILES`` files.
    """

    view: View = View.HANG
    workers: int | None = None
    progress: Progress | None = None
    tail: bool | None = None
    job: str | None = None
    """The job id to analyse in a folder of several jobs (None: the newest)."""


@dataclass(slots=True)
class _Read:
    """What reading every file of a folder gave (``_read_folder``)."""

    dumps: list[RankDump]
    problems: list[FileProblem]
    built: dict[int, RankIndex]
    """Per dump (by ``id``), its index."""
    shared: dict[bytes, RankIndex]
    """Equal indexes that arrive from different loader processes (or batches), shared again."""


def load_dir(path: str | Path, options: AnalysisOptions | None = None) -> Run:
    """Read every dump under ``path`` and choose one dump per rank.

    Args:
        path: a folder (searched recursively) or a single dump file.
        options: which dump to keep for a rank that dumped several times (``view``), loader
            processes (``workers``: default the usable CPUs; 1 reads in this process),
            ``progress``, the job to analyse in a folder of several (``job``: None, the
            newest), and ``tail``: read only the tail section of dumps that have one (schema
            1.3), and whole only the rings whose tail does not reach where a peer is
            (``depth``); False reads every file whole; None (the default) reads tails only in
            a folder of more than ``TAIL_FROM_FILES`` files, where reading whole would cost
            tens of seconds. Defaults when None.

    Returns:
        The chosen dumps, the problems met (one per bad file) and notes about choices made.

    Raises:
        UsageError: ``path`` does not exist, or holds no dump of ``job``.
        NoDumpsError: no readable dump was found.
    """
    options = options or AnalysisOptions()
    root = Path(path)
    if not root.exists():
        raise UsageError(f"{root}: no such file or folder")
    workers = options.workers or default_workers()
    read = _read_folder(root, workers, options)
    problems = read.problems
    notes: list[str] = []
    _one_identity_per_process(read.dumps, notes)
    candidates = _prefer_dumps(read.dumps, notes)
    try:
        candidates = _one_job(candidates, notes, options.job)
    except UsageError as exc:
        raise UsageError(f"{root}: {exc}") from None
    candidates = _agree_on_world_size(candidates, problems)
    histories, claimed = _histories(candidates, problems)
    if claimed:
        notes.append(
            f"{_ranks(claimed)} written by more than one process (a restarted job, or two runs "
            "in one folder); using the newest process of each"
        )
    first = _first_hang(histories) if options.view is View.HANG else None
    chosen, later = _choose(histories, options.view, first, notes)
    hang_ns = first.header.wall_time_ns if first is not None else 0
    _only_black_boxes(chosen, notes)
    world_size = max(max(d.header.world_size for d in chosen.values()), max(chosen) + 1)
    indexes = {r: read.built[id(d)] for r, d in chosen.items() if id(d) in read.built}
    _deepen(chosen, indexes, root, workers, notes, read.shared)
    return Run(chosen, world_size, tuple(problems), tuple(notes), indexes, later, hang_ns)


def _read_folder(root: Path, workers: int, options: AnalysisOptions) -> _Read:
    """Every file under ``root`` read (its tail, where ``options.tail`` says so).

    Raises:
        NoDumpsError: no readable dump was found.
    """
    read = _Read([], [], {}, {})
    skipped = 0
    files = list(discover(root))
    tail = len(files) > TAIL_FROM_FILES if options.tail is None else options.tail
    for outcome in _read_all(files, root, workers, options.progress, tail):
        if outcome.problem is not None:
            read.problems.append(outcome.problem)
        skipped += outcome.skipped
        read.dumps.extend(outcome.dumps)
        for d, ri in zip(outcome.dumps, outcome.indexes, strict=True):
            read.built[id(d)] = ri.intern(read.shared)
    if not read.dumps:
        what = _nothing_readable(root, len(files), len(read.problems), skipped)
        if root.is_file() and read.problems:  # one file: say what is wrong with it
            what += f": {read.problems[0].reason}"
        extra = f", {skipped} other files skipped" if skipped and read.problems else ""
        raise NoDumpsError(f"{root}: no readable dump ({what}{extra})")
    return read


def _histories(
    candidates: Sequence[RankDump], problems: list[FileProblem]
) -> tuple[dict[int, list[RankDump]], list[int]]:
    """Per rank, its dumps oldest first, without duplicates (each one a problem) and from its
    newest process only; and the ranks that more than one process claimed."""
    per_rank: dict[int, list[RankDump]] = defaultdict(list)
    for d in candidates:
        per_rank[d.rank].append(d)
    claimed: list[int] = []
    histories: dict[int, list[RankDump]] = {}
    for rank, ds in sorted(per_rank.items()):
        if len(ds) == 1:  # (nothing to order, deduplicate or tell apart)
            histories[rank] = ds
            continue
        ds.sort(key=_order_key)
        seen: dict[tuple[int, int, int], RankDump] = {}
        unique: list[RankDump] = []
        for d in ds:
            ident = (d.header.pid, d.header.dump_index, d.header.wall_time_ns)
            if ident in seen:
                problems.append(
                    FileProblem(d.path, f"duplicate of {seen[ident].path} (rank {rank}); ignored")
                )
                continue
            seen[ident] = d
            unique.append(d)
        # Two processes claiming one rank: a restarted job, or two runs in one folder. Only
        # the newest process speaks for the rank; mixing incarnations would make its history
        # jump back to sequence number 1 in the middle.
        process = (unique[-1].header.hostname, unique[-1].header.pid)
        if any((d.header.hostname, d.header.pid) != process for d in unique):
            claimed.append(rank)
            unique = [d for d in unique if (d.header.hostname, d.header.pid) == process]
        histories[rank] = unique
    return histories, claimed


def _choose(
    histories: dict[int, list[RankDump]],
    view: View,
    first: RankDump | None,
    notes: list[str],
) -> tuple[dict[int, RankDump], dict[int, tuple[RankDump, ...]]]:
    """Per rank, the dump ``view`` picks (``first``: the hang event, for ``View.HANG``) and
    the dumps its process wrote after it; says which in ``notes``."""
    chosen: dict[int, RankDump] = {}
    later: dict[int, tuple[RankDump, ...]] = {}
    several: list[int] = []
    reasons: dict[str, list[int]] = defaultdict(list)
    for rank, unique in histories.items():
        if len(unique) == 1:
            chosen[rank] = unique[0]
            continue
        at = _pick(unique, view, first)
        pick = chosen[rank] = unique[at]
        if unique[at + 1 :]:
            later[rank] = tuple(unique[at + 1 :])
        several.append(rank)
        reasons[pb.DumpReason.Name(pick.header.reason)].append(rank)
    picked = "; ".join(f"{reason} for {_ranks(rs)}" for reason, rs in reasons.items())
    if first is not None:
        after = sorted(later)
        notes.append(
            f"analysing the hang: the first hang event is rank {first.rank}'s "
            f"{pb.DumpReason.Name(first.header.reason)} dump at "
            f"{_clock(first.header.wall_time_ns)}"
            + (f"; using each rank's dump from then on ({picked})" if several else "")
            + (
                f"; later dumps of {_ranks(after)} are read as what happened next "
                "(--view latest analyses them)"
                if after
                else ""
            )
        )
    elif several:
        used = view.value if view is not View.HANG else "latest (no hang event)"
        notes.append(
            f"{_ranks(several)} dumped more than once; using the {used} dump of each ({picked})"
        )
    return chosen, later
