"""A rank's summary (``flightrec.format.summary``) as the analysis's view of a dump.

The view holds the summary's entries only; every earlier entry of the rank's ring reads as
overwritten, which the analysis already handles (it never takes a missing entry for a skipped
call). So the same passes that analyse full dumps analyse summaries.
"""

from __future__ import annotations

from flightrec.format import flightrec_pb2 as pb
from flightrec.format.builder import DumpBuilder, EntryValues
from flightrec.format.read import validate
from flightrec.format.schema import SUMMARY_SOURCE
from flightrec.format.summary import Frame, Summary
from flightrec.format.view import DumpView

SOURCE = SUMMARY_SOURCE
"""``Header.source`` of a view built from a summary."""


def summary_view(s: Summary, label: str = "") -> DumpView:
    """The view of one rank built from its summary.

    Args:
        s: a decoded (hence checked) summary.
        label: names it in errors.

    Raises:
        CorruptDumpError: the summary does not make a consistent dump.
    """
    code = {(f.file, f.line): f.code for f in _frames(s) if f.code}
    b = DumpBuilder(source=lambda file, line: code.get((file, line), ""))
    h = b.header
    h.rank, h.world_size, h.hostname, h.pid = s.rank, s.world_size, s.host, s.pid
    h.local_rank, h.device, h.job_id, h.backend = s.local_rank, s.device, s.job_id, s.backend
    h.reason = pb.DumpReason.Value(s.reason)  # type: ignore[assignment]
    h.reason_detail = f"summary through the job's store, request {s.round}"
    h.wall_time_ns, h.mono_time_ns, h.timeout_s = s.wall_ns, s.mono_ns, s.timeout_s
    h.requested_by = -1
    h.source = SOURCE
    entries: list[EntryValues] = []
    for g in s.groups:
        index = b.group(
            g.name, g.ranks, desc=g.desc, backend=g.backend, last_seq=g.last_seq,
            p2p=g.p2p, members_known=g.members_known,
        )  # fmt: skip
        for e in g.entries:
            entries.append(
                EntryValues(
                    record_id=e.record_id,
                    group=index,
                    op=e.op,
                    seq=e.seq,
                    p2p_seq=e.p2p_seq,
                    reduce_op=e.reduce_op,
                    peer=e.peer,
                    state=e.state,
                    enqueue_ns=e.enqueue_ns,
                    complete_ns=e.complete_ns,
                    flags=e.flags,
                    stack=[_raw(f) for f in e.stack],
                    inputs=[(t.shape, t.dtype) for t in e.inputs],
                    outputs=[(t.shape, t.dtype) for t in e.outputs],
                )
            )
    # Ring order. Entries only PyTorch's recorder saw (DDP's C++ reducer, functional
    # collectives) were merged in by time and carry record id 0: order by enqueue time.
    entries.sort(key=lambda e: (e.enqueue_ns, e.record_id))
    for values in entries:
        b.entry(values)
    h.entries_recorded = max((e.record_id for e in entries), default=0)
    pending = any(e.state != pb.COMPLETED for e in entries)
    b.thread(1, "MainThread", [_raw(f) for f in s.stack], is_main=True, holds_recorder=pending)
    for x in s.exceptions:
        b.exception(
            x.type, x.message, [_raw(f) for f in x.stack], thread=x.thread, is_main=x.is_main,
            wall_time_ns=x.wall_ns, via="summary",
        )  # fmt: skip
    dump = b.build()
    validate(dump, label or f"rank {s.rank}'s summary")
    return DumpView.of(dump)


def _frames(s: Summary) -> list[Frame]:
    return [
        *s.stack,
        *(f for g in s.groups for e in g.entries for f in e.stack),
        *(f for x in s.exceptions for f in x.stack),
    ]


def _raw(f: Frame) -> tuple[str, str, int]:
    return (f.file, f.function, f.line)
