"""Validate the plain data of one native dump into typed records.

PyTorch has written several versions of the Flight Recorder format (torch 2.4 wrote "2.2",
torch 2.13 writes "2.10"); keys were added over time and the JSON form spells some values
differently. Everything here reads with defaults for the optional keys and refuses, with a
sentence naming the file, anything that is not the expected plain type. No value from a dump
is ever evaluated: the group rank lists, which PyTorch stores as a string like "[0, 1, 2]" and
its analyzer passes to ``eval``, go through a strict grammar instead.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from flightrec.errors import CorruptDumpError, NotADumpError, UnsafeDumpError

# Work bound: a dump's containers may share sub-objects (pickle memo), so the size of the
# file does not bound how much a naive walk visits. Every value read counts against this.
MAX_CELLS = 30_000_000
MAX_FRAMES_PER_ENTRY = 64
MAX_TENSORS_PER_ENTRY = 4096
MAX_DIMS = 64
_INT64 = 1 << 63

_RANK_LIST = re.compile(r"\[\s*(?:\d{1,9}\s*(?:,\s*\d{1,9}\s*)*,?\s*)?\]")
_P2P = re.compile(r"(?P<a>\d{1,9})\s*(?P<arrow>->|<-)\s*(?P<b>\d{1,9})")

# c10 ScalarType names (what the recorder writes) to torch dtype names (what flightrec uses).
_DTYPES = {
    "Float": "float32",
    "Double": "float64",
    "Half": "float16",
    "BFloat16": "bfloat16",
    "Long": "int64",
    "Int": "int32",
    "Short": "int16",
    "Char": "int8",
    "Byte": "uint8",
    "Bool": "bool",
    "ComplexFloat": "complex64",
    "ComplexDouble": "complex128",
    "ComplexHalf": "complex32",
    "Float8_e4m3fn": "float8_e4m3fn",
    "Float8_e5m2": "float8_e5m2",
    "Float8_e4m3fnuz": "float8_e4m3fnuz",
    "Float8_e5m2fnuz": "float8_e5m2fnuz",
    "UInt16": "uint16",
    "UInt32": "uint32",
    "UInt64": "uint64",
}

# Backend-internal spellings of collectives, mapped to the torch.distributed API names the
# rest of flightrec uses, so a mismatch report reads the same for every source.
_OPS = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "_allgather_base": "all_gather_into_tensor",
    "_all_gather_base": "all_gather_into_tensor",  # ProcessGroupNCCL's name for it
    "allgather_into_tensor_coalesced": "all_gather_into_tensor_coalesced",
    "_reduce_scatter_base": "reduce_scatter_tensor",
    "reduce_scatter_base": "reduce_scatter_tensor",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all_single",
    "all_to_all_base": "all_to_all_single",
}


@dataclass(frozen=True, slots=True)
class NativeEntry:
    """One entry of a native ring, validated. Times are wall-clock ns (0: unknown)."""

    record_id: int
    pg_id: int
    pg_name: str
    pg_desc: str
    seq: int
    p2p_seq: int
    op_id: int
    backend: str
    op: str
    local_src: int  # P2P: group-local sender from the profiling name; -1 otherwise
    local_dst: int  # P2P: group-local receiver; -1 otherwise
    is_p2p: bool
    state: str
    created_ns: int
    started_ns: int
    completed_ns: int
    inputs: tuple[tuple[tuple[int, ...], str], ...]
    outputs: tuple[tuple[tuple[int, ...], str], ...]
    frames: tuple[tuple[str, str, int], ...]
    thread: str
    timeout_ms: int


@dataclass(frozen=True, slots=True)
class PgConfig:
    """One ``pg_config`` record. ``ranks`` is None when the dump left the list empty."""

    name: str
    desc: str
    ranks: tuple[int, ...] | None


@dataclass(frozen=True, slots=True)
class NativeDump:
    """One native dump file, validated."""

    path: str
    rank: int
    host: str
    form: str  # "pickle" or "json"
    version: str
    comm_lib_version: str
    entries: tuple[NativeEntry, ...]
    pg_config: tuple[PgConfig, ...]
    pg_status: Mapping[int, int]  # pg uid -> last enqueued op counter
    mtime_ns: int


class _Reader:
    """Typed accessors that count work and name the file in every error."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.cells = 0
        # The recorder symbolizes each distinct frame once and every entry refers to the same
        # frame dict (shared through the pickle memo): validate each object once. Keyed by
        # id(), which is stable because the whole unpickled tree outlives the reader.
        self.frame_memo: dict[int, tuple[str, str, int]] = {}

    def _tick(self, n: int = 1) -> None:
        self.cells += n
        if self.cells > MAX_CELLS:  # read at call time so tests can lower it
            raise CorruptDumpError(self.path, "more values than any Flight Recorder dump holds")

    def fail(self, what: str) -> CorruptDumpError:
        return CorruptDumpError(self.path, f"not a valid Flight Recorder dump: {what}")

    def mapping(self, value: object, what: str) -> Mapping[object, object]:
        self._tick()
        if not isinstance(value, dict):
            raise self.fail(f"{what} is {type(value).__name__}, expected a dict")
        return value

    def seq(self, value: object, what: str) -> Sequence[object]:
        self._tick()
        if not isinstance(value, list | tuple):
            raise self.fail(f"{what} is {type(value).__name__}, expected a list")
        self._tick(len(value))
        return value

    def integer(self, value: object, what: str, default: int = 0) -> int:
        self._tick()
        if type(value) is int and -_INT64 <= value < _INT64:
            return value  # the common case, checked first: this runs for every number
        if value is None:
            return default
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, str) and re.fullmatch(r"-?\d{1,19}", value):
            value = int(value)  # the JSON form writes pg_status counters as strings
        if not isinstance(value, int):
            raise self.fail(f"{what} is {type(value).__name__}, expected an integer")
        if not -_INT64 <= value < _INT64:
            raise self.fail(f"{what} ({value}) does not fit 64 bits")
        return value

    def text(self, value: object, what: str, default: str = "") -> str:
        self._tick()
        if type(value) is str:
            return value
        if value is None:
            return default
        if isinstance(value, bytes):
            return value.decode("utf-8", "replace")
        if not isinstance(value, str):
            raise self.fail(f"{what} is {type(value).__name__}, expected a string")
        return value

    def flag(self, value: object, what: str) -> bool:
        self._tick()
        if value is None:
            return False
        if not isinstance(value, bool | int):
            raise self.fail(f"{what} is {type(value).__name__}, expected a boolean")
        return bool(value)


