"""A rank's summary (``flightrec.format.summary``) as the analysis's view of a dump.

A summary carries its rank's dump cut down, as a ``Dump`` message already checked by the dump
validator when it was decoded: the view is that dump's, with no per-entry Python objects in
between. It holds the summary's entries only; every earlier entry of the rank's ring reads as
overwritten, which the analysis already handles (it never takes a missing entry for a skipped
call). So the same passes that analyse full dumps analyse summaries.
"""

from __future__ import annotations

from flightrec.format import flightrec_pb2 as pb
from flightrec.format.schema import SUMMARY_SOURCE
from flightrec.format.summary import Summary, to_dump
from flightrec.format.view import DumpView

SOURCE = SUMMARY_SOURCE
"""``Header.source`` of a view built from a summary."""


def summary_view(s: pb.Summary | Summary) -> DumpView:
    """The view of one rank built from its summary.

    Args:
        s: a summary as ``decode`` returns it (checked), or as ``summarize`` built it.
    """
    return DumpView.of(s.dump if isinstance(s, pb.Summary) else to_dump(s))
