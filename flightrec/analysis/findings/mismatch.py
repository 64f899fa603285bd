"""Mismatches: the same (group, seq) issued with a different op, shape, dtype, reduce op, root.

Each rank's entries are reduced to a signature id per seq through a per-dump cache of the
interned columns, so comparing thousands of ranks costs integer comparisons; records are only
materialised at the first seq where ranks disagree. The minority is blamed by majority vote;
with no strict majority (two ranks, or an even split) the finding says so instead of guessing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

from flightrec.analysis.matching.matching import Matched
from flightrec.analysis.matching.signature import (
    FIELDS,
    UNKNOWN,
    RawSignature,
    compared_tensors,
    compatible,
    raw_signatures,
    resolve,
)
from flightrec.analysis.model import (
    CollectiveRecord,
    Evidence,
    Finding,
    FindingKind,
    ProcessGroupInfo,
    TensorInfo,
    user_frame,
)
from flightrec.format import flightrec_pb2 as pb
from flightrec.text import compress, ranks_phrase

KINDS = (FindingKind.MISMATCH,)
"""The kinds this module makes (``kinds.KINDS`` names it for each)."""


@dataclass(frozen=True, slots=True)
class ValueGroup:
    """One value that some members passed, and those members."""

    value: str | tuple[int, ...]
    """The value as shown to people; for a membership mismatch, the members listed."""
    ranks: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class MismatchEvidence(Evidence):
    """Evidence of a ``mismatch`` finding (collective fields, or group membership)."""

    values: tuple[ValueGroup, ...]
    """Each distinct value with the ranks that had it, the most common first."""
    majority: bool
    """Whether a strict majority agreed (else every rank is blamed)."""
    callsites: Mapping[int, str] | None = None
    """Per rank, the user code that issued the call (collective mismatches)."""
    later_mismatches: int | None = None
    """Further disagreements on the same group (usually echoes of this one)."""
    numel: Mapping[int, int] | None = None
    """Per rank, the elements of the tensors compared."""
    states: Mapping[int, str] | None = None
    """Per rank, the entry's state (``COMPLETED``, ``STARTED``...)."""
    first_mismatch_seq: int | None = None
    """The group's first disagreement, where the one reported is a later one (a hang's)."""


def _show(field: str, value: Hashable) -> str:
    if field in ("shape", "output_shape") and isinstance(value, tuple):
        return ", ".join("[" + "x".join(map(str, s)) + "]" for s in value) or "no tensor"
    if field in ("dtype", "output_dtype") and isinstance(value, tuple):
        return ", ".join(map(str, value)) or "no tensor"
    if field == "root":
        return f"root {value}"
    return str(value) if value not in ("", None) else "none"


def _numel_of(field: str, rec: CollectiveRecord) -> tuple[TensorInfo, ...]:
    return rec.outputs if field.startswith("output") else compared_tensors(rec)


def _signatures(
    m: Matched, rank: int, group: str, canon: dict[Hashable, int], cache: dict[RawSignature, int]
) -> dict[int, int]:
    """seq -> signature id. ``cache`` maps this dump's raw interned columns to ids."""
    gi = m.index[rank][group]
    d = m.dump(rank)
    # Only distinct raw tuples (a handful per rank) are resolved through the dump's tables.
    raws = raw_signatures(d, gi.positions)
    for raw in set(raws):
        if raw not in cache:
            cache[raw] = canon.setdefault(resolve(d, raw), len(canon))
    # seq 0 is not a collective sequence number (P2P and unnumbered entries): never compared.
    table = dict(zip(gi.seqs, map(cache.__getitem__, raws), strict=True))
    table.pop(0, None)
    return table


def _vote(values: dict[int, Hashable]) -> tuple[Hashable | None, tuple[int, ...]]:
    """(majority value or None, blamed ranks). Strict majority only; else every rank."""
    counts = Counter(values.values())
    value, n = counts.most_common(1)[0]
    if n * 2 > len(values):
        return value, tuple(sorted(r for r, v in values.items() if v != value))
    return None, tuple(sorted(values))