def parse_rank_list(value: object, path: str) -> tuple[int, ...] | None:
    """Parse a ``pg_config`` rank list without evaluating it.

    PyTorch stores the list as a string such as ``"[0, 1, 2, 3]"``; only that shape (digits,
    commas, brackets, blanks) is accepted. A real list of integers is accepted too.

    Returns:
        The ranks, or None when the list is empty (torch 2.13 gloo subgroups).

    Raises:
        UnsafeDumpError: the string is anything else (a crafted dump hiding code in it).
        CorruptDumpError: not a string or list, or ranks out of range.
    """
    if isinstance(value, str):
        if len(value) > 10_000_000 or not _RANK_LIST.fullmatch(value):
            raise UnsafeDumpError(
                path,
                f"pg_config rank list {value[:60]!r} is not a list of integers; "
                "refusing it (it is never evaluated)",
            )
        ranks = tuple(int(x) for x in re.findall(r"\d+", value))
    elif isinstance(value, list | tuple):
        ranks = tuple(x for x in value if isinstance(x, int) and not isinstance(x, bool))
        if len(ranks) != len(value):
            raise CorruptDumpError(path, "pg_config rank list holds something other than ranks")
    else:
        raise CorruptDumpError(path, f"pg_config rank list is {type(value).__name__}")
    if any(r < 0 or r >= 1 << 24 for r in ranks):
        raise CorruptDumpError(path, "pg_config rank list holds a rank out of range")
    return ranks or None


