"""The timeline: a Chrome Trace Event Format file (loads in ui.perfetto.dev and chrome://tracing).

One process per host, one thread (track) per rank, every recorded operation a complete ("X")
slice from its enqueue to its completion, so a slice's length is the time the rank spent in
it, mostly waiting for the others. All times are on one clock, aligned from the dumps by the
analysis (``Report.timeline_clock``, estimated when first asked for), in microseconds from the
earliest event. Operations that never completed run to the rank's dump and are named
``... (incomplete)``; the hang point of the first finding is a global instant event, every
rank's dump an instant on its track.

A rank whose slices overlap (async work, collectives from two threads) gets extra tracks
("rank 3 · 2") next to its first, because a track's slices must nest.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from flightrec.analysis.model import FindingKind
from flightrec.format import flightrec_pb2 as pb
from flightrec.text import compress

if TYPE_CHECKING:
    from flightrec.analysis import Report
    from flightrec.analysis.model import RankDump

_COMPLETED = pb.COMPLETED
# Tracks per rank: rank r's lane k is thread id r * _LANES + k.
_LANES = 64


def _state_name(state: int) -> str:
    return pb.State.Name(state) if state in pb.State.values() else str(state)  # type: ignore[arg-type]


class _Clock:
    """Aligned microseconds from one rank's monotonic nanoseconds."""

    def __init__(self, report: Report) -> None:
        self.shift = report.timeline_clock.shift_ns
        self.origin = 0

    def us(self, rank: int, mono_ns: int) -> float:
        return round((mono_ns + self.shift[rank] - self.origin) / 1e3, 3)


