"""The recorder's life in a process: background threads from the first group on, ``fork``,
and what happens at exit.

Background machinery (watchdog, dump-request poller, signal handlers, metrics) starts lazily,
when the process creates its default process group or records its first call, never in a
process that only imports torch.distributed (the torchrun launcher, a data-loading helper).
At exit, in the order ``runtime`` registers them: the exit dump (when asked for, or when the
process dies of an exception), the black box kept or deleted, the raw stacks file with it, and
the threads stopped before the interpreter finalizes.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time

from flightrec.format import flightrec_pb2 as pb
from flightrec.format.rawstacks import stacks_path
from flightrec.recorder.dumping.dumper import torch_version
from flightrec.recorder.dumping.exceptions import error_file, from_error_file
from flightrec.recorder.dumping.rawstacks import RawStacks
from flightrec.recorder.hooks import ddp
from flightrec.recorder.metrics import FlightrecCollector, MetricsServer, metrics_port
from flightrec.recorder.native import merge as native_merge
from flightrec.recorder.parts import Parts
from flightrec.recorder.peers import POLLER_STOP_WAIT_S, WarnOnce, job_world_size
from flightrec.recorder.recording.unseen import UnseenBook, unseen_rows
from flightrec.recorder.signals import SignalHandlers
from flightrec.recorder.triggers import Triggers
from flightrec.recorder.watchdog import Watchdog

log = logging.getLogger("flightrec")


class Lifecycle:
    """The watchdog, the signal handlers, the raw stacks and the metrics, started once a
    process is in a job; the black box labelled then and closed at exit; the exit dump.

    Args:
        parts: what the runtime made.
        triggers: the dump triggers (the watchdog's and the poller's callbacks).
        warn: says once per topic that a part is left off.
    """

    def __init__(self, parts: Parts, triggers: Triggers, warn: WarnOnce) -> None:
        self._p = parts
        self._triggers = triggers
        self._warn = warn
        self._lock = threading.Lock()
        self.signals = SignalHandlers(triggers.on_signal)
        self.watchdog: Watchdog | None = None
        self.rawstacks: RawStacks | None = None
        self.metrics: MetricsServer | None = None
        bb = parts.blackbox
        self._unseen = UnseenBook(bb.unseen) if bb is not None else None
        self._identified = False
        self._started_ns = time.time_ns()

    # -- start ----------------------------------------------------------------------------
    def start_threads(self) -> None:
        """Start the watchdog, the peers' threads and the signal handlers (idempotent).

        Called at init_process_group and at the first recorded call: each part that fails is
        left off with one warning, whichever call saw it first.
        """
        with self._lock:
            try:
                if self.watchdog is None:
                    self.watchdog = Watchdog(
                        self._p.recorder, self._triggers.on_hang, on_tick=self.tick
                    )
            except Exception as exc:
                self._warn("watchdog", "no hang detection (watchdog not started)", exc)
            bb = self._p.blackbox
            self._p.peers.start(
                self._triggers.on_request,
                self._triggers.on_covered,
                str(bb.directory) if bb is not None else "",
            )
            try:
                if not self.signals.installed:
                    self.signals.install()
            except Exception as exc:
                self._warn("signals", "SIGUSR1/SIGTERM dumps are off", exc)

    def in_job(self) -> None:
        """Once the default group exists: fix the identity, label the black box, arm the raw
        stacks, serve the metrics and announce tracing (each once)."""
        self._p.dumper.remember_identity()
        self._identify_blackbox()
        self._arm_rawstacks()
        self._start_metrics()
        self._p.peers.announce()

    def _identify_blackbox(self) -> None:
        """Write rank, world and job into the black box."""
        bb = self._p.blackbox
        ident = self._p.dumper.identity
        if bb is None or self._identified or ident is None:
            return
        self._identified = True
        try:
            bb.identify(ident.rank, ident.world_size, ident.job_id, ident.backend, torch_version())
        except Exception as exc:
            log.warning("flightrec: could not label the black box: %s", exc)

    def _arm_rawstacks(self) -> None:
        """Beside the black box (named by rank by now), once the default group exists."""
        bb = self._p.blackbox
        if not self._p.config.raw_stacks or bb is None or not self._identified:
            return
        with self._lock:
            if self.rawstacks is not None or self.watchdog is None:
                return
            try:
                main = threading.main_thread().ident or 0
                self.rawstacks = RawStacks(stacks_path(bb.path), self._p.config.timeout_s, main)
            except Exception as exc:
                log.warning("flightrec: no raw stacks if Python stops running: %s", exc)

    def _start_metrics(self) -> None:
        """FLIGHTREC_METRICS_PORT: serve Prometheus metrics once the process is in a job
        (not in a launcher that merely imports torch.distributed)."""
        if not self._p.config.metrics_port:
            return
        with self._lock:
            if self.metrics is not None:
                return
            watch = self._p.native_watch
            collector = FlightrecCollector(
                self._p.recorder, self._p.counts, self._p.uploader, self._identity,
                native=lambda: list(watch.pending.values()),
            )  # fmt: skip
            port = metrics_port(self._p.config.metrics_port)
            self.metrics = server = MetricsServer(collector, port, self._p.config.metrics_addr)
            try:
                server.start()
            except Exception as exc:  # metrics are a bonus: never a reason to fail the job
                self._warn("metrics", f"no metrics on port {port}", exc)
                return
        atexit.register(server.close)

    def _identity(self) -> tuple[int, int, str]:
        ident = self._p.dumper.identity
        if ident is None:
            return self._triggers.rank(), job_world_size(), self._p.config.job_id
        return ident.rank, ident.world_size, ident.job_id

    # -- every watchdog tick ------------------------------------------------------------------
    def tick(self, now_ns: int) -> None:
        """The watchdog's ``on_tick``: before its scan, on its thread."""
        # Before anything else: the sooner a group follows torch's numbers, the fewer of its
        # entries carry numbers its peers' dumps do not (see ``hotpath.groups``).
        self._p.recorder.groups.follow_native()
        hung = self._p.native_watch.poll(now_ns)
        if hung is not None:  # a collective flightrec's hooks never saw (funcol, C++)
            self._triggers.on_native_hang(hung, now_ns)
        self._write_unseen()
        raw = self.rawstacks
        if raw is not None:
            raw.rearm(now_ns)
        bb = self._p.blackbox
        if bb is not None:
            bb.write_sources()
        exchange = self._p.peers.exchange
        if exchange is not None:
            exchange.tick(now_ns, self._p.recorder.ring, self._p.config.timeout_s)

    def _write_unseen(self) -> None:
        """Copy what torch counted into the black box's header (``recording.unseen``), when it
        changed. Never raises."""
        book = self._unseen
        if book is None:
            return
        try:
            watch, groups = self._p.native_watch, self._p.recorder.groups
            pending = {p.group: p for p in list(watch.pending.values())}
            for name in book.unnamed(watch.groups | set(pending)):
                # a group only torch's recorder saw: registered by its name
                native_merge.group_named(groups, name, unresolved=False)
            book.write(unseen_rows(list(groups.groups), pending, ddp.bucket_groups()))
        except Exception as exc:  # flightrec's own fault: one warning per process, in all
            self._p.recorder.internal_error("the black box's table of torch's counts", exc)

    # -- stop, fork and exit ------------------------------------------------------------------
    def pause(self) -> None:
        """``flightrec.disable``: stop the threads; nothing re-arms the raw stacks any more (it
        would fire for a process that is fine)."""
        self.signals.uninstall()
        with self._lock:
            if self.watchdog is not None:
                self.watchdog.stop()
                self.watchdog = None
            self.close_rawstacks()
        self._p.peers.pause()

    def stop_threads(self) -> None:
        """At exit, before the interpreter finalizes: end the watchdog and the peers' threads.

        Left running, a daemon thread can be inside torch when the interpreter shuts down: the
        poller in a store call, or the watchdog dropping the last reference to a finished
        frame's tensors and Works (the stack cache's purge), whose C++ destructors then race
        the finalization; gloo aborts the process ("terminate called without an active
        exception") after the job has finished.
        """
        with self._lock:
            watchdog, self.watchdog = self.watchdog, None
        if watchdog is not None:
            watchdog.stop(wait_s=POLLER_STOP_WAIT_S)
        self._p.peers.close()

    def close_rawstacks(self) -> None:
        """Disarm; keep a file faulthandler wrote into only while its black box stays."""
        raw, self.rawstacks = self.rawstacks, None
        if raw is None:
            return
        bb = self._p.blackbox
        try:
            raw.close(keep=bb is not None and bb.path.exists())
        except Exception as exc:
            log.warning("flightrec: could not close the raw stacks file: %s", exc)

    def close_blackbox(self) -> None:
        """At normal exit: a healthy ring (or one a dump just superseded) is deleted."""
        bb = self._p.blackbox
        if bb is None:
            return
        ring = self._p.recorder.ring
        died = self._triggers.died_of is not None and self._p.dumper.identity is not None
        healthy = self._p.dumper.exit_dumped or not (
            ring.pending_slots() or ring.failed_any() or died
        )
        try:
            bb.close(healthy)
        except Exception as exc:
            log.warning("flightrec: could not close the black box: %s", exc)

    def at_exit(self) -> None:
        """Dump at exit when FLIGHTREC_DUMP_ON_EXIT asks, or when the process that took part
        in a job is dying of an exception (it says what it died of, with or without the flag)."""
        rec, triggers = self._p.recorder, self._triggers
        if not rec.enabled:
            return
        if triggers.died_of is None and error_file():
            x = from_error_file(error_file(), self._started_ns)
            if x is not None:
                triggers.on_exception(x)
        try:
            import torch.distributed as dist

            used = dist.is_available() and dist.is_initialized()
        except Exception:
            used = False
        # A job whose every collective went through torch's C++ paths (functional collectives,
        # DDP's builtin hooks) registered no group here: it still ran, and dumps.
        needed = (
            used
            or self.watchdog is not None  # started when its default group was created
            or rec.ring.pending_slots()
            or rec.groups.groups
        )
        x = triggers.died_of
        died = x is not None and self._p.dumper.identity is not None
        exchange = self._p.peers.exchange
        if needed and not died and exchange is not None:
            exchange.after_exit()  # a hang among the ranks still running names this one exited
        if not ((self._p.config.dump_on_exit and needed) or died):
            return
        detail = "process exit" + (f": {x.type}: {x.message}"[:4000] if x is not None else "")
        triggers.dump(pb.PROCESS_EXIT, detail)
        interrupted = x is not None and x.type == "KeyboardInterrupt"
        if died and exchange is not None and not interrupted:
            exchange.after_death()  # the verdict in the log names the crash (Ctrl-C is none)

    def before_fork(self) -> None:
        """Disarm the raw stacks while the process forks (the child must not inherit them)."""
        raw = self.rawstacks
        if raw is not None:
            raw.pause()

    def after_fork_in_parent(self) -> None:
        raw = self.rawstacks
        if raw is not None:
            raw.resume(time.monotonic_ns())

    def after_fork_in_child(self) -> None:
        """The parent's threads did not survive the fork; its files are not the child's."""
        self._lock = threading.Lock()
        self.watchdog = None
        self.metrics = None  # the parent serves them; its server thread is not here
        self.signals.after_fork_in_child()
        if self.rawstacks is not None:
            self.rawstacks.forget()  # the parent's file; its faulthandler thread is not ours
            self.rawstacks = None