def _value_groups(field: str, values: dict[int, Hashable]) -> tuple[ValueGroup, ...]:
    by_value: dict[Hashable, list[int]] = {}
    for r, v in sorted(values.items()):
        by_value.setdefault(v, []).append(r)
    return tuple(
        ValueGroup(_show(field, v), tuple(rs))
        for v, rs in sorted(by_value.items(), key=lambda kv: -len(kv[1]))
    )


def _first_difference(records: Mapping[int, CollectiveRecord]) -> tuple[str, dict[int, Hashable]]:
    """The first field (``FIELDS``) whose values differ among ``records``, and each rank's
    value of it (``op`` and the ops where none differs)."""
    for name, getter in FIELDS:
        vals = {r: getter(rec) for r, rec in records.items()}
        if name in UNKNOWN:  # ranks that did not record the field agree with any value
            vals = {r: v for r, v in vals.items() if v != UNKNOWN[name]}
        if len(set(vals.values())) > 1:
            return name, vals
    return "op", {r: rec.op for r, rec in records.items()}


_VERB = {
    "op": "called",
    "reduce_op": "reduced with",
    "root": "named",
    "output_shape": "passed an output of",
    "output_dtype": "passed an output of",
}
"""What a rank did with a field's value, in a verdict (``passed`` for the others)."""


def _summary(
    m: Matched,
    info: ProcessGroupInfo,
    what: tuple[str, str, str],
    first: CollectiveRecord,
    groups: Sequence[ValueGroup],
    blamed: Sequence[int],
    broken: Sequence[int],
) -> str:
    """The verdict of a mismatch with a majority (``broken`` empty), or of one without where
    the op's own rule blames ``broken``; ``what`` is (field, op, where) and ``first`` the
    first blamed rank's record."""
    field, op, where = what
    frame = user_frame(first.stack)
    at = f" at {frame.where()}" if frame else ""
    verb = _VERB.get(field, "passed")
    if broken:
        split = " vs ".join(f"{ranks_phrase(g.ranks)}: {g.value}" for g in groups)
        who = ranks_phrase(broken)
        return (
            f"{field} mismatch in {op} {where} with no majority ({split}); {who}"
            f"{at if len(broken) == 1 else ''} passed an output that does not fit its input for "
            f"{len(info.ranks)} ranks ({RELATION.get(_relation_kind(op) or '', '')})"
        )
    who = ranks_phrase(blamed)
    if len(blamed) == 1:
        who = f"{who} ({m.dump(blamed[0]).describe()})"
    odd = " / ".join(str(g.value) for g in groups[1:])
    target = f"as collective {where}" if field == "op" else f"to {op} {where}"
    return (
        f"{who[0].upper()}{who[1:]} {verb} {odd} {target}{at}, where "
        f"{ranks_phrase(groups[0].ranks)} {verb} {groups[0].value} ({field} mismatch)"
    )


def _collective_mismatch(
    m: Matched,
    info: ProcessGroupInfo,
    seq: int,
    ranks: Sequence[int],
    later: int,
    first_seq: int | None,
) -> Finding | None:
    records = {r: rec for r in ranks if (rec := m.record(r, info.key, seq)) is not None}
    field, values = _first_difference(records)
    majority, blamed = _vote(values)
    broken: tuple[int, ...] = ()
    if majority is None and field in ("shape", "output_shape"):
        # No majority (two ranks, an even split): the op's own rule between input and output
        # sizes may still say which side is wrong.
        broken = tuple(r for r, rec in sorted(records.items()) if not relation_holds(rec, info))
        if broken and len(broken) < len(records):
            blamed = broken
        else:
            broken = ()
    if not blamed:
        return None
    groups = _value_groups(field, values)
    op_votes = Counter(rec.op for rec in records.values())
    op = op_votes.most_common(1)[0][0]  # the op the group was running, by majority
    where = f"#{seq} on group {info.key} [ranks {compress(info.ranks)}]"
    first = records[blamed[0]]
    if majority is not None or broken:
        summary = _summary(m, info, (field, op, where), first, groups, blamed, broken)
    else:
        split = " vs ".join(f"{ranks_phrase(g.ranks)}: {g.value}" for g in groups)
        summary = (
            f"{field} mismatch in {op} {where} with no majority ({split}); "
            "cannot tell which side is wrong"
        )
    callsites = {
        r: (f.where() if (f := user_frame(rec.stack)) else "") for r, rec in records.items()
    }
    return Finding(
        kind=FindingKind.MISMATCH,
        ranks=blamed,
        summary=summary,
        process_group=info.key,
        pg_ranks=info.ranks,
        seq=seq,
        op=op,
        field=field,
        evidence=MismatchEvidence(
            values=groups,
            majority=majority is not None,
            callsites=dict(sorted(callsites.items())),
            later_mismatches=later,
            numel={
                r: sum(t.numel for t in _numel_of(field, rec)) for r, rec in sorted(records.items())
            },
            states={r: rec.state_name for r, rec in sorted(records.items())},
            first_mismatch_seq=first_seq,
        ),
    )


