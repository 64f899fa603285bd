"""torchcomms' Flight Recorder dumps: one counter for the whole process, renumbered per group.

torchcomms (the communicators torch 2.15 builds NCCL groups on) has a recorder of its own,
attached to each communicator by its ``FlightRecorderHook`` and written in torch's format
(``comm_lib_trace_rank_<rank>`` under ``~/.cache/torch`` or ``TORCHCOMM_FR_DUMP_TEMP_FILE``).
Two things differ from torch's recorder, both read off its writer
(``comms/torchcomms/hooks/fr/FlightRecorder.cpp``):

- ``collective_seq_id`` is one counter for every communicator of the process, from 0, sends
  and receives included, where torch numbers each group's collectives from 1. Two members of a
  group that also use other groups differently (pipeline stages, tensor-parallel pairs) give
  one collective different numbers;
- each group is named ``(communicator name, backend)`` and each entry ``<backend>:<op>``;
  ``is_p2p`` is always false and sends and receives name no peer.

Such a ring is recognised by both marks (every entry's group description is its backend, and
the numbers run on by one across the whole ring) and renumbered as torch numbers: each group's
collectives 1, 2, ... in ring order. Exact when the ring holds the process's first operation
(its first number is 0); after the ring wrapped, the recorder-wide number is kept (plus one),
which agrees across ranks when every rank issued the same operations before the ring's window.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from flightrec.readers.native.model import NativeDump


def recorder_wide(dump: NativeDump) -> bool:
    """Whether ``dump``'s ring is numbered by one counter for all its groups (torchcomms)."""
    es = dump.entries
    if not len(es):
        return False
    if any(
        not desc or desc != backend for desc, backend in zip(es.pg_desc, es.backend, strict=True)
    ):
        return False
    first = es.seq[0]
    return all(seq == first + i for i, seq in enumerate(es.seq))


def per_group(dump: NativeDump) -> NativeDump:
    """``dump`` with each group's collectives numbered 1, 2, ... (unchanged unless
    ``recorder_wide``)."""
    if not recorder_wide(dump):
        return dump
    es = dump.entries
    if es.seq[0] != 0:  # wrapped: the counter itself, 1-based (see the module's note)
        return dataclasses.replace(
            dump, entries=dataclasses.replace(es, seq=[s + 1 for s in es.seq])
        )
    counts: dict[str, int] = defaultdict(int)
    seq: list[int] = []
    for name, p2p in zip(es.pg_name, es.is_p2p, strict=True):
        if p2p:
            seq.append(0)
            continue
        counts[name] += 1
        seq.append(counts[name])
    return dataclasses.replace(dump, entries=dataclasses.replace(es, seq=seq))
