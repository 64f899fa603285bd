"""Strip terminal control characters from everything a dump says in words.

A dump is untrusted input, and its strings (function names, file names, host names, group
descriptions, exception text) end up on the analyst's terminal. An ESC in one of them could
move the cursor, rewrite earlier lines of the report or set the window title. Every string
of a dump is checked once as it enters the analysis; the rare one that holds a control
character has each such character replaced by ``?``. Tabs are kept.
"""

from __future__ import annotations

import dataclasses

from flightrec.errors import CONTROL, printable
from flightrec.format import flightrec_pb2 as pb
from flightrec.format.view import DumpView

_HEADER_TEXT = tuple(f.name for f in pb.Header.DESCRIPTOR.fields if f.type == f.TYPE_STRING)


# Table bytes (``DumpView.tables``: strings, threads, exceptions among them) found without a
# control character, per process: the ranks of one job mostly hold the same. Bounded.
_CLEAN: set[bytes] = set()
_MAX_CLEAN = 4096


def _scrub_tables(meta: pb.Dump) -> bool:
    """Replace control characters in the strings, thread names and exceptions; whether any."""
    found = False
    strings = meta.strings
    if CONTROL.search("\t".join(strings)):
        for i, s in enumerate(strings):
            if CONTROL.search(s):
                strings[i] = printable(s)
                found = True
    for t in meta.threads:
        if CONTROL.search(t.name):
            t.name = printable(t.name)
            found = True
    for x in meta.exceptions:
        for name in ("type", "message", "thread", "via"):
            value = getattr(x, name)
            if CONTROL.search(value):  # a multi-line message reads as one line
                setattr(x, name, printable(value.strip().replace("\n", " / ")))
                found = True
    return found


def scrub(view: DumpView) -> DumpView:
    """``view`` with no control characters in its strings, header or group names.

    One regular-expression search over the joined strings in the common case (nothing to
    replace), none where the same table bytes were found clean before; the tables are
    rewritten in place only when something is found.
    """
    meta = view.meta
    h = meta.header
    for name in _HEADER_TEXT:
        value = getattr(h, name)
        if value and CONTROL.search(value):
            setattr(h, name, printable(value))
    tables = view.tables
    if (tables is None or tables not in _CLEAN) and not _scrub_tables(meta) and tables:
        if len(_CLEAN) >= _MAX_CLEAN:
            _CLEAN.clear()
        _CLEAN.add(tables)
    groups = view.groups
    if any(CONTROL.search(g.name) or CONTROL.search(g.desc) for g in groups):
        groups = tuple(
            dataclasses.replace(g, name=printable(g.name), desc=printable(g.desc)) for g in groups
        )
        view = DumpView(meta, groups, view.entries, view.older)
    return view
