"""Every key flightrec uses in a job's store, in one place.

All keys live under ``flightrec/<namespace>/`` (``FLIGHTREC_JOB_ID``, else ``default``) on the
underlying TCPStore: torch's prefix stores are unwrapped, so an outside client connected to
MASTER_ADDR:MASTER_PORT (``flightrec trigger``) sees the keys the workers see.

| key | written by | what |
| --- | --- | --- |
| ``requests`` | whoever posts a dump request | how many requests were posted (a counter) |
| ``requests/<n>`` | the poster of request ``n`` | ``"<rank> <REASON>"``; every rank waits for the next one |
| ``requests/<n>/dumped``, ``.../failed`` | each rank answering a trigger | ``"<rank>,"`` appended |
| ``world`` | rank 0 | the world size, for ``flightrec trigger`` |
| ``endpoint`` | rank 0, in torchrun's rendezvous store | the workers' store address |
| ``summary/<rank>`` | each rank answering a round | its latest summary |
| ``round/<n>/progress`` | each rank answering round ``n`` | its progress record, framed, appended |
| ``round/<n>/ranks`` | each rank answering round ``n`` | ``"<rank>,"`` appended |
| ``round/<n>/reporter`` | the ranks answering round ``n`` that may report | the lowest (``"<rank>!"`` once it prints) |
| ``died/<restart>``, ``left/<restart>`` | ranks dying of an exception, ending cleanly | ``"<rank>,"`` appended |
| ``verdict/<restart>`` | the reporter of a hang's first verdict | the finding it printed |
| ``slow/<rank>`` | each rank, every slow-check interval | its digest of recent arrivals |

(``<restart>``: torchrun's restart count of the attempt.)
"""

from __future__ import annotations

import os
from dataclasses import dataclass

DEFAULT_NAMESPACE = "default"


def restart_count() -> str:
    """torchrun's restart count of this attempt ("0" outside torchrun, or when unreadable)."""
    value = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0").strip()
    return value if value.isdigit() and len(value) < 9 else "0"


@dataclass(frozen=True, slots=True)
class Keys:
    """The keys of one job (one namespace)."""

    namespace: str = ""

    @property
    def root(self) -> str:
        """``flightrec/<namespace>``."""
        return f"flightrec/{self.namespace or DEFAULT_NAMESPACE}"

    @property
    def requests(self) -> str:
        """How many dump requests were posted."""
        return f"{self.root}/dump_request"

    def request(self, n: int) -> str:
        """Request ``n``'s description; every rank waits for the next request's."""
        return f"{self.requests}/{n}"

    def acknowledged(self, n: int, what: str) -> str:
        """Ranks that answered trigger ``n``: ``what`` is ``dumped`` or ``failed``."""
        return f"{self.requests}/{n}/{what}"

    @property
    def world(self) -> str:
        """The world size rank 0 registered."""
        return f"{self.root}/world"

    @property
    def endpoint(self) -> str:
        """The workers' store address, in torchrun's rendezvous store."""
        return f"{self.root}/endpoint"

    def summary(self, rank: int) -> str:
        """Rank ``rank``'s latest summary."""
        return f"{self.root}/summary/{rank}"

    def round(self, n: int, what: str) -> str:
        """``ranks``, ``progress`` or ``reporter`` of round ``n``."""
        return f"{self.root}/round/{n}/{what}"

    def died(self, restart: str) -> str:
        """Ranks of attempt ``restart`` that died of an exception."""
        return f"{self.root}/died/{restart}"

    def left(self, restart: str) -> str:
        """Ranks of attempt ``restart`` that ended cleanly."""
        return f"{self.root}/left/{restart}"

    def verdict(self, restart: str) -> str:
        """The hang's first verdict in attempt ``restart``."""
        return f"{self.root}/verdict/{restart}"

    def slow(self, rank: int) -> str:
        """Rank ``rank``'s slow-check digest."""
        return f"{self.root}/slow/{rank}"
