"""Fold what the root cause explains into it, instead of findings that blame its victims.

Once a job hangs or one rank breaks a collective, much else goes wrong after it: peers time
out or lose their connections and die inside a collective, a rank gloo aborted for the
culprit's bad message dies without a word, pipeline peers blocked behind the culprit leave
sends and receives unmatched, and groups the culprit stopped using fall out of step. Each of
those, reported on its own, puts ranks that did nothing wrong in ``ranks``. Here the first
finding (the root cause) takes them as consequences (``Finding.explains``), and every wait
under it says whether the waiting process has ended since (``Consequence.ended``): a dead
process is never described as waiting.

What counts as explained (never a rule about particular ranks or sizes):

* a rank that died of an exception raised inside a collective (a timeout, a connection
  reset), or after the hang was declared, when it belongs to the root cause's groups: that
  is how gloo ends the peers of a rank that broke or left a collective;
* a rank that died without a word (a black box, or no dump at all) inside the very
  collective a mismatch broke, or later on that group: gloo aborts the receiver of a message
  of the wrong size;
* a ``desync`` or ``p2p_unmatched`` finding whose blamed ranks are all the culprit itself or
  ranks held up behind it (waiting under it, or dead as above), or a ``desync`` of a group the
  culprit is furthest behind on (it left the group behind).

The culprit's own death, when it died after it broke the collective, goes into the root
cause's summary ("rank 1 then died of ...").

Every root cause folds what it explains, not only the first: with two faults in one job,
each one's consequences go under it. And a finding about ranks that were late because they
waited on another rank (``Finding.held_by``, from the chains of waits of ``timing.activity``)
goes under the finding that blames that rank, whatever the kinds: the rank at the head of a
chain is named, the ranks it held up are not blamed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from flightrec.analysis.facts.deaths import HANG_SLACK_NS, died_of, process_ended
from flightrec.analysis.findings.crashes import CrashEvidence
from flightrec.analysis.findings.desync import DesyncEvidence
from flightrec.analysis.kinds import kinds_where
from flightrec.analysis.matching.matching import Matched
from flightrec.analysis.model import Finding, FindingKind, Folded
from flightrec.readers.blackbox import died as blackbox_died
from flightrec.text import ranks_phrase

ROOT_KINDS = kinds_where("root_cause")
"""Kinds that name why a job stopped; a finding of another kind explains nothing after it."""

_OUT_OF_STEP = kinds_where("out_of_step")
"""Kinds that describe counters out of step, which a rank held up by the root cause shows."""

_GONE = kinds_where("gone")
"""Kinds that say the blamed ranks' processes are gone (a death the root cause may explain)."""


def fold_consequences(m: Matched, findings: list[Finding]) -> list[Finding]:
    """Fold the findings each root cause explains into it; mark waits of ended processes.

    Every root cause folds what it explains, in order (most likely first), so that with two
    faults in one job the second fault's consequences go under the second, not on their
    own. Findings whose ranks were held up by another's (``Finding.held_by``: a chain of
    waits leads there) go under the finding that blames that rank, whatever its kind.

    Args:
        m: the lined-up histories.
        findings: every finding, most likely root cause first (after ``place_crashes``).

    Returns:
        The findings left standing, each root cause carrying what it explains.
    """
    gone: dict[int, bool] = {}

    def ended(rank: int) -> bool:
        if rank not in gone:
            gone[rank] = process_ended(m, rank)
        return gone[rank]

    findings = fold_chains([_mark_ended(f, ended) for f in findings])
    i = 0
    while i < len(findings):
        if findings[i].kind in ROOT_KINDS:
            findings = _fold_into(m, findings, i)
        i += 1
    return findings


def fold_chains(findings: list[Finding]) -> list[Finding]:
    """Findings held up by a rank another finding blames (``Finding.held_by``), folded
    under the first such finding that is held up by nobody itself."""
    heads = [f for f in findings if not f.held_by]
    if len(heads) == len(findings):
        return findings
    folded: dict[int, list[Folded]] = {}
    kept: list[Finding] = []
    for f in findings:
        if not f.held_by:
            kept.append(f)
            continue
        head = next((h for h in heads if set(h.ranks) & set(f.held_by)), None)
        if head is None:
            kept.append(f)
            continue
        folded.setdefault(id(head), []).append(
            Folded(f.kind, f.ranks, f.summary, f.process_group, f.seq)
        )
    return [
        dataclasses.replace(f, explains=f.explains + tuple(folded[id(f)])) if id(f) in folded else f
        for f in kept
    ]


