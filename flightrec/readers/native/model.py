"""Validate the plain data of one native dump into typed records.

PyTorch has written several versions of the Flight Recorder format (torch 2.4 wrote "2.2",
torch 2.13 writes "2.10"); keys were added over time and the JSON form spells some values
differently. Everything here reads with defaults for the optional keys and refuses, with a
sentence naming the file, anything that is not the expected plain type. The entries table is
read column by column (``entries``); this module reads the rest (group configuration and
status) and assembles the ``NativeDump``. No value from a dump is ever evaluated: the group
rank lists, which PyTorch stores as a string like "[0, 1, 2]" and its analyzer passes to
``eval``, go through a strict grammar instead.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass

from flightrec.errors import CorruptDumpError, NotADumpError, UnsafeDumpError
from flightrec.readers.native.entries import NativeEntries, read_entries
from flightrec.readers.native.reader import Reader

_DIGITS = re.compile(r"\d+")
_RANK_LIST = re.compile(r"\[\s*(?:\d{1,9}\s*(?:,\s*\d{1,9}\s*)*,?\s*)?\]")


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
    entries: NativeEntries
    pg_config: tuple[PgConfig, ...]
    pg_status: Mapping[int, int]  # pg uid -> last enqueued op counter
    mtime_ns: int
    job_id: str = ""
    """Set where the file's place names its job (torchft's quorum folders: ``torchft``)."""


def _parse_rank_string(value: str) -> tuple[int, ...] | None:
    if not _RANK_LIST.fullmatch(value):
        return None
    return tuple(map(int, _DIGITS.findall(value)))


# Every rank's dump repeats the same lists (the world group's is 16,384 numbers at 16,384
# ranks): a process reading many dumps parses each distinct list once. Only lists of a
# plausible size are kept (64 x 1 MB at most).
_parse_known_rank_string = functools.lru_cache(maxsize=64)(_parse_rank_string)
_CACHED_LIST_CHARS = 1_000_000


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
        if len(value) > 10_000_000:
            raise UnsafeDumpError(path, "pg_config rank list is longer than any job's")
        parsed = (
            _parse_known_rank_string(value)
            if len(value) <= _CACHED_LIST_CHARS
            else _parse_rank_string(value)
        )
        if parsed is None:
            raise UnsafeDumpError(
                path,
                f"pg_config rank list {value[:60]!r} is not a list of integers; "
                "refusing it (it is never evaluated)",
            )
        ranks = parsed
    elif isinstance(value, list | tuple):
        ranks = tuple(x for x in value if isinstance(x, int) and not isinstance(x, bool))
        if len(ranks) != len(value):
            raise CorruptDumpError(path, "pg_config rank list holds something other than ranks")
    else:
        raise CorruptDumpError(path, f"pg_config rank list is {type(value).__name__}")
    if ranks and (min(ranks) < 0 or max(ranks) >= 1 << 24):
        raise CorruptDumpError(path, "pg_config rank list holds a rank out of range")
    return ranks or None


def _name_legacy_groups(
    entries: NativeEntries, legacy: Mapping[int, tuple[int, ...]]
) -> tuple[NativeEntries, list[PgConfig]]:
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
    # Entries that name no group (format 1.x has no process_group tuple) take their id's name.
    pairs = [
        (names[uid], "default_pg" if uid == 0 else "")
        if not name and uid in names
        else (name, desc)
        for name, desc, uid in zip(entries.pg_name, entries.pg_desc, entries.pg_id, strict=True)
    ]
    if not pairs:
        return entries, configs
    pg_name, pg_desc = zip(*pairs, strict=True)
    return dataclasses.replace(entries, pg_name=pg_name, pg_desc=pg_desc), configs


def normalize(
    obj: object,
    *,
    path: str,
    rank: int,
    host: str,
    form: str,
    mtime_ns: int,
    entries: NativeEntries | None = None,
) -> NativeDump:
    """Turn the plain data of one native dump into a ``NativeDump``.

    ``entries``, when given, is the dump's entries table already read (by the C reader,
    which leaves it out of ``obj``); otherwise ``obj["entries"]`` is read here.

    Raises:
        NotADumpError: the data is not shaped like a Flight Recorder dump at all.
        CorruptDumpError: a field has the wrong type or an impossible value.
        UnsafeDumpError: a rank list holds something other than integers.
    """
    r = Reader(path)
    if not isinstance(obj, dict) or (entries is None and "entries" not in obj):
        raise NotADumpError(path, "not a PyTorch Flight Recorder dump (no 'entries' table)")
    if entries is None:
        entries = read_entries(r, obj["entries"])
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
