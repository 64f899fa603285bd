"""Load on the job's store from flightrec's dump-request channel, and how fast a request lands.

A real TCPStore server runs in a process of its own (as it does in rank 0's process or in
torchrun's agent); N simulated ranks run as threads of this process, each with the store
connection and thread that a traced rank has. Two modes:

  poll     what flightrec did before issue 17, kept here for the comparison: every rank reads
           the request counter every 0.25 s on a connection of its own.
  current  ``flightrec.recorder.exchange.store.Poller`` as the recorder runs it.
  request  what one dump request costs the store server at ``--ranks`` ranks: ringing a
           doorbell key per rank in one ``multi_set`` (the design before issue 50), the same
           in pieces of 1,024 keys, and the current design (one description key every rank
           waits on: the server writes one byte to each waiting connection; measured with up
           to ``--connections`` waiting connections, and per connection).
  events   what the server's work is made of: ``--connections`` connections (one per rank) each
           send one thing at once (a wait, a read and the next wait in one write, a rank's
           answer in one write, the same as separate writes, ...), and the server's CPU and
           system calls per connection are printed (median of three): its cost is per system
           call (one read per arrival, one write per answer), not per request.
  exchange the verdict's exchange end to end: each rank also has the recorder's ``Exchange``
           with its dump of a simulated hang (``flightrec simulate``'s tp=8,pp=8 stall); a
           request makes every rank publish its summary and progress record, and the lowest
           rank reports with ``flightrec.live.report``. Printed: when the last rank's answer
           landed, whether the reporter gathered every rank within the window
           (``exchange.GATHER_S``), when its verdict was ready, the culprit it names, and at
           the end how many verdicts each request printed (one). Each rank's exchange opens
           its store connection before the first request, as the recorder does once an
           operation is half-way to a hang (``--cold``: at the rank's first answer).

Printed per mode: the server's requests per second in steady state (its read system calls
from /proc/PID/io: one per request from a client that waits for each answer, which every
TCPStore client does), its CPU use, and the latency from posting a request (as
``flightrec trigger`` does) to each rank's callback, over a few requests.

Run: ``python benchmarks/bench_store.py [--ranks 1024] [--seconds 10] [--mode poll current exchange]``
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "cli")]

from torch.distributed import TCPStore  # type: ignore[attr-defined]  # noqa: E402

from flightrec.recorder.exchange import store as channel  # noqa: E402
from flightrec.recorder.exchange import wire  # noqa: E402
from flightrec.recorder.exchange.keys import Keys  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from store_server import Server  # noqa: E402

NAMESPACE = "bench"


def client(port: int) -> Any:
    return TCPStore(
        "127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60), wait_for_workers=False
    )


class OldPoller:
    """The channel before issue 17, as it ran in every rank (see the module docstring)."""

    def __init__(self, store: Any, on_request: Callable[[int, int, str], None]) -> None:
        self._store = store.clone()
        self._on_request = on_request
        self._keys = Keys(NAMESPACE)
        self._seen = channel.first_free(self._store, self._keys, 0) - 1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            if self._store.check([self._keys.request(self._seen + 1)]):
                self._seen += 1
                rank, reason = channel.read_request(self._store, self._keys, self._seen)
                self._on_request(self._seen, rank, reason)

    def stop(self, wait_s: float = 0.0) -> None:
        self._stop.set()
        self._thread.join(wait_s or None)


def start_ranks(mode: str, ranks: int, port: int, answered: dict[int, list[float]]) -> list[Any]:
    base = client(port)
    lock = threading.Lock()

    def start(r: int) -> Any:
        def on_request(n: int, requester: int, reason: str) -> None:
            with lock:
                answered.setdefault(n, []).append(time.monotonic())

        if mode == "poll":
            return OldPoller(base, on_request)
        return channel.Poller(base, NAMESPACE, on_request, rank=r, world_size=ranks)

    # A TCPStore connection takes about 0.2 s to set up (ranks make theirs in parallel).
    with ThreadPoolExecutor(128) as pool:
        return list(pool.map(start, range(ranks)))


def run(mode: str, ranks: int, seconds: float, requests: int) -> None:
    server = Server()
    answered: dict[int, list[float]] = {}
    t0 = time.monotonic()
    pollers = start_ranks(mode, ranks, server.port, answered)
    start_s = time.monotonic() - t0
    time.sleep(2.0)  # connections made, every poller in its steady state
    reads0, cpu0 = server.counters()
    time.sleep(seconds)
    reads1, cpu1 = server.counters()
    rate = (reads1 - reads0) / seconds
    cpu = 100 * (cpu1 - cpu0) / seconds
    latencies: list[float] = []
    slowest: list[float] = []
    client = channel.connect("127.0.0.1", server.port)  # as ``flightrec trigger`` connects
    for _ in range(requests):
        posted = time.monotonic()
        n = channel.post_request(client, Keys(NAMESPACE), -1, "CLI_TRIGGER")
        deadline = posted + 10
        while len(answered.get(n, ())) < ranks and time.monotonic() < deadline:
            time.sleep(0.01)
        got = [t - posted for t in answered.get(n, [])]
        latencies += got
        slowest.append(max(got, default=float("inf")))
        if len(got) < ranks:
            print(f"  request {n}: only {len(got)} of {ranks} ranks answered within 10 s")
        time.sleep(1.2)  # a rank answers at most one request per second
    for p in pollers:
        p.stop()
    for p in pollers:
        p.stop(wait_s=5.0)
    server.close()
    latencies.sort()
    p99 = latencies[int(0.99 * (len(latencies) - 1))] if latencies else float("nan")
    print(
        f"{mode:8s} {ranks:5d} ranks: {rate:8.0f} server requests/s in steady state "
        f"({rate / ranks:.3f} per rank; at 16,384 ranks {rate / ranks * 16384:,.0f}/s), "
        f"server CPU {cpu:.1f}%; request -> every rank's callback: "
        f"median {1000 * statistics.median(latencies):.0f} ms, p99 {1000 * p99:.0f} ms, "
        f"worst {1000 * max(slowest):.0f} ms over {requests} requests "
        f"(start-up of all ranks {start_s:.1f} s)",
        flush=True,
    )


def run_exchange(ranks: int, requests: int, connected: bool) -> None:
    """Every rank's summary through the real exchange, and the report, ``requests`` times."""
    from flightrec import live
    from flightrec.format.progress import encode_progress, progress
    from flightrec.format.summary import encode, summarize
    from flightrec.recorder.exchange import verdict as exchange
    from flightrec.recorder.exchange.verdict import GATHER_S, Exchange
    from flightrec.simulate.faults import Fault
    from flightrec.simulate.job import SimConfig, build_rank_dump, plan
    from flightrec.simulate.layout import parse_layout

    sim = plan(SimConfig(parse_layout("tp=8,pp=8", ranks), entries=64, fault=Fault.STALL,
                         fault_rank=ranks // 3))  # fmt: skip
    dumps = {r: build_rank_dump(sim, r) for r in range(ranks)}
    # Each rank summarises and encodes its dump in its own process (about 3 ms); here 1,024
    # threads would take turns at one interpreter for it: made beforehand for each request,
    # handed over as each rank answers.
    made: dict[tuple[int, int], tuple[bytes, bytes]] = {}
    for n in range(1, requests + 1):
        for r, d in dumps.items():
            s = summarize(d, n, f"/var/flightrec/rank{r}.frdump")
            made[(r, n)] = (encode(s), encode_progress(progress(d, n)))

    def summarize_made(dump: Any, n: int, path: str) -> tuple[int, int]:
        return (dump.header.rank, n)

    exchange.summarize = summarize_made  # type: ignore[assignment]
    exchange.encode = lambda key: made[key][0]  # type: ignore[assignment]

    def progress_made(dump: Any, n: int) -> tuple[int, int]:
        return (dump.header.rank, n)

    exchange.progress = progress_made  # type: ignore[assignment]
    exchange.encode_progress = lambda key: made[key][1]  # type: ignore[assignment]
    server = Server()
    texts: dict[int, list[tuple[float, str]]] = {}
    """Round number -> (when, text) of each verdict printed for it."""
    answered: dict[int, list[float]] = {}
    exchanges: dict[int, Exchange] = {}
    lock = threading.Lock()

    # Captured per reporting thread: several ranks may report at once for a moment (each
    # steps aside when it sees a lower one), and swapping the writer around each report
    # would hand one's text to another's list, or to the real stderr.
    local = threading.local()
    live._write_stderr = lambda text: local.captured.append(text)  # type: ignore[assignment]

    def reporter(rnd: Any) -> None:
        captured: list[str] = []
        local.captured = captured
        live.report(rnd)
        if captured:  # (a rank that found a lower one reporting stepped aside)
            with lock:
                texts.setdefault(rnd.number, []).append((time.monotonic(), "".join(captured)))

    base = client(server.port)

    def start(r: int) -> Any:
        def on_request(n: int, requester: int, reason: str) -> None:
            # As the recorder does: dump (here: the simulated dump), then answer the round.
            ex = exchanges[r]
            ex.on_dump(dumps[r], Path(f"/var/flightrec/rank{r}.frdump"))
            ex.after_request(n, "WATCHDOG_TIMEOUT")
            with lock:
                answered.setdefault(n, []).append(time.monotonic())

        poller = channel.Poller(base, NAMESPACE, on_request, rank=r, world_size=ranks)
        exchanges[r] = Exchange(poller, r, ranks, NAMESPACE, reporter)
        return poller

    with ThreadPoolExecutor(128) as pool:
        pollers = list(pool.map(start, range(ranks)))
        if connected:  # as a rank's recorder does once an operation is half-way to a hang
            list(pool.map(lambda ex: ex.connect(), exchanges.values()))
    time.sleep(2.0)
    trigger = channel.connect("127.0.0.1", server.port)  # as ``flightrec trigger`` connects
    posts: dict[int, float] = {}
    for _ in range(requests):
        posted = time.monotonic()
        n = channel.post_request(trigger, Keys(NAMESPACE), -1, "CLI_TRIGGER")
        posts[n] = posted
        deadline = posted + GATHER_S + 20
        while n not in texts and time.monotonic() < deadline:
            time.sleep(0.01)
        got = sorted(t - posted for t in answered.get(n, []))
        done = texts[n][0][0] - posted if n in texts else float("nan")
        text = texts[n][0][1] if n in texts else ""
        head = text.splitlines()[0] if text else "(no verdict)"
        culprit = next((x.strip("│ ") for x in text.splitlines() if "never entered" in x), "")
        print(
            f"exchange {ranks:5d} ranks, request {n}: {len(got)} published, the last "
            f"{max(got, default=float('nan')):.2f} s after the request (window "
            f"{GATHER_S:.0f} s from the reporter's own answer); verdict printed "
            f"{done:.2f} s after the request\n  {head}\n  {culprit}",
            flush=True,
        )
        time.sleep(1.2)
    time.sleep(GATHER_S + 2.0)  # a late second reporter of the last round would print by now
    for n, posted in posts.items():
        late = [f"{t - posted:.2f} s" for t, _ in texts.get(n, [])[1:]]
        print(
            f"  request {n}: {len(texts.get(n, []))} verdict(s) printed"
            + (f" (the later ones {', '.join(late)} after the request)" if late else ""),
            flush=True,
        )
    for p in pollers:
        p.stop()
    for p in pollers:
        p.stop(wait_s=5.0)
    for ex in exchanges.values():
        ex.close(5.0)
    server.close()


def _server_cpu(server: Server, action: Callable[[], Any], probe: Any) -> float:
    """Server CPU seconds of ``action``, up to the server's answer to one read after it."""
    _, cpu0 = server.counters()
    action()
    probe.check(["-"])  # answered once everything sent before it is taken in
    return server.counters()[1] - cpu0


def run_request(ranks: int, connections: int) -> None:
    """One dump request's cost at the server, three ways (see the module docstring)."""
    for how in ("doorbells, one multi_set", "doorbells, pieces of 1,024", "one key, waited on"):
        server = Server()
        try:
            print(
                f"request {ranks:6d} ranks, {how}: {_request_cost(server, how, ranks, connections)}",
                flush=True,
            )
        finally:
            server.close()


def _request_cost(server: Server, how: str, ranks: int, connections: int) -> str:
    keys = Keys(NAMESPACE)
    poster = wire.WireStore("127.0.0.1", server.port, 600)
    bells = [f"{keys.requests}/bell/{r}" for r in range(ranks)]
    ones = ["1"] * ranks
    if how == "doorbells, one multi_set":
        return f"{_server_cpu(server, lambda: poster.multi_set(bells, ones), poster):.3f} s"
    if how == "doorbells, pieces of 1,024":

        def pieces() -> None:
            for i in range(0, ranks, 1024):
                poster.multi_set(bells[i : i + 1024], ones[i : i + 1024])

        return f"{_server_cpu(server, pieces, poster):.3f} s"
    waiting = min(ranks, connections)
    socks = []
    for _ in range(waiting):
        sock = channel.answered_connection("127.0.0.1", server.port, 5.0, tries=5).socket
        sock.sendall(wire.encode_wait([keys.request(1)]))
        socks.append(sock)
    time.sleep(1.0)
    cpu = _server_cpu(server, lambda: channel.post_request(poster, keys, -1, "CLI_TRIGGER"), poster)
    for sock in socks:
        sock.recv(1)
        sock.close()
    per = cpu / waiting
    return (
        f"{cpu:.3f} s for {waiting} waiting connections ({1e6 * per:.1f} us each; "
        f"{per * ranks:.2f} s for {ranks})"
    )


def run_events(connections: int) -> None:
    """The server's CPU and system calls per connection for what one rank sends at a time."""
    server = Server()
    socks = [wire.WireStore("127.0.0.1", server.port, 20).socket for _ in range(connections)]
    probe = wire.WireStore("127.0.0.1", server.port, 60)
    keys = Keys(NAMESPACE)
    probe.set(keys.requests, "1")
    probe.set(keys.request(1), "0 WATCHDOG_TIMEOUT")
    results: dict[str, list[tuple[float, float, float]]] = {}

    def measure(name: str, action: Callable[[], None]) -> None:
        time.sleep(0.2)
        probe.check(["-"])
        (r0, w0), c0 = server.syscalls(), server.cpu_s()
        action()
        probe.check(["-"])  # answered once everything sent before it is taken in
        time.sleep(0.3)
        probe.check(["-"])
        (r1, w1), c1 = server.syscalls(), server.cpu_s()
        n = connections
        results.setdefault(name, []).append((1e6 * (c1 - c0) / n, (r1 - r0) / n, (w1 - w0) / n))

    for rep in range(3):
        for name, action in _event_steps(socks, probe, keys, f"{keys.root}/events/{rep}"):
            measure(name, action)
    print(f"events at the server, per connection, over {connections} connections (median of 3):")
    for name, got in results.items():
        cpu, reads, writes = (statistics.median(x[k] for x in got) for k in range(3))
        print(f"  {name:40s} {cpu:6.1f} us of CPU  {reads:5.2f} reads  {writes:5.2f} writes")
    for sock in socks:
        sock.close()
    server.close()


def _event_steps(
    socks: list[Any], probe: wire.WireStore, keys: Keys, key: str
) -> list[tuple[str, Callable[[], None]]]:
    """(what, do it on every connection and read the answers), in an order that leaves the
    connections as they were."""
    read = wire.encode_multi_get([keys.requests, keys.request(1)])
    summary = os.urandom(1800)

    def send(
        parts: Callable[[int], list[bytes]], answer: Callable[[int], int], ring: str = ""
    ) -> Callable[[], None]:
        def action() -> None:
            for i, sock in enumerate(socks):
                for part in parts(i):
                    sock.sendall(part)
            if ring:
                probe.set(ring, "1")  # wakes every connection waiting on it
            for i, sock in enumerate(socks):
                size, got = answer(i), 0
                while got < size:
                    got += len(sock.recv(size - got))

        return action

    def answer(i: int, claim: bool = False) -> list[bytes]:
        parts = [
            wire.encode_set(f"{keys.root}/events/summary/{i}", summary),
            wire.encode_append(f"{key}/progress", summary[:96]),
            wire.encode_append(f"{key}/ranks", f"{i},"),
        ]
        if claim:
            parts.append(wire.encode_compare_set(f"{key}/reporter/{i}", "", str(i)))
        return parts

    read_answer = 8 + 1 + 8 + len("0 WATCHDOG_TIMEOUT")
    return [
        ("a wait registered", send(lambda i: [wire.encode_wait([key])], lambda i: 0)),
        ("woken (one byte written to each)", send(lambda i: [], lambda i: 1, key)),
        ("the request read (multi_get)", send(lambda i: [read], lambda i: read_answer)),
        (
            "the read and the next wait, one write",
            send(lambda i: [read + wire.encode_wait([key + "/next"])], lambda i: read_answer),
        ),
        ("woken again", send(lambda i: [], lambda i: 1, key + "/next")),
        ("an answer, one write", send(lambda i: [b"".join(answer(i))], lambda i: 0)),
        ("an answer, one write a request", send(answer, lambda i: 0)),
        (
            "an answer and a claim, one write",
            send(lambda i: [b"".join(answer(i, claim=True))], lambda i: 8 + len(str(i))),
        ),
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ranks", type=int, nargs="+", default=[1024])
    p.add_argument("--seconds", type=float, default=10.0, help="steady-state measurement")
    p.add_argument("--requests", type=int, default=3)
    p.add_argument(
        "--connections", type=int, default=4096, help="request mode: waiting connections at most"
    )
    p.add_argument(
        "--mode",
        nargs="+",
        default=["poll", "current"],
        choices=["poll", "current", "exchange", "request", "events"],
    )
    p.add_argument(
        "--cold",
        action="store_true",
        help="exchange mode: each rank opens its exchange's store connection at its first "
        "answer (not beforehand, as a rank does once an operation is half-way to a hang)",
    )
    args = p.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    for ranks in args.ranks:
        for mode in args.mode:
            if mode == "exchange":
                run_exchange(ranks, args.requests, not args.cold)
            elif mode == "request":
                run_request(ranks, args.connections)
            elif mode == "events":
                run_events(args.connections)
            else:
                run(mode, ranks, args.seconds, args.requests)


if __name__ == "__main__":
    main()
