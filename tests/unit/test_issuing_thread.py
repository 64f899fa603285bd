"""A rank's place comes from the thread that issues its collectives (``format/threads.py``).

Ray Train runs the training function in a thread of its own while the main thread sits in
Ray's worker loop: the verdict must name the stalled line of the training thread, from full
dumps and from the summaries of the verdict in the job's log alike.
"""

from __future__ import annotations

from dataclasses import replace

from factories import Job, user_stack

from flightrec.analysis import RankDump, analyze
from flightrec.analysis.loading.loader import Run
from flightrec.format import summary as fs
from flightrec.format.threads import issuing_thread, where_thread
from flightrec.readers.summary import summary_view

RAY_LOOP = [
    ("/venv/lib/python3.11/site-packages/ray/_private/worker.py", "Worker.main_loop", 1069),
    ("/venv/lib/python3.11/site-packages/ray/_private/workers/default_worker.py", "<module>", 330),
]


def ray_job() -> Job:
    """Four ranks whose collectives all come from the thread "train_fn"; rank 2 stalls there
    (the others wait in the fourth all_reduce); every main thread is in Ray's loop."""
    job = Job()
    for _ in range(3):
        job.collective()
    job.collective(ranks=[0, 1, 3], complete=False)
    for r, st in job.ranks.items():
        st.entries = [replace(e, thread="train_fn") for e in st.entries]
        pending = r != 2
        train = list(st.entries[-1].stack) if pending else user_stack("load_shard", 31)[1:]
        st.threads = [("MainThread", RAY_LOOP, True, False), ("train_fn", train, False, pending)]
    return job


def test_the_verdict_names_the_line_of_the_thread_that_issues_the_collectives() -> None:
    first = analyze(ray_job().run()).findings[0]
    assert first.ranks == (2,)
    assert "load_shard at job/train.py:31" in first.summary, first.summary
    assert "main_loop" not in first.summary


def test_the_summary_in_the_log_carries_that_threads_stack() -> None:
    job = ray_job()
    summaries = {r: fs.decode(fs.encode(fs.summarize(job.build(r), 1, ""))) for r in job.ranks}
    dumps = {r: RankDump(f"rank {r}", summary_view(s)) for r, s in summaries.items()}
    first = analyze(Run(dumps, 4, (), ())).findings[0]
    assert first.ranks == (2,)
    assert "load_shard at job/train.py:31" in first.summary, first.summary
    assert summary_view(summaries[2]).threads[0].name == "train_fn"


class _T:
    def __init__(self, name: str, is_main: bool = False, holds: bool = False, frames: int = 1):
        self.name, self.is_main, self.holds_recorder, self.frames = name, is_main, holds, frames


def test_the_choice_of_thread() -> None:
    strings = ["", "MainThread", "train_fn", "ckpt"]
    # most of the newest entries come from the main thread; a side thread's newest one does
    # not move the rank's place there
    assert issuing_thread([1, 1, 1, 3], strings) == "MainThread"
    assert issuing_thread([2, 2, 0, 0], strings) == "train_fn"  # 0: entries only torch saw
    assert issuing_thread([0, 0], strings) == ""
    assert issuing_thread([9], strings) == ""  # an index out of the table says nothing
    main, train = _T("MainThread", is_main=True), _T("train_fn")
    has = lambda t: t.frames > 0  # noqa: E731
    assert where_thread([main, train], "train_fn", has) is train
    assert where_thread([main, train], "", has) is main
    # the program returned from main, its training thread is gone: main's empty stack says so
    gone = _T("MainThread", is_main=True, frames=0)
    assert where_thread([gone, _T("flightrec-watchdog")], "train_fn", has) is gone
    assert where_thread([], "x", has) is None
