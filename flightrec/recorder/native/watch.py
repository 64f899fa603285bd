"""The watchdog's view of collectives only PyTorch's recorder saw (see ``harvest``)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from flightrec.format.native_names import parse_profiling_name

log = logging.getLogger("flightrec")


@dataclass(frozen=True, slots=True)
class PendingNative:
    """A collective torch's recorder shows unfinished (``NativeWatch.pending``)."""

    group: str
    """torch's group name."""
    seq: int
    """Its ``collective_seq_id``: the ProcessGroup's own number."""
    op: str
    since_ns: int
    """Monotonic time torch's counters were first seen standing still on it."""


class NativeWatch:
    """Spots a collective only the native recorder saw that stays incomplete too long.

    torch keeps, per process group, the last collective enqueued and the last completed
    (``pg_status``); reading them is one small JSON without entries. A group whose enqueued
    counter stays ahead of its completed one, unchanged, for ``timeout_s`` is hung.
    """

    POLL_NS = 1_000_000_000
    PENDING_NS = 2_000_000_000
    """A collective torch's counters show unfinished this long is looked up (``pending``)."""

    def __init__(self, timeout_s: float, enabled: bool = True) -> None:
        self.timeout_ns = int(timeout_s * 1e9)
        self._next_poll = 0
        self._pending: dict[str, tuple[tuple[int, int], int]] = {}
        """pg id -> ((last completed, last enqueued), monotonic time they were first seen)."""
        self._reported: set[tuple[str, int]] = set()
        """(pg id, last enqueued) already looked into."""
        self._checked: set[tuple[str, int]] = set()
        """(pg id, last enqueued) looked up for ``pending``."""
        self.pending: dict[str, PendingNative] = {}
        """pg id -> the oldest collective of the group that torch's recorder shows unfinished
        for ``PENDING_NS`` or more, as confirmed from its entries: what a black box cannot
        see in its own ring (DDP's bucket all-reduces, FSDP2, funcol) while a rank waits."""
        self.version = 0
        """Moves whenever ``pending`` changes."""
        self.groups: set[str] = set()
        """pg ids torch's recorder has counters for (the name it gives a group it names)."""
        self._off = not enabled

    def poll(self, now_ns: int) -> str | None:
        """At most once a second: a description of a newly hung collective, else None."""
        if self._off or now_ns < self._next_poll:
            return None
        self._next_poll = now_ns + self.POLL_NS
        status = self._status()
        if status is None:
            return None
        found = None
        self.groups.update(status)
        for pg, st in status.items():
            try:
                enq = int(st.get("last_enqueued_collective", -1))
                done = int(st.get("last_completed_collective", -1))
            except (TypeError, ValueError, AttributeError):
                continue
            if enq <= done:
                self._pending.pop(pg, None)
                self._forget(pg)
                continue
            seen = self._pending.get(pg)
            if seen is None or seen[0] != (done, enq):  # moved: its clock starts again
                self._pending[pg] = ((done, enq), now_ns)
                self._forget(pg)
                continue
            if now_ns - seen[1] >= self.PENDING_NS and (pg, enq) not in self._checked:
                self._checked.add((pg, enq))
                oldest = self._confirm(pg, enq)
                if oldest is not None:
                    seq, op, group = oldest
                    self.pending[pg] = PendingNative(group, seq, op, seen[1])
                    self.version += 1
            if now_ns - seen[1] >= self.timeout_ns and (pg, enq) not in self._reported:
                self._reported.add((pg, enq))
                pending = self._confirm(pg, enq)
                if pending is not None and found is None:
                    seq, op, group = pending
                    found = (
                        f"{op} on group {group} seq {seq} (seen by PyTorch's recorder) "
                        f"incomplete for over {self.timeout_ns / 1e9:g}s"
                    )
        return found

    def _forget(self, pg: str) -> None:
        if self.pending.pop(pg, None) is not None:
            self.version += 1

    def _confirm(self, pg: str, enqueued: int) -> tuple[int, str, str] | None:
        """(seq, op, group name) of the oldest unfinished native entry of ``pg``, if any.

        The counters alone can lie: gloo's worker threads store "last completed" without
        ordering, so a slow thread can set it back below a collective that did finish. The
        entries (read only when the counters look stuck) say which one is really unfinished.
        """
        data = self._json(include_entries=True)
        for e in (data or {}).get("entries") or []:
            if not isinstance(e, dict) or str(e.get("pg_id")) != pg or e.get("is_p2p"):
                continue
            done = e.get("retired") or e.get("state") == "completed"
            seq = int(e.get("collective_seq_id") or 0)
            if not done and 0 < seq <= enqueued:
                _, op, _, _ = parse_profiling_name(str(e.get("profiling_name") or ""))
                name = (e.get("process_group") or ("?",))[0]
                return seq, op, str(name)
        return None

    def _status(self) -> dict[str, dict[str, Any]] | None:
        data = self._json(include_entries=False)
        status = (data or {}).get("pg_status") or {}
        return status if isinstance(status, dict) else None

    def _json(self, include_entries: bool) -> dict[str, Any] | None:
        try:
            from torch._C import _distributed_c10d as c10d

            fn = getattr(c10d, "_dump_fr_trace_json", None)
            if fn is None:
                self._off = True
                return None
            data = json.loads(fn(includeCollectives=include_entries, onlyActive=True))
            return data if isinstance(data, dict) else None
        except Exception as exc:
            self._off = True
            log.warning("flightrec: hangs in collectives issued outside Python go unseen: %s", exc)
            return None
