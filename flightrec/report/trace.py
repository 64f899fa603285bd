"""The timeline: a Chrome Trace Event Format file (loads in ui.perfetto.dev and chrome://tracing).

One process per host, one track per rank (one per thread where a rank issued operations
from several), every operation with a known end a complete ("X") slice from its enqueue to
its completion, so a slice's length is the time the rank spent in it, mostly waiting for the
others. All times are on one clock, aligned from the dumps by the analysis
(``Report.timeline_clock``, estimated when first asked for), in microseconds from the earliest
event.

The timeline draws only what was recorded. An operation still in flight when its rank dumped
runs to the dump and is named ``... (incomplete)``. An operation whose end is unknown (an
entry only PyTorch's own recorder saw, such as DDP's reducer or DTensor under gloo, which
records no completion time; every entry of a dump that does not track completion; a failed
call) is an instant at its start whose ``args.note`` says what is known: drawing it up to the
dump would show a 20 s wait that never happened. The hang point of the first finding is a
global instant event, every rank's dump an instant on its track.

A thread whose slices overlap (async work still running as it issues the next) gets extra
tracks ("rank 3 · 2") next to its first, because a track's slices must nest.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TextIO

from flightrec.analysis.kinds import KINDS
from flightrec.analysis.model import FindingKind
from flightrec.format import flightrec_pb2 as pb
from flightrec.text import compress

if TYPE_CHECKING:
    from flightrec.analysis import Report
    from flightrec.analysis.model import RankDump

_COMPLETED = pb.COMPLETED
# Tracks per rank: rank r's lane k is thread id r * _LANES + k.
_LANES = 64


# Operations drawn as instants at their start, and the note each carries: their end is unknown.
_NOT_TRACKED = "not tracked"
_NO_END = "no end"
_FAILED = "failed"
_INSTANTS = {
    _NOT_TRACKED: "this dump does not record completion (a converted gloo dump): start only",
    _NO_END: "completed, completion time not recorded (an entry only PyTorch's own recorder "
    "saw, or one a later completed collective of its group shows done): start only",
    _FAILED: "failed; when is not recorded: start only",
}


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
        out: where to write.
        recent: newest entries per rank to include (all when None): a 1,000-rank job's full
            rings make a file of hundreds of megabytes.
    """

    def __init__(self, out: TextIO, recent: int | None = None) -> None:
        self.out = out
        self.recent = recent

    def render(self, report: Report) -> None:
        """Write the trace as JSON text."""
        trace = trace_dict(report, self.recent)
        self.out.write(json.dumps(trace, separators=(",", ":")) + "\n")


def trace_dict(report: Report, recent: int | None = None) -> dict[str, Any]:
    """The trace as a JSON-ready dict: ``traceEvents``, ``displayTimeUnit``, ``metadata``.

    Args:
        report: the analysis.
        recent: newest entries per rank to include (all when None).
    """
    return _Timeline(recent).to_dict(report)


