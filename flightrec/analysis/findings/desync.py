"""Desync: members of a group issued different numbers of collectives and nobody waits.

A hang shows up in the wait-for graph; this pass covers what remains, such as a rank that ran
fewer iterations and exited cleanly. Ranks ahead only by collectives still in flight (a dump
taken while the job runs) are in step.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from flightrec.analysis.candidates import Stages
from flightrec.analysis.model import Evidence, Finding, FindingKind
from flightrec.text import compress, ranks_phrase

KINDS = (FindingKind.DESYNC,)
"""The kinds this module makes (``kinds.KINDS`` names it for each)."""


@dataclass(frozen=True, slots=True)
class DesyncEvidence(Evidence):
    """Evidence of a ``desync`` finding."""

    issued: Mapping[int, int]
    """Collectives each member issued on the group, by rank."""


def find_desyncs(s: Stages, above: Sequence[Finding]) -> list[Finding]:
    """Groups whose members' counters disagree, other than those a root cause or a mismatch
    already explains.

    Args:
        s: the stages before (``Stages.explained``: groups a root cause or a mismatch
            accounts for).
        above: the findings listed before these (not read: what explains a group is
            ``Stages.explained``).

    Returns:
        ``desync`` findings blaming the ranks off the most common counter.
    """
    m, explained = s.m, s.explained
    findings: list[Finding] = []
    for key, info in m.groups.items():
        if key in explained:
            continue
        listed = set(info.ranks)  # (a set: the world group lists every rank of the job)
        members = {r: p for r, p in info.progress.items() if r in listed}
        counters = {r: p.last_seq for r, p in members.items()}
        if len(set(counters.values())) < 2:
            continue
        # Ranks ahead only by collectives still in flight are not out of step: someone must
        # have completed a collective that another member never issued.
        done = [p.last_completed for p in members.values()]
        if min(done) >= 0 and max(done) <= min(counters.values()):
            continue
        if min(done) < 0 and max(counters.values()) - min(counters.values()) < 2:
            continue  # no completion tracking: one in flight is indistinguishable from drift
        counts = Counter(counters.values())
        common, n = counts.most_common(1)[0]
        if n * 2 <= len(counters):
            blamed = tuple(sorted(counters))
        else:
            blamed = tuple(sorted(r for r, c in counters.items() if c != common))
        by_count: dict[int, list[int]] = {}
        for r, c in sorted(counters.items()):
            by_count.setdefault(c, []).append(r)
        spread = "; ".join(
            f"{ranks_phrase(rs)} issued {c}" for c, rs in sorted(by_count.items(), reverse=True)
        )
        findings.append(
            Finding(
                kind=FindingKind.DESYNC,
                ranks=blamed,
                summary=(
                    f"{info.label()}"
                    + (f" [ranks {compress(info.ranks)}]" if info.desc else "")
                    + f" is out of step: {spread} "
                    "collective(s), and nobody is blocked"
                ),
                process_group=key,
                pg_ranks=info.ranks,
                seq=min(counters.values()) + 1,
                evidence=DesyncEvidence(dict(sorted(counters.items()))),
            )
        )
    return findings