def _tensors(
    r: _Reader, sizes: object, dtypes: object, what: str
) -> tuple[tuple[tuple[int, ...], str], ...]:
    if sizes is None:
        return ()
    # Labels built once: formatting a message per value would cost more than the checks.
    size_label, dtype_label = f"{what}_sizes", f"{what}_dtypes"
    shapes = r.seq(sizes, size_label)
    names = r.seq(dtypes, dtype_label) if dtypes is not None else ()
    out: list[tuple[tuple[int, ...], str]] = []
    for i, shape in enumerate(shapes[:MAX_TENSORS_PER_ENTRY]):
        dims = r.seq(shape, size_label)
        if len(dims) > MAX_DIMS:
            raise r.fail(f"{size_label}[{i}] has {len(dims)} dimensions")
        dtype = r.text(names[i], dtype_label) if i < len(names) else ""
        out.append(
            (tuple([r.integer(d, size_label) for d in dims]), _DTYPES.get(dtype) or dtype.lower())
        )
    return tuple(out)


def _frames(r: _Reader, value: object) -> tuple[tuple[str, str, int], ...]:
    if value is None:
        return ()
    out: list[tuple[str, str, int]] = []
    memo = r.frame_memo
    for frame in r.seq(value, "frames")[:MAX_FRAMES_PER_ENTRY]:
        done = memo.get(id(frame))
        if done is None:
            f = r.mapping(frame, "a frame")
            line = r.integer(f.get("line"), "frame line")
            done = (
                r.text(f.get("filename"), "frame filename"),
                r.text(f.get("name"), "frame name"),
                max(0, line),
            )
            memo[id(frame)] = done
        out.append(done)
    return tuple(out)


def _entry(r: _Reader, raw: object, index: int) -> NativeEntry:
    e = r.mapping(raw, f"entries[{index}]")
    name = r.text(e.get("profiling_name"), "profiling_name")
    backend, _, rest = name.partition(":")
    if not rest:  # older or third-party writers without the "backend:" prefix
        backend, rest = "", name
    op, _, meta = rest.strip().partition(" ")
    op = _OPS.get(op, op)
    src = dst = -1
    m = _P2P.search(meta)
    if m and op in ("send", "recv"):
        a, b = int(m["a"]), int(m["b"])
        # "send 0->1" names sender then receiver; "recv 1<-0" names receiver then sender.
        src, dst = (a, b) if m["arrow"] == "->" else (b, a)
    pg = e.get("process_group")
    pg_name, pg_desc = "", ""
    if pg is not None:
        parts = r.seq(pg, "process_group")
        pg_name = r.text(parts[0], "process_group name") if parts else ""
        pg_desc = r.text(parts[1], "process_group desc") if len(parts) > 1 else ""
    seq = r.integer(e.get("collective_seq_id", e.get("seq_id")), "collective_seq_id")
    p2p_seq = r.integer(e.get("p2p_seq_id"), "p2p_seq_id")
    is_p2p = r.flag(e.get("is_p2p"), "is_p2p") or op in ("send", "recv")
    return NativeEntry(
        record_id=r.integer(e.get("record_id"), "record_id", index),
        pg_id=r.integer(e.get("pg_id"), "pg_id", -1),
        pg_name=pg_name,
        pg_desc=pg_desc,
        seq=max(0, seq),
        p2p_seq=max(0, p2p_seq),
        op_id=r.integer(e.get("op_id"), "op_id"),
        backend=backend,
        op=op,
        local_src=src,
        local_dst=dst,
        is_p2p=is_p2p,
        state=r.text(e.get("state"), "state"),
        created_ns=max(0, r.integer(e.get("time_created_ns"), "time_created_ns")),
        started_ns=max(
            0, r.integer(e.get("time_discovered_started_ns"), "time_discovered_started_ns")
        ),
        completed_ns=max(
            0, r.integer(e.get("time_discovered_completed_ns"), "time_discovered_completed_ns")
        ),
        inputs=_tensors(r, e.get("input_sizes"), e.get("input_dtypes"), "input"),
        outputs=_tensors(r, e.get("output_sizes"), e.get("output_dtypes"), "output"),
        frames=_frames(r, e.get("frames")),
        thread=r.text(e.get("thread_name"), "thread_name"),
        timeout_ms=max(0, r.integer(e.get("timeout_ms"), "timeout_ms")),
    )


