"""The whole path of a hang's verdict at scale: from the dump request to the verdict in the log.

A simulated job (``flightrec simulate``'s model: tp x pp x dp with one injected fault) gives
every rank's summary and progress record, made as the recorder makes them. Each run is a
fresh job, in three processes beside a real TCPStore server (torch's, the libuv one, in a
process of its own, as in rank 0's process or torchrun's agent):

- rank 0, in a process of its own, runs the recorder's own code: a ``Poller`` waiting on the
  store, an ``Exchange`` that publishes its summary when the request comes, and the verdict's
  reporter (``flightrec.live.REPORTER``), prepared ahead as the recorder prepares it once an
  operation is half-way to a hang; what it would write to stderr is timed and kept;
- every other rank is played by one driver process over its own connections to the store:
  each rank waits for the request on the store, reads it when woken (the ``multi_get`` a
  poller makes), and publishes as ``Exchange`` does, one rank after another on a connection,
  each with its own requests (two ``set``, two ``append``, the reporter claim), never in
  bulk;
- this process posts the request (as the rank that declares the hang does) and reads the
  clocks (``CLOCK_MONOTONIC``, shared by the processes).

Printed per size, for the first run and as medians of ``--repeat`` runs: when the last rank
had the request, when the last rank had published, when the verdict was written (from the
request; the figure issue 50 asks to keep under 5 s at 131,072 ranks), the reporter's own
steps (waiting for the answers, reading the progress records, the first pass, reading the
implicated summaries, analysing and rendering), the CPU seconds of the store server, the
reporter's process and the driver (the driver stands for every rank's own CPU), the
reporter's peak resident memory, and whether the verdict names the simulated culprit.

Limits of one machine: a process here may hold 20,000 file descriptors, so at most
``--connections`` (16,384) connections carry the ranks: above that, each connection carries
several ranks one after another, and the server writes one wake-up per connection instead of
one per rank (``--wake-cost`` prints what the missing ones cost, measured). The ranks' own
dumps are not part of the path here (each rank dumps in its own process, in parallel).

The summaries are made once per size and kept under ``--cache`` (131,072 ranks take about
ten minutes of CPU to simulate; the cache file is about 270 MB).

Run: ``python benchmarks/bench_inlog.py [--ranks 16384 65536 131072] [--repeat 3]``
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import pickle
import re
import resource
import select
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "cli")]

from flightrec.format.progress import encode_progress, progress  # noqa: E402
from flightrec.format.summary import encode, summarize  # noqa: E402
from flightrec.recorder.exchange import wire  # noqa: E402
from flightrec.recorder.exchange.keys import Keys  # noqa: E402
from flightrec.recorder.exchange.store import answered_connection, post_request  # noqa: E402
from flightrec.recorder.exchange.verdict import frame  # noqa: E402
from flightrec.simulate.faults import Fault  # noqa: E402
from flightrec.simulate.job import SimConfig, build_rank_dump, plan  # noqa: E402
from flightrec.simulate.layout import parse_layout  # noqa: E402

NAMESPACE = "bench"
TARGET_S = 5.0
"""From the request to the verdict in the log, at 131,072 ranks, on this machine's 2 cores."""
SERVER = """
import sys
from datetime import timedelta
from torch.distributed import TCPStore
s = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=300))
print(s.port, flush=True)
sys.stdin.read()
"""
_PLAN: Any = None


# -- the simulated job ------------------------------------------------------------------------
def _make(ranks: range) -> list[tuple[int, bytes, bytes]]:
    out = []
    for rank in ranks:
        if rank in _PLAN.dead:
            continue
        dump = build_rank_dump(_PLAN, rank)
        path = f"/var/flightrec/{dump.header.hostname}/rank{rank:06d}.frdump"
        out.append((rank, encode(summarize(dump, 1, path)), encode_progress(progress(dump, 1))))
    return out


def generate(cache: Path, world: int, layout: str, fault: str, entries: int) -> dict[str, Any]:
    """Every rank's (rank, summary, progress) and the expected verdict, cached in ``cache``."""
    global _PLAN
    shape = layout.replace("=", "").replace(",", "-")
    path = cache / f"inlog-{world}x{entries}-{shape}-{fault}.pickle"
    if path.exists():
        with path.open("rb") as f:
            return pickle.load(f)  # type: ignore[no-any-return]  # (our own cache file)
    start = time.perf_counter()
    config = SimConfig(
        parse_layout(layout, world), entries=entries, fault=Fault(fault), fault_rank=world // 3
    )
    _PLAN = plan(config)
    chunks = [range(lo, min(world, lo + 2048)) for lo in range(0, world, 2048)]
    procs = max(1, min(len(os.sched_getaffinity(0)), 4))
    with multiprocessing.get_context("fork").Pool(procs) as pool:
        rows = [row for part in pool.map(_make, chunks) for row in part]
    data = {"expected": _PLAN.expected, "rows": rows}
    cache.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tmp.open("wb") as f:
        pickle.dump(data, f, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, path)
    print(f"  simulated {world} ranks in {time.perf_counter() - start:.0f} s -> {path}")
    return data


