"""Read PyTorch's native Flight Recorder dumps (pickle and JSON) without executing them.

PyTorch's recorder (``TORCH_FR_BUFFER_SIZE`` / ``TORCH_NCCL_TRACE_BUFFER_SIZE``) writes one file
per rank named with a prefix and the rank: ``rank_3``, ``nccl_trace_rank_3``,
``comm_lib_trace_rank_3``, possibly with a host name in front, or whatever prefix the job set in
``TORCH_FR_DUMP_TEMP_FILE`` (``_dump_3``). A file is taken for one by its content
(``native_form``), and its rank is the number its name ends with. Its analyzer loads them with
``pickle.load`` and ``eval``; here a pickle of the usual shape is read by a C reader that
runs only plain-data opcodes and reads the ring straight into checked columns
(``_pickled.c``); any other pickle
goes through an unpickler that refuses every global (``unpickle``), the JSON form through
strict JSON (``jsonform``), and their data through a typed validator (``model`` for the dump,
``entries`` for its ring, a column at a time, on the accessors of ``reader``), which defines
what the C reader must produce, before anything is converted into flightrec's schema
(``convert``), or straight into the analyzer's compact form (``view``). Because gloo dumps
lack group membership, it is rebuilt from all the ranks' dumps of a folder (``groups``); a
dump that lists its own groups (NCCL) is converted alone.

Public API: ``sniff(path)``, ``read_native(path)``, ``convert_paths(paths)``,
``convert_dir(src, out)``; ``view.read_native_view(path)`` for the analyzer.
"""

from __future__ import annotations

import gc
import os
import re
import threading
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from flightrec.errors import DumpError, NoDumpsError, NotADumpError, UsageError
from flightrec.format import flightrec_pb2 as pb
from flightrec.format.native_names import dtype_name
from flightrec.format.schema import dump_filename
from flightrec.format.write import write_dump
from flightrec.readers.native import reader
from flightrec.readers.native.convert import to_pb
from flightrec.readers.native.entries import NativeEntries, from_c
from flightrec.readers.native.groups import (
    GroupEvidence,
    JobGroups,
    evidence,
    groups_of_one,
    rebuild_groups,
)
from flightrec.readers.native.jsonform import load_json
from flightrec.readers.native.model import NativeDump, normalize
from flightrec.readers.native.torchcomms import per_group
from flightrec.readers.native.torchft import in_global_terms
from flightrec.readers.native.unpickle import load_plain_pickle

try:  # the C reader of the common pickle (see _pickled.c); the Python path reads the rest
    import flightrec.readers.native._pickled as _pickled
except ImportError:  # pragma: no cover - the extension is optional
    _pickled = None  # type: ignore[assignment]

__all__ = [
    "MAX_NATIVE_BYTES",
    "ConvertResult",
    "NativeName",
    "convert_dir",
    "convert_paths",
    "job_of_file",
    "parse_name",
    "read_native",
    "sniff",
]

# A 20,000-entry NCCL ring with C++ and Python stacks is tens of MB; refuse what no recorder
# writes before reading it into memory.
MAX_NATIVE_BYTES = 512 * 1024 * 1024

# <host?><prefix?>rank<_?><digits><.json|.pkl|.pickle?>; the prefix is whatever the job set in
# TORCH_FR_DUMP_TEMP_FILE / TORCH_NCCL_DEBUG_INFO_TEMP_FILE (default "nccl_trace_rank_").
_NAME = re.compile(
    r"(?P<head>.*?)rank[_-]?(?P<rank>\d{1,7})(?P<ext>\.(?:json|pkl|pickle))?", re.IGNORECASE
)
_PREFIXES = ("comm_lib_trace_", "nccl_trace_", "fr_trace_", "gloo_trace_", "xccl_trace_", "trace_")


# Any other name: the rank is the last number in it (``_dump_3``, ``trace.3.json``,
# ``fr-3.pkl``): a prefix chosen in TORCH_FR_DUMP_TEMP_FILE is followed by the rank.
_LAST_NUMBER = re.compile(r"(?P<rank>\d{1,7})(?P<ext>\.(?:json|pkl|pickle))?", re.IGNORECASE)