class _Timeline:
    """Builds the trace of a report, rank by rank."""

    def __init__(self, recent: int | None) -> None:
        self.recent = recent

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
        marks: dict[int, set[str]] = {}  # ranks whose lane names the kind (a straggler)
        for f in report.findings:
            if KINDS[f.kind].marks_lanes:
                for r in f.ranks:
                    marks.setdefault(r, set()).add(str(f.kind))
        meta: list[dict[str, Any]] = []
        for h, pid in pid_of.items():
            meta.append(_meta("process_name", pid, 0, {"name": h}))
            meta.append(_meta("process_sort_index", pid, 0, {"sort_index": pid}))
        events: list[dict[str, Any]] = []
        for rank, d in sorted(dumps.items()):
            pid = pid_of[d.header.hostname or "host not recorded"]
            labels = self._rank_events(report, d, clock, pid, events)
            for lane, label in enumerate(labels):
                if d.header.device:
                    label += f" ({d.header.device})"
                if rank in marks and not lane:
                    label += " " + " ".join(sorted(marks[rank]))
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
    ) -> list[str]:
        """Append rank ``d``'s events; returns its tracks' labels (lane k is tid rank*_LANES+k).

        One track per thread that issued operations; a thread whose slices overlap (async
        work still running when it issued the next) gets extra lanes beside its own, because a
        track's slices must nest. An operation whose completion time is unknown is an instant
        at its start with a note saying what is known, never a slice invented up to the dump;
        only operations still in flight when the rank dumped run to the dump.
        """
        rank = d.rank
        dump_us = clock.us(rank, d.header.mono_time_ns) if d.header.mono_time_ns else None
        keys = d.group_keys
        groups = report.matched.groups
        descs = {k: groups[k].desc for k in keys if k in groups}
        threads = self._by_thread(d, clock, dump_us, self._done_upto(report, d))
        names = sorted(threads, key=lambda t: (-len(threads[t]), t))
        labels: list[str] = []
        for thread in names:
            first = len(labels)
            lanes = 0
            for start, end, i, shape, lane in _lanes(threads[thread]):
                if shape not in _INSTANTS:
                    lanes = max(lanes, lane + 1)
                tid = rank * _LANES + min(first + lane, _LANES - 1)
                out.append(self._event(d, i, start, end, shape, pid, tid, keys, descs))
            for lane in range(max(1, lanes)):
                label = f"rank {rank}"
                if len(names) > 1:
                    label += f" · {thread or 'thread not recorded'}"
                labels.append(label + (f" · {lane + 1}" if lane else ""))
        if dump_us is not None:
            out.append(_dump_event(d, dump_us, pid))
        return labels[:_LANES] or [f"rank {rank}"]

    def _done_upto(self, report: Report, d: RankDump) -> dict[int, int]:
        """Per group (the dump's index): a seq up to which every collective of this rank
        completed. Collectives of a group complete in the order they were issued, so an entry
        never marked complete (PyTorch's recorder missed its end) that a later completed one
        follows completed too; only its end time is unknown."""
        e = d.dump.entries
        groups = report.matched.groups
        done_upto: dict[int, int] = {}
        for local, k in enumerate(d.group_keys):
            p = groups[k].progress.get(d.rank) if k in groups else None
            if p is not None:
                done_upto[local] = p.last_completed
        for i in self._window(d):
            if e.state[i] == _COMPLETED and not e.flags[i] & pb.IS_P2P:
                g = e.group[i]
                done_upto[g] = max(done_upto.get(g, -1), e.seq[i])
        return done_upto

    def _by_thread(
        self, d: RankDump, clock: _Clock, dump_us: float | None, done_upto: dict[int, int]
    ) -> dict[str, list[tuple[float, float, int, str]]]:
        """Per issuing thread, its operations: (start, end, entry, shape)."""
        e = d.dump.entries
        rank = d.rank
        threads: dict[str, list[tuple[float, float, int, str]]] = {}
        for i in self._window(d):
            if not e.enqueue_ns[i]:
                continue
            start = clock.us(rank, e.enqueue_ns[i])
            shape, end = _extent(d, i, start, clock, dump_us, done_upto)
            thread = d.string(e.thread[i]) if e.thread[i] < len(d.dump.strings) else ""
            threads.setdefault(thread, []).append((start, end, i, shape))
        return threads

    def _event(
        self,
        d: RankDump,
        i: int,
        start: float,
        end: float,
        shape: str,
        pid: int,
        tid: int,
        keys: tuple[str, ...],
        descs: dict[str, str],
    ) -> dict[str, Any]:
        """One operation: a slice where its extent is known, else an instant with a note."""
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
        }
        if descs.get(key):
            args["group_desc"] = descs[key]
        if d.string(e.reduce_op[i]):
            args["reduce_op"] = d.string(e.reduce_op[i])
        if p2p or e.peer[i] >= 0:
            args["peer"] = e.peer[i]
        cat = "p2p" if p2p else "collective"
        if shape in _INSTANTS:
            if shape == _NOT_TRACKED:
                args["state"] = "not tracked"
            args["note"] = _INSTANTS[shape]
            return {
                "name": op if shape != _FAILED else f"{op} (failed)",
                "cat": cat + ",no_end",
                "ph": "i",
                "s": "t",
                "ts": start,
                "pid": pid,
                "tid": tid,
                "args": args,
            }
        args["wait_ms"] = round((end - start) / 1e3, 3)
        if shape == "open":
            args["note"] = "still running when the rank dumped: drawn up to the dump"
        return {
            "name": op if shape == "slice" else f"{op} ({state.lower()}, incomplete)",
            "cat": cat + ("" if shape == "slice" else ",incomplete"),
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
            (x for x in report.findings if KINDS[x.kind].hang and x.process_group),
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


def _extent(
    d: RankDump,
    i: int,
    start: float,
    clock: _Clock,
    dump_us: float | None,
    done_upto: dict[int, int],
) -> tuple[str, float]:
    """How entry ``i`` is drawn (a slice, or one of ``_INSTANTS``, or "open") and where it ends."""
    e = d.dump.entries
    state = e.state[i]
    p2p = bool(e.flags[i] & pb.IS_P2P)
    if state == _COMPLETED and e.complete_ns[i] and e.complete_ns[i] >= e.enqueue_ns[i]:
        return "slice", clock.us(d.rank, e.complete_ns[i])
    if not d.tracks_completion:
        return _NOT_TRACKED, start
    if state == _COMPLETED or (
        not p2p and state != pb.FAILED and 0 < e.seq[i] <= done_upto.get(e.group[i], -1)
    ):
        return _NO_END, start
    if state == pb.FAILED:
        return _FAILED, start
    # in flight when the rank dumped: its known extent runs to the dump
    return "open", max(start, dump_us if dump_us is not None else start)


def _lanes(
    items: list[tuple[float, float, int, str]],
) -> Iterator[tuple[float, float, int, str, int]]:
    """One thread's operations in time order, each with its lane: the first whose last slice
    ended by its start (slices of a track must nest); instants stay in lane 0."""
    lane_end: list[float] = []
    for start, end, i, shape in sorted(items):
        if shape in _INSTANTS:  # no extent: never needs a lane of its own
            lane = 0
        else:
            lane = next((k for k, t in enumerate(lane_end) if t <= start), len(lane_end))
            if lane == len(lane_end):
                lane_end.append(end)
            else:
                lane_end[lane] = end
        yield start, end, i, shape, lane


def _dump_event(d: RankDump, dump_us: float, pid: int) -> dict[str, Any]:
    """The instant the rank dumped, on its first lane."""
    return {
        "name": f"dump ({pb.DumpReason.Name(d.header.reason)})"
        if d.header.reason in pb.DumpReason.values()
        else "dump",
        "cat": "dump",
        "ph": "i",
        "s": "t",
        "ts": dump_us,
        "pid": pid,
        "tid": d.rank * _LANES,
        "args": {"rank": d.rank, "reason_detail": d.header.reason_detail},
    }


def _meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "ts": 0, "args": args}


def _straggler_onsets(
    report: Report, clock: _Clock, pid_of: dict[str, int]
) -> list[dict[str, Any]]:
    """Per straggler whose lateness has a trend: an instant on its track where it began
    (``flightrec.analysis.timing.trend``), named by its shape, with the trend in its arguments."""
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
