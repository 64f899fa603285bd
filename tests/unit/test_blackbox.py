"""The black box's file format: written through the recorder's own ring and tables, read back."""

from __future__ import annotations

import inspect
import os
import sys
import time
from pathlib import Path

import pytest

from flightrec.analysis import analyze
from flightrec.analysis.loading.loader import load_dir
from flightrec.errors import CorruptDumpError, NotADumpError, UnsupportedVersionError
from flightrec.format import flightrec_pb2 as pb
from flightrec.format.blackbox import BEAT, HEADER_SIZE, OFF_BEAT, Status, UnseenRow, fixed
from flightrec.format.builder import DumpBuilder, EntryValues
from flightrec.format.members import members_of
from flightrec.format.schema import dump_filename
from flightrec.format.slot import COMPLETED, ENQUEUED, SLOT_SIZE
from flightrec.format.write import write_dump
from flightrec.frames import origin_of
from flightrec.readers.blackbox import is_blackbox, read_blackbox
from flightrec.recorder.hotpath.groups import GroupInfo
from flightrec.recorder.hotpath.ring import Ring
from flightrec.recorder.recording.blackbox import BlackBox
from flightrec.recorder.recording.stacks import StackTable
from flightrec.recorder.recording.tables import StringTable, TensorTable


class Recording:
    """A ring and tables wired to a black box, as ``Recorder`` wires them."""

    def __init__(self, directory: Path, capacity: int = 8) -> None:
        self.bb = BlackBox(str(directory), capacity, SLOT_SIZE, 4, 2.0, nameless=False)
        self.ring = Ring(capacity, self.bb.slots)
        self.strings = StringTable(self.bb.on_string)
        self.tensors = TensorTable(self.bb.on_tensors)
        self.stacks = StackTable(4, self.bb.on_stack)
        self.group = GroupInfo(0, "0", "default_pg", (0, 1, 2, 3), "gloo")
        self.bb.on_group(self.group)

    def call(self, op: str, shape: tuple[int, ...], done: bool = True) -> int:
        """One collective issued from this function's caller, as the hot path records it."""
        stack = self.stacks.capture(sys._getframe(1), 1)
        sig = self.tensors.add(("sig", shape), lambda: ((shape, "float32"),))
        rid = self.ring.append(
            100, ENQUEUED, self.group.next_seq(), 0, 0, self.strings.of(op, lambda: op), 0, -1,
            self.strings.of("MainThread", lambda: "MainThread"), stack, sig, sig,
            self.strings.of("cpu", lambda: "cpu"), 0,
        )  # fmt: skip
        if done:
            self.ring.finish(rid, COMPLETED, 200)
        return rid


def train_step(rec: Recording, n: int) -> None:
    for _ in range(n):
        rec.call("all_reduce", (4,))  # the line a reader must name


def test_a_killed_process_leaves_its_entries_stacks_and_groups(tmp_path: Path) -> None:
    rec = Recording(tmp_path)
    rec.bb.identify(1, 4, "job-7", "gloo", "2.x")
    train_step(rec, 3)
    rec.call("broadcast", (2, 2), done=False)
    # Nothing is flushed or closed: this is what a SIGKILL leaves.
    ring = tmp_path / f"flightrec-rank00001-{rec.bb.host}-{rec.bb.pid}.ring"
    assert rec.bb.path == ring and is_blackbox(ring)
    dump = read_blackbox(ring)
    h = dump.header
    assert (h.rank, h.world_size, h.job_id, h.backend) == (1, 4, "job-7", "gloo")
    assert h.reason == pb.BLACKBOX and h.source == "flightrec-blackbox"
    assert "still running" in h.reason_detail  # this test's own process wrote it
    e = dump.entries
    assert [dump.strings[o] for o in e.op] == ["all_reduce"] * 3 + ["broadcast"]
    assert list(e.seq) == [1, 2, 3, 4]
    assert list(e.state) == [COMPLETED] * 3 + [ENQUEUED]
    spec = dump.tensor_specs[e.inputs[3]]
    assert list(spec.dims) == [2, 2] and [dump.strings[d] for d in spec.dtype] == ["float32"]
    top = dump.frames[dump.stacks[e.stack[0]].frames[0]]
    assert dump.strings[top.name] == "train_step" and top.line > 0
    assert dump.strings[top.file] == __file__
    g = dump.groups[0]
    assert (g.name, list(members_of(g)), g.last_seq) == ("0", [0, 1, 2, 3], 4)