SNIFF_BYTES = 4096
"""Bytes read to recognise a native dump by its content (its first keys are in them)."""
# Top-level keys of every version of the format: a pickle names them as strings (its first
# key is "version"), the JSON form as quoted keys in sorted order ("entries" second). One of
# them must appear at the start of the file: a pickle or JSON file of anything else is not a
# native dump ("version" alone is too common a JSON key to count).
_PICKLE_KEYS = (b"entries", b"pg_config", b"version")
_JSON_KEYS = (b'"entries"', b'"pg_config"')


class NativeName:
    """What a native dump's file name says: the rank and, when present, the host."""

    __slots__ = ("host", "rank")

    def __init__(self, rank: int, host: str) -> None:
        self.rank = rank
        self.host = host


def parse_name(path: str | Path) -> NativeName | None:
    """The rank (and host, where PyTorch's own naming gives one) a native dump's name carries.

    PyTorch's names (``[host-]nccl_trace_rank_3``, ``rank_3.json``) give both; any other name
    gives its last number as the rank (the prefix in TORCH_FR_DUMP_TEMP_FILE is whatever the
    job chose, and the rank follows it) and no host. None when the name holds no number.
    """
    base = os.path.basename(os.fspath(path))
    m = _NAME.fullmatch(base)
    if m is not None:
        head = m["head"]
        for prefix in _PREFIXES:
            if head.lower().endswith(prefix):
                head = head[: -len(prefix)]
                break
        return NativeName(int(m["rank"]), head.strip("_-. "))
    numbers = list(_LAST_NUMBER.finditer(base))
    if not numbers or numbers[-1].end() != len(base):
        return None
    return NativeName(int(numbers[-1]["rank"]), "")


def _form(first: bytes) -> str | None:
    # Pickle protocol 2+ starts with PROTO (0x80) then the protocol number; torch uses 2.
    if len(first) >= 2 and first[0] == 0x80 and 2 <= first[1] <= 5:
        return "pickle"
    if first.lstrip()[:1] == b"{":
        return "json"
    return None


def native_form(head: bytes) -> str | None:
    """``"pickle"`` or ``"json"`` when the first bytes of a file are a native dump's, else None.

    Decided from the content alone, never by running it: a pickle (PROTO opcode) or a JSON
    object whose opening bytes name one of the format's top-level keys.
    """
    form = _form(head[:16])
    if form == "pickle" and any(k in head for k in _PICKLE_KEYS):
        return form
    if form == "json" and any(k in head for k in _JSON_KEYS):
        return form
    return None