class TraceRenderer:
    """Renders a ``Report`` as a Chrome Trace Event Format JSON object.

    Args:
        recent: newest entries per rank to include (all when None): a 1,000-rank job's full
            rings make a file of hundreds of megabytes.
    """

    def __init__(self, recent: int | None = None) -> None:
        self.recent = recent

    def render(self, report: Report) -> str:
        """The trace as JSON text."""
        return json.dumps(self.to_dict(report), separators=(",", ":")) + "\n"

    def to_dict(self, report: Report) -> dict[str, Any]:
        """The trace as a JSON-ready dict: ``traceEvents``, ``displayTimeUnit``, ``metadata``."""
        alignment = report.timeline_clock.alignment
        clock = _Clock(report)
        dumps = report.run.dumps
        starts = [
            d.dump.entries.enqueue_ns[i] + clock.shift[r]
            for r, d in dumps.items()
            for i in self._window(d)
            if d.dump.entries.enqueue_ns[i]
        ]
        clock.origin = min(starts, default=0)
        hosts = sorted({d.header.hostname or "host not recorded" for d in dumps.values()})
        pid_of = {h: i + 1 for i, h in enumerate(hosts)}
        stragglers = {
            r for f in report.findings if f.kind is FindingKind.STRAGGLER for r in f.ranks
        }
        meta: list[dict[str, Any]] = []
        for h, pid in pid_of.items():
            meta.append(_meta("process_name", pid, 0, {"name": h}))
            meta.append(_meta("process_sort_index", pid, 0, {"sort_index": pid}))
        events: list[dict[str, Any]] = []
        for rank, d in sorted(dumps.items()):
            pid = pid_of[d.header.hostname or "host not recorded"]
            lanes = self._rank_events(report, d, clock, pid, events)
            for lane in range(lanes):
                label = f"rank {rank}" + (f" · {lane + 1}" if lane else "")
                if d.header.device:
                    label += f" ({d.header.device})"
                if rank in stragglers and not lane:
                    label += " straggler"
                tid = rank * _LANES + lane
                meta.append(_meta("thread_name", pid, tid, {"name": label}))
                meta.append(_meta("thread_sort_index", pid, tid, {"sort_index": tid}))
        events += self._hang_point(report, clock)
        events += _straggler_onsets(report, clock, pid_of)
        # Per track in time order (viewers and validators expect it), metadata first.
        # Equal starts: the longer slice first, so that it is the parent.
        events.sort(key=lambda e: (e["pid"], e["tid"], e["ts"], -e.get("dur", 0)))
        return {
            "traceEvents": meta + events,
            "displayTimeUnit": "ms",
            "metadata": {
                "source": "flightrec",
                "world_size": report.world_size,
                "clock": {
                    "reference_rank": alignment.reference,
                    "origin_wall_time_ns": clock.origin,
                    "unaligned_ranks": list(alignment.unaligned),
                    "offsets_ms": {
                        str(r): {
                            "offset_ms": round(c.offset_ns / 1e6, 3),
                            "uncertainty_ms": round(c.uncertainty_ns / 1e6, 4),
                        }
                        for r, c in sorted(alignment.clocks.items())
                    },
                },
                "findings": [
                    {"kind": f.kind.value, "ranks": list(f.ranks), "summary": f.summary}
                    for f in report.findings
                ],
            },
        }

    def _window(self, d: RankDump) -> range:
        n = len(d)
        return range(max(0, n - self.recent) if self.recent is not None else 0, n)

    def _rank_events(
        self, report: Report, d: RankDump, clock: _Clock, pid: int, out: list[dict[str, Any]]
    ) -> int:
        """Append rank ``d``'s slices; returns the number of tracks (lanes) it needed."""
        e = d.dump.entries
        rank = d.rank
        dump_us = clock.us(rank, d.header.mono_time_ns) if d.header.mono_time_ns else None
        lane_end: list[float] = []
        keys = d.group_keys
        descs = {k: report.matched.groups[k].desc for k in keys if k in report.matched.groups}
        slices: list[tuple[float, float, int]] = []
        for i in self._window(d):
            if not e.enqueue_ns[i]:
                continue
            start = clock.us(rank, e.enqueue_ns[i])
            done = e.state[i] == _COMPLETED and e.complete_ns[i] >= e.enqueue_ns[i]
            if done:
                end = clock.us(rank, e.complete_ns[i])
            elif not d.tracks_completion:
                end = start  # completion not recorded (converted gloo dumps): a mark only
            else:
                end = max(start, dump_us if dump_us is not None else start)
            slices.append((start, end, i))
        slices.sort()
        for start, end, i in slices:
            # First lane free by this slice's start (slices of one lane never overlap).
            lane = next((k for k, t in enumerate(lane_end) if t <= start), len(lane_end))
            if lane == len(lane_end):
                lane_end.append(end)
            else:
                lane_end[lane] = end
            lane = min(lane, _LANES - 1)
            out.append(self._slice(d, i, start, end, pid, rank * _LANES + lane, keys, descs))
        if dump_us is not None:
            out.append(
                {
                    "name": f"dump ({pb.DumpReason.Name(d.header.reason)})"
                    if d.header.reason in pb.DumpReason.values()
                    else "dump",
                    "cat": "dump",
                    "ph": "i",
                    "s": "t",
                    "ts": dump_us,
                    "pid": pid,
                    "tid": rank * _LANES,
                    "args": {"rank": rank, "reason_detail": d.header.reason_detail},
                }
            )
        return max(1, min(len(lane_end), _LANES))

    def _slice(
        self,
        d: RankDump,
        i: int,
        start: float,
        end: float,
        pid: int,
        tid: int,
        keys: tuple[str, ...],
        descs: dict[str, str],
    ) -> dict[str, Any]:
        e = d.dump.entries
        op = d.string(e.op[i])
        key = keys[e.group[i]] if e.group[i] < len(keys) else str(e.group[i])
        state = _state_name(e.state[i])
        p2p = bool(e.flags[i] & pb.IS_P2P)
        inputs = d.tensors(e.inputs[i])
        outputs = d.tensors(e.outputs[i])
        args: dict[str, Any] = {
            "rank": d.rank,
            "group": key,
            "seq": e.p2p_seq[i] if p2p else e.seq[i],
            "op": op,
            "sizes": [list(t.shape) for t in inputs],
            "output_sizes": [list(t.shape) for t in outputs],
            "dtype": inputs[0].dtype if inputs else (outputs[0].dtype if outputs else ""),
            "state": state,
            "wait_ms": round((end - start) / 1e3, 3),
        }
        if descs.get(key):
            args["group_desc"] = descs[key]
        if d.string(e.reduce_op[i]):
            args["reduce_op"] = d.string(e.reduce_op[i])
        if p2p or e.peer[i] >= 0:
            args["peer"] = e.peer[i]
        complete = e.state[i] == _COMPLETED or not d.tracks_completion
        if not d.tracks_completion:
            args["state"] = "not tracked"
        return {
            "name": op if complete else f"{op} ({state.lower()}, incomplete)",
            "cat": ("p2p" if p2p else "collective") + ("" if complete else ",incomplete"),
            "ph": "X",
            "ts": start,
            "dur": round(max(0.0, end - start), 3),
            "pid": pid,
            "tid": tid,
            "args": args,
        }

    def _hang_point(self, report: Report, clock: _Clock) -> list[dict[str, Any]]:
        """A global instant where the first hang finding's collective stalled."""
        f = next(
            (x for x in report.findings if x.kind is not FindingKind.STRAGGLER and x.process_group),
            None,
        )
        if f is None or f.process_group is None or f.seq is None:
            return []
        entered: list[tuple[float, int]] = []
        if f.process_group is not None and f.seq is not None:
            for r in f.pg_ranks:
                rec = report.matched.record(r, f.process_group, f.seq)
                if r in report.run.dumps and rec is not None and rec.enqueue_ns:
                    entered.append((clock.us(r, rec.enqueue_ns), r))
        if not entered:
            # No single collective (a P2P cycle, a desync): where each blamed rank first
            # blocked, the latest of those.
            for r in f.ranks:
                stuck = report.matched.incomplete.get(r, ())
                d = report.run.dumps.get(r)
                if d is not None and stuck and d.tracks_completion:
                    entered.append((clock.us(r, d.dump.entries.enqueue_ns[stuck[0]]), r))
        if not entered:
            return []
        ts, rank = max(entered)
        d = report.run.dumps[rank]
        return [
            {
                "name": f"hang: {f.kind}"
                + (f" {f.op or ''} #{f.seq} on group {f.process_group}" if f.seq else "")
                + f", ranks {compress(f.ranks)}",
                "cat": "hang",
                "ph": "i",
                "s": "g",
                "ts": ts,
                "pid": 0,
                "tid": 0,
                "args": {"summary": f.summary, "host": d.header.hostname},
            }
        ]


