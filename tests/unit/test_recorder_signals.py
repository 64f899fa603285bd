"""Signal handling: dump on SIGUSR1/SIGTERM, then the previous handler; uninstall restores it."""

from __future__ import annotations

import os
import signal
import threading
import time
from types import FrameType

from flightrec.recorder.signals import SignalHandlers


def test_dumps_then_chains_to_previous_handlers_and_uninstalls() -> None:
    dumped: list[tuple[int, str]] = []
    previous: list[int] = []

    def prev(signum: int, frame: FrameType | None) -> None:
        previous.append(signum)

    old = {s: signal.signal(s, prev) for s in (signal.SIGUSR1, signal.SIGTERM)}
    handlers = SignalHandlers(lambda s: dumped.append((s, threading.current_thread().name)))
    try:
        assert handlers.install() and handlers.uses_wakeup_fd
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 5
        while len(previous) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)  # the Python-level handlers run between these bytecodes
        # The dump ran on the watcher thread (so it also works while the main thread is
        # blocked in C++), and the previous handlers still ran, in order.
        assert sorted(s for s, _ in dumped) == sorted([signal.SIGUSR1, signal.SIGTERM])
        assert {name for _, name in dumped} == {"flightrec-signals"}
        assert previous == [signal.SIGUSR1, signal.SIGTERM]
    finally:
        handlers.uninstall()
        assert signal.getsignal(signal.SIGUSR1) is prev and signal.getsignal(signal.SIGTERM) is prev
        assert signal.set_wakeup_fd(-1) == -1
        for s, h in old.items():
            signal.signal(s, h)


def test_install_outside_the_main_thread_changes_nothing() -> None:
    result: list[bool] = []
    before = signal.getsignal(signal.SIGUSR1)
    t = threading.Thread(target=lambda: result.append(SignalHandlers(lambda s: None).install()))
    t.start()
    t.join()
    assert result == [False] and signal.getsignal(signal.SIGUSR1) is before
