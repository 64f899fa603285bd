"""Find dump files under a folder, read each one, and pick one consistent view per rank.

Every file goes through ``read_any``: the one place that knows file formats. A file that
cannot be read becomes a ``FileProblem`` (one line) and the rest are still analysed.
"""

from __future__ import annotations

import enum
import importlib
import os
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from flightrec.analysis.model import FileProblem, RankDump
from flightrec.blackbox import SOURCE as BLACKBOX_SOURCE
from flightrec.blackbox import is_blackbox, read_blackbox
from flightrec.blackbox.format import TABLES_SUFFIX
from flightrec.dumpfile import SUFFIX, has_magic, read_dump
from flightrec.errors import DumpError, NoDumpsError, NotADumpError, UsageError
from flightrec.proto import flightrec_pb2 as pb
from flightrec.report.ranges import compress


class View(enum.StrEnum):
    """Which dump to use for a rank that dumped more than once."""

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

    @property
    def ranks_with_dump(self) -> tuple[int, ...]:
        """Sorted global ranks that have a dump."""
        return tuple(sorted(self.dumps))

    @property
    def missing_ranks(self) -> tuple[int, ...]:
        """Ranks below ``world_size`` without a dump."""
        return tuple(r for r in range(self.world_size) if r not in self.dumps)


def _native() -> ModuleType | None:
    # The native-dump reader is optional at this layer: it plugs in here when present.
    try:
        return importlib.import_module("flightrec.native")
    except ImportError:
        return None


def read_any(path: str | Path) -> pb.Dump | list[pb.Dump]:
    """Read one file in any format flightrec understands.

    Args:
        path: a flightrec dump, or a PyTorch native Flight Recorder dump.

    Returns:
        The dump (a native file may convert to several, one per rank).

    Raises:
        DumpError: (a subclass) naming the file and the problem in one line.
    """
    if has_magic(path):
        return read_dump(path)
    if is_blackbox(path):
        return read_blackbox(path)
    native = _native()
    sniff = getattr(native, "sniff", None)
    read_native = getattr(native, "read_native", None)
    if sniff is not None and read_native is not None and sniff(path):
        result = read_native(path)
        if isinstance(result, pb.Dump):
            return result
        return list(result)
    # Let the flightrec reader produce its precise message (empty file, no magic, unreadable).
    return read_dump(path)


def _looks_like_dump(path: Path) -> bool:
    """Whether a file that failed to read deserves a complaint rather than silence."""
    name = path.name.lower()
    return name.endswith(SUFFIX) or "flightrec" in name or "trace" in name


def discover(root: Path) -> Iterator[Path]:
    """Every regular file under ``root`` (recursively, sorted), skipping temporaries."""
    if root.is_file():
        yield root
        return
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            # Temporaries of an atomic write in progress, editor droppings, hidden files.
            if name.startswith(".") or name.endswith(TABLES_SUFFIX):
                continue  # (a black box's tables are read with its .ring file)
            path = Path(dirpath) / name
            if path.is_file():
                yield path


def _order_key(d: RankDump) -> tuple[int, int, str]:
    return (d.header.wall_time_ns, d.header.dump_index, d.path)


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
        if d.header.source == BLACKBOX_SOURCE and (
            (d.header.hostname, d.header.pid) in dumped or d.header.rank < 0 or len(d) == 0
        ):
            superseded += 1
            continue
        kept.append(d)
    if superseded:
        notes.append(
            f"set aside {superseded} black-box file(s) of processes that also wrote a dump "
            "or recorded nothing"
        )
    return kept or candidates


def load_dir(path: str | Path, view: View = View.LATEST) -> Run:
    """Read every dump under ``path`` and choose one dump per rank.

    Args:
        path: a folder (searched recursively) or a single dump file.
        view: which dump to keep for a rank that dumped several times.

    Returns:
        The chosen dumps, the problems met (one per bad file) and notes about choices made.

    Raises:
        UsageError: ``path`` does not exist.
        NoDumpsError: no readable dump was found.
    """
    root = Path(path)
    if not root.exists():
        raise UsageError(f"{root}: no such file or folder")
    problems: list[FileProblem] = []
    candidates: list[RankDump] = []
    skipped = 0
    for file in discover(root):
        try:
            result = read_any(file)
        except NotADumpError as exc:
            if file == root or _looks_like_dump(file):
                problems.append(FileProblem(str(file), exc.reason))
            else:
                skipped += 1
            continue
        except DumpError as exc:
            problems.append(FileProblem(str(file), exc.reason))
            continue
        except OSError as exc:
            problems.append(FileProblem(str(file), f"cannot read: {exc.strerror or exc}"))
            continue
        for dump in result if isinstance(result, list) else [result]:
            candidates.append(RankDump(str(file), dump))
    if not candidates:
        what = f"{len(problems)} unreadable" if problems else "none readable"
        extra = f", {skipped} other files skipped" if skipped else ""
        raise NoDumpsError(f"{root}: no readable dump ({what}{extra})")

    notes: list[str] = []
    candidates = _prefer_dumps(candidates, notes)
    # Dumps of several jobs in one folder cannot be merged: keep the most recent job's.
    by_job: dict[str, list[RankDump]] = defaultdict(list)
    for d in candidates:
        by_job[d.header.job_id].append(d)
    if len(by_job) > 1:
        newest = max(by_job, key=lambda j: max(d.header.wall_time_ns for d in by_job[j]))
        for job, ds in by_job.items():
            if job != newest:
                notes.append(
                    f"ignored {len(ds)} dump(s) of another job {job!r}; analysing job {newest!r}"
                )
        candidates = by_job[newest]

    per_rank: dict[int, list[RankDump]] = defaultdict(list)
    for d in candidates:
        per_rank[d.rank].append(d)
    chosen: dict[int, RankDump] = {}
    several: list[int] = []
    reasons: dict[str, list[int]] = defaultdict(list)
    for rank, ds in sorted(per_rank.items()):
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
        pick = unique[-1] if view is View.LATEST else unique[0]
        chosen[rank] = pick
        if len(unique) > 1:
            several.append(rank)
            reasons[pb.DumpReason.Name(pick.header.reason)].append(rank)
    if several:
        picked = "; ".join(f"{reason} for ranks {compress(rs)}" for reason, rs in reasons.items())
        notes.append(
            f"ranks {compress(several)} dumped more than once; using the {view.value} dump "
            f"of each ({picked})"
        )
    world_size = max(max(d.header.world_size for d in chosen.values()), max(chosen) + 1)
    return Run(chosen, world_size, tuple(problems), tuple(notes))