def _meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "ts": 0, "args": args}


def _straggler_onsets(
    report: Report, clock: _Clock, pid_of: dict[str, int]
) -> list[dict[str, Any]]:
    """Per straggler whose lateness has a trend: an instant on its track where it began
    (``flightrec.analysis.trend``), named by its shape, with the trend in its arguments."""
    out: list[dict[str, Any]] = []
    for f in report.findings:
        trend = getattr(f.evidence, "trend", None)
        if f.kind is not FindingKind.STRAGGLER or trend is None or not f.ranks:
            continue
        rank = f.ranks[0]
        d = report.run.dumps.get(rank)
        if d is None:
            continue
        # The trend's times are wall-anchored on the group's lowest member's clock.
        anchor = min(f.pg_ranks) if f.pg_ranks else rank
        ts = (
            trend.onset_ns - report.timeline_clock.alignment.offset_ns(anchor) - clock.origin
        ) / 1e3
        out.append(
            {
                "name": f"straggler {'since' if trend.onset_seen else 'from'} here: {trend.shape}",
                "cat": "straggler",
                "ph": "i",
                "s": "t",
                "ts": round(max(0.0, ts), 3),
                "pid": pid_of[d.header.hostname or "host not recorded"],
                "tid": rank * _LANES,
                "args": {
                    "shape": trend.shape,
                    "onset_seen": trend.onset_seen,
                    "before_ms": trend.before_ms,
                    "after_ms": trend.after_ms,
                    "late_share": trend.late_share,
                    "growth_ms_per_min": trend.growth_ms_per_min,
                    "sparkline": trend.sparkline,
                },
            }
        )
    return out
