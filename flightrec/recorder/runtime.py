"""One recorder per process: turning tracing on and off, and wiring the dump triggers.

Background machinery (watchdog, dump-request poller, signal handlers) starts lazily, when the
process creates its default process group or records its first call, never in a process
that only imports torch.distributed (the torchrun launcher, a data-loading helper).
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from flightrec.format import flightrec_pb2 as pb
from flightrec.format.rawstacks import stacks_path
from flightrec.recorder import torchapi
from flightrec.recorder.config import Config, from_env, store_namespace
from flightrec.recorder.dumping.dumper import Dumper, describe_entry, in_thread
from flightrec.recorder.dumping.exceptions import (
    MAX_EXCEPTIONS,
    ExceptionHooks,
    RaisedException,
    error_file,
    from_error_file,
)
from flightrec.recorder.dumping.rawstacks import RawStacks
from flightrec.recorder.dumping.upload import Uploader
from flightrec.recorder.exchange.endpoint import Registration, register
from flightrec.recorder.exchange.keys import DEFAULT_NAMESPACE
from flightrec.recorder.exchange.slowcheck import SlowCheck
from flightrec.recorder.exchange.store import Poller, default_store, store_address
from flightrec.recorder.exchange.verdict import GATHER_S, Exchange, Reporter
from flightrec.recorder.hooks import codegen, ddp
from flightrec.recorder.hooks.ddp import DDPHooks
from flightrec.recorder.hooks.install import Hooks
from flightrec.recorder.hotpath import layout
from flightrec.recorder.metrics import (
    Counts,
    FlightrecCollector,
    MetricsServer,
    WarningCounter,
    metrics_port,
)
from flightrec.recorder.native import merge as native_merge
from flightrec.recorder.native.watch import NativeWatch
from flightrec.recorder.recording.recorder import Recorder
from flightrec.recorder.signals import SignalHandlers
from flightrec.recorder.startup import lowest_on_node, say, startup_line
from flightrec.recorder.watchdog import Watchdog

log = logging.getLogger("flightrec")
POLLER_STOP_WAIT_S = 2.0
"""How long the end of the job waits for the poller to leave a store call (its wait ends as
soon as its connection is closed, and a call to a live store takes milliseconds)."""
ERROR_DUMP_INTERVAL_NS = 5_000_000_000
"""A dead peer makes every later call fail; one error dump per interval is enough."""
REGISTER_WAIT_S = 2.0
"""How long exit waits for the endpoint registration (a store call taking milliseconds)."""


class Runtime:
    """The process's recorder with its triggers."""

    def __init__(self, config: Config) -> None:
        self.torch = torchapi.probe()
        """What the installed torch offers (``torchapi``): a torch newer than tested is traced
        through its public API only."""
        if config.native and not self.torch.merge_native:
            config = dataclasses.replace(config, native=False)
        if not self.torch.fast_paths:  # once per process: the wrappers are generated after this
            codegen.USE_FAST = layout.USE_LAYOUT = False
            log.warning("%s", self.torch.notice())
        self.config = config
        self.recorder = Recorder(config)
        self.dumper = Dumper(self.recorder, config.job_id)
        self.hooks = Hooks()
        self.ddp = DDPHooks()
        self.namespace = store_namespace(os.environ) or DEFAULT_NAMESPACE
        self.watchdog: Watchdog | None = None
        self.poller: Poller | None = None
        self.reporter: Reporter | None = None
        """Prints the verdict into the job's log (handed in by ``flightrec.enable``)."""
        self.exchange: Exchange | None = None
        self.slowcheck: SlowCheck | None = None
        self.dumper.on_dump = self._on_dump
        self.signals = SignalHandlers(self._on_signal)
        self.native_watch = NativeWatch(config.timeout_s, config.native)
        self._hang_dumped_ns = 0
        self._lock = threading.Lock()
        self._last_error_dump = 0
        self._warned: set[str] = set()
        self.recorder.on_first_use = self.start_background
        self.recorder.on_error = self._on_error
        self._identified = False
        self._announced = False
        self.registration: Registration | None = None
        """Leaves the store's address for ``flightrec trigger`` (``endpoint``)."""
        self._named: set[str] = set()
        """Group names torch's recorder counts, registered in the group registry."""
        self._unseen: list[tuple[int, int, int, int, str, int]] = []
        """The rows last written to the black box's header (``_write_unseen``)."""
        self.exception_hooks = ExceptionHooks(self._on_exception)
        self.died_of: RaisedException | None = None
        """The exception that ended the main thread, once one did."""
        self._started_ns = time.time_ns()
        # FLIGHTREC_DIR as a URL: dumps go from the spool to object storage (recorder.upload).
        self.uploader: Uploader | None = None
        if config.upload_url:
            self.uploader = Uploader(config.upload_url, config.directory, config.upload_retries)
            atexit.register(self._close_uploader)  # registered first: runs after the exit dump
        self.counts = Counts()
        """Dumps and warnings, for the metrics (FLIGHTREC_METRICS_PORT)."""
        self.metrics: MetricsServer | None = None
        if config.metrics_port:
            logging.getLogger("flightrec").addFilter(WarningCounter(self.counts))
        # atexit runs handlers last-registered first: the exit dump (if any) is written before
        # the black box decides whether it is still needed, and a dump another thread is
        # writing is finished before the interpreter stops that thread.
        atexit.register(self.dumper.close)
        atexit.register(self._stop_threads)
        self.rawstacks: RawStacks | None = None
        atexit.register(self._close_rawstacks)  # after the black box decided to stay or go
        if self.recorder.blackbox is not None:
            atexit.register(self._close_blackbox)
        # FLIGHTREC_DUMP_ON_EXIT, or a process of a job dying of an exception.
        atexit.register(self._at_exit)

    # -- lifecycle ------------------------------------------------------------------------
    def enable(self) -> None:
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
        self.recorder.enabled = False
        self.hooks.uninstall()
        self.exception_hooks.uninstall()
        self.ddp.uninstall()
        self.signals.uninstall()
        with self._lock:
            if self.watchdog is not None:
                self.watchdog.stop()
                self.watchdog = None
            # Nothing re-arms it any more: it would fire for a process that is fine.
            self._close_rawstacks()
            if self.poller is not None:
                self.poller.stop()
                self.poller = None
            if self.slowcheck is not None:
                self.slowcheck.stop(wait_s=0.0)
                self.slowcheck = None

    def after_fork_in_child(self) -> None:
        """Tracing does not follow ``fork()``: the child's process groups, ring and black box
        are the parent's. Record nothing, dump nothing, and give the signals back.

        Runs in the child right after ``fork`` (``os.register_at_fork``), when only the forking
        thread exists: locks another thread held at the fork are replaced, never waited on.
        """
        self.recorder.enabled = False
        self._lock = threading.Lock()
        self.watchdog = None  # its thread did not survive the fork
        self.poller = None
        self.registration = None
        self.exchange = None
        self.uploader = None  # nothing to upload (dumps are off), nothing to wait for at exit
        self.metrics = None  # the parent serves them; its server thread is not here
        self.slowcheck = None  # its thread did not survive the fork either
        self.recorder.tracker.after_fork_in_child()
        self.signals.after_fork_in_child()
        if self.rawstacks is not None:
            self.rawstacks.forget()  # the parent's file; its faulthandler thread is not ours
            self.rawstacks = None

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
                python_hook=self.config.wants_ddp_hook(),
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
            exchange = self.exchange
            if exchange is not None:
                exchange.after_exit()
            self._stop_poller()

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
        self.recorder.groups.by_pg.clear()  # in place: the generated wrappers share this dict
        self.recorder.groups.forget_native()
        self._stop_poller()

    def _stop_threads(self) -> None:
        """At exit, before the interpreter finalizes: end the watchdog and the poller.

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
        exchange = self.exchange
        if exchange is not None:
            exchange.close(wait_s=GATHER_S + 2.0)
        registration = self.registration
        if registration is not None:
            registration.join(REGISTER_WAIT_S)
        self._stop_poller()

    def _stop_poller(self) -> None:
        """Stop the request poller and wait (briefly) until its thread is out of the store."""
        with self._lock:
            poller, self.poller = self.poller, None
            self.exchange = None
            slowcheck, self.slowcheck = self.slowcheck, None
        if slowcheck is not None:  # out of the store before the store goes
            slowcheck.stop()
        if poller is not None:
            poller.stop(wait_s=POLLER_STOP_WAIT_S)

    def start_background(self) -> None:
        """Start the watchdog, the request poller and the signal handlers (idempotent)."""
        if not self.recorder.enabled:
            return
        # Called at init_process_group and at the first recorded call: each part that fails
        # is left off with one warning, whichever call saw it first.
        with self._lock:
            try:
                if self.watchdog is None:
                    self.watchdog = Watchdog(self.recorder, self._on_hang, on_tick=self._tick)
            except Exception as exc:
                self._warn_once("watchdog", "no hang detection (watchdog not started)", exc)
            if self.poller is None:
                store = default_store()
                if store is not None:
                    try:
                        self.poller = Poller(
                            store, self.namespace, self._on_request,
                            rank=_rank(), world_size=_world_size(),
                        )  # fmt: skip
                        self.poller.on_covered = self._on_covered
                    except Exception as exc:
                        self._warn_once("poller", "dump requests through the store are off", exc)
            reporter = self.reporter if self.config.verdict else None
            if self.poller is not None and self.exchange is None and reporter is not None:
                self.exchange = Exchange(
                    self.poller, _rank(), _world_size(), self.namespace, reporter
                )
                bb = self.recorder.blackbox
                if bb is not None:
                    self.exchange.blackbox_dir = str(bb.directory)
            if self.poller is not None and self.slowcheck is None and self.config.slow_check_s:
                self._start_slowcheck(self.poller)
            try:
                if not self.signals.installed:
                    self.signals.install()
            except Exception as exc:
                self._warn_once("signals", "SIGUSR1/SIGTERM dumps are off", exc)
        self._install_ddp()
        self.dumper.remember_identity()
        self._identify_blackbox()
        self._arm_rawstacks()
        self._start_metrics()
        self._announce()

    def _start_metrics(self) -> None:
        """FLIGHTREC_METRICS_PORT: serve Prometheus metrics once the process is in a job
        (not in a launcher that merely imports torch.distributed)."""
        if not self.config.metrics_port:
            return
        with self._lock:
            if self.metrics is not None:
                return
            collector = FlightrecCollector(
                self.recorder, self.counts, self.uploader, self._identity
            )
            port = metrics_port(self.config.metrics_port)
            self.metrics = server = MetricsServer(collector, port, self.config.metrics_addr)
            try:
                server.start()
            except Exception as exc:  # metrics are a bonus: never a reason to fail the job
                self._warn_once("metrics", f"no metrics on port {port}", exc)
                return
        atexit.register(server.close)

    def _identity(self) -> tuple[int, int, str]:
        ident = self.dumper.identity
        if ident is None:
            return self._rank(), _world_size(), self.config.job_id
        return ident.rank, ident.world_size, ident.job_id

    def _close_uploader(self) -> None:
        uploader = self.uploader
        if uploader is not None:
            uploader.close()

    def _announce(self) -> None:
        """Once the default group exists: the start-up line (the node's lowest rank), and the
        store's address where ``flightrec trigger`` looks for it."""
        ident = self.dumper.identity
        if self._announced or ident is None:
            return
        self._announced = True
        try:
            address = store_address() if self.poller is not None else ""
            leader = lowest_on_node(ident.rank)
            if address and (leader or ident.rank == 0):
                local = "://" not in self.config.directory
                self.registration = register(
                    address, self.namespace, ident.world_size,
                    self.config.directory if leader and local else None, ident.rank,
                )  # fmt: skip
            if leader:
                from flightrec import __version__

                say(
                    startup_line(
                        __version__, ident.rank, ident.world_size, self.config.directory,
                        self.config.timeout_s, self.config.verdict and self.reporter is not None,
                        address,
                    )
                )  # fmt: skip
        except Exception as exc:
            log.warning("flightrec: could not announce tracing: %s", exc)

    def _start_slowcheck(self, poller: Poller) -> None:
        """The slow check (docs/slow-ranks.md); rank 0 judges, with what the reporter makes."""
        rank = _rank()
        make = getattr(self.reporter, "slow_judge", None) if rank == 0 else None
        try:
            from flightrec.recorder.dumping.dumper import _device_identity

            def device() -> str:  # asked at the first check, once the group's backend is known
                ident = self.dumper.identity
                return _device_identity(ident.backend if ident is not None else "")[0]

            self.slowcheck = SlowCheck(
                poller.connection_source(), self.recorder, rank, _world_size(),
                self.namespace, self.config.slow_check_s, make, device,
            )  # fmt: skip
        except Exception as exc:
            self._warn_once("slowcheck", "no slow-rank check", exc)

    def _warn_once(self, topic: str, what: str, exc: BaseException) -> None:
        if topic not in self._warned:
            self._warned.add(topic)
            log.warning("flightrec: %s: %s", what, exc)

    def _arm_rawstacks(self) -> None:
        """Beside the black box (named by rank by now), once the default group exists."""
        bb = self.recorder.blackbox
        if not self.config.raw_stacks or bb is None or not self._identified:
            return
        with self._lock:
            if self.rawstacks is not None or self.watchdog is None:
                return
            try:
                main = threading.main_thread().ident or 0
                self.rawstacks = RawStacks(stacks_path(bb.path), self.config.timeout_s, main)
            except Exception as exc:
                log.warning("flightrec: no raw stacks if Python stops running: %s", exc)

    def _tick(self, now_ns: int) -> None:
        # Before anything else: the sooner a group follows torch's numbers, the fewer of its
        # entries carry numbers its peers' dumps do not (see ``hotpath.groups``).
        self.recorder.groups.follow_native()
        hung = self.native_watch.poll(now_ns)
        if hung is not None:  # a collective flightrec's hooks never saw (funcol, C++)
            self._on_native_hang(hung, now_ns)
        self._write_unseen()
        raw = self.rawstacks
        if raw is not None:
            raw.rearm(now_ns)
        bb = self.recorder.blackbox
        if bb is not None:
            bb.write_sources()
        exchange = self.exchange
        if exchange is not None:
            exchange.tick(now_ns, self.recorder.ring, self.config.timeout_s)

    def _write_unseen(self) -> None:
        """Copy what torch counted into the black box's header (each tick, when it changed):
        per group whose numbers torch also gives to calls flightrec never saw, the last one
        the ProcessGroup issued (its own counter), and the one torch's recorder shows
        unfinished. A rank killed while it waits in a DDP bucket all-reduce (which its ring
        never held) still shows where it waits, and a rank that never issued it, that it did
        not. Never raises."""
        bb = self.recorder.blackbox
        if bb is None:
            return
        try:
            watch = self.native_watch
            buckets = ddp.bucket_groups()
            pending = {p.group: p for p in list(watch.pending.values())}
            fresh = (watch.groups | set(pending)) - self._named
            for name in fresh:  # a group only torch's recorder saw: registered by its name
                self._named.add(name)
                native_merge.group_named(self.recorder.groups, name, unresolved=False)
            rows = []
            for info in list(self.recorder.groups.groups):
                p = pending.get(info.name)
                if info.counter.source is None and p is None:
                    continue  # flightrec's numbers are torch's: the ring says it all
                try:
                    issued = info.native_seq()
                except Exception:
                    issued = p.seq if p is not None else 0
                if p is None:
                    rows.append((info.index, 0, issued, 0, "", 0))
                    continue
                flags = pb.DDP_BUCKET if p.group in buckets and p.op == "all_reduce" else 0
                rows.append((info.index, flags, max(issued, p.seq), p.seq, p.op, p.since_ns))
            if rows != self._unseen:
                self._unseen = rows
                bb.unseen(rows)
        except Exception as exc:  # flightrec's own fault: one warning per process, in all
            self.recorder.internal_error("the black box's table of torch's counts", exc)

    def _close_rawstacks(self) -> None:
        """Disarm; keep a file faulthandler wrote into only while its black box stays."""
        raw, self.rawstacks = self.rawstacks, None
        if raw is None:
            return
        bb = self.recorder.blackbox
        try:
            raw.close(keep=bb is not None and bb.path.exists())
        except Exception as exc:
            log.warning("flightrec: could not close the raw stacks file: %s", exc)

    def _identify_blackbox(self) -> None:
        """Once the default group exists, write rank, world and job into the black box."""
        bb = self.recorder.blackbox
        ident = self.dumper.identity
        if bb is None or self._identified or ident is None:
            return
        from flightrec.recorder.dumping.dumper import _torch_version

        self._identified = True
        try:
            bb.identify(ident.rank, ident.world_size, ident.job_id, ident.backend, _torch_version())
        except Exception as exc:
            log.warning("flightrec: could not label the black box: %s", exc)

    def _close_blackbox(self) -> None:
        """At normal exit: a healthy ring (or one a dump just superseded) is deleted."""
        bb = self.recorder.blackbox
        if bb is None:
            return
        ring = self.recorder.ring
        dumped = self.dumper.exit_dumped
        died = self.died_of is not None and self.dumper.identity is not None
        healthy = dumped or not (ring.pending_slots() or ring.failed_any() or died)
        try:
            bb.close(healthy)
        except Exception as exc:
            log.warning("flightrec: could not close the black box: %s", exc)

    # -- triggers -------------------------------------------------------------------------
    def dump(self, reason: int, detail: str = "", requested_by: int = -1) -> Path | None:
        return self.dumper.dump(reason, detail, requested_by)

    def _on_hang(self, slot: Any) -> None:
        poller = self.poller
        if poller is not None and poller.last_round_ns > slot.enqueue_ns:
            # Another rank saw this hang first; we already dumped, with this entry pending.
            # (A trigger's request is no such round: a hang pending through one is declared.)
            return
        seen = poller.seen if poller is not None else 0
        if poller is not None:
            poller.hang_ns = time.monotonic_ns()
        what = describe_entry(self.recorder, slot)
        self._hang_dumped_ns = time.monotonic_ns()
        self.dump(pb.WATCHDOG_TIMEOUT, f"incomplete for over {self.config.timeout_s:g}s: {what}")
        if poller is not None:
            rank = self._rank()  # the identity fixed at the first group, as in the dumps
            # Posting may block on a slow store: never on the watchdog thread.
            threading.Thread(
                target=_post, args=(poller, rank, seen, self.exchange), name="flightrec-post",
                daemon=True,
            ).start()  # fmt: skip

    def _rank(self) -> int:
        ident = self.dumper.identity
        return ident.rank if ident is not None else int(os.environ.get("RANK", "-1") or -1)

    def _on_native_hang(self, what: str, now_ns: int) -> None:
        poller, since = self.poller, now_ns - self.native_watch.timeout_ns
        if self._hang_dumped_ns > since or (poller is not None and poller.last_round_ns > since):
            return  # this hang was dumped already: our watchdog's, or another rank's request
        ring = self.recorder.ring
        if any(ring.read(i).enqueue_ns < since + 10**9 for i in ring.pending_slots()):
            return  # one of our own entries is as overdue: our watchdog reports it, better
        self._hang_dumped_ns = now_ns
        # As for a hang our own watchdog sees (_on_hang): the request others answer, then the
        # verdict exchange for it.
        seen = poller.seen if poller is not None else 0
        if poller is not None:
            poller.hang_ns = time.monotonic_ns()
        self.dump(pb.WATCHDOG_TIMEOUT, what)
        if poller is not None:
            threading.Thread(
                target=_post,
                args=(poller, self._rank(), seen, self.exchange),
                name="flightrec-post",
                daemon=True,
            ).start()

    def _on_request(self, n: int, requester: int, reason: str) -> bool:
        """Dump for request ``n``; returns whether the dump was written."""
        if reason == "CLI_TRIGGER":
            return self.dump(pb.CLI_TRIGGER, f"request {n}: flightrec trigger", -1) is not None
        who = f"rank {requester}" if requester >= 0 else "another process"
        detail = f"request {n} from {who} ({reason or 'unknown'})"
        path = self.dump(pb.PEER_REQUEST, detail, requester)
        exchange = self.exchange
        if exchange is not None:
            exchange.after_request(n, reason)
        return path is not None

    def _on_covered(self, n: int, reason: str) -> None:
        exchange = self.exchange
        if exchange is not None:
            exchange.rejoin(n, reason)

    def _on_error(self, rid: int, exc: BaseException) -> None:
        now = time.monotonic_ns()
        if self._last_error_dump and now - self._last_error_dump < ERROR_DUMP_INTERVAL_NS:
            return
        self._last_error_dump = now
        slot = self.recorder.ring.read((rid - 1) % self.recorder.ring.capacity)
        what = describe_entry(self.recorder, slot) if slot.record_id == rid else f"record {rid}"
        detail = f"{what} raised {type(exc).__name__}: {exc}"[:4000]
        if threading.current_thread().name == "flightrec-dump":
            self.dump(pb.COLLECTIVE_ERROR, detail)
        elif _on_torch_thread():
            in_thread(self.dumper, pb.COLLECTIVE_ERROR, detail)
        else:
            self.dump(pb.COLLECTIVE_ERROR, detail)

    def _on_signal(self, signum: int) -> None:
        import signal

        reason = pb.SIGNAL_TERM if signum == signal.SIGTERM else pb.SIGNAL_USR1
        self.dump(reason, f"signal {signal.Signals(signum).name}")
        exchange, poller = self.exchange, self.poller
        if reason == pb.SIGNAL_TERM and exchange is not None and poller is not None:
            exchange.after_term()  # the verdict, if this rank reports, before dying
        uploader = self.uploader
        if reason == pb.SIGNAL_TERM and uploader is not None:
            uploader.drain()  # the process ends next, without its atexit handlers

    def _on_exception(self, x: RaisedException) -> None:
        """An exception ended a thread: keep it for every later dump and in the black box."""
        if not self.recorder.enabled:
            return
        if x.is_main and self.died_of is None:
            self.died_of = x
        if len(self.dumper.exceptions) < MAX_EXCEPTIONS:
            self.dumper.exceptions.append(x)
            bb = self.recorder.blackbox
            if bb is not None:  # on disk now: the exit that follows may never finish
                bb.on_exception(x)

    def _at_exit(self) -> None:
        """Dump at exit when FLIGHTREC_DUMP_ON_EXIT asks, or when the process that took part
        in a job is dying of an exception (it says what it died of, with or without the flag)."""
        if not self.recorder.enabled:
            return
        if self.died_of is None and error_file():
            x = from_error_file(error_file(), self._started_ns)
            if x is not None:
                self._on_exception(x)
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
            or self.recorder.ring.pending_slots()
            or self.recorder.groups.groups
        )
        died = self.died_of is not None and self.dumper.identity is not None
        exchange = self.exchange
        if needed and not died and exchange is not None:
            exchange.after_exit()  # a hang among the ranks still running names this one exited
        if not ((self.config.dump_on_exit and needed) or died):
            return
        detail = "process exit"
        if self.died_of is not None:
            x = self.died_of
            detail += f": {x.type}: {x.message}"[:4000]
        if self.dump(pb.PROCESS_EXIT, detail) is not None:
            self.dumper.exit_dumped = True
        interrupted = self.died_of is not None and self.died_of.type == "KeyboardInterrupt"
        if died and exchange is not None and not interrupted:
            exchange.after_death()  # the verdict in the log names the crash (Ctrl-C is none)

    def _on_dump(self, dump: pb.Dump, path: Path | None) -> None:
        if path is None:
            self.counts.dumps_failed += 1
        else:
            self.counts.dumps_written += 1
            if self.uploader is not None:
                self.uploader.submit(path)  # a queue put: the network is the upload thread's
        exchange = self.exchange
        if exchange is not None:
            exchange.on_dump(dump, path)


