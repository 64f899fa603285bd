"""Straggler detection: false-positive rate on healthy jobs, detection rate on straggling ones.

Two sources of jobs:

  real       4-rank gloo jobs on this machine (tests/integration/scripts/straggler.py, forked
             from one driver so torch is imported once): ``--real-healthy`` healthy runs and
             ``--real-slow`` runs in which one rank (rank k % 4 in run k) sleeps 30-50 ms
             before each all_reduce. Every rank dumps at the end of its loop.
  simulated  ``flightrec simulate`` jobs (tp/pp/dp layout, hosts with different monotonic
             origins and a few ms of wall-clock skew): ``--sim-healthy`` healthy jobs and
             ``--sim-slow`` jobs with a straggler 30-50 ms late, each with its own seed (and
             fault rank).

A false positive is any ``straggler``, ``slow_stage`` or ``imbalance`` finding on a healthy
job; a detection is a job whose findings of those kinds are exactly a straggler finding of
the slow rank. Also reported: the analysis time per simulated
job, and the straggler pass's share of it.

  pipelines  simulated pipeline-parallel jobs whose timing is played out (tp=4, pp=4 at 64
             ranks by default): ``--pipelines`` jobs each of a slow worker (2x compute), a
             slow stage (1.5x) and spread imbalance, and as many healthy ones. A detection is a
             job whose findings are exactly the expected one (the worker, every rank of the
             stage, or imbalance blaming nobody); a false positive is any finding on a healthy
             one.

Run: ``python benchmarks/bench_straggler.py [--real-healthy 100] [--sim-healthy 100] ...``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "cli")]

from flightrec.analysis import analyze_dir  # noqa: E402 - after the source tree is on the path
from flightrec.analysis.candidates import Histories  # noqa: E402
from flightrec.analysis.findings.straggler import find_stragglers  # noqa: E402
from flightrec.analysis.timing.clocks import Clocks  # noqa: E402
from flightrec.simulate import Fault, SimConfig, parse_layout, simulate  # noqa: E402

SCRIPT = ROOT / "tests" / "integration" / "scripts" / "straggler.py"


SLOWNESS = ("straggler", "slow_stage", "imbalance")


def _stragglers(path: Path) -> tuple[tuple[str, int], ...]:
    """(kind, rank) of every slowness finding (``("imbalance", -1)``: no rank blamed)."""
    return tuple(
        (f.kind.value, r)
        for f in analyze_dir(str(path)).findings
        if f.kind in SLOWNESS
        for r in f.ranks or (-1,)
    )


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTREC")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "cli"), env.get("PYTHONPATH", "")])
    return env


def _real_runs(out: Path, runs: int, steps: int, slow: bool) -> list[Path]:
    cmd = [
        sys.executable, str(SCRIPT), "--runs", str(runs), "--steps", str(steps),
        "--out", str(out), *(["--cycle-slow"] if slow else []),
    ]  # fmt: skip
    subprocess.run(cmd, env=_env(), check=True, capture_output=True, timeout=120 + 20 * runs)
    return sorted(out.glob("run-*"))


def bench_real(healthy: int, slow: int, steps: int, work: Path) -> dict[str, object]:
    """False positives over ``healthy`` real runs; detections over ``slow`` real runs."""
    fp = [
        run.name for run in _real_runs(work / "healthy", healthy, steps, False) if _stragglers(run)
    ]
    detected = 0
    if slow:
        for k, run in enumerate(_real_runs(work / "slow", slow, steps, True)):
            detected += _stragglers(run) == (("straggler", k % 4),)  # --cycle-slow's rank
    return {
        "healthy_runs": healthy,
        "false_positives": len(fp),
        "false_positive_rate": len(fp) / healthy if healthy else None,
        "false_positive_runs": fp,
        "slow_runs": slow,
        "detected": detected,
        "detection_rate": detected / slow if slow else None,
    }


def bench_sim(healthy: int, slow: int, ranks: int, entries: int, work: Path) -> dict[str, object]:
    """The same on simulated jobs, with analysis times."""
    layout = parse_layout("tp=8,pp=2", ranks)
    fp, detected, times, pass_times = 0, 0, [], []
    for k in range(healthy + slow):
        out = work / f"sim-{k}"
        is_slow = k >= healthy
        rank = (k * 7919) % ranks
        fault = Fault.STRAGGLER if is_slow else Fault.NONE
        simulate(SimConfig(layout, entries=entries, fault=fault, fault_rank=rank, seed=k), out)
        t0 = time.perf_counter()
        report = analyze_dir(str(out))
        times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        find_stragglers(Histories(report.matched, Clocks(report.matched)), ())
        pass_times.append(time.perf_counter() - t0)
        blamed = tuple(
            (f.kind.value, r)
            for f in report.findings
            if f.kind in SLOWNESS
            for r in f.ranks or (-1,)
        )
        if is_slow:
            detected += blamed == (("straggler", rank),)
        else:
            fp += bool(blamed)
    return {
        "ranks": ranks,
        "entries": entries,
        "healthy_jobs": healthy,
        "false_positives": fp,
        "false_positive_rate": fp / healthy if healthy else None,
        "slow_jobs": slow,
        "detected": detected,
        "detection_rate": detected / slow if slow else None,
        "analyze_s_median": round(statistics.median(times), 3),
        "straggler_pass_s_median": round(statistics.median(pass_times), 3),
    }


def bench_pipelines(jobs: int, ranks: int, entries: int, work: Path) -> dict[str, object]:
    """Detections of the three slow shapes, and findings on healthy played pipelines."""
    layout = parse_layout("tp=4,pp=4", ranks)
    out: dict[str, object] = {"ranks": ranks, "entries": entries, "jobs_per_shape": jobs}
    for fault in (Fault.SLOW_WORKER, Fault.SLOW_STAGE, Fault.SPREAD_IMBALANCE, Fault.NONE):
        hits, times = 0, []
        for k in range(jobs):
            rank = (k * 7919 + 13) % ranks
            path = work / f"pipe-{fault.value}-{k}"
            config = SimConfig(layout, entries, fault, rank, seed=k, played=True)
            expected = simulate(config, path)
            t0 = time.perf_counter()
            findings = analyze_dir(str(path)).findings
            times.append(time.perf_counter() - t0)
            got = [(f.kind.value, list(f.ranks)) for f in findings]
            want = [(expected["kind"], expected["ranks"])] if expected else []
            hits += got == want
        name = "healthy_without_finding" if fault is Fault.NONE else f"{fault.value}_found"
        out[name] = hits
        out[f"{fault.value}_analyze_s_median"] = round(statistics.median(times), 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--real-healthy", type=int, default=100)
    parser.add_argument("--real-slow", type=int, default=20)
    parser.add_argument("--steps", type=int, default=25, help="all_reduces per real run")
    parser.add_argument("--sim-healthy", type=int, default=100)
    parser.add_argument("--sim-slow", type=int, default=50)
    parser.add_argument("--sim-ranks", type=int, default=64)
    parser.add_argument("--sim-entries", type=int, default=500)
    parser.add_argument("--pipelines", type=int, default=10, help="played jobs per shape")
    parser.add_argument("--pipeline-ranks", type=int, default=64)
    parser.add_argument("--pipeline-entries", type=int, default=1000)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-straggler-") as tmp:
        work = Path(tmp)
        result = {
            "real": bench_real(args.real_healthy, args.real_slow, args.steps, work),
            "simulated": bench_sim(
                args.sim_healthy, args.sim_slow, args.sim_ranks, args.sim_entries, work
            ),
            "pipelines": bench_pipelines(
                args.pipelines, args.pipeline_ranks, args.pipeline_entries, work
            ),
        }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for source, figures in result.items():
        print(source)
        for key, value in figures.items():
            print(f"  {key:26} {value}")


if __name__ == "__main__":
    main()
