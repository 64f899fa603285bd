"""This rank's link to the other ranks through the job's store.

The dump-request poller (``exchange.store``), the verdict exchange (``exchange.verdict``), the
slow check (``exchange.slowcheck``) and the registration that lets ``flightrec trigger`` find
the store (``exchange.endpoint``). Each starts once the process has a default group with a
store, and leaves the store before the store goes.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from flightrec.recorder.config import Config
from flightrec.recorder.dumping.dumper import Dumper, device_identity
from flightrec.recorder.exchange.endpoint import Registration, register
from flightrec.recorder.exchange.slowcheck import SlowCheck
from flightrec.recorder.exchange.store import Poller, default_store, store_address
from flightrec.recorder.exchange.verdict import GATHER_S, Exchange, Reporter
from flightrec.recorder.recording.recorder import Recorder
from flightrec.recorder.startup import lowest_on_node, say, startup_line

log = logging.getLogger("flightrec")
POLLER_STOP_WAIT_S = 2.0
"""How long the end of the job waits for the poller to leave a store call (its wait ends as
soon as its connection is closed, and a call to a live store takes milliseconds)."""
REGISTER_WAIT_S = 2.0
"""How long exit waits for the endpoint registration (a store call taking milliseconds)."""


class WarnOnce:
    """Says once per topic that a part is left off (``warn(topic, what, exc)``)."""

    def __init__(self) -> None:
        self._said: set[str] = set()

    def __call__(self, topic: str, what: str, exc: BaseException) -> None:
        if topic not in self._said:
            self._said.add(topic)
            log.warning("flightrec: %s: %s", what, exc)


class Peers:
    """The poller, the exchange, the slow check and the registration (each None until
    started, and again once stopped).

    Args:
        config: the settings.
        recorder: the process's recorder (the slow check reads its ring).
        dumper: its identity is the rank's, once the default group exists.
        namespace: the store's key prefix (FLIGHTREC_JOB_ID's, or the default).
        reporter: prints the verdict into the job's log (None: no verdict).
        warn: says once per topic that a part is left off.
    """

    def __init__(
        self,
        config: Config,
        recorder: Recorder,
        dumper: Dumper,
        namespace: str,
        reporter: Reporter | None,
        warn: WarnOnce,
    ) -> None:
        self._config = config
        self._recorder = recorder
        self._dumper = dumper
        self.namespace = namespace
        self.reporter = reporter
        self._warn = warn
        self._lock = threading.Lock()
        self.poller: Poller | None = None
        self.exchange: Exchange | None = None
        self.slowcheck: SlowCheck | None = None
        self.registration: Registration | None = None
        """Leaves the store's address for ``flightrec trigger`` (``endpoint``)."""
        self._announced = False

    def use_reporter(self, reporter: Reporter) -> None:
        """Print the verdict with ``reporter`` from the next exchange on."""
        self.reporter = reporter

    def start(
        self,
        on_request: Callable[[int, int, str], bool],
        on_covered: Callable[[int, str], None],
        blackbox_dir: str,
    ) -> None:
        """Start what is not running yet, where the default group has a store (idempotent).

        Args:
            on_request: the poller's ``on_request(n, requester, reason)``: dump for it.
            on_covered: the poller's ``on_covered(n, reason)``.
            blackbox_dir: where the black box lives ("": none), for the verdict.
        """
        with self._lock:
            if self.poller is None:
                store = default_store()
                if store is not None:
                    try:
                        self.poller = Poller(
                            store, self.namespace, on_request,
                            rank=job_rank(), world_size=job_world_size(),
                            on_covered=on_covered,
                            relay_scope="" if self._config.host_relay else None,
                        )  # fmt: skip
                    except Exception as exc:
                        self._warn("poller", "dump requests through the store are off", exc)
            poller = self.poller
            reporter = self.reporter if self._config.verdict else None
            if poller is not None and self.exchange is None and reporter is not None:
                self.exchange = Exchange(
                    poller, job_rank(), job_world_size(), self.namespace, reporter, blackbox_dir
                )
            if poller is not None and self.slowcheck is None and self._config.slow_check_s:
                self._start_slowcheck(poller)

    def _start_slowcheck(self, poller: Poller) -> None:
        """The slow check (docs/slow-ranks.md); rank 0 judges, with what the reporter makes."""
        rank = job_rank()
        make = self.reporter.slow_judge if rank == 0 and self.reporter is not None else None
        try:

            def device() -> str:  # asked at the first check, once the group's backend is known
                ident = self._dumper.identity
                return device_identity(ident.backend if ident is not None else "")[0]

            self.slowcheck = SlowCheck(
                poller.connection_source(), self._recorder, rank, job_world_size(),
                self.namespace, self._config.slow_check_s, make, device,
            )  # fmt: skip
        except Exception as exc:
            self._warn("slowcheck", "no slow-rank check", exc)

    def announce(self) -> None:
        """Once the default group exists: the start-up line (the node's lowest rank), and the
        store's address where ``flightrec trigger`` looks for it."""
        ident = self._dumper.identity
        if self._announced or ident is None:
            return
        self._announced = True
        config = self._config
        try:
            address = store_address() if self.poller is not None else ""
            leader = lowest_on_node(ident.rank)
            if address and (leader or ident.rank == 0):
                local = "://" not in config.directory
                self.registration = register(
                    address, self.namespace, ident.world_size,
                    config.directory if leader and local else None, ident.rank,
                )  # fmt: skip
            if leader:
                from flightrec import __version__

                say(
                    startup_line(
                        __version__, ident.rank, ident.world_size, config.directory,
                        config.timeout_s, config.verdict and self.reporter is not None,
                        address,
                    )
                )  # fmt: skip
        except Exception as exc:
            log.warning("flightrec: could not announce tracing: %s", exc)

    def before_store_goes(self) -> None:
        """The default group (and, usually, the store) is about to go: the exchange says
        this rank exited, and everything leaves the store while it still answers."""
        exchange = self.exchange
        if exchange is not None:
            exchange.after_exit()
        self.stop()

    def stop(self) -> None:
        """Stop the poller and the slow check, and wait (briefly) until they are out of the
        store; the exchange goes with the poller."""
        with self._lock:
            poller, self.poller = self.poller, None
            self.exchange = None
            slowcheck, self.slowcheck = self.slowcheck, None
        if slowcheck is not None:  # out of the store before the store goes
            slowcheck.stop()
        if poller is not None:
            poller.stop(wait_s=POLLER_STOP_WAIT_S)

    def close(self) -> None:
        """At exit: let the verdict being printed finish, the registration end, then stop."""
        exchange = self.exchange
        if exchange is not None:
            exchange.close(wait_s=GATHER_S + 2.0)
        registration = self.registration
        if registration is not None:
            registration.join(REGISTER_WAIT_S)
        self.stop()

    def pause(self) -> None:
        """``flightrec.disable``: stop polling and checking at once (no wait); the exchange is
        kept for a later ``enable``."""
        with self._lock:
            if self.poller is not None:
                self.poller.stop()
                self.poller = None
            if self.slowcheck is not None:
                self.slowcheck.stop(wait_s=0.0)
                self.slowcheck = None

    def after_fork_in_child(self) -> None:
        """In a forked child: none of the parent's threads or connections are its own."""
        self._lock = threading.Lock()
        self.poller = None
        self.registration = None
        self.exchange = None
        self.slowcheck = None


def job_rank() -> int:
    """This process's global rank: torch's, else ``RANK`` (-1: unknown)."""
    rank = _ask_torch(lambda dist: dist.get_rank())
    return rank if rank is not None else int(os.environ.get("RANK", "-1") or -1)


def job_world_size() -> int:
    """The job's world size from torch (0: no default group)."""
    world = _ask_torch(lambda dist: dist.get_world_size())
    return world if world is not None else 0


def _ask_torch(ask: Callable[[Any], Any]) -> int | None:
    """``ask(torch.distributed)`` while a default group exists; None without one (or torch)."""
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            return int(ask(dist))
    except Exception:
        pass
    return None