def sniff(path: str | Path) -> bool:
    """True when ``path`` is a native dump by its content (its first ``SNIFF_BYTES``), whatever
    its name (the rank comes from the dump, else its name: ``load_native``). A pickle or JSON
    file named the way PyTorch names its dumps is one too, however damaged its start: reading
    it says what is wrong with it.

    Never raises; an unreadable file is simply not a native dump.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(SNIFF_BYTES)
    except OSError:
        return False
    if native_form(head) is not None:
        return True
    return _form(head[:16]) is not None and _NAME.fullmatch(os.path.basename(path)) is not None


@contextmanager
def _no_gc_pauses() -> Iterator[None]:
    """Hold the cyclic garbage collector off while one dump is unpickled and read.

    A 2,000-entry dump unpickles into some 50,000 dicts, lists and tuples, none of which can
    be garbage before the reading ends; each collection the allocations trigger would walk
    them all for nothing (about 15% of the reading time). Nothing is lost: plain data freed
    by reference counting never needs the collector, and a cycle a crafted pickle might hold
    is collected after the collector is back on.
    """
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def load_native(path: str | Path) -> NativeDump:
    """Read and validate one native dump file (no conversion, no group reconstruction).

    Raises:
        NotADumpError: unreadable, badly named, or neither pickle nor JSON.
        UnsafeDumpError: the file asks for code (a pickle global, a rank list that is not data).
        CorruptDumpError: too large, truncated, or with fields of the wrong shape.
    """
    p = str(path)
    name = parse_name(p)
    try:
        st = os.stat(p)
        if st.st_size > MAX_NATIVE_BYTES:
            raise NotADumpError(p, f"{st.st_size} bytes is larger than any Flight Recorder dump")
        with open(p, "rb") as f:
            data = f.read(MAX_NATIVE_BYTES + 1)
    except OSError as exc:
        raise NotADumpError(p, f"cannot read: {exc.strerror or exc}") from None
    form = _form(data[:16])
    if form is None:
        raise NotADumpError(
            p, "empty file" if not data else "neither a pickle nor a JSON Flight Recorder dump"
        )
    with _no_gc_pauses():
        reading = (
            _pickled.read(data, dtype_name, reader.MAX_CELLS)
            if form == "pickle" and _pickled
            else None
        )
        if reading is not None:
            obj: object = reading[0]
            entries: NativeEntries | None = from_c(reading)
        else:
            obj = load_plain_pickle(data, p) if form == "pickle" else load_json(data, p)
            entries = None
        del data, reading
        # The rank the dump states, where its writer added one; else the number its name ends
        # with (PyTorch's own dumps state none: its writer puts the rank after the prefix).
        own = obj.get("rank") if isinstance(obj, dict) else None
        if isinstance(own, int) and not isinstance(own, bool) and 0 <= own < 1 << 24:
            rank = own
        elif name is not None:
            rank = name.rank
        else:
            raise NotADumpError(p, "neither the dump nor its file name gives its rank")
        dump = normalize(
            obj,
            path=p,
            rank=rank,
            host=name.host if name is not None else "",
            form=form,
            mtime_ns=st.st_mtime_ns,
            entries=entries,
        )
        del obj  # freed while the collector is off, so it never walks the tree
    return in_global_terms(per_group(dump))


def convert_paths(paths: Sequence[str | Path]) -> tuple[list[pb.Dump], list[DumpError], JobGroups]:
    """Convert the native dumps of one job together, rebuilding group membership across ranks.

    Args:
        paths: native dump files of one job (typically one per rank).

    Returns:
        The converted dumps (in the order of ``paths``, unreadable ones left out), one error
        per file that could not be read (its one-line ``str()`` names the file), and the
        rebuilt groups with notes on what could not be reconstructed.
    """
    natives: list[NativeDump] = []
    errors: list[DumpError] = []
    for path in paths:
        try:
            natives.append(load_native(path))
        except DumpError as exc:
            errors.append(exc)
    job = rebuild_groups(natives)
    return [to_pb(d, job) for d in natives], errors, job


# Reading a folder file by file (the analyzer's read_any) would rebuild groups from the
# siblings once per file; the siblings' group evidence (small: no entries, stacks or tensors)
# is cached by (path, mtime, size), so each sibling is parsed once per folder.
_CACHE_MAX = 100_000
_cache_lock = threading.Lock()
_cache: dict[str, tuple[tuple[int, int], GroupEvidence | None]] = {}


def _sibling(path: str) -> GroupEvidence | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (st.st_mtime_ns, st.st_size)
    with _cache_lock:
        hit = _cache.get(path)
    if hit is not None and hit[0] == key:
        return hit[1]
    try:
        found: GroupEvidence | None = evidence(load_native(path))
    except DumpError:
        found = None  # a bad sibling is reported when it is read itself
    with _cache_lock:
        if len(_cache) >= _CACHE_MAX:
            _cache.clear()
        _cache[path] = (key, found)
    return found


def read_native(path: str | Path) -> pb.Dump | list[pb.Dump]:
    """Convert a native dump file, or every native dump in a folder, to flightrec dumps.

    For a file, group membership that the file lacks (gloo) is rebuilt from the native dumps
    beside it in the same folder, read once and cached; a file that lists its groups itself
    (NCCL) is converted alone (see ``groups_of_one``).

    Args:
        path: a native dump file, or a folder of them.

    Returns:
        One ``pb.Dump`` for a file; a list for a folder (unreadable files left out; use
        ``convert_paths`` to get their errors too).

    Raises:
        DumpError: (a subclass) naming the file, when the file itself cannot be read; for
            ``UnsafeDumpError`` nothing from the file was executed.
    """
    p = Path(path)
    if p.is_dir():
        files = sorted(str(f) for f in p.iterdir() if f.is_file() and sniff(f))
        return convert_paths(files)[0]
    own = load_native(p)
    return to_pb(own, job_of_file(p, own))


def job_of_file(path: Path, own: NativeDump) -> JobGroups:
    """The groups of the job of one native dump file (``own``, read from ``path``).

    From the file alone when it lists its groups (``groups_of_one``), else rebuilt from the
    native dumps in its folder, read once per folder and cached.
    """
    # A torchft replica's dump lists its own groups completely, yet its world is every
    # replica's (``torchft``): only the quorum folder says how large.
    alone = None if own.job_id else groups_of_one(own)
    return alone or _job_of_folder(path, own)


# The groups rebuilt for a folder, keyed by the folder's listing (names, mtimes, sizes) so
# that reading N files one by one sniffs and rebuilds once, not N times.
_jobs: dict[str, tuple[tuple[tuple[str, int, int], ...], JobGroups]] = {}


def _listing(folder: Path) -> tuple[tuple[str, int, int], ...]:
    found: list[tuple[str, int, int]] = []
    with os.scandir(folder) as it:
        for de in it:
            # Any file may be a native dump (its content says, ``sniff``), except a temporary.
            if not de.name.startswith(".") and de.is_file():
                st = de.stat()
                found.append((de.name, st.st_mtime_ns, st.st_size))
    return tuple(sorted(found))


def _job_of_folder(path: Path, own: NativeDump) -> JobGroups:
    folder = path.parent
    key = str(folder.resolve())
    try:
        listing = _listing(folder)
    except OSError:
        return rebuild_groups([own])
    with _cache_lock:
        hit = _jobs.get(key)
    if hit is not None and hit[0] == listing:
        return hit[1]
    siblings: list[NativeDump | GroupEvidence] = [own]
    for name, _mtime, _size in listing:
        f = folder / name
        if name != path.name and sniff(f):
            found = _sibling(str(f))
            if found is not None:
                siblings.append(found)
    job = rebuild_groups(siblings)
    with _cache_lock:
        if len(_jobs) >= _CACHE_MAX:
            _jobs.clear()
        _jobs[key] = (listing, job)
    return job


@dataclass(frozen=True, slots=True)
class ConvertResult:
    """What ``convert_dir`` did: files written, files refused, and reconstruction notes."""

    written: tuple[Path, ...]
    errors: tuple[DumpError, ...]
    notes: tuple[str, ...]


def convert_dir(src: str | Path, out: str | Path) -> ConvertResult:
    """Write a flightrec dump for every native dump found under ``src`` into ``out``.

    Each folder holding native dumps is taken as one job (groups are rebuilt across its
    files) and is mirrored under ``out`` at the same relative path, so the output of several
    jobs never mixes.

    Raises:
        UsageError: ``src`` is not a folder.
        NoDumpsError: no native dump under ``src`` could be converted.
        OSError: ``out`` cannot be written.
    """
    src_p, out_p = Path(src), Path(out)
    if not src_p.is_dir():
        raise UsageError(f"{src_p}: not a folder")
    by_folder: dict[Path, list[str]] = defaultdict(list)
    for root, _dirs, files in os.walk(src_p):
        for name in sorted(files):
            if sniff(os.path.join(root, name)):
                by_folder[Path(root)].append(os.path.join(root, name))
    written: list[Path] = []
    errors: list[DumpError] = []
    notes: list[str] = []
    for folder, paths in sorted(by_folder.items()):
        dumps, errs, job = convert_paths(paths)
        errors.extend(errs)
        notes.extend(f"{folder}: {n}" for n in job.notes)
        target = out_p / folder.relative_to(src_p)
        for dump in dumps:
            name = dump_filename(dump.header.rank, 0, "converted", dump.header.pid)
            written.append(write_dump(dump, target, name))
    if not written:
        found = f"; {len(errors)} refused" if errors else ""
        raise NoDumpsError(f"{src_p}: no convertible PyTorch Flight Recorder dump found{found}")
    return ConvertResult(tuple(written), tuple(errors), tuple(notes))