RELATION = {
    "gather": "gathered output = world size x input",
    "scatter": "scattered input = world size x output",
    "same": "output = input",
}
"""How each kind of op sizes its output from its input, in words."""


def _relation_kind(op: str) -> str | None:
    if "object" in op:
        return None
    if "gather" in op:  # all-gather, and a gather's root (only the root passes the list)
        return "gather"
    if "scatter" in op:  # reduce-scatter, and a scatter's root (only it passes the list)
        return "scatter"
    if op in ("all_reduce", "all_reduce_coalesced", "broadcast", "reduce"):
        return "same"
    return None


def relation_holds(rec: CollectiveRecord, info: ProcessGroupInfo) -> bool:
    """Whether ``rec``'s output size is what its op makes of its input for the group's size.

    True where the op defines no such rule, or the entry records no tensors.
    """
    kind = _relation_kind(rec.op)
    if kind is None or not rec.inputs or not rec.outputs:
        return True
    i = sum(t.numel for t in rec.inputs)
    o = sum(t.numel for t in rec.outputs)
    world = len(info.ranks)
    if kind == "gather":
        return o == world * i
    if kind == "scatter":
        return i == world * o
    return o == i


def relation_mismatch(m: Matched, info: ProcessGroupInfo, seq: int) -> Finding | None:
    """Members whose output at (group, seq) does not fit their input for the group's size.

    Where a hang sits and nothing recorded differs between members, a buffer can still be
    wrong on its own terms: a gather root's list one tensor short, an all-gather output sized
    for another world size on every rank but one. A strict minority of such members is
    blamed (field ``output_shape``); None otherwise.
    """
    records = {
        r: rec for r in info.ranks if r in m.run.dumps and (rec := m.record(r, info.key, seq))
    }
    if len(records) < 2:
        return None
    broken = tuple(r for r, rec in sorted(records.items()) if not relation_holds(rec, info))
    if not broken or len(broken) * 2 >= len(records):
        return None
    first = records[broken[0]]
    kind = _relation_kind(first.op) or ""
    frame = user_frame(first.stack)
    at = f" at {frame.where()}" if frame and len(broken) == 1 else ""
    who = ranks_phrase(broken)
    if len(broken) == 1:
        who = f"{who} ({m.dump(broken[0]).describe()})"
    groups = _value_groups(
        "output_shape", {r: tuple(t.shape for t in rec.outputs) for r, rec in records.items()}
    )
    summary = (
        f"{who[0].upper()}{who[1:]} passed an output of "
        f"{_show('output_shape', tuple(t.shape for t in first.outputs))} to {first.op} #{seq} on "
        f"group {info.key} [ranks {compress(info.ranks)}]{at} that does not fit its input for "
        f"{len(info.ranks)} ranks ({RELATION.get(kind, '')}) (output_shape mismatch)"
    )
    return Finding(
        kind=FindingKind.MISMATCH,
        ranks=broken,
        summary=summary,
        process_group=info.key,
        pg_ranks=info.ranks,
        seq=seq,
        op=first.op,
        field="output_shape",
        evidence=MismatchEvidence(
            values=groups,
            majority=True,
            numel={r: sum(t.numel for t in rec.outputs) for r, rec in sorted(records.items())},
            states={r: rec.state_name for r, rec in sorted(records.items())},
        ),
    )


