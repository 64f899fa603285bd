"""The in-job slow check, measured: detection, time to the log line, false positives, cost.

Four parts, each printing its figures:

1. ``live``: real 4-rank gloo jobs (``tests/integration/scripts/slow_job.py``, forked from
   one driver that imports torch once) in three shapes: a rank slowing step by step
   (``growing``), a rank slow every k-th step (``every``), a rank that becomes slow halfway
   (``halfway``); the slow rank cycles over the ranks (rank 0 included). Detection: rank 0's
   log names the slow rank after the onset. Time to the line: from the slow rank's onset to
   the first line appearing in rank 0's log (the driver polls the log every 50 ms).
2. ``healthy``: the same jobs without a slow rank, ``--healthy-runs`` times (at least 50):
   any line is a false positive.
3. ``sim``: a simulated 1,024-rank job (``flightrec.simulate.Layout``, tp=8: 128 tensor-
   parallel groups of 8 and 8 data-parallel groups of 128), its ranks' digests made check by
   check from a timing model with per-rank clock offsets and jitter, judged by the same
   ``SlowJudge``: detection and checks to the line per shape, false positives over healthy
   runs, and the judge's time per check.
4. ``cost``: what one check costs a rank: making and encoding its digest from a full ring
   (2,000 entries), and the judge's time at 4 and 1,024 ranks; the digest's size.
5. ``pipes``: simulated pipeline-parallel jobs (tp=4, pp=4; ``--pipe-ranks``) whose timing
   is played out (``flightrec.simulate.digests``), six checks each: a slow worker, a slow
   stage, spread imbalance and a healthy job, ``--pipe-runs`` seeds each. A detection is a
   first line that names the shape (the worker, the stage); any line on a healthy job is a
   false positive.

Run: ``python benchmarks/bench_slow.py`` (all parts; ``--parts sim,cost`` for some). The live
parts take minutes: the machine they ran on is noted with the figures in docs/slow-ranks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "cli")]

from flightrec.format.digest import Digest, GroupDigest, encode  # noqa: E402
from flightrec.live.slow import SlowJudge, SlowOptions  # noqa: E402
from flightrec.simulate.layout import GroupKind, Layout  # noqa: E402

SCRIPT = REPO / "tests" / "integration" / "scripts" / "slow_job.py"
SHAPES = ("growing", "every", "halfway")
MS = 1_000_000


# -- live jobs ---------------------------------------------------------------------------------
def live_runs(out: Path, runs: int, interval: float, extra: list[str]) -> list[dict[str, object]]:
    """Fork ``runs`` 4-rank jobs with slow_job.py; their result.json contents."""
    env = dict(os.environ, FLIGHTREC_SLOW_CHECK=str(interval), TORCH_CPP_LOG_LEVEL="ERROR")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "cli")])
    cmd = [sys.executable, str(SCRIPT), "--runs", str(runs), "--out", str(out), *extra]
    subprocess.run(cmd, env=env, check=False, timeout=runs * 120)
    return [json.loads((d / "result.json").read_text()) for d in sorted(out.glob("run-*"))]


def names(line: str, rank: int) -> bool:
    return f"rank {rank} (" in line and "is persistently late" in line


def live(args: argparse.Namespace) -> None:
    print(f"live 4-rank gloo jobs, FLIGHTREC_SLOW_CHECK={args.interval}, {args.runs} runs a shape")
    for shape in SHAPES:
        with tempfile.TemporaryDirectory() as tmp:
            # Steps after the onset: about 20 s of each shape (a growing rank's steps grow
            # 1 ms longer each, up to 150 ms; one slow step in 4 adds 10 ms a step on
            # average); a run ends soon after its first line.
            after = {"growing": 220, "every": 600, "halfway": 320}[shape]
            extra = ["--shape", shape, "--steps", str(args.onset + after), "--cycle-slow",
                     "--onset-step", str(args.onset), "--max-ms", "150", "--stop-on-line"]  # fmt: skip
            results = live_runs(Path(tmp), args.runs, args.interval, extra)
        found, delays, wrong = 0, [], 0
        for r in results:
            slow, onset, first = r["slow_rank"], r["onset"], r["first_line"]
            lines = [ln for ln in r["lines"] if "is persistently late" in ln]  # type: ignore[attr-defined]
            wrong += sum(not names(ln, slow) for ln in lines)  # type: ignore[arg-type]
            if any(names(ln, slow) for ln in lines) and onset and first:  # type: ignore[arg-type]
                found += 1
                delays.append(float(first) - float(onset))  # type: ignore[arg-type]
        med = f"{statistics.median(delays):.1f} s" if delays else "-"
        worst = f"{max(delays):.1f} s" if delays else "-"
        print(
            f"  {shape:8} detected {found}/{len(results)}; onset to first line: median {med}, "
            f"max {worst}; lines naming another rank: {wrong}"
        )


def healthy(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        extra = ["--shape", "none", "--steps", str(args.healthy_steps)]
        started = time.monotonic()
        results = live_runs(Path(tmp), args.healthy_runs, args.interval, extra)
        took = time.monotonic() - started
    fp = [r for r in results if r["lines"]]
    failed = sum(any(r["codes"]) for r in results)  # type: ignore[arg-type]
    print(
        f"healthy 4-rank gloo jobs: {len(fp)} of {len(results)} runs printed a line "
        f"(false positives); {failed} runs failed; {took:.0f} s"
    )
    for r in fp[:3]:
        print(f"    {r['lines'][0]}")  # type: ignore[index]
    # What the checks cost each rank's flightrec thread (CPU), per check: rank 0 publishes,
    # gathers and judges; the others publish.
    per: dict[bool, list[float]] = {True: [], False: []}
    for r in results:
        for rank, checks, total_ms in r.get("check_costs", []):  # type: ignore[union-attr]
            if int(checks):
                per[rank == "0"].append(float(total_ms) / int(checks))
    for judge, costs in per.items():
        if costs:
            who = "rank 0 (publish, gather, judge)" if judge else "other ranks (publish)"
            print(f"  CPU per check, {who}: median {statistics.median(costs):.2f} ms, "
                  f"max {max(costs):.2f} ms")  # fmt: skip


# -- simulated 1,024-rank job ------------------------------------------------------------------
class SimJob:
    """A timing model of a 1,024-rank job: per step one tensor-parallel and one data-parallel
    all_reduce; each rank's clock is offset; the slow rank's extra delay follows a shape."""

    def __init__(
        self, shape: str, slow: int, onset_step: int, seed: int, world: int = 1024, tp: int = 8
    ) -> None:
        self.layout = Layout(world=world, tp=tp, pp=1)
        self.world = world
        self.rng = random.Random(seed)
        self.shape, self.slow, self.onset_step = shape, slow, onset_step
        self.offset = [self.rng.uniform(-5, 5) * MS for _ in range(world)]
        self.tp = [self.layout.group_of(r, GroupKind.TP) for r in range(world)]
        self.dp = [self.layout.group_of(r, GroupKind.DP) for r in range(world)]
        self.rows: dict[tuple[int, str], list[tuple[int, int, int]]] = {}
        self.t = 1_790_000_000 * 10**9
        self.step = 0

    def extra_ms(self, rank: int) -> float:
        k = self.step - self.onset_step
        if rank != self.slow or self.shape == "none" or k < 0:
            return 0.0
        if self.shape == "growing":
            return min(200.0, 1.0 * (k + 1))
        if self.shape == "every":
            return 40.0 if k % 4 == 0 else 0.0
        return 40.0

    def run_step(self) -> None:
        rng, world = self.rng, range(self.world)
        arrive = [self.t + rng.uniform(0, 2) * MS + self.extra_ms(r) * MS for r in world]
        done_tp: dict[str, float] = {}
        for r in world:
            g = self.tp[r]
            if g.name not in done_tp:
                done_tp[g.name] = max(arrive[m] for m in g.ranks) + 0.2 * MS
        arrive2 = [done_tp[self.tp[r].name] + rng.uniform(0, 1) * MS for r in world]
        done_dp: dict[str, float] = {}
        for r in world:
            g = self.dp[r]
            if g.name not in done_dp:
                done_dp[g.name] = max(arrive2[m] for m in g.ranks) + 0.5 * MS
        self.step += 1
        for r in world:
            off = self.offset[r]
            for key, a, c in (
                (self.tp[r].name, arrive[r], done_tp[self.tp[r].name]),
                (self.dp[r].name, arrive2[r], done_dp[self.dp[r].name]),
            ):
                rows = self.rows.setdefault((r, key), [])
                rows.append((self.step, int(a + off), int(c + rng.uniform(0, 0.05) * MS + off)))
                del rows[:-64]
        self.t = int(max(done_dp.values())) + 100 * MS  # the next step's compute

    def digests(self) -> dict[int, bytes]:
        out = {}
        for r in range(self.world):
            groups = []
            for g in (self.tp[r], self.dp[r]):
                rows = self.rows[(r, g.name)]
                groups.append(
                    GroupDigest(
                        g.name, len(g.ranks), *(tuple(x[i] for x in rows) for i in range(3))
                    )
                )
            out[r] = encode(
                Digest(r, self.world, self.t, f"host{r // 8}", f"cuda:{r % 8}", tuple(groups))
            )
        return out


def sim_run(
    shape: str, seed: int, checks: int, steps_per_check: int
) -> tuple[int | None, list[str], list[float]]:
    """Checks to the first line after the onset (None: none), the lines, judge seconds per check."""
    rng = random.Random(seed)
    slow = rng.randrange(1024)
    onset_check = checks // 3
    job = SimJob(shape, slow, onset_check * steps_per_check, seed)
    judge = SlowJudge()
    lines, costs, first = [], [], None
    for c in range(checks):
        for _ in range(steps_per_check):
            job.run_step()
        raw = job.digests()
        started = time.thread_time()
        line = judge.check(raw)
        costs.append(time.thread_time() - started)
        if line:
            lines.append(line)
            if first is None and f"rank {slow} (" in line and c >= onset_check:
                first = c - onset_check + 1
    return first, lines, costs


def sim(args: argparse.Namespace) -> None:
    print(f"simulated 1,024-rank job (tp=8, dp=128), {args.sim_runs} runs a shape, "
          f"a check every 50 steps")  # fmt: skip
    costs: list[float] = []
    for shape in SHAPES:
        got, delays, wrong = 0, [], 0
        for k in range(args.sim_runs):
            first, lines, c = sim_run(shape, k, 9, 50)
            costs += c
            if first is not None:
                got += 1
                delays.append(first)
            wrong += sum(
                "persistently late" in ln and ln != lines[0] and first is None for ln in lines
            )
        print(f"  {shape:8} detected {got}/{args.sim_runs}; checks from onset to the line: "
              f"median {statistics.median(delays) if delays else '-'}")  # fmt: skip
    fp = 0
    for k in range(args.sim_healthy):
        _, lines, c = sim_run("none", 1000 + k, 9, 50)
        costs += c
        fp += bool(lines)
    print(f"  healthy: {fp} of {args.sim_healthy} runs printed a line (false positives)")
    print(f"  judge per check at 1,024 ranks: median {1e3 * statistics.median(costs):.0f} ms CPU")


# -- cost ------------------------------------------------------------------------------------
def cost(args: argparse.Namespace) -> None:
    from flightrec.format.slot import COMPLETED, SLOT
    from flightrec.recorder.exchange.slowcheck import make_digest

    buf = bytearray()
    t = time.monotonic_ns()
    for i in range(2000):
        rid = i + 1
        buf += SLOT.pack(rid, t + i * MS, t + i * MS + MS // 2, COMPLETED, i + 1, 0, 0, 0, 0,
                         -1, 0, 0, 0, 0, 0, 0, rid)  # fmt: skip
    snap = bytes(buf)
    samples = []
    for _ in range(20):
        started = time.perf_counter()
        data = encode(make_digest(snap, [("0", 4)], 0, 4, "host", "cpu", 0, time.time_ns()))
        samples.append(time.perf_counter() - started)
    print(f"digest of a full ring (2,000 entries, one group): {len(data)} bytes, "
          f"median {1e3 * statistics.median(samples):.2f} ms to make and encode")  # fmt: skip
    job = SimJob("none", 0, 0, 0, world=4, tp=4)
    judge = SlowJudge()
    for _ in range(64):
        job.run_step()
    four = job.digests()
    samples = []
    for _ in range(20):
        started = time.perf_counter()
        judge.check(four)
        samples.append(time.perf_counter() - started)
    print(f"judge per check at 4 ranks: median {1e3 * statistics.median(samples):.2f} ms")


# -- simulated pipelines ------------------------------------------------------------------------
def pipes(args: argparse.Namespace) -> None:
    from flightrec.simulate import Fault, SimConfig, parse_layout
    from flightrec.simulate.digests import checked_digests

    layout = parse_layout("tp=4,pp=4", args.pipe_ranks)
    print(f"simulated pipelines ({args.pipe_ranks} ranks, tp=4, pp=4), {args.pipe_runs} runs a "
          "shape, six checks each")  # fmt: skip
    for fault in (Fault.SLOW_WORKER, Fault.SLOW_STAGE, Fault.SPREAD_IMBALANCE, Fault.NONE):
        found, costs = 0, []
        for k in range(args.pipe_runs):
            rank = (k * 7919 + 5) % args.pipe_ranks
            stage = layout.coords(rank)[1]
            want = {
                Fault.SLOW_WORKER: f"slow rank: rank {rank} (",
                Fault.SLOW_STAGE: f"slow stage: stage {stage} of",
                Fault.SPREAD_IMBALANCE: "spread imbalance:",
            }.get(fault)
            judge = SlowJudge(SlowOptions(min_persist_s=0))
            lines = []
            for raw in checked_digests(SimConfig(layout, 2000, fault, rank, seed=k), 6):
                started = time.thread_time()
                line = judge.check(raw)
                costs.append(time.thread_time() - started)
                lines += [line] if line else []
            found += (want is None and not lines) or bool(
                want
                and lines
                and want in lines[0]
                and "a slow worker" * (fault is Fault.SLOW_WORKER) in lines[0]
            )
        what = "healthy without a line" if fault is Fault.NONE else "found"
        print(f"  {fault.value:17} {what} {found}/{args.pipe_runs}; judge per check: median "
              f"{1e3 * statistics.median(costs):.0f} ms CPU")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--parts", default="live,healthy,sim,cost,pipes")
    p.add_argument("--interval", type=float, default=1.0, help="FLIGHTREC_SLOW_CHECK for live jobs")
    p.add_argument("--runs", type=int, default=8, help="live runs per shape")
    p.add_argument("--onset", type=int, default=100, help="steps before a live shape's onset")
    p.add_argument("--healthy-runs", type=int, default=50)
    p.add_argument("--healthy-steps", type=int, default=250)
    p.add_argument("--sim-runs", type=int, default=5)
    p.add_argument("--sim-healthy", type=int, default=10)
    p.add_argument("--pipe-runs", type=int, default=5)
    p.add_argument("--pipe-ranks", type=int, default=64)
    args = p.parse_args()
    parts = set(args.parts.split(","))
    print(f"bench_slow on {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    for name, fn in (
        ("cost", cost), ("sim", sim), ("pipes", pipes), ("live", live), ("healthy", healthy)
    ):  # fmt: skip
        if name in parts:
            fn(args)


if __name__ == "__main__":
    main()
