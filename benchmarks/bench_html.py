"""Size of `flightrec analyze --html` and how fast headless Chromium loads it, by job size.

Usage (from the repository root):
    python benchmarks/bench_html.py [--ranks 4 1024 16384] [--runs 3]
        [--cache /tmp/flightrec-bench] [--browser chromium]

4 ranks is the shipped sample ``samples/stalled_rank`` (a real gloo job); larger sizes are
jobs written once by `flightrec simulate` (tp=8,pp=4, 2,000 entries per rank, rank 0
stalls), cached as ``bench_scale.py`` caches them. Printed per size: the page's size (and
gzipped), the median wall time of ``flightrec analyze DIR --html`` (the whole command:
loading, analysis, the page), the median wall time of ``chromium --headless --dump-dom`` on the
page (the browser's start, parse, the page's script, the DOM written out), and the median time
the page's own script took to draw its grids (``data-render-ms``, measured by the page).
"""

from __future__ import annotations

import argparse
import gzip
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_scale import child_env, generate

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "samples" / "stalled_rank"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def _analyze(folder: Path, page: Path) -> float:
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "flightrec_cli", "analyze", str(folder), "--html", str(page)],
        env=child_env(), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    took = time.perf_counter() - start
    if out.returncode not in (0, 1):
        raise SystemExit(f"flightrec analyze {folder} failed: {out.stderr[-2000:]}")
    return took


def _load(browser: str, page: Path) -> tuple[float, int]:
    with tempfile.TemporaryDirectory() as profile:
        start = time.perf_counter()
        out = subprocess.run(
            [browser, *FLAGS, f"--user-data-dir={profile}", "--dump-dom", page.as_uri()],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        took = time.perf_counter() - start
    found = re.search(r'data-render-ms="(\d+)"', out.stdout)
    if out.returncode or 'data-ready="1"' not in out.stdout or found is None:
        raise SystemExit(f"{browser} did not finish the page {page}: {out.stderr[-2000:]}")
    return took, int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[4, 1024, 16384])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/flightrec-bench"))
    parser.add_argument("--browser", default="chromium")
    args = parser.parse_args()
    browser = shutil.which(args.browser)
    if browser is None:
        raise SystemExit(f"no {args.browser} found (Debian: apt-get install chromium)")
    print(f"{'ranks':>7} {'page':>10} {'gzipped':>9} {'analyze --html':>15} "
          f"{'chromium load':>14} {'page script':>12}")  # fmt: skip
    for ranks in args.ranks:
        folder = SAMPLE if ranks == 4 else generate(args.cache, ranks, 2000, "stall", 0)
        with tempfile.TemporaryDirectory() as tmp:
            page = Path(tmp) / "report.html"
            analyze = statistics.median(_analyze(folder, page) for _ in range(args.runs))
            loads = [_load(browser, page) for _ in range(args.runs)]
            size = page.stat().st_size
            packed = len(gzip.compress(page.read_bytes()))
        wall = statistics.median(t for t, _ in loads)
        script = statistics.median(ms for _, ms in loads)
        print(
            f"{ranks:>7,} {size / 1e3:>8.0f} kB {packed / 1e3:>6.0f} kB {analyze:>13.1f} s "
            f"{wall:>12.2f} s {script:>9.0f} ms",
            flush=True,
        )


if __name__ == "__main__":
    main()
