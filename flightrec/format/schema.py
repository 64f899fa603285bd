"""The dump file's fixed facts: magic bytes, schema version, file names, size limits.

A dump file is one serialized ``flightrec.v1.Dump``. Field 1, the constant magic string, is
always written first, so every valid file starts with ``MAGIC_PREFIX``; readers check it
before handing the bytes to the parser. Since schema 1.3 the rest is laid out so that the
file's end can be read on its own (``flightrec.format.write.serialize``, the proto's "tail
layout").
"""

from __future__ import annotations

import struct

from flightrec.format import flightrec_pb2 as pb

MAGIC = "flightrec.dump"
MAGIC_PREFIX = b"\x0a" + bytes([len(MAGIC)]) + MAGIC.encode()
SCHEMA_MAJOR = 1
SCHEMA_MINOR = 7
TAIL_ENTRIES = 256
"""Newest entries a 1.3 writer puts after the tables, readable without the rest of the file:
a few steps of training (the frontier where ranks diverge and every group's recent past);
the loader reads deeper where that is not enough."""
FOOTER_LAYOUT = struct.Struct("<BQBI")
"""The footer that ends a 1.3 file: ``tail_start`` (tag, fixed64), then ``older_entries``
(tag, fixed32), as ``flightrec.format.write.serialize`` writes them and
``flightrec.format.tail`` reads them."""
FOOTER = FOOTER_LAYOUT.size
"""Bytes of the footer (14)."""
TAIL_START_TAG = (pb.Dump.DESCRIPTOR.fields_by_name["tail_start"].number << 3) | 1
"""The footer's first tag: field ``tail_start``, wire type fixed64."""
OLDER_ENTRIES_TAG = (pb.Dump.DESCRIPTOR.fields_by_name["older_entries"].number << 3) | 5
"""The footer's second tag: field ``older_entries``, wire type fixed32."""
SUFFIX = ".frdump"
RECORDER_SOURCE = "flightrec"
"""``Header.source`` of a dump flightrec's recorder wrote."""
SUMMARY_SOURCE = "flightrec-summary"
"""``Header.source`` of the view built from a rank's summary (the verdict in the log)."""
# A 16,384-entry ring with deep stacks is a few MB; anything past this is not a dump we wrote,
# and reading it whole could exhaust the analysis machine's memory.
MAX_DUMP_BYTES = 256 * 1024 * 1024

# Far beyond the largest jobs (~100,000 GPUs); a header claiming more is damaged, and believing
# it would make the analysis allocate per-rank state for billions of ranks.
MAX_WORLD_SIZE = 1 << 24

ENTRY_COLUMNS = tuple(field.name for field in pb.Entries.DESCRIPTOR.fields)


def new_dump() -> pb.Dump:
    """An empty dump with magic, version and the index-0 sentinels already in place."""
    dump = pb.Dump(magic=MAGIC, schema_major=SCHEMA_MAJOR, schema_minor=SCHEMA_MINOR)
    dump.strings.append("")
    dump.stacks.add()
    dump.tensor_specs.add()
    return dump


def dump_filename(rank: int, dump_index: int, reason: str, pid: int) -> str:
    """File name for one dump event; distinct per rank, process and event, so none overwrites another."""
    return f"flightrec-rank{rank:05d}-{pid}-{dump_index:03d}-{reason.lower()}{SUFFIX}"