def test_torn_slots_and_journal_lines_are_dropped(tmp_path: Path) -> None:
    rec = Recording(tmp_path)
    train_step(rec, 2)
    # A kill in the middle of writing slot 1: its last word (the record id copy) is stale.
    rec.bb.slots[2 * SLOT_SIZE - 8 : 2 * SLOT_SIZE] = (99).to_bytes(8, "little")
    with open(rec.bb._tables_path(rec.bb.path), "ab") as f:
        f.write(b'["s", 77, "half a li')
    dump = read_blackbox(rec.bb.path)
    assert list(dump.entries.record_id) == [1]
    assert "1 torn or unresolvable slots dropped" in dump.header.reason_detail


def test_source_lines_are_journaled_off_the_calling_thread(tmp_path: Path) -> None:
    rec = Recording(tmp_path)
    train_step(rec, 1)
    top = read_blackbox(rec.bb.path)
    assert top.frames[top.stacks[top.entries.stack[0]].frames[0]].code == 0  # no tick yet
    rec.bb.write_sources()  # what the watchdog's tick does
    dump = read_blackbox(rec.bb.path)
    frame = dump.frames[dump.stacks[dump.entries.stack[0]].frames[0]]
    assert dump.strings[frame.code] == 'rec.call("all_reduce", (4,))  # the line a reader must name'
    # ... with whose code each frame is, as this process judges it (schema 1.6)
    assert top.frames[0].origin == pb.ORIGIN_UNKNOWN
    assert frame.origin == origin_of(__file__) == pb.ORIGIN_USER
    assert {f.origin for f in dump.frames} <= {pb.ORIGIN_USER, pb.ORIGIN_FRAMEWORK, pb.ORIGIN_CORE}


def test_hostile_journal_lines_are_bad_lines_not_crashes(tmp_path: Path) -> None:
    rec = Recording(tmp_path)
    train_step(rec, 2)
    with open(rec.bb._tables_path(rec.bb.path), "ab") as f:
        f.write(b"[" * 200_000 + b"\n")  # nested past the JSON parser's recursion limit
        f.write(b'["s", 1e400, "x"]\n["f", 9, "a.py", "f", 1e400]\n["c", 1, 5]\n')
    dump = read_blackbox(rec.bb.path)
    assert list(dump.entries.record_id) == [1, 2]


def test_a_number_past_its_field_is_one_clear_error(tmp_path: Path) -> None:
    # Found by the long fuzz run: a damaged header pid does not fit the dump's 32-bit field.
    rec = Recording(tmp_path)
    train_step(rec, 1)
    rec.bb.head[24:32] = (-6939620822281604851).to_bytes(8, "little", signed=True)
    with pytest.raises(CorruptDumpError, match="out of range"):
        read_blackbox(rec.bb.path)


def test_the_ring_wraps_and_the_reader_keeps_the_newest(tmp_path: Path) -> None:
    rec = Recording(tmp_path, capacity=4)
    train_step(rec, 10)
    dump = read_blackbox(rec.bb.path)
    assert list(dump.entries.record_id) == [7, 8, 9, 10]
    assert dump.header.entries_recorded == 10