def _on_torch_thread() -> bool:
    # Future callbacks run on threads torch creates (no Python name of ours); dumping there
    # would hold up torch's completion machinery, so those dumps go to a helper thread.
    return threading.current_thread().name.startswith("Dummy")


_post_warned = False


def _post(poller: Poller, rank: int, seen: int, exchange: Exchange | None) -> None:
    global _post_warned
    try:
        _, n = poller.start_round(rank, "WATCHDOG_TIMEOUT", seen)
        if exchange is not None:
            exchange.after_hang(n)
    except Exception as exc:
        if exchange is not None:
            exchange.store_lost()
        if not _post_warned:  # the store is gone: saying so once is enough
            _post_warned = True
            log.warning("flightrec: could not ask other ranks to dump: %s", exc)


def _rank() -> int:
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            return int(dist.get_rank())
    except Exception:
        pass
    return int(os.environ.get("RANK", "-1") or -1)


def _world_size() -> int:
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            return int(dist.get_world_size())
    except Exception:
        pass
    return 0


_runtime: Runtime | None = None
_runtime_lock = threading.Lock()


def _before_fork() -> None:
    rt = _runtime
    if rt is not None and rt.rawstacks is not None:
        try:
            rt.rawstacks.pause()
        except Exception as exc:
            log.warning("flightrec: could not disarm faulthandler before fork: %s", exc)


def _after_fork_in_parent() -> None:
    rt = _runtime
    if rt is not None and rt.rawstacks is not None:
        try:
            rt.rawstacks.resume(time.monotonic_ns())
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
