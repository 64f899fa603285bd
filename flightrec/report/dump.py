"""``flightrec show``: one dump, readably (header, groups, entries, thread stacks)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from flightrec.analysis.facts.deaths import exceptions_of
from flightrec.analysis.model import FrameInfo, RankDump, TensorInfo, op_label, user_frame
from flightrec.format import flightrec_pb2 as pb
from flightrec.format.blackbox import SOURCE as BLACKBOX_SOURCE
from flightrec.format.schema import RECORDER_SOURCE
from flightrec.report.layout import code_line, compact_table, hanging, longest_token
from flightrec.text import compress


def _specs(ts: tuple[TensorInfo, ...]) -> str:
    return ", ".join(f"{t.dtype}[{'x'.join(map(str, t.shape))}]" for t in ts)


def _tensors(inputs: tuple[TensorInfo, ...], outputs: tuple[TensorInfo, ...]) -> str:
    """Inputs, then ``-> outputs`` where they differ (a recv or an all_gather has only outputs)."""
    shown_in, shown_out = _specs(inputs), _specs(outputs)
    if not shown_out or shown_out == shown_in:
        return shown_in
    return f"-> {shown_out}" if not shown_in else f"{shown_in} -> {shown_out}"


_STATES: dict[int, str] = {
    int(pb.ENQUEUED): "enqueued",
    int(pb.STARTED): "started",
    int(pb.COMPLETED): "done",
    int(pb.FAILED): "failed",
}


def _state(value: int) -> str:
    return _STATES.get(int(value), "?")


def _own_ids(d: RankDump) -> bool:
    """Whether record ids are flightrec's own (from 1; 0: an entry only PyTorch's recorder
    saw, merged in at dump time); converted native dumps keep torch's ids, which start at 0."""
    return d.header.source in ("", RECORDER_SOURCE, BLACKBOX_SOURCE)


def _record_id(d: RankDump, i: int) -> str:
    rid = d.dump.entries.record_id[i]
    return "-" if rid == 0 and _own_ids(d) else str(rid)


def _ring(d: RankDump) -> str:
    """``11 entries of 2000: 0 calls recorded by flightrec's hooks, 11 entries from PyTorch's
    recorder`` (a DDP job's reducer issues its all-reduces where only torch sees them)."""
    h = d.header
    text = f"{len(d)} entries" + (f" of {h.buffer_capacity}" if h.buffer_capacity else "")
    if not _own_ids(d):
        return text
    native = d.dump.entries.record_id.count(0)
    text += f": {h.entries_recorded} calls recorded by flightrec's hooks"
    return text + (f", {native} entries from PyTorch's recorder" if native else "")


