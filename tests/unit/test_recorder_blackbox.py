"""The recorder's real hot path writing into the black box, from several threads at once."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from flightrec.blackbox import read_blackbox  # noqa: E402
from flightrec.recorder.config import Config  # noqa: E402
from flightrec.recorder.runtime import Runtime  # noqa: E402
from tests.integration.jobs import free_port  # noqa: E402

THREADS = 6
CALLS = 150


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[Runtime]:
    dist.init_process_group(
        "gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{free_port()}",
        timeout=timedelta(seconds=20),
    )  # fmt: skip
    runtime = Runtime(Config(enabled=True, directory=str(tmp_path), timeout_s=3600, buffer=4096))
    runtime.enable()
    yield runtime
    runtime.disable()
    dist.destroy_process_group()


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
