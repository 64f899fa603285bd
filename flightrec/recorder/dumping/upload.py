"""Dumps to object storage: each dump written to the local spool is uploaded by one thread.

When ``FLIGHTREC_DIR`` is a URL (``s3://bucket/prefix``, ``gs://...``, any fsspec protocol),
the dumper still writes every dump into a local folder (``FLIGHTREC_SPOOL``) exactly as it
does for a local ``FLIGHTREC_DIR``: atomically, with nothing between the job and the disk.
``Uploader.submit`` only puts the path on a queue; the ``flightrec-upload`` thread copies it
to ``<url>/<name>`` and deletes the local copy once the object exists. A failed upload is
tried again a bounded number of times (``FLIGHTREC_UPLOAD_RETRIES``); after the last try the
file stays in the spool and one warning names it. The black box is never uploaded: it lives
in the spool, where a hard crash leaves it.

fsspec (and the protocol's package: s3fs, gcsfs, ...) is imported on the upload thread, on the
first dump: a job that never dumps never imports it, and one without it installed gets one
warning and keeps its dumps locally.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

log = logging.getLogger("flightrec")

BACKOFF_S = 0.5
"""Wait before the first retry; doubled before each further one (0.5, 1, 2 s for 3 retries)."""
EXIT_WAIT_S = 5.0
"""At interpreter exit, how long the process waits for uploads still queued or in flight (an
exit or SIGTERM dump is written moments before). The job's work is over by then; what is not
uploaded in time stays in the spool, with one warning."""

_PERMANENT = (PermissionError, FileNotFoundError, NotADirectoryError, IsADirectoryError)
"""Errors another try cannot fix (no permission, no such bucket): no retry."""


class Uploader:
    """Uploads dump files from the spool folder to ``url`` on its own daemon thread.

    Args:
        url: where dumps go (``s3://bucket/prefix``); a file ``spool/x`` becomes ``url/x``.
        spool: the local folder the dumper writes into.
        retries: further tries after a failed upload.
        backoff_s: wait before the first retry, doubled each time.
    """

    def __init__(self, url: str, spool: str, retries: int, backoff_s: float = BACKOFF_S) -> None:
        self.url = url.rstrip("/")
        self.spool = Path(spool)
        self.retries = retries
        self.backoff_s = backoff_s
        self.uploaded = 0
        """Dumps uploaded (and removed from the spool)."""
        self.failed = 0
        """Dumps left in the spool after their last try (each warned about once)."""
        self._queue: queue.SimpleQueue[Path] = queue.SimpleQueue()
        self._pending = 0
        """Submitted and not yet uploaded or given up on."""
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._fs: Any = None
        self._root = ""
        self._pid = os.getpid()
        self._exiting = False

    # -- the job's side: never waits --------------------------------------------------------
    def submit(self, path: Path) -> None:
        """Queue ``path`` (a finished dump in the spool) for upload; returns at once."""
        if os.getpid() != self._pid or self._stop.is_set():
            return  # a forked child's dumps are off; after exit, nothing more goes out
        with self._cond:
            self._pending += 1
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="flightrec-upload", daemon=True
                )
                self._thread.start()
        self._queue.put(path)

    def close(self, wait_s: float = EXIT_WAIT_S) -> None:
        """At exit: wait (at most ``wait_s``) for queued uploads, then stop; one warning
        names what is left in the spool."""
        if os.getpid() != self._pid:
            return
        self._exiting = True
        _run_inline_at_exit()
        with self._cond:
            self._cond.wait_for(lambda: self._pending == 0, timeout=wait_s)
            left = self._pending
        self._stop.set()
        if left:
            log.warning(
                "flightrec: %d dump(s) not uploaded to %s before the process ended; they stay in %s",
                left,
                self.url,
                self.spool,
            )

    def drain(self, wait_s: float = EXIT_WAIT_S) -> bool:
        """Wait (at most ``wait_s``) until nothing is queued or in flight; True if so.

        For a process about to be ended by a signal (SIGTERM from torchrun), whose atexit
        handlers will not run: its last dump gets the same bounded chance as an exit dump.
        """
        with self._cond:
            return self._cond.wait_for(lambda: self._pending == 0, timeout=wait_s)

    @property
    def pending(self) -> int:
        """Dumps queued or being uploaded."""
        return self._pending

    # -- the upload thread ------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            path = self._queue.get()
            try:
                if self._upload(path):
                    self.uploaded += 1
                else:
                    self.failed += 1
            except Exception as exc:  # never out of this thread
                self.failed += 1
                log.warning("flightrec: could not upload %s: %s", path, exc)
            with self._cond:
                self._pending -= 1
                self._cond.notify_all()

    def _filesystem(self) -> tuple[Any, str]:
        if self._fs is None:
            try:
                from fsspec.core import url_to_fs
            except ImportError:
                raise RuntimeError(
                    "FLIGHTREC_DIR is a URL, which needs fsspec and the protocol's package "
                    "(pip install 'torch-flightrec[s3]' for s3://)"
                ) from None
            try:
                self._fs, root = url_to_fs(self.url)
            except ImportError as exc:  # the protocol's package (s3fs, gcsfs) is missing
                raise RuntimeError(f"{exc} (pip install 'torch-flightrec[s3]' for s3://)") from None
            self._root = str(root).rstrip("/")
            if self._exiting:  # the first dump came at exit (FLIGHTREC_DUMP_ON_EXIT)
                _run_inline_at_exit()
        return self._fs, self._root

    def _upload(self, path: Path) -> bool:
        """Upload one file, trying again up to ``retries`` times; True once it is there."""
        try:
            name = path.relative_to(self.spool).as_posix()
        except ValueError:
            name = path.name
        target = f"{self.url}/{name}"
        error: BaseException | None = None
        tries = 0
        for attempt in range(self.retries + 1):
            # Bounded and interruptible: the process's exit ends the wait.
            if attempt and self._stop.wait(self.backoff_s * 2 ** (attempt - 1)):
                break
            tries += 1
            try:
                fs, root = self._filesystem()
                fs.put_file(os.fspath(path), f"{root}/{name}")
            except RuntimeError as exc:  # no fsspec: no try can succeed
                error = exc
                break
            except Exception as exc:
                error = exc
                if isinstance(exc, _PERMANENT):
                    break
                continue
            with contextlib.suppress(OSError):
                path.unlink()  # uploaded: the spool keeps only what did not make it
            log.info("flightrec: uploaded %s", target)
            return True
        log.warning(
            "flightrec: could not upload a dump to %s after %d %s (%s); it stays at %s",
            target,
            tries,
            "try" if tries == 1 else "tries",
            _one_line(error),
            path,
        )
        return False


class _Inline(ThreadPoolExecutor):
    """Runs what is submitted at once, on the submitting thread (fsspec's IO thread)."""

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        done: Future[Any] = Future()
        try:
            done.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            done.set_exception(exc)
        return done


def _run_inline_at_exit() -> None:
    """Let fsspec's event loop work after the interpreter began to exit.

    Exit dumps are written by atexit handlers, which run after ``concurrent.futures`` shut its
    thread pools down: from then on, the loop's ``run_in_executor`` (asyncio's name lookups,
    botocore's credential loading) fails with "cannot schedule new futures after interpreter
    shutdown", and no exit dump could be uploaded. At exit the job's work is over, so the
    loop's blocking calls may as well run on its own thread.
    """
    asyn = sys.modules.get("fsspec.asyn")
    loop = getattr(asyn, "loop", [None])[0] if asyn is not None else None
    if loop is not None:
        with contextlib.suppress(Exception):
            loop.set_default_executor(_Inline(max_workers=1))


def _one_line(exc: BaseException | None) -> str:
    if exc is None:
        return "stopped at exit"
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:300]
