"""How a process ended, as the dump header's enum (schema 1.7), and as older headers say it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flightrec.format import flightrec_pb2 as pb
from flightrec.format.blackbox import DIED, RUNNING_NOW, SOURCE, Status, UnseenRow
from flightrec.format.ending import is_gone, process_end
from flightrec.format.slot import SLOT_SIZE
from flightrec.readers.blackbox import died, ended, read_blackbox
from flightrec.recorder.recording.blackbox import BlackBox
from flightrec.recorder.recording.unseen import UnseenBook


def header(**fields: object) -> pb.Header:
    return pb.Header(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "end"),
    [
        # Before 1.7: the reason and a black box's words say it.
        ({"reason": pb.PROCESS_EXIT, "source": "flightrec"}, pb.END_EXITED),
        ({"reason": pb.WATCHDOG_TIMEOUT, "source": "flightrec"}, pb.END_UNKNOWN),
        ({"reason": pb.BLACKBOX, "source": SOURCE, "reason_detail": f"pid 7: {DIED} (x)"}, pb.END_DIED),
        ({"reason": pb.BLACKBOX, "source": SOURCE, "reason_detail": f"pid 7: {RUNNING_NOW}"}, pb.END_RUNNING),
        ({"reason": pb.BLACKBOX, "source": SOURCE, "reason_detail": "pid 7: the process exited healthy"}, pb.END_EXITED),
        ({"reason": pb.CONVERTED, "source": "torch-native-json"}, pb.END_UNKNOWN),
        # From 1.7: the field, whatever the words.
        ({"reason": pb.BLACKBOX, "source": SOURCE, "reason_detail": DIED, "process_end": pb.END_RUNNING}, pb.END_RUNNING),
        ({"reason": pb.API_CALL, "source": "flightrec", "process_end": pb.END_RUNNING}, pb.END_RUNNING),
    ],
)  # fmt: skip
def test_the_field_wins_and_older_headers_read_as_before(
    fields: dict[str, object], end: int
) -> None:
    h = header(**fields)
    assert process_end(h) == end
    assert is_gone(h) == (end in (pb.END_EXITED, pb.END_DIED))
    assert died(h) == (h.source == SOURCE and end == pb.END_DIED)
    assert ended(h) == (h.source == SOURCE and is_gone(h))


def blackbox(directory: Path) -> BlackBox:
    bb = BlackBox(str(directory), 4, SLOT_SIZE, 4, 2.0, nameless=False)
    bb.identify(0, 2, "job", "gloo", "2.x")
    return bb


def test_a_black_box_says_how_its_process_ended(tmp_path: Path) -> None:
    running = blackbox(tmp_path / "running")  # this process: alive
    assert read_blackbox(running.path).header.process_end == pb.END_RUNNING
    exited = blackbox(tmp_path / "exited")
    exited.close(healthy=False)
    assert read_blackbox(exited.path).header.process_end == pb.END_EXITED
    dead = blackbox(tmp_path / "dead")
    gone = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # never a running process
    dead.head[24:32] = gone.to_bytes(8, "little")
    h = read_blackbox(dead.path).header
    assert h.process_end == pb.END_DIED and died(h) and ended(h)
    assert int.from_bytes(exited.head[40:44], "little") == Status.EXITED
    assert os.getpid() == running.pid


def test_the_unseen_table_is_rewritten_only_when_a_row_changed() -> None:
    written: list[list[UnseenRow]] = []
    book = UnseenBook(written.append)
    row = UnseenRow(group=0, flags=0, issued=4, pending=0, op="", since_ns=0)
    book.write([row])
    book.write([row])
    book.write([row._replace(issued=5)])
    assert [r[0].issued for r in written] == [4, 5]
    assert book.unnamed({"a", "b"}) and book.unnamed({"a", "b"}) == []
