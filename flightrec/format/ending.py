"""How the process a dump describes had ended (``Header.process_end``, schema 1.7).

Writers say it in the header: the recorder (its exit dump: exited; any other: running) and the
black-box reader (from the file's status and whether its process still runs). Dumps written
before 1.7, converted from PyTorch's format or made by other writers leave it unset; for them
it is told as before, from ``reason`` and, for a black box, from the words of its
``reason_detail`` (``flightrec.format.blackbox.DIED`` and ``RUNNING_NOW``).
"""

from __future__ import annotations

from flightrec.format import flightrec_pb2 as pb
from flightrec.format.blackbox import DIED, RUNNING_NOW, SOURCE

ENDED = frozenset({pb.END_EXITED, pb.END_DIED})
"""The values of a process that is gone."""


def process_end(header: pb.Header) -> pb.ProcessEnd.ValueType:
    """How the process of ``header`` had ended: the field, or what an older header says."""
    if header.process_end != pb.END_UNKNOWN:
        return header.process_end
    if header.source == SOURCE:  # a black box read before 1.7: its words say it
        if DIED in header.reason_detail:
            return pb.END_DIED
        if RUNNING_NOW in header.reason_detail:
            return pb.END_RUNNING
        return pb.END_EXITED
    if header.reason == pb.PROCESS_EXIT:
        return pb.END_EXITED
    return pb.END_UNKNOWN


def is_gone(header: pb.Header) -> bool:
    """Whether the process of ``header`` had ended (exited or died) when the dump was made."""
    return process_end(header) in ENDED
