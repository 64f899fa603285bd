"""What makes a process dump: a hang, another rank's request, a failed call, a signal, an
exception that ends a thread, ``flightrec.dump()``; and what follows each dump.

Every handler here runs on the thread that noticed (the watchdog, the request poller, the signal
watcher, a torch callback) and never raises into it.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path

from flightrec.format import flightrec_pb2 as pb
from flightrec.format.slot import Slot
from flightrec.recorder.dumping.dumper import describe_entry, in_thread
from flightrec.recorder.dumping.exceptions import RaisedException
from flightrec.recorder.exchange.store import Poller
from flightrec.recorder.exchange.verdict import Exchange
from flightrec.recorder.parts import Parts

log = logging.getLogger("flightrec")
ERROR_DUMP_INTERVAL_NS = 5_000_000_000
"""A dead peer makes every later call fail; one error dump per interval is enough."""


class Triggers:
    """The process's dump triggers and what each dump is handed to (``parts``: what the
    runtime made)."""

    def __init__(self, parts: Parts) -> None:
        self._p = parts
        self.uploader = parts.uploader
        """None once forked: the child uploads nothing."""
        self._hang_dumped_ns = 0
        self._last_error_dump = 0
        self.died_of: RaisedException | None = None
        """The exception that ended the main thread, once one did."""

    def dump(self, reason: int, detail: str = "", requested_by: int = -1) -> Path | None:
        """Write one dump now (``Dumper.dump``)."""
        return self._p.dumper.dump(reason, detail, requested_by)

    def rank(self) -> int:
        """The identity fixed at the first group, as in the dumps (else ``RANK``)."""
        ident = self._p.dumper.identity
        return ident.rank if ident is not None else int(os.environ.get("RANK", "-1") or -1)

    # -- hangs --------------------------------------------------------------------------------
    def on_hang(self, slot: Slot) -> None:
        """The watchdog saw ``slot`` outlive the timeout: dump, and ask every rank to."""
        poller = self._p.peers.poller
        if poller is not None and poller.last_round_ns > slot.enqueue_ns:
            # Another rank saw this hang first; we already dumped, with this entry pending.
            # (A trigger's request is no such round: a hang pending through one is declared.)
            return
        seen = poller.seen if poller is not None else 0
        if poller is not None:
            poller.hang_ns = time.monotonic_ns()
        what = describe_entry(self._p.recorder, slot)
        self._hang_dumped_ns = time.monotonic_ns()
        self.dump(pb.WATCHDOG_TIMEOUT, f"incomplete for over {self._p.config.timeout_s:g}s: {what}")
        if poller is not None:
            self._post(poller, seen)

    def on_native_hang(self, what: str, now_ns: int) -> None:
        """A collective only PyTorch's recorder saw (funcol, C++) outlived the timeout."""
        poller, since = self._p.peers.poller, now_ns - self._p.native_watch.timeout_ns
        if self._hang_dumped_ns > since or (poller is not None and poller.last_round_ns > since):
            return  # this hang was dumped already: our watchdog's, or another rank's request
        ring = self._p.recorder.ring
        if any(ring.read(i).enqueue_ns < since + 10**9 for i in ring.pending_slots()):
            return  # one of our own entries is as overdue: our watchdog reports it, better
        self._hang_dumped_ns = now_ns
        # As for a hang our own watchdog sees (on_hang): the request others answer, then the
        # verdict exchange for it.
        seen = poller.seen if poller is not None else 0
        if poller is not None:
            poller.hang_ns = time.monotonic_ns()
        self.dump(pb.WATCHDOG_TIMEOUT, what)
        if poller is not None:
            self._post(poller, seen)

    def _post(self, poller: Poller, seen: int) -> None:
        # Posting may block on a slow store: never on the watchdog thread.
        threading.Thread(
            target=_post, args=(poller, self.rank(), seen, self._p.peers.exchange),
            name="flightrec-post", daemon=True,
        ).start()  # fmt: skip

    # -- requests, errors, signals, exceptions ------------------------------------------------
    def on_request(self, n: int, requester: int, reason: str) -> bool:
        """Dump for request ``n``; returns whether the dump was written."""
        if reason == "CLI_TRIGGER":
            return self.dump(pb.CLI_TRIGGER, f"request {n}: flightrec trigger", -1) is not None
        who = f"rank {requester}" if requester >= 0 else "another process"
        detail = f"request {n} from {who} ({reason or 'unknown'})"
        path = self.dump(pb.PEER_REQUEST, detail, requester)
        exchange = self._p.peers.exchange
        if exchange is not None:
            exchange.after_request(n, reason)
        return path is not None

    def on_covered(self, n: int, reason: str) -> None:
        """Another rank's request ``n`` is for the hang this rank dumped moments ago."""
        exchange = self._p.peers.exchange
        if exchange is not None:
            exchange.rejoin(n, reason)

    def on_error(self, rid: int, exc: BaseException) -> None:
        """Recorded call ``rid`` failed: dump (at most one such dump per interval)."""
        now = time.monotonic_ns()
        if self._last_error_dump and now - self._last_error_dump < ERROR_DUMP_INTERVAL_NS:
            return
        self._last_error_dump = now
        ring = self._p.recorder.ring
        slot = ring.read((rid - 1) % ring.capacity)
        what = describe_entry(self._p.recorder, slot) if slot.record_id == rid else f"record {rid}"
        detail = f"{what} raised {type(exc).__name__}: {exc}"[:4000]
        if threading.current_thread().name == "flightrec-dump":
            self.dump(pb.COLLECTIVE_ERROR, detail)
        elif _on_torch_thread():
            in_thread(self._p.dumper, pb.COLLECTIVE_ERROR, detail)
        else:
            self.dump(pb.COLLECTIVE_ERROR, detail)

    def on_signal(self, signum: int) -> None:
        """SIGUSR1 or SIGTERM arrived (on the signal watcher's thread)."""
        reason = pb.SIGNAL_TERM if signum == signal.SIGTERM else pb.SIGNAL_USR1
        self.dump(reason, f"signal {signal.Signals(signum).name}")
        exchange, poller = self._p.peers.exchange, self._p.peers.poller
        if reason == pb.SIGNAL_TERM and exchange is not None and poller is not None:
            exchange.after_term()  # the verdict, if this rank reports, before dying
        uploader = self.uploader
        if reason == pb.SIGNAL_TERM and uploader is not None:
            uploader.drain()  # the process ends next, without its atexit handlers

    def on_exception(self, x: RaisedException) -> None:
        """An exception ended a thread: keep it for every later dump and in the black box."""
        if not self._p.recorder.enabled:
            return
        if x.is_main and self.died_of is None:
            self.died_of = x
        if self._p.dumper.add_exception(x):
            bb = self._p.blackbox
            if bb is not None:  # on disk now: the exit that follows may never finish
                bb.on_exception(x)

    # -- after each dump ----------------------------------------------------------------------
    def on_dump(self, dump: pb.Dump, path: Path | None) -> None:
        """The dumper built ``dump`` and wrote it to ``path`` (None: it could not)."""
        if path is None:
            self._p.counts.dumps_failed += 1
        else:
            self._p.counts.dumps_written += 1
            if self.uploader is not None:
                self.uploader.submit(path)  # a queue put: the network is the upload thread's
        exchange = self._p.peers.exchange
        if exchange is not None:
            exchange.on_dump(dump, path)

    def after_fork_in_child(self) -> None:
        """In a forked child: nothing to upload (dumps are off), nothing to wait for at exit."""
        self.uploader = None

    def close_uploader(self) -> None:
        """At exit, after the last dump: let the uploads finish (``upload``)."""
        uploader = self.uploader
        if uploader is not None:
            uploader.close()


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
