"""Which frames of a stack are the user's: shared by the summaries a rank publishes and the
analysis that reads them (both need "the line of code" a person wants to see)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")

# Frames inside these are not "the line of code" a user wants: torch's own Python,
# flightrec's hooks, the standard library (queue.get, threading waits), import machinery, and
# typing_extensions' ``deprecated`` wrapper, which torch puts around deprecated collectives
# (``all_gather_into_tensor`` in torch 2.13).
_LIBRARY_FILE = re.compile(
    r"(^<)|(/|^)(torch|flightrec)/|/lib/python3\.\d+/(?!site-packages/|dist-packages/)"
    r"|/(site|dist)-packages/(torch|flightrec|typer|click|rich)/"
    r"|/(site|dist)-packages/typing_extensions\.py$"
)


def is_library_file(file: str) -> bool:
    """True for files of torch, flightrec or the standard library rather than user code."""
    return bool(_LIBRARY_FILE.search(file.replace("\\", "/")))


def keep_user_frames(frames: Sequence[T], files: Sequence[str], limit: int) -> list[T]:
    """At most ``limit`` of ``frames`` (innermost first), in order: the innermost one, then
    the user's frames, then the rest in order while room is left.

    A stack cut to its innermost frames alone loses the user's line under torch's (a DDP
    bucket all-reduce is six frames below ``loss.backward()``).
    """
    if len(frames) <= limit:
        return list(frames)
    keep = [0]
    keep += [i for i in range(1, len(frames)) if not is_library_file(files[i])][: limit - 1]
    rest = (i for i in range(1, len(frames)) if i not in keep)
    keep += [next(rest) for _ in range(limit - len(keep))]
    return [frames[i] for i in sorted(keep)]
