"""Every thread's Python stack of a running process, read from outside by py-spy.

py-spy (the ``attach`` extra) reads the interpreter's memory: ``py-spy dump --pid P --json``
pauses the process for the few milliseconds of the read (ptrace), prints each thread's frames
as JSON and lets it go on; nothing runs inside the process. It needs the right to trace the
process: the same user (and no ``kernel.yama.ptrace_scope`` above 0), or root, or
``CAP_SYS_PTRACE``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from flightrec.format.builder import FrameTuple

TIMEOUT_S = 20.0
"""Longest wait for one py-spy run (it takes about 0.1 s; a process with thousands of threads
or a loaded machine can take seconds)."""


class StackReadError(Exception):
    """py-spy could not read a process; ``reason`` is one line without the pid."""

    def __init__(self, pid: int, reason: str) -> None:
        super().__init__(f"pid {pid}: {reason}")
        self.pid = pid
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ThreadStack:
    """One thread of one process at one instant."""

    pid: int
    ident: int
    """Python's thread id (``threading.get_ident()``)."""
    native_id: int
    """The kernel's thread id; equal to ``pid`` for the main thread."""
    name: str
    frames: tuple[FrameTuple, ...]
    """(file, function, line), innermost first."""

    @property
    def is_main(self) -> bool:
        """Whether this is the process' main thread."""
        return self.native_id == self.pid


def find_pyspy() -> str | None:
    """The py-spy executable: on PATH, else next to this interpreter (a virtual environment's
    ``bin/``, where ``pip install 'torch-flightrec[attach]'`` puts it)."""
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None


def _reason(pid: int, stderr: str, returncode: int) -> str:
    """py-spy's failure in one line, with what to do about it where that is known."""
    text = " ".join(stderr.split("Stack backtrace:")[0].split())
    low = text.lower()
    if "permission denied" in low or "operation not permitted" in low:
        return (
            "no permission to read its memory (ptrace): run as the job's user or as root "
            "(with kernel.yama.ptrace_scope above 0, as root or with CAP_SYS_PTRACE)"
        )
    if "no such file" in low or "no such process" in low or "failed to find process" in low:
        return "no such process (it has exited)"
    if "failed to find python version" in low or "failed to get process executable" in low:
        return "not a Python process that py-spy can read"
    return f"py-spy failed (exit {returncode}): {text[:300] or 'no message'}"


def _frames(raw: object) -> tuple[FrameTuple, ...]:
    out: list[FrameTuple] = []
    if not isinstance(raw, list):
        return ()
    for f in raw:
        if not isinstance(f, dict):
            continue
        file, name, line = f.get("filename"), f.get("name"), f.get("line")
        if isinstance(file, str) and isinstance(name, str) and isinstance(line, int):
            out.append((file, name, max(0, line)))
    return tuple(out)


def parse_dump(pid: int, text: str) -> list[ThreadStack]:
    """The threads in py-spy's JSON output, as printed by ``py-spy dump --json``.

    Raises:
        StackReadError: the output is not that JSON.
    """
    try:
        raw = json.loads(text)
    except ValueError:
        raise StackReadError(pid, "py-spy printed something other than JSON") from None
    if not isinstance(raw, list):
        raise StackReadError(pid, "py-spy's JSON is not a list of threads")
    threads: list[ThreadStack] = []
    for t in raw:
        if not isinstance(t, dict):
            continue
        owner = t.get("pid")
        ident = t.get("thread_id")
        native = t.get("os_thread_id")
        name = t.get("thread_name")
        threads.append(
            ThreadStack(
                pid=owner if isinstance(owner, int) else pid,
                ident=ident if isinstance(ident, int) else 0,
                native_id=native if isinstance(native, int) else 0,
                name=name if isinstance(name, str) else "",
                frames=_frames(t.get("frames")),
            )
        )
    return threads


def read_stacks(pid: int, pyspy: str) -> list[ThreadStack]:
    """Every thread's stack of ``pid``.

    Args:
        pid: the process.
        pyspy: the py-spy executable (``find_pyspy``).

    Returns:
        The threads.

    Raises:
        StackReadError: py-spy could not read it (gone, no permission, not Python).
    """
    cmd = [pyspy, "dump", "--pid", str(pid), "--json"]
    # Its errors without the Rust backtrace an inherited RUST_BACKTRACE would add.
    env = {**os.environ, "RUST_BACKTRACE": "0", "RUST_LIB_BACKTRACE": "0"}
    try:
        done = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    except subprocess.TimeoutExpired:
        raise StackReadError(pid, f"py-spy did not answer within {TIMEOUT_S:g} s") from None
    except OSError as exc:
        raise StackReadError(pid, f"cannot run {pyspy}: {exc.strerror or exc}") from None
    if done.returncode != 0:
        raise StackReadError(pid, _reason(pid, done.stderr or done.stdout, done.returncode))
    return parse_dump(pid, done.stdout)