@dataclass(frozen=True, slots=True)
class ExchangeEvidence(Evidence):
    """Evidence of an all-to-all whose members' sizes cannot add up."""

    sent: Mapping[int, int]
    """Per rank, the elements it sends (its input)."""
    received: Mapping[int, int]
    """Per rank, the elements it receives into (its output)."""


@dataclass(frozen=True, slots=True)
class SplitPair:
    """One sender and receiver of an all-to-all that disagree on how much passes between them."""

    src: int
    dst: int
    sent: int
    """Elements ``src`` sends to ``dst`` (its input chunk for ``dst``)."""
    expected: int
    """Elements ``dst`` expects from ``src`` (its output chunk for ``src``)."""


@dataclass(frozen=True, slots=True)
class SplitEvidence(Evidence):
    """Evidence of an all-to-all whose members disagree pair by pair."""

    pairs: tuple[SplitPair, ...]
    """Every disagreeing (sender, receiver), in group-rank order."""


def exchange_mismatch(m: Matched, info: ProcessGroupInfo, seq: int) -> Finding | None:
    """An all-to-all at (group, seq) whose members cannot exchange what they passed.

    Split sizes differ between ranks by design, so an all-to-all's sizes are not compared
    rank to rank; but what all members send is what all members receive. When the totals
    differ, the members whose output differs from their input are blamed where they are a
    strict minority (even splits make input = output on every rank); else every member.
    Where every member's entry holds one chunk per peer (``all_to_all``, and
    ``all_to_all_single`` with split sizes), each chunk a rank sends must be the size its
    peer receives from it (``_split_mismatch``): that check comes first, totals or not, and
    its answer stands where the totals agree or where it singles out a minority.

    Returns:
        A ``mismatch`` finding (field ``output_total`` or ``split_sizes``), or None when the
        sizes add up or a member's entry is not in the dumps.
    """
    records = {}
    for r in info.ranks:
        rec = m.record(r, info.key, seq) if r in m.run.dumps else None
        if rec is None or "all_to_all" not in rec.op or rec.flags & pb.OBJECT_API:
            return None
        records[r] = rec
    sent = {r: sum(t.numel for t in rec.inputs) for r, rec in records.items()}
    received = {r: sum(t.numel for t in rec.outputs) for r, rec in records.items()}
    # Pair by pair first, whether or not the totals add up: a rank found in every pair that
    # disagrees is the one whose split sizes are wrong (a stale routing table changes what it
    # sends and what it expects, and the totals with them).
    pairwise = _split_mismatch(records, info, seq)
    if sum(sent.values()) == sum(received.values()):
        return pairwise
    if pairwise is not None and len(pairwise.ranks) * 2 < len(records):
        return pairwise
    odd = tuple(r for r in sorted(records) if sent[r] != received[r])
    blamed = odd if odd and len(odd) * 2 < len(records) else tuple(sorted(records))
    op = records[blamed[0]].op
    who = ranks_phrase(blamed)
    frame = user_frame(records[blamed[0]].stack)
    at = f" at {frame.where()}" if frame and len(blamed) == 1 else ""
    totals = f"{sum(sent.values())} elements sent, {sum(received.values())} received"
    summary = (
        f"{op} #{seq} on group {info.key} [ranks {compress(info.ranks)}] cannot add up "
        f"({totals}): {who}{at} "
        + (
            "passed an output sized unlike its input, where every other member's match"
            if len(blamed) < len(records)
            else "passed split sizes that do not match (cannot tell which side is wrong)"
        )
        + " (output_total mismatch)"
    )
    return Finding(
        kind=FindingKind.MISMATCH,
        ranks=blamed,
        summary=summary,
        process_group=info.key,
        pg_ranks=info.ranks,
        seq=seq,
        op=op,
        field="output_total",
        evidence=ExchangeEvidence(dict(sent), dict(received)),
    )