def test_healthy_exit_deletes_the_files_unhealthy_exit_keeps_them(tmp_path: Path) -> None:
    healthy = Recording(tmp_path / "a")
    train_step(healthy, 1)
    healthy.bb.close(healthy=True)
    assert not (tmp_path / "a").exists()  # the folder it created goes too, when empty
    healthy.call("all_reduce", (4,))  # a late write into the unlinked map is harmless

    sick = Recording(tmp_path / "b")
    sick.call("all_reduce", (4,), done=False)
    sick.bb.close(healthy=False)
    dump = read_blackbox(sick.bb.path)
    assert "exited with unfinished or failed operations" in dump.header.reason_detail
    assert int.from_bytes(sick.bb.head[40:44], "little") == Status.EXITED


def test_other_files_and_versions_are_refused(tmp_path: Path) -> None:
    other = tmp_path / "x.ring"
    other.write_bytes(b"\0" * HEADER_SIZE)
    assert not is_blackbox(other)
    with pytest.raises(NotADumpError):
        read_blackbox(other)
    rec = Recording(tmp_path)
    rec.bb.head[8:12] = (99).to_bytes(4, "little")
    with pytest.raises(UnsupportedVersionError, match="version 99"):
        read_blackbox(rec.bb.path)


def test_a_rank_that_died_with_nobody_waiting_is_still_named(tmp_path: Path) -> None:
    # Rank 1 died after its last collective; rank 0 finished the same three and dumped.
    rec = Recording(tmp_path, capacity=8)
    rec.group = GroupInfo(0, "0", "default_pg", (0, 1), "gloo")
    rec.bb.on_group(rec.group)
    rec.bb.identify(1, 2, "job-7", "gloo", "2.x")
    train_step(rec, 3)
    # A pid the kernel never hands out: a process that no longer runs.
    gone = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
    rec.bb.head[24:32] = gone.to_bytes(8, "little")
    b = DumpBuilder()
    h = b.header
    h.rank, h.world_size, h.job_id, h.pid, h.reason = 0, 2, "job-7", 1, pb.API_CALL
    h.source = "flightrec"
    h.wall_time_ns, h.mono_time_ns = time.time_ns(), 10_000
    b.group("0", [0, 1], desc="default_pg", backend="gloo", last_seq=3)
    for seq in (1, 2, 3):
        b.entry(EntryValues(seq, 0, "all_reduce", seq=seq, state=pb.COMPLETED, enqueue_ns=100,
                            complete_ns=200, thread="MainThread", device="cpu",
                            inputs=[((4,), "float32")], outputs=[((4,), "float32")]))  # fmt: skip
    write_dump(b.build(), tmp_path, dump_filename(0, 0, "API_CALL", 1))

    report = analyze(load_dir(tmp_path))
    first = report.findings[0]
    line = (
        inspect.getsource(train_step)
        .splitlines()
        .index('        rec.call("all_reduce", (4,))  # the line a reader must name')
        + train_step.__code__.co_firstlineno
    )
    assert first.kind == "dead_rank" and first.ranks == (1,)
    assert "died after completing all_reduce #3" in first.summary
    assert f"its last call was at unit/test_blackbox.py:{line}" in first.summary, first.summary
    assert "never entered" not in first.summary


def test_a_forked_child_never_touches_its_parents_black_box(tmp_path: Path) -> None:
    rec = Recording(tmp_path)
    train_step(rec, 1)
    pid = os.fork()
    if pid == 0:  # the child: what its inherited atexit handler would do
        rec.bb.close(healthy=True)
        rec.bb.identify(5, 8, "other", "gloo", "")
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    assert rec.bb.path.exists()
    assert read_blackbox(rec.bb.path).header.rank == -1


