"""Stragglers: a rank that arrives last at collectives, again and again, while nothing hangs.

A collective completes on every member at about the same moment (when the last one arrives),
so each rank's own wait, complete minus enqueue on its own monotonic clock, shows who arrived
last without comparing clocks across hosts: the last arriver waited least. A straggler is
last at most of the recent collectives it took part in, by a clear margin.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from statistics import median

from flightrec.analysis.matching import Matched
from flightrec.analysis.model import Finding, FindingKind
from flightrec.proto import flightrec_pb2 as pb


@dataclass(frozen=True, slots=True)
class StragglerOptions:
    """Thresholds of the straggler pass.

    Attributes:
        recent: completed collectives per group looked at (the newest ones).
        min_samples: collectives a rank must have taken part in to be judged.
        min_fraction: share of them at which it must have arrived last.
        min_margin_ms: how much later than the others' median it must have arrived (median).
    """

    recent: int = 64
    min_samples: int = 5
    min_fraction: float = 0.6
    min_margin_ms: float = 5.0


def find_stragglers(m: Matched, options: StragglerOptions | None = None) -> list[Finding]:
    """Ranks that consistently arrive last at completed collectives.

    Args:
        m: the lined-up histories.
        options: thresholds; defaults when None.

    Returns:
        ``straggler`` findings, the most consistent straggler first.
    """
    opt = options or StragglerOptions()
    taken: Counter[int] = Counter()
    last: Counter[int] = Counter()
    margins: dict[int, list[float]] = defaultdict(list)
    groups_of: dict[int, Counter[str]] = defaultdict(Counter)
    ops_of: dict[int, Counter[str]] = defaultdict(Counter)
    for key, info in m.groups.items():
        waits: dict[int, dict[int, int]] = {}
        for r in info.ranks:
            gi = m.index.get(r, {}).get(key)
            if gi is None or not m.dump(r).tracks_completion:
                continue
            e = m.dump(r).dump.entries
            table: dict[int, int] = {}
            for seq, pos in zip(gi.seqs[-opt.recent :], gi.positions[-opt.recent :], strict=True):
                if e.state[pos] == pb.COMPLETED and e.complete_ns[pos] and e.enqueue_ns[pos]:
                    table[seq] = e.complete_ns[pos] - e.enqueue_ns[pos]
            waits[r] = table
        if len(waits) < 2:
            continue
        seqs = set.intersection(*(set(t) for t in waits.values()))
        for seq in seqs:
            per = {r: t[seq] for r, t in waits.items()}
            late = min(per.items(), key=lambda kv: kv[1])[0]
            margin_ms = (median(v for r, v in per.items() if r != late) - per[late]) / 1e6
            for r in per:
                taken[r] += 1
            if margin_ms >= opt.min_margin_ms:
                last[late] += 1
                margins[late].append(margin_ms)
                groups_of[late][key] += 1
                at = m.index[late][key].position_of(seq)
                if at is not None:
                    ops_of[late][m.dump(late).string(m.dump(late).columns["op"][at])] += 1
    findings: list[tuple[float, Finding]] = []
    for r, n in last.items():
        total = taken[r]
        if total < opt.min_samples or n / total < opt.min_fraction:
            continue
        typical = median(margins[r])
        if typical < opt.min_margin_ms:
            continue
        group = groups_of[r].most_common(1)[0][0]
        info = m.groups[group]
        d = m.dump(r)
        summary = (
            f"Rank {r} ({d.describe()}) arrived last at {n} of the {total} recent collectives it "
            f"took part in, typically {typical:.1f} ms after the others "
            f"(groups {', '.join(sorted(groups_of[r]))}); nothing hangs, but every peer waits for it"
        )
        findings.append(
            (
                n / total,
                Finding(
                    kind=FindingKind.STRAGGLER.value,
                    ranks=(r,),
                    summary=summary,
                    process_group=group,
                    pg_ranks=info.ranks,
                    op=ops_of[r].most_common(1)[0][0] if ops_of[r] else None,
                    evidence={
                        "last_arrivals": n,
                        "collectives": total,
                        "median_lateness_ms": round(typical, 3),
                        "groups": dict(groups_of[r]),
                    },
                ),
            )
        )
    findings.sort(key=lambda t: -t[0])
    return [f for _, f in findings]
