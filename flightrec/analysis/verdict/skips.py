"""Skipped or extra calls: where a rank's call sites start running one step off its peers'.

When a rank skips one collective call (a rank-dependent ``if``), its later calls pair with
its peers' next ones: sizes may still agree, nothing fails there, and the hang shows up later,
at a collective that has nothing to do with the cause. The line of code each call came from
still tells the story: from the skipped call on, the rank's call sites equal its peers' call
sites one sequence number later. This pass finds that point and adds it to the finding.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Literal

from flightrec.analysis.kinds import kinds_where
from flightrec.analysis.matching.matching import Matched
from flightrec.analysis.model import CallShift, Finding, user_frame

# Peers sampled to establish the majority call site per seq; the shift must hold this long.
_SAMPLE = 8
_CONFIRM = 4


def _sites(m: Matched, rank: int, group: str) -> dict[int, str]:
    """seq -> ``file:line`` of the user code that issued it (innermost user frame)."""
    gi = m.index.get(rank, {}).get(group)
    if gi is None:
        return {}
    d = m.dump(rank)
    stacks = d.dump.entries.stack
    out: dict[int, str] = {}
    for seq, pos in zip(gi.seqs, gi.positions, strict=True):
        frame = user_frame(d.stack(stacks[pos]))
        if frame is not None:
            out[seq] = f"{frame.file}:{frame.line}"
    return out


def find_shift(m: Matched, rank: int, group: str) -> CallShift | None:
    """The first seq where ``rank`` called from a different line than its peers, if from
    there on its calls are its peers' shifted by one (a skipped or an extra call).

    Returns:
        The shift, or None.
    """
    info = m.groups.get(group)
    if info is None:
        return None
    peers = [r for r in info.ranks if r != rank and r in m.index][:_SAMPLE]
    mine = _sites(m, rank, group)
    if not peers or not mine:
        return None
    votes: dict[int, Counter[str]] = {}
    for p in peers:
        for seq, site in _sites(m, p, group).items():
            votes.setdefault(seq, Counter())[site] += 1
    majority = {seq: c.most_common(1)[0][0] for seq, c in votes.items()}
    agreed_before = False
    for seq in sorted(mine):
        if seq not in majority:
            continue
        if mine[seq] == majority[seq]:
            agreed_before = True
            continue
        if not agreed_before:
            return None  # never in step within the window: a rank-specific code path
        shifts: tuple[tuple[int, Literal["skipped", "extra"]], ...] = (
            (1, "skipped"),
            (-1, "extra"),
        )
        for delta, kind in shifts:
            pairs = [
                (mine[s], majority[s + delta])
                for s in range(seq, seq + _CONFIRM)
                if s in mine and s + delta in majority
            ]
            if pairs and all(a == b for a, b in pairs):
                rec = m.record(peers[0], group, seq)
                return CallShift(seq, kind, majority[seq], mine[seq], rec.op if rec else None)
        return None
    return None


def _short(site: str) -> str:
    file, _, line = site.rpartition(":")
    parts = file.replace("\\", "/").split("/")
    return f"{'/'.join(parts[-2:])}:{line}"


def annotate_shifts(m: Matched, findings: list[Finding]) -> list[Finding]:
    """Add the skipped (or extra) call behind a finding about one rank on one group.

    Args:
        m: the lined-up histories.
        findings: the ordered findings.

    Returns:
        The same findings, with ``call_shift`` set and a clause in the summary where a shift
        was found.
    """
    kinds = kinds_where("shifted_by_skips")
    out: list[Finding] = []
    for f in findings:
        if f.kind in kinds and len(f.ranks) == 1 and f.process_group and f.ranks[0] in m.index:
            shift = find_shift(m, f.ranks[0], f.process_group)
            if shift is not None:
                op = shift.op or "collective"
                if shift.kind == "skipped":
                    clause = (
                        f"it appears to have skipped the {op} at {_short(shift.peer_site)} "
                        f"(#{shift.seq}): from there on its calls run one ahead of its peers'"
                    )
                else:
                    clause = (
                        f"it appears to have made an extra call at "
                        f"{_short(shift.rank_site)} (#{shift.seq}): from there on its "
                        "calls run one behind its peers'"
                    )
                f = replace(f, summary=f"{f.summary}; {clause}", call_shift=shift)
        out.append(f)
    return out
