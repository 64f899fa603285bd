"""Run functions in forked processes: over a list of tasks (results in task order), or one
call in the background.

The loader's replacement for ``multiprocessing.Pool.imap``. The tasks are known up front
(chunks of files): each process takes the next task from a shared counter and answers on a
pipe of its own, and the caller reads whichever pipe has an answer, yielding in task order:
no task queue and no helper threads. What that saves, measured at 16,384 ranks
(``benchmarks/bench_scale.py``): the pool's worker-handler thread polls its result queue
among its sentinels and so spins while results wait to be read, about 2.2 s of the
analysing process's CPU (of 6.3 s), besides the result-handler thread that unpickled
alongside the caller and took the GIL from it. Tasks are taken as processes come free, so a
process that a busy machine slows down takes fewer of them.

``Background`` runs one analysis candidate beside the others (``pipeline.diagnose``): the forked
process reads the loaded job without anything being copied to it.

A process that raises sends the exception instead of a result, and the caller re-raises it;
one that dies (killed for memory) ends with ``WorkerLostError`` (one line from the CLI).
Closing the iterator early, or leaving a ``Background`` block, terminates the processes.
"""

from __future__ import annotations

import multiprocessing
import traceback
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from multiprocessing.sharedctypes import Synchronized
from typing import Any, Generic, TypeVar, cast

from flightrec.errors import WorkerLostError

T = TypeVar("T")
R = TypeVar("R")


def can_fork() -> bool:
    """Whether this platform starts processes by forking (the loader's workers need it)."""
    return "fork" in multiprocessing.get_all_start_methods()


def _serve(
    fn: Callable[[T], R], tasks: Sequence[T], counter: Synchronized[int], out: Connection
) -> None:
    try:
        while True:
            with counter.get_lock():
                i = counter.value
                counter.value = i + 1
            if i >= len(tasks):
                return
            try:
                result = fn(tasks[i])
            except BaseException as exc:  # (handed to the caller, which raises it)
                try:
                    out.send((i, False, exc))
                except Exception:  # an exception that does not pickle: its text
                    text = "".join(traceback.format_exception(exc))
                    out.send((i, False, RuntimeError(text)))
                return
            out.send((i, True, result))
    finally:
        out.close()


def ordered_map(fn: Callable[[T], R], tasks: Sequence[T], workers: int) -> Iterator[R]:
    """``map(fn, tasks)`` over ``workers`` forked processes, yielded in task order.

    Args:
        fn: the function; a module-level one (the children inherit it by forking).
        tasks: the tasks, taken in order by whichever process is free.
        workers: processes to start (at most one per task).

    Raises:
        WorkerLostError: a process ended without answering (killed).
        RuntimeError: a process raised an exception that could not be sent back (its
            traceback is the message).
        Exception: whatever ``fn`` raised in a process.
    """
    readers: list[Connection] = []
    procs: list[BaseProcess] = []
    counter: list[Synchronized[int]] = []  # kept while the processes run (see ``_start``)
    try:
        counter.append(_start(fn, tasks, max(1, min(workers, len(tasks))), readers, procs))
        # Answers that came early, by task (a process a task or so ahead of another).
        early: dict[int, tuple[bool, Any]] = {}
        live = list(readers)
        for want in range(len(tasks)):
            while want not in early:
                if not live:
                    for proc in procs:
                        proc.join(5)
                    codes = [p.exitcode for p in procs if p.exitcode != 0]
                    raise WorkerLostError(
                        f"a loader process ended without answering (exit code "
                        f"{codes[0] if codes else 'unknown'}; killed for lack of memory?)"
                    )
                for ready in wait(live):
                    conn = cast(Connection, ready)
                    try:
                        i, ok, value = conn.recv()
                    except EOFError:  # (done: no task left for it, or it died)
                        live.remove(conn)
                        continue
                    early[i] = (ok, value)
            answered, value = early.pop(want)
            if not answered:
                raise value
            yield value
    finally:
        _stop(readers, procs)


class Background(Generic[T, R]):
    """``fn(arg)`` computed in a forked process, started at once; ``result()`` waits for it.

    The process sees this one's memory as it was at the fork (nothing is pickled on the way
    in); only the result comes back pickled. Use it as a context manager, which stops the
    process if the result was never asked for.
    """

    def __init__(self, fn: Callable[[T], R], arg: T) -> None:
        self._readers: list[Connection] = []
        self._procs: list[BaseProcess] = []
        self._counter = _start(fn, [arg], 1, self._readers, self._procs)

    def result(self) -> R:
        """The result (raising what ``fn`` raised, as ``ordered_map`` does)."""
        try:
            try:
                _, ok, value = self._readers[0].recv()
            except EOFError:
                proc = self._procs[0]
                proc.join(5)
                raise WorkerLostError(
                    f"analysis process {proc.pid} ended without answering (exit code "
                    f"{proc.exitcode}; killed for lack of memory?)"
                ) from None
            if not ok:
                raise value
            result: R = value
            return result
        finally:
            _stop(self._readers, self._procs)

    def __enter__(self) -> Background[T, R]:
        return self

    def __exit__(self, *exc: object) -> None:
        _stop(self._readers, self._procs)


def _start(
    fn: Callable[[T], R],
    tasks: Sequence[T],
    workers: int,
    readers: list[Connection],
    procs: list[BaseProcess],
) -> Synchronized[int]:
    """Start the processes; returns their shared task counter, which the caller must keep
    until they end: its shared memory is freed with it, and reused by the next counter."""
    ctx = multiprocessing.get_context("fork")
    counter = ctx.Value("q", 0)
    for _ in range(workers):
        reader, writer = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_serve, args=(fn, tasks, counter, writer), daemon=True)
        proc.start()
        writer.close()  # (the child holds its own end: EOF when it exits)
        readers.append(reader)
        procs.append(proc)
    return counter


def _stop(readers: list[Connection], procs: list[BaseProcess]) -> None:
    for reader in readers:
        reader.close()
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
        proc.join()
    readers.clear()
    procs.clear()