# -- the processes ----------------------------------------------------------------------------
class Server:
    """A TCPStore server in a child process."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())

    def cpu_s(self) -> float:
        return _cpu_s(self.proc.pid)

    def rss_mb(self) -> float:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(60)


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _child(role: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, f"--role={role}", *args],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip


def _say(obj: Any) -> None:
    print(json.dumps(obj), flush=True)


def _read(proc: subprocess.Popen[str]) -> Any:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"a bench process ended early (exit {proc.wait()})")
    return json.loads(line)


# -- rank 0: the recorder's own code ----------------------------------------------------------
def rank0(port: int, world: int, cache_file: str, restart: str) -> None:
    """Rank 0 as the recorder runs it: poller, exchange, reporter (its output timed)."""
    from flightrec import live
    from flightrec.format.summary import decode
    from flightrec.recorder.exchange import verdict as exchange
    from flightrec.recorder.exchange.store import Poller

    with open(cache_file, "rb") as f:
        summary = decode(f.read(), "rank 0's summary")
    dump = summary.dump
    written: dict[str, Any] = {}
    steps: dict[str, float] = {}

    def timed(obj: Any, name: str, label: str) -> None:
        real = getattr(obj, name)

        def wrapper(*a: Any, **k: Any) -> Any:
            t = time.monotonic()
            try:
                return real(*a, **k)
            finally:
                steps[label] = steps.get(label, 0.0) + time.monotonic() - t
                steps[f"{label} ends"] = time.monotonic()

        setattr(obj, name, wrapper)

    def write(text: str) -> None:
        written.setdefault("at", time.monotonic())
        written["text"] = text

    live._write_stderr = write  # type: ignore[assignment]
    from flightrec.live import verdict as live_verdict

    timed(exchange.Round, "progress", "read progress")
    timed(exchange.Round, "summaries", "read summaries")
    timed(live_verdict, "select", "decode progress + first pass")
    timed(live_verdict, "render", "decode + analysis + render")
    done = threading.Event()
    store = SimpleNamespace(host="127.0.0.1", port=port)  # (what torch's store says of itself)
    reporter = live.REPORTER

    def on_request(n: int, requester: int, reason: str) -> bool:
        steps["woken"] = time.monotonic()
        ex.on_dump(dump, Path("/var/flightrec/node00000/rank000000.frdump"))
        ex.after_request(n, "WATCHDOG_TIMEOUT")
        steps["published"] = time.monotonic()
        done.set()
        return True

    poller = Poller(store, NAMESPACE, on_request, rank=0, world_size=world)
    ex = exchange.Exchange(poller, 0, world, NAMESPACE, reporter)
    ex.restart = restart
    ex.connect()
    reporter.prepare()  # (what Exchange.tick starts once an operation is half-way to a hang)
    _say({"ready": True, "waits": poller.waits})
    cpu0 = time.process_time()  # (the imports done ahead are no part of the path)
    done.wait()
    running = ex._reporting
    if running is not None:
        running.join(120)
    text = written.get("text", "")
    _say({
        "steps": steps, "written": written.get("at", float("nan")), "text": text,
        "cpu_s": time.process_time() - cpu0,
        "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    })  # fmt: skip
    poller.stop(wait_s=2.0)


# -- every other rank: a driver over raw connections ------------------------------------------
_U64 = struct.Struct("<Q")


class Conn:
    """One connection to the store and the ranks it carries, one after another."""

    __slots__ = ("buf", "i", "need", "ranks", "sock", "state", "tries")

    def __init__(self, sock: socket.socket, ranks: list[int]) -> None:
        self.sock, self.ranks = sock, ranks
        self.buf = bytearray()
        self.i = 0
        self.state = "wait"
        self.tries = 0


def _value(buf: bytearray, at: int) -> tuple[bytes, int] | None:
    if len(buf) < at + 8:
        return None
    size = _U64.unpack_from(buf, at)[0]
    if len(buf) < at + 8 + size:
        return None
    return bytes(buf[at + 8 : at + 8 + size]), at + 8 + size


def driver(port: int, world: int, cache: str, connections: int) -> None:
    """Ranks 1.. of the job: wait, read the request, publish; one connection per rank up to
    ``connections``."""
    with open(cache, "rb") as f:
        rows = pickle.load(f)["rows"]
    keys = Keys(NAMESPACE)
    n = 1
    reporter_key = keys.round(n, "reporter")
    publish: dict[int, bytes] = {}
    for rank, summary, prog in rows:
        if rank == 0:
            continue
        publish[rank] = b"".join((
            wire.encode_set(keys.summary(rank), summary),
            wire.encode_set(keys.progress(rank), prog),
            wire.encode_append(keys.round(n, "progress"), frame(rank, prog)),
            wire.encode_append(keys.round(n, "ranks"), f"{rank},"),
            wire.encode_compare_set(reporter_key, "", str(rank)),
        ))  # fmt: skip
    del rows
    ranks = sorted(publish)
    count = min(connections, len(ranks))
    read_request = wire.encode_multi_get([keys.requests, keys.request(n)])
    conns: dict[int, Conn] = {}
    poll = select.epoll()
    for c in range(count):
        # (torch's libuv server now and then leaves a loaded host's new connection unread)
        sock = answered_connection("127.0.0.1", port, 5.0, tries=5).socket
        sock.setblocking(False)
        conn = Conn(sock, ranks[c::count])
        conns[sock.fileno()] = conn
        sock.sendall(wire.encode_wait([keys.request(n)]))
        poll.register(sock.fileno(), select.EPOLLIN)
    time.sleep(1.0)  # (every wait registered on the server)
    cpu0 = time.process_time()
    _say({"ready": True, "connections": count})
    reached: list[float] = []
    published: list[float] = []
    left = count
    while left:
        for fd, _ in poll.poll(60):
            conn = conns[fd]
            try:
                data = conn.sock.recv(1 << 16)
            except BlockingIOError:
                continue
            if not data:
                raise RuntimeError("the store closed a connection")
            conn.buf += data
            while True:
                state = conn.state
                if state == "wait":
                    if not conn.buf:
                        break
                    del conn.buf[:1]  # STOP_WAITING
                    conn.sock.sendall(read_request)
                    conn.state = "read"
                elif state == "read":
                    first = _value(conn.buf, 0)
                    second = first and _value(conn.buf, first[1])
                    if not second:
                        break
                    del conn.buf[: second[1]]
                    reached.append(time.monotonic())
                    conn.sock.sendall(publish[conn.ranks[conn.i]])
                    conn.state, conn.tries = "claim", 0
                elif state == "claim":
                    got = _value(conn.buf, 0)
                    if not got:
                        break
                    del conn.buf[: got[1]]
                    rank = conn.ranks[conn.i]
                    holder = got[0]
                    # As Exchange._claim: take the key while it names a higher rank.
                    if holder.isdigit() and int(holder) > rank and conn.tries < 16:
                        conn.tries += 1
                        conn.sock.sendall(wire.encode_compare_set(reporter_key, holder, str(rank)))
                        continue
                    published.append(time.monotonic())
                    conn.i += 1
                    if conn.i < len(conn.ranks):
                        conn.sock.sendall(read_request)
                        conn.state = "read"
                    else:  # every rank of it answered: it waits for the next request
                        conn.sock.sendall(wire.encode_wait([keys.request(n + 1)]))
                        conn.state = "done"
                        left -= 1
                else:
                    break
    _say({
        "reached": max(reached), "published": max(published), "ranks": len(published),
        "cpu_s": time.process_time() - cpu0,
    })  # fmt: skip
    sys.stdin.read()  # (connections kept until the run is over)


# -- one run ----------------------------------------------------------------------------------
def one_run(
    world: int, rows_file: Path, rank0_file: Path, connections: int, restart: str
) -> dict[str, Any]:
    server = Server()
    drive = _child("driver", str(server.port), str(world), str(rows_file), str(connections))
    first = _child("rank0", str(server.port), str(world), str(rank0_file), restart)
    try:
        ready = _read(first)
        assert ready["waits"], "rank 0's poller does not wait on the store"
        info = _read(drive)
        time.sleep(0.5)
        cpu0 = server.cpu_s()
        poster = wire.WireStore("127.0.0.1", server.port)
        culprit = world // 3
        t0 = time.monotonic()
        post_request(poster, Keys(NAMESPACE), culprit, "WATCHDOG_TIMEOUT")
        ranks = _read(drive)
        out = _read(first)
        server_cpu = server.cpu_s() - cpu0
        server_mb = server.rss_mb()
    finally:
        for proc in (drive, first):
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(60)
        server.close()
    steps = out["steps"]
    return {
        "connections": info["connections"],
        "reached": ranks["reached"] - t0,
        "published": max(ranks["published"], steps.get("published", t0)) - t0,
        "written": out["written"] - t0,
        "answers waited": steps["read progress ends"] - steps["read progress"] - steps["published"],
        "read progress": steps.get("read progress", float("nan")),
        "decode progress + first pass": steps.get("decode progress + first pass", float("nan")),
        "read summaries": steps.get("read summaries", float("nan")),
        "decode + analysis + render": steps.get("decode + analysis + render", float("nan")),
        "server CPU": server_cpu,
        "reporter CPU": out["cpu_s"],
        "driver CPU": ranks["cpu_s"],
        "reporter peak MB": out["peak_mb"],
        "server MB": server_mb,
        "text": out["text"],
        "answered": ranks["ranks"] + 1,
    }


def wake_cost(ranks: int) -> float:
    """Server CPU seconds to wake ``ranks`` waiting connections (one byte written to each)."""
    server = Server()
    socks = []
    keys = Keys(NAMESPACE)
    try:
        for _ in range(ranks):
            s = answered_connection("127.0.0.1", server.port, 5.0, tries=5).socket
            s.sendall(wire.encode_wait([keys.request(1)]))
            socks.append(s)
        time.sleep(1.0)
        cpu0 = server.cpu_s()
        wire.WireStore("127.0.0.1", server.port).set(keys.request(1), "0 CLI_TRIGGER")
        for s in socks:
            s.recv(1)
        return server.cpu_s() - cpu0
    finally:
        for s in socks:
            s.close()
        server.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[16384, 65536, 131072])
    parser.add_argument("--layout", default="tp=8,pp=8")
    parser.add_argument("--fault", default="stall")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--entries", type=int, default=256, help="ring entries per rank (a summary keeps 21)"
    )
    parser.add_argument("--connections", type=int, default=16384)
    parser.add_argument("--generate-only", action="store_true")
    parser.add_argument("--wake-cost", action="store_true", help="measure the server's wake-up")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/flightrec-bench"))
    parser.add_argument("--show", action="store_true", help="print the verdict text")
    parser.add_argument("--role", default="", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if args.role == "driver":
        driver(int(rest[0]), int(rest[1]), rest[2], int(rest[3]))
        return 0
    if args.role == "rank0":
        rank0(int(rest[0]), int(rest[1]), rest[2], rest[3])
        return 0
    if args.wake_cost:
        for n in (4096, 16384):
            cost = wake_cost(n)
            print(f"waking {n} waiting connections: {cost:.3f} s of server CPU "
                  f"({1e6 * cost / n:.1f} us each)")  # fmt: skip
    for world in args.ranks:
        data = generate(args.cache, world, args.layout, args.fault, args.entries)
        if args.generate_only:
            continue
        shape = args.layout.replace("=", "").replace(",", "-")
        rows_file = args.cache / f"inlog-{world}x{args.entries}-{shape}-{args.fault}.pickle"
        rank0_file = args.cache / f"inlog-{world}-rank0.summary"
        rank0_file.write_bytes(next(s for r, s, _ in data["rows"] if r == 0))
        expected = data["expected"]
        del data
        runs = []
        for i in range(args.repeat):
            load = os.getloadavg()[0]
            run = one_run(world, rows_file, rank0_file, args.connections, str(i))
            run["load"] = load
            runs.append(run)
        report(world, args, runs, expected)
    return 0


def report(
    world: int, args: argparse.Namespace, runs: list[dict[str, Any]], expected: dict[str, Any]
) -> None:
    text = runs[0]["text"]
    right = all(str(v) in text for k, v in expected.items() if k in ("op", "seq")) and (
        f"Rank {expected['ranks'][0]} " in text
    )
    widest = max((len(line) for line in text.splitlines()), default=0)
    print(f"{world} ranks ({args.layout}, {args.fault}), {runs[0]['answered']} answering, "
          f"over {runs[0]['connections']} connections:")  # fmt: skip
    names = ["reached", "published", "written", "answers waited", "read progress",
             "decode progress + first pass", "read summaries", "decode + analysis + render",
             "server CPU", "reporter CPU", "driver CPU", "reporter peak MB", "server MB"]  # fmt: skip
    print(f"  {'':<32} {'first run':>10} {'median':>10}  (of {len(runs)}; seconds unless MB)")
    for name in names:
        first = runs[0][name]
        median = statistics.median(r[name] for r in runs)
        print(f"  {name:<32} {first:10.2f} {median:10.2f}")
    loads = ", ".join(f"{r['load']:.1f}" for r in runs)
    wall = statistics.median(r["written"] for r in runs)
    verdict = "met" if wall <= TARGET_S else "MISSED"
    print(f"  request -> verdict in the log: first {runs[0]['written']:.2f} s, median {wall:.2f} s "
          f"(target {TARGET_S:g} s: {verdict}); load average at each run's start: {loads}")  # fmt: skip
    print(f"  verdict names the simulated culprit: {right} ({expected}); widest line {widest}")
    if args.show:
        print(text)


if __name__ == "__main__":
    sys.exit(main())
