"""A real TCPStore server (torch's libuv one, the default) in a process of its own, as in rank
0's process or torchrun's agent, with what the benchmarks read of it: CPU seconds, system
calls and resident memory, from ``/proc``.

It listens on an IPv4 socket made here and handed to torch (``master_listen_fd``). torch's
libuv server looks up the name of every address that connects (``getnameinfo``) on its one
thread; listening on ``::``, as it does by itself, a connection from 127.0.0.1 arrives as
``::ffff:127.0.0.1``, which no hosts file names, so every connection asks DNS, and on this
machine, whose resolver loses a query now and then, one connection in about fifty stops the
whole server for the resolver's 5 s timeout. A plain IPv4 address is named from the hosts
file. (A job's ranks connect at start-up, not on the path a hang takes.)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

SERVER = """
import socket, sys
from datetime import timedelta
from torch.distributed import TCPStore
listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", 0))
listener.listen(4096)
port = listener.getsockname()[1]
s = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
             timeout=timedelta(seconds=300), master_listen_fd=listener.fileno())
print(s.port, flush=True)
sys.stdin.read()
"""


class Server:
    """A TCPStore server in a child process."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())

    def cpu_s(self) -> float:
        """CPU seconds of the server process so far (10 ms ticks)."""
        return cpu_s(self.proc.pid)

    def syscalls(self) -> tuple[int, int]:
        """(read, write) system calls of the server process so far."""
        io = dict(
            line.split(": ") for line in Path(f"/proc/{self.proc.pid}/io").read_text().splitlines()
        )
        return int(io["syscr"]), int(io["syscw"])

    def counters(self) -> tuple[int, float]:
        """(read system calls, CPU seconds) of the server process so far."""
        return self.syscalls()[0], self.cpu_s()

    def rss_mb(self) -> float:
        """The server's resident memory now."""
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        found = re.search(r"VmRSS:\s+(\d+)", status)
        return int(found.group(1)) / 1024 if found else float("nan")

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(60)


def cpu_s(pid: int) -> float:
    """CPU seconds (user and system) of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
