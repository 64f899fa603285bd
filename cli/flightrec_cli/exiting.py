"""Ending the ``flightrec`` process without tearing down what an analysis built.

A 16,384-rank analysis holds millions of objects; freeing them one by one as the interpreter
shuts down took about 2 s after the report was written (131,072 ranks: tens of seconds). A
command whose work is done and written (``analyze``) calls ``skip_teardown``; ``app.main``
then flushes the standard streams and ends the process at once with the command's status. A
command that runs other code whose exit handlers matter never calls it, and neither does a
command run in-process (tests' ``CliRunner``), since only ``main`` acts on it.
"""

from __future__ import annotations

import contextlib
import os
import sys

_skip = False


def skip_teardown() -> None:
    """Ask ``app.main`` to end the process without freeing what it holds."""
    global _skip
    _skip = True


def leave_now_if_asked(code: object) -> None:
    """End the process with ``code`` (as ``sys.exit`` reads it) if ``skip_teardown`` was called."""
    if not _skip:
        return
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # (a closed pipe: nothing to say)
            stream.flush()
    os._exit(code or 0)
