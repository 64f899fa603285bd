"""The recorder's real hot path writing into the black box, from several threads at once."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from flightrec.readers.blackbox import read_blackbox  # noqa: E402
from flightrec.recorder.runtime import Runtime  # noqa: E402
from tests.integration.gloo import one_rank_gloo, traced_runtime  # noqa: E402

THREADS = 6
CALLS = 150


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[Runtime]:
    with one_rank_gloo(), traced_runtime(tmp_path, buffer=4096) as runtime:
        yield runtime


def test_entries_written_from_several_threads_stay_intact(rt: Runtime) -> None:
    bb = rt.recorder.blackbox
    assert bb is not None
    rt.start_background()  # labels the file with the rank, as init_process_group does
    assert bb.path.name.startswith("flightrec-rank00000-")
    start = threading.Barrier(THREADS)

    def worker(k: int) -> None:
        t = torch.ones(k + 1)  # each thread's own size: an entry must keep its thread's shape
        start.wait()
        for _ in range(CALLS):
            dist.all_reduce(t)

    threads = [
        threading.Thread(target=worker, args=(k,), name=f"worker-{k}") for k in range(THREADS)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    dump = read_blackbox(bb.path)  # the file, as a process killed now would leave it
    e = dump.entries
    assert "torn" not in dump.header.reason_detail
    assert list(e.record_id) == list(range(1, THREADS * CALLS + 1))
    assert sorted(e.seq) == list(range(1, THREADS * CALLS + 1))  # no number handed out twice
    per_thread: dict[str, int] = {}
    for i in range(len(e.record_id)):
        thread = dump.strings[e.thread[i]]
        spec = dump.tensor_specs[e.inputs[i]]
        assert list(spec.dims) == [int(thread.removeprefix("worker-")) + 1], thread
        assert dump.strings[e.op[i]] == "all_reduce" and e.state[i] == 3
        per_thread[thread] = per_thread.get(thread, 0) + 1
    assert per_thread == {f"worker-{k}": CALLS for k in range(THREADS)}
