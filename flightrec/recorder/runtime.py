"""One recorder per process: the composition root that wires its parts, and turns tracing on
and off.

The parts, each in its own module: the ``Recorder`` (``recording``: ring, tables, black box),
the ``Dumper`` (``dumping``), the hooks on torch.distributed and DDP (``hooks``), the link to
the other ranks (``peers``), the dump triggers (``triggers``) and the process's life from the
first group to exit (``lifecycle``). Callbacks are handed to each part when it is made; no part
reads another's fields for it.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import threading
from pathlib import Path
from typing import Any

from flightrec.format import flightrec_pb2 as pb
from flightrec.recorder import torchapi
from flightrec.recorder.config import Config, from_env, store_namespace
from flightrec.recorder.dumping.dumper import Dumper
from flightrec.recorder.dumping.exceptions import ExceptionHooks
from flightrec.recorder.dumping.upload import Uploader
from flightrec.recorder.exchange.keys import DEFAULT_NAMESPACE
from flightrec.recorder.exchange.verdict import Reporter
from flightrec.recorder.hooks import codegen
from flightrec.recorder.hooks.ddp import DDPHooks
from flightrec.recorder.hooks.install import Hooks
from flightrec.recorder.hotpath import layout
from flightrec.recorder.lifecycle import Lifecycle
from flightrec.recorder.metrics import Counts, WarningCounter
from flightrec.recorder.native.watch import NativeWatch
from flightrec.recorder.parts import Parts
from flightrec.recorder.peers import Peers, WarnOnce
from flightrec.recorder.recording.recorder import Recorder
from flightrec.recorder.triggers import Triggers

log = logging.getLogger("flightrec")


class Runtime:
    """The process's recorder with its triggers.

    Args:
        config: the settings (FLIGHTREC_*).
        reporter: prints the verdict into the job's log (``flightrec.live.REPORTER``, handed
            in by ``flightrec.enable``); None: no verdict.
    """

    def __init__(self, config: Config, reporter: Reporter | None = None) -> None:
        self.torch = torchapi.probe()
        """What the installed torch offers (``torchapi``): a torch newer than tested is traced
        through its public API only."""
        if config.native and not self.torch.merge_native:
            config = dataclasses.replace(config, native=False)
        if not self.torch.fast_paths:  # once per process: the wrappers are generated after this
            codegen.USE_FAST = layout.USE_LAYOUT = False
            log.warning("%s", self.torch.notice())
        self.config = config
        self.counts = Counts()
        """Dumps and warnings, for the metrics (FLIGHTREC_METRICS_PORT)."""
        if config.metrics_port:
            logging.getLogger("flightrec").addFilter(WarningCounter(self.counts))
        # FLIGHTREC_DIR as a URL: dumps go from the spool to object storage (recorder.upload).
        uploader = None
        if config.upload_url:
            uploader = Uploader(config.upload_url, config.directory, config.upload_retries)
        # The recorder and the dumper exist before the triggers they call: their callbacks
        # reach the triggers through this root, once made.
        self.recorder = Recorder(
            config, on_first_use=self.start_background, on_error=self._on_error
        )
        self.dumper = Dumper(self.recorder, config.job_id, on_dump=self._on_dump)
        self.hooks = Hooks()
        self.ddp = DDPHooks()
        warn = WarnOnce()
        namespace = store_namespace(os.environ) or DEFAULT_NAMESPACE
        self.peers = Peers(config, self.recorder, self.dumper, namespace, reporter, warn)
        native_watch = NativeWatch(config.timeout_s, config.native)
        bb = self.recorder.blackbox
        parts = Parts(
            config, self.recorder, self.dumper, self.peers, native_watch, self.counts,
            uploader, bb,
        )  # fmt: skip
        self.triggers = Triggers(parts)
        self.lifecycle = Lifecycle(parts, self.triggers, warn)
        self.exception_hooks = ExceptionHooks(self.triggers.on_exception)
        # atexit runs handlers last-registered first: the exit dump (if any) is written before
        # the black box decides whether it is still needed, and a dump another thread is
        # writing is finished before the interpreter stops that thread; the uploads last.
        if uploader is not None:
            atexit.register(self.triggers.close_uploader)
        atexit.register(self.dumper.close)
        atexit.register(self.lifecycle.stop_threads)
        atexit.register(self.lifecycle.close_rawstacks)  # after the black box stayed or went
        if bb is not None:
            atexit.register(self.lifecycle.close_blackbox)
        # FLIGHTREC_DUMP_ON_EXIT, or a process of a job dying of an exception.
        atexit.register(self.lifecycle.at_exit)

    def _on_error(self, rid: int, exc: BaseException) -> None:
        self.triggers.on_error(rid, exc)

    def _on_dump(self, dump: pb.Dump, path: Path | None) -> None:
        self.triggers.on_dump(dump, path)

    # -- on and off -----------------------------------------------------------------------
    def enable(self, reporter: Reporter | None = None) -> None:
        """Trace: wrap torch.distributed's functions (and DDP), record uncaught exceptions,
        and start the background threads if the default group already exists.

        Args:
            reporter: replaces the one given at construction, when given.
        """
        if reporter is not None:
            self.peers.use_reporter(reporter)
        self.recorder.enabled = True
        if self.config.native and not {
            "TORCH_FR_BUFFER_SIZE",
            "TORCH_NCCL_TRACE_BUFFER_SIZE",
        } & set(os.environ):
            # torch reads this when its recorder is first used (after start-up): its ring then
            # spans at least ours, so merging leaves none of our older entries out.
            os.environ["TORCH_FR_BUFFER_SIZE"] = str(max(self.config.buffer, 2000))
        self.hooks.install(
            self.recorder, self.start_background, self._after_destroy, self._before_destroy
        )
        try:
            self.exception_hooks.install()
        except Exception as exc:  # a bonus, as DDP coverage is
            log.warning("flightrec: uncaught exceptions will not be recorded: %s", exc)
        self._install_ddp()
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            self.start_background()

    def disable(self) -> None:
        """Stop tracing: put torch's functions back and stop the background threads."""
        self.recorder.enabled = False
        self.hooks.uninstall()
        self.exception_hooks.uninstall()
        self.ddp.uninstall()
        self.lifecycle.pause()

    def start_background(self) -> None:
        """Start the watchdog, the request poller and the signal handlers (idempotent)."""
        if not self.recorder.enabled:
            return
        self.lifecycle.start_threads()
        self._install_ddp()
        self.lifecycle.in_job()

    def dump(self, reason: int, detail: str = "", requested_by: int = -1) -> Path | None:
        """Write one dump now (``Dumper.dump``)."""
        return self.triggers.dump(reason, detail, requested_by)

    def after_fork_in_child(self) -> None:
        """Tracing does not follow ``fork()``: the child's process groups, ring and black box
        are the parent's. Record nothing, dump nothing, and give the signals back.

        Runs in the child right after ``fork`` (``os.register_at_fork``), when only the forking
        thread exists: locks another thread held at the fork are replaced, never waited on.
        """
        self.recorder.after_fork_in_child()
        self.peers.after_fork_in_child()
        self.triggers.after_fork_in_child()
        self.lifecycle.after_fork_in_child()

    # -- what the hooks call ------------------------------------------------------------------
    def _install_ddp(self) -> None:
        """Wrap DDP; at start-up torch.nn may not be importable yet (torch.distributed loads
        first), so this is tried again when the default group is created, before any DDP
        model can exist."""
        if self.ddp.installed or not self.recorder.enabled:
            return
        try:
            self.ddp.install(
                lambda: self.recorder.enabled,
                lambda: self.hooks.ddp_all_reduce,
                python_hook=self.config.ddp_hook,
                completion=lambda: self.recorder.tracker if self.recorder.enabled else None,
            )
        except Exception as exc:  # DDP coverage is a bonus; never a reason to fail
            log.warning("flightrec: DDP gradient all-reduces will not be recorded: %s", exc)

    def _before_destroy(self, group: Any) -> None:
        """The default group is about to go, and with it, usually, the store (rank 0's process
        hosts it outside torchrun): the request poller and the slow check leave it now, while it
        still answers. A call of torch's store client that fails as the store goes logs a C++
        warning with a stack trace into the job's log."""
        import torch.distributed as dist

        if group is None or group is dist.GroupMember.WORLD:
            self.peers.before_store_goes()

    def _after_destroy(self) -> None:
        """Every group (and with it, usually, the store) is gone: stop polling it, and let go
        of the ProcessGroup objects.

        Held on to, they would be destroyed at interpreter exit instead of here, as they are
        untraced; a gloo group torn down that late can abort the process ("terminate called
        without an active exception"). Their records (names, ranks, counters) stay for dumps.
        A later ``init_process_group`` starts a poller on the new store.
        """
        import torch.distributed as dist

        if dist.is_initialized():
            return
        self.recorder.forget_groups()
        self.peers.stop()


_runtime: Runtime | None = None
_runtime_lock = threading.Lock()


def _before_fork() -> None:
    rt = _runtime
    if rt is not None:
        try:
            rt.lifecycle.before_fork()
        except Exception as exc:
            log.warning("flightrec: could not disarm faulthandler before fork: %s", exc)


def _after_fork_in_parent() -> None:
    rt = _runtime
    if rt is not None:
        try:
            rt.lifecycle.after_fork_in_parent()
        except Exception as exc:
            log.warning("flightrec: could not re-arm faulthandler after fork: %s", exc)


def _after_fork_in_child() -> None:
    global _runtime_lock
    _runtime_lock = threading.Lock()
    rt = _runtime
    if rt is None:
        return
    try:
        rt.after_fork_in_child()
    except Exception as exc:  # never into the child
        log.warning("flightrec: could not detach the recorder in a forked child: %s", exc)


def get(config: Config | None = None) -> Runtime:
    """The process's runtime, created on first use (hooks not installed by this)."""
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            _runtime = Runtime(config or from_env())
        return _runtime


os.register_at_fork(
    before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child
)


def current() -> Runtime | None:
    """The runtime if one was created."""
    return _runtime
