"""Wall time of healthy framework jobs, traced (``FLIGHTREC=1``) against untraced.

Each framework's healthy job of ``tests/integration/frameworks/scripts`` (4 gloo ranks on
CPU, started the way its users start it, as the framework tests do) runs ``--rounds`` times
traced and as often untraced, interleaved (traced first in even rounds, untraced first in odd
ones), so that the machine's load drifts over both alike. Prints each run's wall time, then
per framework the medians and their ratio. A run that fails is reported and counted out.

Run (in an environment with the frameworks: ``.ci/frameworks.sh`` builds one)::

    python benchmarks/bench_frameworks.py [--rounds 3] [--steps 40] [--only lightning accelerate]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "cli")]

from tests.integration.jobs import free_port, start_job  # noqa: E402

SCRIPTS = REPO / "tests" / "integration" / "frameworks" / "scripts"


def _accelerate() -> dict[str, object]:
    launcher = [
        "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes=4",
        "--num_machines=1", "--mixed_precision=no", "--dynamo_backend=no",
        f"--main_process_port={free_port()}",
    ]  # fmt: skip
    return {"launch": "self", "launcher": launcher}


JOBS = {
    "lightning": ("lightning_job.py", lambda: {"launch": "self"}),
    "accelerate": ("accelerate_job.py", _accelerate),
    "transformers": ("hf_trainer_job.py", lambda: {"launch": "torchrun"}),
}
"""Framework -> (its script, how it is launched)."""


def one_run(name: str, steps: int, traced: bool) -> float | None:
    """Wall seconds of one healthy job, from launch to the last process's exit."""
    script, how = JOBS[name]
    env = {"FLIGHTREC_TIMEOUT": "300"}
    with tempfile.TemporaryDirectory() as tmp:
        start = time.monotonic()
        with start_job(
            SCRIPTS / script, ["none", "--steps", str(steps)], env=env, flightrec=traced,
            workdir=Path(tmp), **how(),  # type: ignore[arg-type]
        ) as job:  # fmt: skip
            try:
                codes = job.wait(timeout=900)
            except TimeoutError:
                codes = [-1]
            took = time.monotonic() - start
            if any(codes):
                print(f"  {name} {'traced' if traced else 'untraced'} failed: {codes}")
                print(job.output()[-2000:])
                return None
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40, help="training steps per job")
    parser.add_argument("--only", nargs="*", choices=sorted(JOBS), default=sorted(JOBS))
    args = parser.parse_args()
    times: dict[tuple[str, bool], list[float]] = {}
    for r in range(args.rounds):
        for name in args.only:
            for traced in (True, False) if r % 2 == 0 else (False, True):
                took = one_run(name, args.steps, traced)
                label = "traced" if traced else "untraced"
                print(
                    f"round {r + 1} {name:12s} {label:8s} {took if took else float('nan'):7.1f} s"
                )
                if took is not None:
                    times.setdefault((name, traced), []).append(took)
    print(f"\nmedian wall time of a healthy 4-rank job, {args.steps} steps, {args.rounds} rounds:")
    for name in args.only:
        on, off = times.get((name, True), []), times.get((name, False), [])
        if not on or not off:
            print(f"  {name:12s} not measured (failed runs above)")
            continue
        a, b = statistics.median(on), statistics.median(off)
        spread = f"traced {min(on):.1f}-{max(on):.1f}, untraced {min(off):.1f}-{max(off):.1f}"
        print(
            f"  {name:12s} traced {a:6.1f} s  untraced {b:6.1f} s  ratio {a / b:5.3f}  ({spread})"
        )


if __name__ == "__main__":
    main()