def _name_legacy_groups(
    entries: tuple[NativeEntry, ...], legacy: Mapping[int, tuple[int, ...]]
) -> tuple[tuple[NativeEntry, ...], list[PgConfig]]:
    """Give format 1.x groups a name that is the same on every member.

    Their only id is per process (members and non-members of a group count differently), so
    the name is built from the member list, with "#k" for the k-th group of the same members
    (members create groups in the same order, so k agrees too). Id 0 is the default group.
    """
    names: dict[int, str] = {}
    seen: dict[tuple[int, ...], int] = {}
    configs: list[PgConfig] = []
    for uid in sorted(legacy):
        ranks = legacy[uid]
        k = seen.get(ranks, 0)
        seen[ranks] = k + 1
        names[uid] = "[" + ",".join(map(str, ranks)) + "]" + (f"#{k}" if k else "")
        desc = "default_pg" if uid == 0 else ""
        configs.append(PgConfig(name=names[uid], desc=desc, ranks=ranks or None))
    fixed = tuple(
        dataclasses.replace(e, pg_name=names[e.pg_id], pg_desc="default_pg" if e.pg_id == 0 else "")
        if not e.pg_name and e.pg_id in names
        else e
        for e in entries
    )
    return fixed, configs


def normalize(
    obj: object, *, path: str, rank: int, host: str, form: str, mtime_ns: int
) -> NativeDump:
    """Turn the plain data of one native dump into a ``NativeDump``.

    Raises:
        NotADumpError: the data is not shaped like a Flight Recorder dump at all.
        CorruptDumpError: a field has the wrong type or an impossible value.
        UnsafeDumpError: a rank list holds something other than integers.
    """
    r = _Reader(path)
    if not isinstance(obj, dict) or "entries" not in obj:
        raise NotADumpError(path, "not a PyTorch Flight Recorder dump (no 'entries' table)")
    entries = tuple(_entry(r, e, i) for i, e in enumerate(r.seq(obj["entries"], "entries")))
    configs: list[PgConfig] = []
    legacy: dict[int, tuple[int, ...]] = {}
    raw_cfg = obj.get("pg_config")
    if raw_cfg is not None:
        for key, value in r.mapping(raw_cfg, "pg_config").items():
            if isinstance(value, list | tuple):
                # Format 1.x (torch 2.2-2.3): {pg_id: [ranks]} keyed by the per-process id.
                legacy[r.integer(key, "pg_config key")] = parse_rank_list(value, path) or ()
                continue
            cfg = r.mapping(value, "a pg_config record")
            name = r.text(cfg.get("name"), "pg_config name") or r.text(key, "pg_config key")
            ranks = parse_rank_list(cfg.get("ranks", "[]"), path)
            configs.append(
                PgConfig(name=name, desc=r.text(cfg.get("desc"), "pg_config desc"), ranks=ranks)
            )
    if legacy:
        entries, more = _name_legacy_groups(entries, legacy)
        configs.extend(more)
    status: dict[int, int] = {}
    raw_status = obj.get("pg_status")
    if raw_status is not None:
        for key, value in r.mapping(raw_status, "pg_status").items():
            uid = r.integer(key, "pg_status key")
            status[uid] = r.integer(
                r.mapping(value, "a pg_status record").get("last_enqueued_collective"), "pg_status"
            )
    return NativeDump(
        path=path,
        rank=rank,
        host=host,
        form=form,
        version=r.text(obj.get("version"), "version"),
        comm_lib_version=r.text(obj.get("comm_lib_version"), "comm_lib_version"),
        entries=entries,
        pg_config=tuple(configs),
        pg_status=status,
        mtime_ns=mtime_ns,
    )