def test_a_black_box_from_another_host_is_judged_by_its_heartbeat(tmp_path: Path) -> None:
    # Analyzed from a login node: the process cannot be looked up, its heartbeat can.
    rec = Recording(tmp_path)
    rec.bb.identify(1, 4, "job-7", "gloo", "2.x")
    train_step(rec, 1)
    rec.bb._fields["hostname"] = fixed("node-elsewhere", 64)
    rec.bb._write_header()
    rec.bb.heartbeat()
    assert (
        "still running as far as another host can tell"
        in read_blackbox(rec.bb.path).header.reason_detail
    )
    hour_ago = time.time_ns() - 3600 * 10**9
    BEAT.pack_into(rec.bb.head, OFF_BEAT, hour_ago, time.monotonic_ns())
    detail = read_blackbox(rec.bb.path).header.reason_detail
    assert "died" in detail and "heartbeat stopped 3600 s before this analysis" in detail


def test_a_live_rank_that_never_dumped_is_read_from_its_black_box(tmp_path: Path) -> None:
    # Rank 1 is alive (this process) but wrote no dump; rank 0 waits in all_reduce #4.
    rec = Recording(tmp_path, capacity=8)
    rec.group = GroupInfo(0, "0", "default_pg", (0, 1), "gloo")
    rec.bb.on_group(rec.group)
    rec.bb.identify(1, 2, "job-7", "gloo", "2.x")
    train_step(rec, 3)
    b = DumpBuilder()
    h = b.header
    h.rank, h.world_size, h.job_id, h.pid, h.reason = 0, 2, "job-7", 1, pb.WATCHDOG_TIMEOUT
    h.source, h.timeout_s = "flightrec", 1.0
    h.wall_time_ns, h.mono_time_ns = time.time_ns(), 60_000_000_000
    b.group("0", [0, 1], desc="default_pg", backend="gloo", last_seq=4)
    for seq in (1, 2, 3, 4):
        b.entry(EntryValues(seq, 0, "all_reduce", seq=seq, enqueue_ns=100,
                            state=pb.COMPLETED if seq < 4 else pb.ENQUEUED,
                            complete_ns=200 if seq < 4 else 0, thread="MainThread",
                            device="cpu", inputs=[((4,), "float32")],
                            outputs=[((4,), "float32")]))  # fmt: skip
    write_dump(b.build(), tmp_path, dump_filename(0, 0, "WATCHDOG_TIMEOUT", 1))

    first = analyze(load_dir(tmp_path)).findings[0]
    assert first.kind == "not_arrived" and first.ranks == (1,), first.summary
    assert "wrote no dump; its black box shows all_reduce #3 done" in first.summary
    assert "died" not in first.summary


def _raise_in_compute_loss() -> None:
    raise ValueError("loss is NaN")  # the raising line a reader must name


def test_the_exception_a_process_died_of_is_in_its_black_box(tmp_path: Path) -> None:
    from flightrec.analysis.facts.deaths import exceptions_of
    from flightrec.analysis.model import RankDump
    from flightrec.recorder.dumping.exceptions import describe

    rec = Recording(tmp_path)
    rec.bb.identify(2, 4, "job-7", "gloo", "2.x")
    train_step(rec, 2)
    try:
        _raise_in_compute_loss()
    except ValueError as exc:
        rec.bb.on_exception(describe(exc, None, "sys.excepthook"))
    rec.bb.close(healthy=False)
    dump = read_blackbox(rec.bb.path)
    assert "exited of an uncaught ValueError" in dump.header.reason_detail
    (x,) = exceptions_of(RankDump(str(rec.bb.path), dump))
    assert (x.type, x.message, x.is_main, x.via) == (
        "ValueError",
        "loss is NaN",
        True,
        "sys.excepthook",
    )
    assert x.traceback[0].function == "_raise_in_compute_loss"
    assert (
        x.traceback[0].code
        == 'raise ValueError("loss is NaN")  # the raising line a reader must name'
    )
    assert x.traceback[1].function == "test_the_exception_a_process_died_of_is_in_its_black_box"


