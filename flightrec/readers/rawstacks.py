"""Read the raw stacks faulthandler left beside a black box, into the dump read from that box.

A rank whose Python could not run (a thread holding the GIL in a long C call) leaves only these:
file, line and function per frame, no thread names, no locals.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

from flightrec.format import flightrec_pb2 as pb
from flightrec.format.rawstacks import stacks_path

MAX_READ_BYTES = 1 << 20
"""A stacks file is a few KB; reading stops here whatever the file claims."""

_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):$")
_FRAME = re.compile(r'^  File "(.*)", line (\d+) in (.*)$')
_MAIN = re.compile(r"\bmain=(0x[0-9a-fA-F]+)\b")


class RawThread(NamedTuple):
    """One thread's stack as faulthandler wrote it."""

    ident: int
    frames: tuple[tuple[str, int, str], ...]
    """(file, line, function), innermost first."""


def parse(text: str) -> tuple[int, list[RawThread]]:
    """(main thread ident or 0, threads of the last complete report) of a stacks file."""
    main = 0
    if m := _MAIN.search(text.split("\n", 1)[0]):
        main = int(m.group(1), 16)
    reports: list[list[RawThread]] = []
    ident: int | None = None
    frames: list[tuple[str, int, str]] = []

    def close_thread() -> None:
        if ident is not None and reports:
            reports[-1].append(RawThread(ident, tuple(frames)))

    for line in text.splitlines():
        if line.startswith("Timeout (") or (not reports and _THREAD.match(line)):
            close_thread()
            ident = None
            reports.append([])
        if t := _THREAD.match(line):
            close_thread()
            ident, frames = int(t.group(1), 16), []
        elif (f := _FRAME.match(line)) and ident is not None:
            frames.append((f.group(1), int(f.group(2)), f.group(3)))
    close_thread()
    complete = [r for r in reports if r]
    return main, complete[-1] if complete else []


def attach(dump: pb.Dump, ring_path: str | Path) -> bool:
    """Add the raw stacks of black box ``ring_path`` (if any) to the dump read from it.

    Returns:
        Whether any thread was added.
    """
    path = stacks_path(ring_path)
    try:
        with open(path, "rb") as f:
            text = f.read(MAX_READ_BYTES).decode("utf-8", "replace")
    except OSError:
        return False
    main, threads = parse(text)
    if not threads:
        return False
    strings = {s: i for i, s in enumerate(dump.strings)}

    def string(value: str) -> int:
        index = strings.get(value)
        if index is None:
            index = strings[value] = len(dump.strings)
            dump.strings.append(value)
        return index

    for t in threads:
        stack = dump.stacks.add()
        for file, line, name in t.frames:
            stack.frames.append(len(dump.frames))
            dump.frames.add(file=string(file), name=string(name), line=line)
        is_main = t.ident == main
        dump.threads.add(
            ident=t.ident,
            name="MainThread" if is_main else f"thread 0x{t.ident:x}",
            stack=len(dump.stacks) - 1,
            is_main=is_main,
        )
    return True