def _split_mismatch(
    records: Mapping[int, CollectiveRecord], info: ProcessGroupInfo, seq: int
) -> Finding | None:
    """Pair by pair: rank ``i``'s input chunk for its ``b``-th peer against that peer's
    output chunk for ``i``.

    A rank that passed wrong split sizes disagrees with several peers, each of them with it
    alone: the ranks found in every disagreeing pair are blamed (one pair alone cannot tell
    sender from receiver: both are named), else those in the most pairs.
    """
    members = info.ranks
    size = len(members)
    if size < 2 or any(
        len(rec.inputs) != size or len(rec.outputs) != size for rec in records.values()
    ):
        return None  # even splits (one tensor each), or a list that is not one per peer
    pairs = [
        SplitPair(src, dst, records[src].inputs[b].numel, records[dst].outputs[a].numel)
        for a, src in enumerate(members)
        for b, dst in enumerate(members)
        if src != dst and records[src].inputs[b].numel != records[dst].outputs[a].numel
    ]
    if not pairs:
        return None
    involved = Counter(r for p in pairs for r in {p.src, p.dst})
    everywhere = tuple(sorted(r for r, n in involved.items() if n == len(pairs)))
    if len(pairs) > 1 and everywhere:
        blamed = everywhere
    else:
        most = max(involved.values())
        blamed = tuple(sorted(r for r, n in involved.items() if n == most))
    op = records[blamed[0]].op
    frame = user_frame(records[blamed[0]].stack)
    at = f" at {frame.where()}" if frame and len(blamed) == 1 else ""
    shown = "; ".join(
        f"rank {p.src} sends {p.sent} elements to rank {p.dst}, which expects {p.expected}"
        for p in pairs[:3]
    ) + (f"; {len(pairs) - 3} more pairs" if len(pairs) > 3 else "")
    side = (
        f"{ranks_phrase(blamed)}{at} passed split sizes that disagree with its peers'"
        if len(blamed) == 1
        else f"{ranks_phrase(blamed)} passed split sizes that do not match (cannot tell "
        "which side is wrong)"
    )
    return Finding(
        kind=FindingKind.MISMATCH,
        ranks=blamed,
        summary=(
            f"{op} #{seq} on group {info.key} [ranks {compress(members)}]: {side}: {shown} "
            "(split_sizes mismatch)"
        ),
        process_group=info.key,
        pg_ranks=members,
        seq=seq,
        op=op,
        field="split_sizes",
        evidence=SplitEvidence(tuple(pairs)),
    )


def _membership_mismatch(m: Matched, info: ProcessGroupInfo) -> Finding | None:
    views = m.memberships.get(info.key, {})
    if len(views) < 2:
        return None
    values: dict[int, Hashable] = {r: members for members, rs in views.items() for r in rs}
    majority, blamed = _vote(values)
    listing = "; ".join(
        f"{ranks_phrase(rs)} list members [{compress(members)}]" for members, rs in views.items()
    )
    verdict = "" if majority is not None else " with no majority"
    return Finding(
        kind=FindingKind.MISMATCH,
        ranks=blamed,
        summary=f"group membership mismatch on {info.label()}{verdict}: {listing}",
        process_group=info.key,
        pg_ranks=info.ranks,
        field="group",
        evidence=MismatchEvidence(
            values=tuple(ValueGroup(tuple(k), tuple(v)) for k, v in views.items()),
            majority=majority is not None,
        ),
    )


def _unfinished(m: Matched, group: str, seq: int, sigs: dict[int, dict[int, int]]) -> bool:
    for r, table in sigs.items():
        if seq in table:
            d = m.dump(r)
            pos = m.index[r][group].position_of(seq)
            if pos is not None and d.tracks_completion and d.columns["state"][pos] != pb.COMPLETED:
                return True
    return False