def test_a_wait_only_torchs_recorder_saw_is_read_back_from_the_header(tmp_path: Path) -> None:
    """DDP's bucket all-reduces never reach the ring: torch's counts in the header say how far
    each rank got and where one waits, and the analysis names the rank that never arrived,
    with no tensors to disagree about."""
    recs = []
    for rank in (0, 1):
        rec = Recording(tmp_path / f"r{rank}")
        rec.group = GroupInfo(0, "0", "default_pg", (0, 1), "gloo")
        rec.bb.on_group(rec.group)
        rec.bb.identify(rank, 2, "job-7", "gloo", "2.x")
        # Two processes the kernel never hands out (they no longer run).
        gone = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1 + rank
        rec.bb.head[24:32] = gone.to_bytes(8, "little")
        train_step(rec, 2)  # numbered alike: 1, 2
        recs.append(rec)
    # Rank 0 then ran buckets #3..#5 from C++ and waits in #5; rank 1 stopped after #4.
    recs[0].bb.unseen([UnseenRow(0, pb.DDP_BUCKET, 5, 5, "all_reduce", 12_345)])
    recs[1].bb.unseen([UnseenRow(0, 0, 4, 0, "", 0)])
    d0 = read_blackbox(recs[0].bb.path)
    assert d0.groups[0].last_seq == 5
    e = d0.entries
    assert (list(e.seq), e.state[-1], e.enqueue_ns[-1]) == ([1, 2, 5], pb.ENQUEUED, 12_345)
    assert e.flags[-1] == pb.DDP_BUCKET | pb.UNSEEN and d0.strings[e.op[-1]] == "all_reduce"
    assert read_blackbox(recs[1].bb.path).groups[0].last_seq == 4

    report = analyze(load_dir(tmp_path))
    first = report.findings[0]
    assert first.ranks == (1,) and first.seq == 5, first
    assert "never entered DDP gradient-bucket all_reduce #5" in first.summary, first.summary
    assert all(f.kind != "mismatch" for f in report.findings), report.findings


def test_an_unseen_row_at_or_below_what_the_ring_holds_adds_nothing(tmp_path: Path) -> None:
    rec = Recording(tmp_path)
    rec.bb.identify(0, 4, "job-7", "gloo", "2.x")
    train_step(rec, 3)
    rec.bb.unseen([UnseenRow(0, 0, 3, 3, "all_reduce", 1)])  # the ring's own #3: nothing new
    d = read_blackbox(rec.bb.path)
    assert list(d.entries.seq) == [1, 2, 3] and d.groups[0].last_seq == 3


def test_an_unseen_row_torch_gave_no_number_is_left_out(tmp_path: Path) -> None:
    """torch answers -1 for a group it has not numbered (P2P only, as in a pipelining job):
    that row is dropped, the others are written, and nothing is raised into the watchdog."""
    rec = Recording(tmp_path)
    rec.bb.identify(0, 4, "job-7", "gloo", "2.x")
    train_step(rec, 2)
    rec.bb.unseen(
        [
            UnseenRow(1, 0, -1, 0, "", 0),
            UnseenRow(0, 0, 4, 0, "", 0),
            UnseenRow(2, 0, 3, -1, "send", 5),
        ]
    )
    d = read_blackbox(rec.bb.path)
    assert d.groups[0].last_seq == 4


def test_the_verdict_in_the_log_reads_black_boxes_of_ranks_that_answered_nothing(
    tmp_path: Path,
) -> None:
    """A rank aborted inside the backend publishes no summary: the reporter reads its black
    box from its own FLIGHTREC_DIR, this job's only."""
    from flightrec.live.verdict import local_blackboxes

    rec = Recording(tmp_path)
    rec.bb.identify(1, 4, "job-7", "gloo", "2.x")
    train_step(rec, 2)
    found = local_blackboxes(str(tmp_path), {1, 2}, {"job-7"})
    assert list(found) == [1] and len(found[1]) == 2
    assert local_blackboxes(str(tmp_path), {1}, {"job-8"}) == {}
    assert local_blackboxes(str(tmp_path / "nowhere"), {1}, {"job-7"}) == {}
