"""Rebuild process-group membership from every rank's native dump.

Native dumps describe groups in ``pg_config`` (name -> description and a rank list). Gloo dumps
from torch 2.13 break that table: every group is filed under the empty name, so each new group
overwrites the previous one, and subgroups carry an empty rank list. What survives is
evidence spread over the ranks:

* ``pg_config`` lists that do name their group (NCCL, older torch) are taken as given;
* the default group (description ``default_pg``) holds every rank of the job;
* a rank whose ring holds an entry of group G is a member of G (only members record);
* an unnamed, complete list ``[0, ..., n-1]`` fixes the world size.

Groups rebuilt from participation are marked ``members_known=False`` and come with a note
saying what could not be established (a member whose ring never used the group, or whose
dump is missing, cannot be seen).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from flightrec.readers.native.model import NativeDump, PgConfig


@dataclass(frozen=True, slots=True)
class JobGroup:
    """One process group as the native dumps of the whole job show it (its name, members and
    backend agreed across ranks; ``JobGroups.groups`` holds them)."""

    name: str
    desc: str
    ranks: tuple[int, ...]  # global ranks in group-rank order (torch sorts them)
    backend: str
    members_known: bool


@dataclass(frozen=True, slots=True)
class GroupEvidence:
    """What one rank's dump says about groups: small enough to keep for every rank of a job."""

    rank: int
    pg_config: tuple[PgConfig, ...]
    used: tuple[tuple[str, str, str], ...]  # (group name, desc, backend) seen in the ring
    named_uids: frozenset[int]  # per-process group ids that the ring's entries name
    active_uids: frozenset[int]  # pg_status ids with at least one operation enqueued


def evidence(d: NativeDump) -> GroupEvidence:
    """Extract the group evidence of one dump (drops entries, stacks and tensors)."""
    used: dict[str, tuple[str, str, str]] = {}
    es = d.entries
    # Each distinct (group, desc, backend) once, in ring order: a repeat cannot change what
    # an earlier occurrence established.
    for name, desc, backend in dict.fromkeys(zip(es.pg_name, es.pg_desc, es.backend, strict=True)):
        if not name:
            continue
        if desc == "undefined":
            desc = ""
        old = used.get(name)
        if old is None or (not old[1] and desc) or (not old[2] and backend):
            used[name] = (name, desc or (old[1] if old else ""), backend or (old[2] if old else ""))
    return GroupEvidence(
        rank=d.rank,
        pg_config=d.pg_config,
        used=tuple(used.values()),
        named_uids=frozenset(es.pg_id),
        active_uids=frozenset(uid for uid, last in d.pg_status.items() if last > 0),
    )


@dataclass(frozen=True, slots=True)
class JobGroups:
    """Every group of the job, the world size, and what could not be reconstructed."""

    world_size: int
    groups: dict[str, JobGroup]
    notes: tuple[str, ...]


def _name_key(name: str) -> tuple[int, int | str]:
    # torch names groups "0", "1", ... in creation order; hashed names sort after them.
    return (0, int(name)) if name.isdigit() else (1, name)


def rebuild_groups(dumps: Sequence[NativeDump | GroupEvidence]) -> JobGroups:
    """Reconstruct group membership and world size from the native dumps of one job.

    Args:
        dumps: every readable native dump of the job (one per rank; more is better), or
            their ``evidence``.

    Returns:
        The groups keyed by name, the world size, and notes on what had to be guessed.
    """
    notes: list[str] = []
    explicit: dict[str, tuple[int, ...]] = {}
    descs: dict[str, str] = {}
    backends: dict[str, str] = {}
    participants: dict[str, set[int]] = defaultdict(set)
    world_hint = 0
    facts = [d if isinstance(d, GroupEvidence) else evidence(d) for d in dumps]
    for d in facts:
        for cfg in d.pg_config:
            if cfg.ranks is None:
                continue
            if cfg.name:
                if cfg.name in explicit and explicit[cfg.name] != cfg.ranks:
                    notes.append(
                        f"group {cfg.name!r}: ranks disagree on its members "
                        f"({list(explicit[cfg.name])} vs {list(cfg.ranks)}); using the first"
                    )
                    continue
                explicit.setdefault(cfg.name, cfg.ranks)
                if cfg.desc:
                    descs.setdefault(cfg.name, cfg.desc)
            elif cfg.ranks == tuple(range(len(cfg.ranks))):
                # An unnamed complete list can only be the default group: it fixes the world.
                world_hint = max(world_hint, len(cfg.ranks))
        for name, desc, backend in d.used:
            participants[name].add(d.rank)
            if desc:
                descs.setdefault(name, desc)
            if backend:
                backends.setdefault(name, backend)
    file_ranks = {d.rank for d in facts}
    world_size = max(
        [world_hint, *(r + 1 for r in file_ranks), *(max(v) + 1 for v in explicit.values())]
    )
    missing = sorted(set(range(world_size)) - file_ranks)

    groups: dict[str, JobGroup] = {}
    for name in sorted(set(explicit) | set(participants), key=_name_key):
        desc = descs.get(name, "")
        backend = backends.get(name, "")
        if name in explicit:
            groups[name] = JobGroup(name, desc, explicit[name], backend, True)
        elif desc == "default_pg":
            known = world_hint == world_size
            if not known:
                notes.append(
                    f"default group {name!r}: world size {world_size} inferred from the dump "
                    "files present; a missing highest rank would not be seen"
                )
            groups[name] = JobGroup(name, desc, tuple(range(world_size)), backend, known)
        else:
            ranks = tuple(sorted(participants[name]))
            groups[name] = JobGroup(name, desc, ranks, backend, False)
            unseen = f"; ranks without a dump ({missing}) may belong too" if missing else ""
            notes.append(
                f"group {name!r}: the dumps do not list its members; reconstructed as "
                f"{list(ranks)} from the ranks whose rings use it (a member that never used "
                f"it within its ring is not seen{unseen})"
            )
    for d in facts:
        # pg_status lists one counter per group the rank belongs to, keyed by a per-process
        # id; more counters than groups named in the ring means memberships we cannot name.
        unnamed = d.active_uids - d.named_uids
        if unnamed:
            notes.append(
                f"rank {d.rank} used {len(unnamed)} group(s) that its ring no longer names; "
                "their membership could not be reconstructed"
            )
    return JobGroups(world_size=world_size, groups=groups, notes=tuple(notes))


def groups_of_one(d: NativeDump) -> JobGroups | None:
    """The groups one dump needs for its conversion, when that dump alone establishes them.

    A dump that lists every group it uses in ``pg_config``, by name and with its members,
    plus a complete world list, and whose ring names the backend of each of its groups
    (NCCL dumps do) leaves nothing for the other ranks' dumps to add to its own conversion:
    reading them, as gloo dumps need, would make reading N files one by one cost N^2.
    What is lost is only a job-wide note when two ranks list different members for one
    group; each dump then carries its own list, and the analysis compares them.

    Returns:
        The groups rebuilt from this dump alone, or None when anything about them has to be
        inferred from the other ranks' dumps (then use ``rebuild_groups`` over all of them).
    """
    explicit = {c.name for c in d.pg_config if c.name and c.ranks is not None}
    job = rebuild_groups([d])
    if not explicit.issuperset(job.groups):
        return None
    complete = tuple(range(job.world_size))
    if not any(c.ranks == complete for c in d.pg_config):
        return None  # the world size could be larger than this dump knows
    own = set(d.entries.pg_name)
    for g in job.groups.values():
        if not g.backend and (g.name in own or d.rank in g.ranks):
            return None  # only another rank's ring may say which backend it runs on
    return job