class DumpRenderer:
    """Renders one rank's dump.

    Args:
        console: where to write.
        limit: newest entries shown (None: all).
    """

    def __init__(self, console: Console, limit: int | None = 100) -> None:
        self.console = console
        self.limit = limit

    def render(self, d: RankDump) -> None:
        """Header, process groups, the newest entries and every thread's stack."""
        c = self.console
        c.print(Text(f"{d.path}", style="bold"))
        for name, value in _facts(d):
            c.print(hanging(f"  {name:<14} ", value))
        c.print(_groups(d))
        c.print(self._entries(d))
        self._threads(d)
        for x in exceptions_of(d):  # what ended a thread: the traceback, raising frame first
            c.print(hanging("", f"Uncaught in {x.thread} ({x.via}): {x.type}: {x.message}", "bold"))
            self._frames(x.traceback)

    def _entries(self, d: RankDump) -> Table:
        n = len(d)
        first = 0 if self.limit is None else max(0, n - self.limit)
        title = "Entries (oldest first)" + (f", newest {n - first} of {n}" if first else "")
        rows = [_entry_row(d, i) for i in range(first, n)]
        entries = compact_table(title)
        # Short columns never wrap; op and tensors wrap between words only (their width never
        # goes below their longest token); file:line keeps its full width, the line number
        # being the point of it.
        for col in ("id", "group", "seq"):
            entries.add_column(col, no_wrap=True)
        entries.add_column("op", min_width=longest_token(row[3] for row in rows))
        entries.add_column("state", no_wrap=True)
        entries.add_column("tensors", min_width=longest_token(row[5] for row in rows))
        entries.add_column("ms", no_wrap=True, justify="right")
        entries.add_column(
            "where", no_wrap=True, min_width=max((len(r[7]) for r in rows), default=0)
        )
        for row in rows:
            entries.add_row(*row)
        return entries

    def _threads(self, d: RankDump) -> None:
        c = self.console
        threads = d.threads()
        if threads:
            c.print(Text("Threads at dump time (innermost frame first)", style="bold"))
        for t in threads:
            marks = [
                m
                for m, on in (
                    ("main", t.is_main),
                    ("in a collective", t.holds_recorder),
                    (f"child process {t.pid}", bool(t.pid)),  # a snapshot from outside
                    (f"still for {t.still_ms / 1000:.1f} s, {t.cpu_ms} ms CPU", bool(t.still_ms)),
                )
                if on
            ]
            c.print(Text(f"  {t.name}" + (f" ({', '.join(marks)})" if marks else "")))
            self._frames(t.stack)

    def _frames(self, stack: Sequence[FrameInfo]) -> None:
        for f in stack:
            self.console.print(hanging("      ", f"{f.where()} in {f.function}"))
            if f.code:
                self.console.print(code_line(10, f.code, style="dim"))


def _facts(d: RankDump) -> list[tuple[str, str]]:
    """The header, fact by fact."""
    h = d.header
    reason = pb.DumpReason.Name(h.reason) if h.reason in pb.DumpReason.values() else h.reason
    local = f"local rank {h.local_rank}" if h.local_rank >= 0 else "local rank not recorded"
    return [
        ("rank", f"{h.rank} of {h.world_size} ({local})"),
        ("host / pid", d.describe_process(" / ")),
        ("device", " ".join(x for x in (h.device, h.device_name, h.device_uuid) if x) or "-"),
        ("job / backend", f"{h.job_id or '-'} / {h.backend or '-'}"),
        (
            "versions",
            f"torch {h.torch_version or 'not recorded'}, "
            f"flightrec {h.flightrec_version or 'not recorded'}",
        ),
        ("source", h.source or "flightrec"),
        (
            "reason",
            f"{reason} #{h.dump_index}" + (f": {h.reason_detail}" if h.reason_detail else ""),
        ),
        ("ring", _ring(d)),
    ]


def _groups(d: RankDump) -> Table:
    groups = compact_table("Process groups")
    for col in (
        "group",
        "desc",
        "ranks",
        "backend",
        "issued",
        "dropped",
        "p2p (peer: sends/recvs)",
    ):
        groups.add_column(col)
    for key, g in zip(d.group_keys, d.dump.groups, strict=True):
        p2p = ", ".join(f"{pc.peer}: {pc.sends}/{pc.recvs}" for pc in g.p2p)
        groups.add_row(
            key, g.desc, compress(g.ranks), g.backend, str(g.last_seq), str(g.dropped), p2p
        )
    return groups


def _entry_row(d: RankDump, i: int) -> tuple[str, ...]:
    """Entry ``i``: id, group, seq, op, state, tensors, ms, where."""
    r = d.record(i)
    number = f"p2p {r.p2p_seq}" if r.is_p2p else str(r.seq)
    op = op_label(r.op + (f" {r.reduce_op}" if r.reduce_op else ""), r.flags)
    if r.peer >= 0:
        op += f" {'to' if r.flags & pb.SEND else 'from'} {r.peer}"
    took = f"{(r.complete_ns - r.enqueue_ns) / 1e6:.1f}" if r.complete_ns else "-"
    frame = user_frame(r.stack)
    return (
        _record_id(d, i),
        r.group,
        number,
        op,
        _state(r.state),
        _tensors(r.inputs, r.outputs),
        took,
        frame.where() if frame else "",
    )
