"""torchft's layout of native dumps: one folder per quorum, one file per global rank.

torchft (fault-tolerant replicated training) runs each replica group as a job of its own, with
its own default group numbered from 0, and re-forms the job at every *quorum* (a change of the
live replicas). Its Manager points PyTorch's recorder at ``<TORCH_FR_DUMP_TEMP_FILE>_quorum_
<id>/<global rank>`` (with ``TORCH_FR_DUMP_DYNAMIC_FILE_NAME=1``) and resets the recorder at
each quorum, so every quorum folder holds one self-contained job's dumps, named by the global
rank (``replica * group size + group rank``), in which each replica's groups list their members
by *group* rank.

Read by content and place (a file named by a bare number, in a folder named ``..._quorum_<N>``,
whose dump has a ``default_pg`` group), such a dump is put in global terms before anything
else sees it: its groups are renamed ``replica<k>/<name>`` (replica k's group "0" is not
replica j's) with their members as global ranks, and its job is its quorum folder's name, so
the quorums of one run read as the jobs of a reused folder: the newest is analyzed, the others
named, and ``--job NAME`` picks one. torchft's cross-replica groups are not registered with
torch's group registry and carry no group name in the recorder; they are left as they are.
"""

from __future__ import annotations

import dataclasses
import os
import re

from flightrec.readers.native.model import NativeDump, PgConfig

QUORUM = re.compile(r".+_quorum_(\d+)")
"""A quorum folder's name (``<prefix>_quorum_<id>``)."""


def quorum_of(path: str) -> str:
    """The quorum folder a native dump file lies in as torchft lays them out, else ""."""
    folder = os.path.basename(os.path.dirname(os.path.abspath(path)))
    name = os.path.basename(path)
    return folder if QUORUM.fullmatch(folder) and name.isdigit() else ""


def in_global_terms(dump: NativeDump) -> NativeDump:
    """``dump`` with its replica's groups renamed and numbered by global rank, and its quorum
    as its job; unchanged when it is not in torchft's layout."""
    quorum = quorum_of(dump.path)
    if not quorum:
        return dump
    # The replica's default group: named so, or (gloo's record of it) an unnamed complete list.
    lists = [(c, c.ranks) for c in dump.pg_config if c.ranks]
    default = next((r for c, r in lists if c.desc == "default_pg"), None) or next(
        (r for c, r in lists if not c.name and r == tuple(range(len(r)))), None
    )
    if not default:
        return dump
    size = len(default)
    replica = dump.rank // size
    first = replica * size

    def rename(name: str) -> str:
        return f"replica{replica}/{name}" if name else name

    configs = tuple(
        PgConfig(
            rename(c.name), c.desc, None if c.ranks is None else tuple(first + r for r in c.ranks)
        )
        for c in dump.pg_config
    )
    names = {name: rename(name) for name in dict.fromkeys(dump.entries.pg_name)}
    entries = dataclasses.replace(
        dump.entries, pg_name=list(map(names.__getitem__, dump.entries.pg_name))
    )
    return dataclasses.replace(dump, pg_config=configs, entries=entries, job_id=quorum)