def _fold_into(m: Matched, findings: list[Finding], at: int) -> list[Finding]:
    """Fold the findings after ``findings[at]`` (a root cause) that it explains into it."""
    root = findings[at]
    culprits = set(root.ranks)
    held = culprits | {r for c in root.consequences for r in c.waiting}
    scope = held | set(root.pg_ranks) | {r for c in root.consequences for r in c.pg_ranks}
    later = findings[at + 1 :]
    # Deaths first: a rank that died as a consequence is held up too, for the counters below.
    dead = [f for f in later if f.kind in _GONE and _death_explained(m, root, f, scope)]
    for f in dead:
        held |= set(f.ranks)
    explained_deaths = {id(f) for f in dead}
    folded: list[Folded] = []
    kept: list[Finding] = []
    for f in later:
        explained = id(f) in explained_deaths or (
            f.kind in _OUT_OF_STEP and _out_of_step_explained(f, culprits, held)
        )
        if explained:
            folded.append(Folded(f.kind, f.ranks, f.summary, f.process_group, f.seq))
        else:
            kept.append(f)
    end = _culprits_end(m, root)
    if not folded and not end:
        return findings
    exception = root.exception
    for f in dead:  # what the culprit died of, where the root does not say yet
        if exception is None and f.exception is not None and f.exception.rank in culprits:
            exception = f.exception
    # Who waited for a rank whose death the root explains waited because of the root.
    have = {(c.process_group, c.seq, c.p2p) for c in root.consequences}
    waits = root.consequences + tuple(
        c for f in dead for c in f.consequences if (c.process_group, c.seq, c.p2p) not in have
    )
    root = dataclasses.replace(
        root,
        summary=root.summary + end,
        exception=exception,
        explains=root.explains + tuple(folded),
        consequences=waits,
    )
    return [*findings[:at], root, *kept]


def _culprits_end(m: Matched, root: Finding) -> str:
    """ "; rank 1 then died of RuntimeError" where the blamed ranks' processes died of what
    the finding blames them for ("" for a finding that already says they died or exited).

    A death well after the hang was declared (the culprit woke from its stall and found its
    peers gone) is what happened next: the finding's evidence (``exception``), not its verdict.
    """
    if root.kind in _GONE:
        return ""
    hang = m.run.hang_wall_ns
    by_how: dict[str, list[int]] = {}
    for r in root.ranks:
        d = m.run.dumps.get(r)
        if d is None:
            continue
        x = died_of(m, r)
        if x is not None:
            if not hang or x.wall_time_ns <= hang + HANG_SLACK_NS:
                by_how.setdefault(f"died of {x.type}", []).append(r)
        elif any(blackbox_died(e.header) for e in (d, *m.run.later.get(r, ()))):
            by_how.setdefault("died", []).append(r)
    return "".join(f"; {ranks_phrase(rs)} then {how}" for how, rs in by_how.items())


def _out_of_step_explained(f: Finding, culprits: set[int], held: set[int]) -> bool:
    """Whether the counters ``f`` finds out of step follow from the culprits' stop: every rank
    it blames is a culprit or held up behind one (a pipeline peer that never received what
    was sent to it), or, for a group, a culprit is the member furthest behind on it (it left
    the group behind)."""
    if f.ranks and set(f.ranks) <= held:
        return True
    evidence = f.evidence
    if isinstance(evidence, DesyncEvidence) and evidence.issued:
        behind = min(evidence.issued.values())
        return any(evidence.issued.get(r) == behind for r in culprits)
    return False


def _death_explained(m: Matched, root: Finding, f: Finding, scope: set[int]) -> bool:
    """Whether the death ``f`` reports follows from ``root`` (see the module's rules)."""
    if not f.ranks or not set(f.ranks) <= scope:
        return False
    evidence = f.evidence
    if isinstance(evidence, CrashEvidence):
        # An exception raised by a collective, or once the hang was declared, is how gloo
        # ends a rank whose peers broke or left a collective; one raised in the program's own
        # code before that is a cause of its own.
        return evidence.in_collective or evidence.raised_after_hang
    if root.kind is not FindingKind.MISMATCH or root.process_group is None or root.seq is None:
        return False
    # A death without a word: explained where the rank had reached the collective the
    # mismatch broke (gloo aborts a receiver of a message of the wrong size).
    if f.kind is FindingKind.MISSING_DUMP:
        return f.process_group == root.process_group and (f.seq or 0) >= root.seq
    info = m.groups.get(root.process_group)
    if info is None:
        return False
    return all((p := info.progress.get(r)) is not None and p.last_seq >= root.seq for r in f.ranks)


def _mark_ended(f: Finding, ended: Callable[[int], bool]) -> Finding:
    if not f.consequences:
        return f
    marked = tuple(
        dataclasses.replace(c, ended=tuple(r for r in c.waiting if ended(r)))
        for c in f.consequences
    )
    return dataclasses.replace(f, consequences=marked)