def _agree_by_fingerprint(m: Matched, group: str, holders: list[int]) -> bool | None:
    """Whether every holder agrees at every seq it shares with another, from the per-rank
    signature bytes; None when some rank's index cannot answer (gaps, too many signatures).

    Each rank's signature ids are translated to job-wide ids (``bytes.translate``) and laid
    over one reference sequence in order of first seq: each rank is one C-speed slice
    comparison against the values earlier ranks put there, so 16,384 agreeing ranks cost
    16,384 comparisons, not 16,384 x 2,000.
    """
    canon: dict[Hashable, int] = {}
    lanes: list[tuple[int, int, bytes]] = []
    # Ranks with equal rings share one index and one signature table (``index_rank``): a
    # lane equal to one laid already says nothing new. (Keyed by identity: all live in ``m``.)
    laid: set[tuple[int, int]] = set()
    for r in holders:
        gi = m.index[r][group]
        if not gi.seqs:
            continue  # nothing of this group in its ring: nothing to compare
        if gi.signature_ids is None or not gi.contiguous:
            return None
        table = m.signatures[r]
        same = (id(gi), id(table))
        if same in laid:
            continue
        laid.add(same)
        ids = [canon.setdefault(key, len(canon)) for key in table]
        if len(canon) > 255:
            return None
        mapping = bytes(ids) + bytes(256 - len(ids))
        lanes.append((gi.seqs[0], gi.seqs[-1], gi.signature_ids.translate(mapping)))
    if not lanes:
        return True
    lanes.sort(key=lambda lane: lane[0])
    ref = bytearray()
    ref_first = lanes[0][0]
    ref_last = ref_first - 1
    for first, last, lane in lanes:
        if first <= ref_last:
            upto = min(last, ref_last)
            if ref[first - ref_first : upto - ref_first + 1] != lane[: upto - first + 1]:
                return False
        if last > ref_last:
            if first > ref_last + 1:  # a gap no later lane can reach (they start later)
                ref += bytes(first - ref_last - 1)
            ref += lane[max(0, ref_last + 1 - first) :]
            ref_last = last
    return True


def find_mismatches(m: Matched) -> list[Finding]:
    """Every group's first disagreement (later ones on that group are usually its echo).

    A stage of its own in ``pipeline.diagnose``: the root-cause arbitration
    (``rootcause.root_causes``) places these among the ends of the wait-for graph.

    Args:
        m: the lined-up histories.

    Returns:
        ``mismatch`` findings, one per group at most plus membership disagreements.
    """
    canon: dict[Hashable, int] = {}
    findings: list[Finding] = []
    for info in m.groups.values():
        member = _membership_mismatch(m, info)
        if member is not None:
            findings.append(member)
        holders = [r for r in info.ranks if r in m.index and info.key in m.index[r]]
        if len(holders) < 2:
            continue
        if _agree_by_fingerprint(m, info.key, holders):
            continue
        caches: dict[int, dict[tuple[int, ...], int]] = {}
        sigs = {r: _signatures(m, r, info.key, canon, caches.setdefault(r, {})) for r in holders}
        # Fast path: every rank agrees with the union of all tables (C-speed set checks).
        union: dict[int, int] = {}
        for table in sigs.values():
            union.update(table)
        if all(table.items() <= union.items() for table in sigs.values()):
            continue
        all_seqs = sorted(union)
        by_id: dict[int, tuple[Hashable, ...]] = {
            i: key for key, i in canon.items() if isinstance(key, tuple)
        }
        agree: dict[frozenset[int], bool] = {}
        bad: list[int] = []
        for seq in all_seqs:
            seen = frozenset(table[seq] for table in sigs.values() if seq in table)
            if len(seen) > 1 and not agree.setdefault(
                seen,
                compatible([by_id[i] for i in seen]),
            ):
                bad.append(seq)
        if not bad:
            continue
        # The disagreement a hang sits on is the one to report (an earlier one that completed
        # is the same bug seen before, kept as evidence); else the first one.
        seq = next((s for s in bad if _unfinished(m, info.key, s, sigs)), bad[0])
        ranks = [r for r, table in sigs.items() if seq in table]
        first = bad[0] if seq != bad[0] else None
        finding = _collective_mismatch(m, info, seq, ranks, len(bad) - 1, first)
        if finding is not None:
            findings.append(finding)
    return findings
