"""Time and peak memory of `flightrec analyze` on simulated jobs of 1,024 / 4,096 / 16,384 ranks.

Usage (from the repository root):
    python benchmarks/bench_scale.py [--ranks 1024 4096 16384] [--entries 2000]
        [--fault stall] [--layout tp=8,pp=4] [--cache /tmp/flightrec-bench] [--simulate-only]

Each job is written once by `flightrec simulate` into the cache folder (reused on later runs;
the time it took is kept beside the dumps), then analysed by `flightrec analyze --json` in a
subprocess. Printed per size: the simulation's wall time and disk, dump size per rank (which
must not grow with the job: group members are written as grids), then the analysis's wall
time, peak memory of the analysing process tree (the parent plus its loader workers and any
pass run beside the others, each process's proportional set size sampled from
/proc, so that pages forked processes share count once; and the largest single process's
resident size as the kernel counts it; sampled at most a tenth of the time), and whether the first finding matches the simulator's expected.json. ``--simulate-only``
stops after the first three (131,072 ranks: see the README's figures).
Never run two large analyses at once on a shared machine.

Beside each analysis: where the time goes (``phases``: the analysis run once more in this
process, with the same loader processes, timed phase by phase: loading, matching, each pass)
and the physical limit (``limit``): the bytes the loader reads (the tail sections of 1.3
dumps, plus the files it read whole) divided by this machine's read bandwidth (page cache)
and by the protobuf parser's bandwidth over the same bytes, spread over the CPUs.

With ``--profile``, each size is also analysed once in this process, serially (one loader
process, so the per-file work shows up too) under cProfile, and the functions that take the
most time are printed, grouped by phase (loading, then each analysis pass).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {16384: (10.0, None), 131072: (60.0, 8.0)}
"""Ranks -> (seconds, GB) that issue 19 asks for on 2 cores."""
SIMULATE_TIME = ".simulate_s"


def child_env() -> dict[str, str]:
    """Environment that makes subprocesses import this source tree, as a user's runs do:
    with the modules' bytecode cached (an installed package has it; a checkout writes it at
    its first run). Where PYTHONDONTWRITEBYTECODE is set, as on some shared machines, every
    run would compile the package's sources again, about 0.13 s of each run that users do not
    pay: the variable is dropped, and the first run of a size writes the cache."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "cli"), env.get("PYTHONPATH", "")])
    return env


def warm_bytecode() -> None:
    """Import the CLI once in a child, so that its modules' bytecode is cached before the
    timed runs (see ``child_env``)."""
    code = "import flightrec_cli.app, flightrec_cli.commands.analyze"
    subprocess.run([sys.executable, "-c", code], env=child_env(), check=True)


def _pss(pid: int) -> int | None:
    """Proportional set size of ``pid`` (a page shared by n processes counts 1/n), if known."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and all its descendants (0 once gone).

    Each process counts its proportional set size where the kernel gives it: forked
    processes (the loader's workers, a pass run beside the others) share the analysing
    process's pages until they write to them, and summing resident sizes would count a
    shared page once per process.
    """
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        p = int(entry)
        children.setdefault(int(fields[1]), []).append(p)
        rss[p] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        if p in rss:
            pss = _pss(p)
            total += rss[p] if pss is None else pss
        todo += children.get(p, [])
    return total


@dataclass(frozen=True)
class Measured:
    """One command's cost."""

    wall_s: float
    tree_peak_bytes: int
    """Largest sampled sum of the RSS of the process and its descendants."""
    max_rss_bytes: int
    """Largest RSS of the process itself (kernel count, exact)."""
    cpu_s: float
    """User + system CPU seconds of the process and its reaped workers (contention-proof)."""
    returncode: int
    stdout: str
    stderr: str


def measure(cmd: list[str], cpus: int | None = None, timeout: float | None = None) -> Measured:
    """Run ``cmd``; return wall time, peak memory and output.

    Args:
        cmd: the command.
        cpus: pin it (and its workers) to this many CPUs when set.
        timeout: seconds before it is killed.
    """

    def pin() -> None:
        if cpus:
            os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:cpus])

    out_path = Path(f"/tmp/bench-{os.getpid()}.out")
    err_path = Path(f"/tmp/bench-{os.getpid()}.err")
    with open(out_path, "w") as out, open(err_path, "w") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=err,
            env=child_env(),
            preexec_fn=pin,  # affinity is set before exec, so workers inherit it
        )
        peak = 0
        stop = threading.Event()

        def sample() -> None:
            # At most a tenth of a CPU: one sample walks /proc and the page tables of every
            # process in the tree (tens of ms at 16,384 ranks). Sampled every 20 ms, it took
            # most of a core from the analysis it measures (22.4 s wall against 15-17 s for the
            # same command run alone).
            nonlocal peak
            while not stop.is_set():
                began = time.perf_counter()
                peak = max(peak, _tree_rss(proc.pid))
                stop.wait(max(0.05, 10 * (time.perf_counter() - began)))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        killer = threading.Timer(timeout, proc.kill) if timeout else None
        if killer:
            killer.start()
        # wait4: the child's own rusage, whose ru_maxrss (KiB) is the largest of it and its
        # reaped workers, exact where sampling may miss a short spike.
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        if killer:
            killer.cancel()
        stop.set()
        sampler.join()
    max_rss = usage.ru_maxrss * 1024
    stdout, stderr = out_path.read_text(), err_path.read_text()
    out_path.unlink()
    err_path.unlink()
    code = os.waitstatus_to_exitcode(status)
    cpu = usage.ru_utime + usage.ru_stime
    return Measured(wall, max(peak, max_rss), max_rss, cpu, code, stdout, stderr)


def generate(
    cache: Path,
    ranks: int,
    entries: int,
    fault: str,
    fault_rank: int,
    form: str = "flightrec",
    layout: str = "tp=8,pp=4",
) -> Path:
    """The simulated job's folder, written by `flightrec simulate` unless already cached."""
    shape = layout.replace("=", "").replace(",", "-")
    folder = cache / f"{form}-{ranks}x{entries}-{shape}-{fault}-{fault_rank}"
    if (folder / "expected.json").exists() and (folder / SIMULATE_TIME).exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    # CPU of the simulate process and its writer processes (reaped children): the figure a
    # busy shared machine does not inflate.
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "flightrec_cli",
            "simulate",
            "--ranks",
            str(ranks),
            "--entries",
            str(entries),
            "--layout",
            layout,
            "--fault",
            fault,
            "--fault-rank",
            str(fault_rank),
            "--format",
            form,
            "--processes",
            str(len(os.sched_getaffinity(0))),
            "--out",
            str(folder),
        ],
        check=True,
        env=child_env(),
        stdout=subprocess.DEVNULL,
    )
    took = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    took_text = f"{took:.1f} s wall, {cpu:.1f} s CPU"
    (folder / SIMULATE_TIME).write_text(took_text + "\n")  # hidden: analyze skips it
    print(f"  generated {folder} in {took_text}", flush=True)
    return folder


def verdict_matches(report: dict[str, Any], expected: dict[str, Any]) -> tuple[bool, str]:
    """Whether the first finding agrees with expected.json on every field it states."""
    findings: list[dict[str, Any]] = report.get("findings") or []
    want: dict[str, Any] | None = expected.get("first_finding")
    if not want:
        return (not findings, "healthy" if not findings else f"unexpected {findings[0]}")
    if not findings:
        return False, "no finding"
    first = findings[0]
    wrong = [f"{k}={first.get(k)!r} (expected {v!r})" for k, v in want.items() if first.get(k) != v]
    return (not wrong, "; ".join(wrong) or f"{first['kind']} {first['ranks']}")


def folder_bytes(folder: Path) -> tuple[int, int]:
    """(total bytes of dump files, number of dump files)."""
    sizes = [
        p.stat().st_size
        for p in folder.iterdir()
        if p.name != "expected.json" and not p.name.startswith(".")
    ]
    return sum(sizes), len(sizes)


def profile(folder: Path, top: int = 25) -> None:
    """Analyse ``folder`` serially in this process under cProfile; print where time goes."""
    import cProfile
    import pstats

    sys.path[:0] = [str(ROOT), str(ROOT / "cli")]
    from flightrec.analysis import AnalysisOptions, analyze_dir

    prof = cProfile.Profile()
    start = time.perf_counter()
    prof.enable()
    analyze_dir(str(folder), AnalysisOptions(workers=1))
    prof.disable()
    print(f"  serial profile ({time.perf_counter() - start:.1f} s under cProfile):")
    stats = pstats.Stats(prof, stream=sys.stdout)
    stats.sort_stats("cumulative").print_stats(r"flightrec/analysis", top)


def load_average() -> str:
    """The 1-minute load average: figures from a shared machine need it beside them."""
    return Path("/proc/loadavg").read_text().split()[0]


def _tail_section(path: Path, size: int) -> int:
    """Bytes the loader reads of one file: its tail section (schema 1.3), else all of it."""
    if size < 14:
        return size
    with open(path, "rb") as f:
        f.seek(size - 14)
        tag, start, tag2, _ = struct.unpack("<BQBI", f.read(14))
    return size - start + 20 if (tag, tag2) == (0x69, 0x75) and start < size else size


def limit(folder: Path, cpus: int, deep: int = 0, sample: int = 2000) -> str:
    """The physical limit of loading ``folder``: bytes to read / (read and parse bandwidth).

    Bandwidths are measured here on up to ``sample`` files (read: ``os.pread`` of the bytes the
    loader reads, from the page cache the analysis just warmed; parse: ``Dump.FromString`` of
    whole files, the C parser, per byte) and the whole job's bytes are divided by them,
    spread over ``cpus``.
    """
    sys.path[:0] = [str(ROOT)]
    from flightrec.format import flightrec_pb2 as pb

    files = sorted(p for p in folder.iterdir() if p.suffix == ".frdump")
    sizes = [p.stat().st_size for p in files]
    step = max(1, len(files) // sample)
    picked = list(zip(files[::step], sizes[::step], strict=True))
    read_bytes = [_tail_section(p, n) for p, n in picked]
    per_file = sum(read_bytes) / len(picked)
    total = per_file * (len(files) - deep) + deep * sum(sizes) / len(files)
    start = time.perf_counter()
    blobs = []
    for (p, n), r in zip(picked, read_bytes, strict=True):
        fd = os.open(p, os.O_RDONLY)
        try:
            blobs.append(os.pread(fd, r, n - r))
        finally:
            os.close(fd)
    read_bw = sum(read_bytes) / (time.perf_counter() - start)
    whole = [p.read_bytes() for p, _ in picked[:200]]
    start = time.perf_counter()
    for data in whole:
        pb.Dump.FromString(data)
    parse_bw = sum(map(len, whole)) / (time.perf_counter() - start)
    floor = (total / read_bw + total / parse_bw) / cpus
    return (
        f"limit {floor:.1f} s = {total / 2**20:,.0f} MB to read "
        f"({per_file / 1024:.1f} KB per tail{f', {deep} rings whole' if deep else ''}) / "
        f"(read {read_bw / 2**20:,.0f} MB/s + parse {parse_bw / 2**20:,.0f} MB/s) / {cpus} CPUs"
    )


def phases(folder: Path, cpus: int) -> tuple[str, int]:
    """Where the time goes: the analysis once more in this process, timed phase by phase.

    Returns:
        The phases as one line, and how many rings the loader read whole.
    """
    sys.path[:0] = [str(ROOT), str(ROOT / "cli")]
    from flightrec.analysis import gc_paused, pipeline
    from flightrec.analysis.loading.loader import AnalysisOptions, load_dir
    from flightrec.analysis.matching.matching import match
    from flightrec.analysis.timing.clocks import Clocks

    spent: list[tuple[str, float]] = []
    with gc_paused():
        start = time.perf_counter()
        run = load_dir(folder, AnalysisOptions(workers=cpus))
        spent.append((f"load ({cpus} processes)", time.perf_counter() - start))
        start = time.perf_counter()
        matched = match(run)
        spent.append(("match", time.perf_counter() - start))
        start = time.perf_counter()
        pipeline.diagnose(matched, Clocks(matched))
        spent.append(("stages", time.perf_counter() - start))
    deep = sum(d.dump.older == 0 and len(d) > 256 for d in run.dumps.values())
    total = sum(t for _, t in spent)
    shown = ", ".join(f"{name} {t:.1f}" for name, t in spent if t >= 0.05 * total or t > 0.5)
    return f"profile {total:.1f} s: {shown}", deep


def compare_readers(
    files: list[Path], fast: Any, slow: Any, label: tuple[str, str], limit: int = 1024
) -> None:
    """CPU time per file of two readers of the same files, in this process, interleaved.

    Each file is read by both, in alternating order (so neither always finds the page cache
    or the interned member lists warm); ``time.process_time`` counts this process's CPU only,
    which neighbours on a shared machine do not inflate the way they do wall time.

    Args:
        files: the files.
        fast / slow: path -> whatever the reader returns.
        label: their names.
        limit: files read at most.
    """
    spent = [0.0, 0.0]
    readers = (fast, slow)
    for i, path in enumerate(files[:limit]):
        for which in (0, 1) if i % 2 == 0 else (1, 0):
            start = time.process_time()
            readers[which](path)
            spent[which] += time.process_time() - start
    n = min(limit, len(files))
    print(
        f"  {label[0]}: {spent[0] / n * 1e3:.2f} ms/file; {label[1]}: {spent[1] / n * 1e3:.2f} "
        f"ms/file ({n} files, CPU); {spent[1] / max(spent[0], 1e-9):.2f}x",
        flush=True,
    )


def compare_flightrec_readers(folder: Path) -> None:
    """``format.wire.read_compact`` against ``DumpView.of(read_dump(...))`` on one folder."""
    sys.path[:0] = [str(ROOT), str(ROOT / "cli")]
    from flightrec.format.read import read_dump
    from flightrec.format.view import DumpView
    from flightrec.format.wire import read_compact

    def wire(path: Path) -> object:
        view = read_compact(path.read_bytes(), str(path))
        assert view is not None, path
        return view

    files = sorted(p for p in folder.iterdir() if p.suffix == ".frdump")
    compare_readers(
        files,
        wire,
        lambda path: DumpView.of(read_dump(path)),
        ("wire.read_compact", "DumpView.of(read_dump)"),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--fault", default="stall")
    parser.add_argument("--fault-rank", type=int, default=517)
    parser.add_argument("--layout", default="tp=8,pp=4", help="tensor/pipeline layout")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs the analysis may use")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/flightrec-bench"))
    parser.add_argument(
        "--profile", action="store_true", help="also profile a serial in-process analysis"
    )
    parser.add_argument(
        "--readers",
        action="store_true",
        help="compare the two flightrec dump readers on each size (serial, CPU per file)",
    )
    parser.add_argument(
        "--no-phases",
        action="store_true",
        help="skip the phase-by-phase rerun and the physical limit",
    )
    parser.add_argument(
        "--simulate-only",
        action="store_true",
        help="only simulate (time, disk, bytes per rank); do not analyze",
    )
    args = parser.parse_args()
    print(
        f"flightrec analyze, {args.entries} entries/rank, fault {args.fault}, {args.cpus} CPUs "
        "(targets: 16,384 ranks <= 10 s; 131,072 ranks <= 60 s and 8 GB); "
        f"load average {load_average()}"
    )
    ok = True
    for ranks in args.ranks:
        folder = generate(
            args.cache, ranks, args.entries, args.fault, args.fault_rank % ranks, layout=args.layout
        )
        expected = json.loads((folder / "expected.json").read_text())
        total, files = folder_bytes(folder)
        simulated = (folder / SIMULATE_TIME).read_text().strip()
        print(
            f"{ranks:>6} ranks: simulate {simulated}, {total / 2**30:.2f} GB on disk, "
            f"{total / files / 1024:.1f} KB/rank ({files} dumps)",
            flush=True,
        )
        if args.readers:
            compare_flightrec_readers(folder)
        if args.simulate_only:
            continue
        warm_bytecode()
        m = measure(
            [sys.executable, "-m", "flightrec_cli", "analyze", "--json", str(folder)],
            cpus=args.cpus,
        )
        if m.returncode not in (0, 1):
            print(f"{ranks:>6} ranks: analyze failed ({m.returncode}): {m.stderr[-500:]}")
            ok = False
            continue
        good, why = verdict_matches(json.loads(m.stdout), expected)
        ok &= good
        wall_target, gb_target = TARGETS.get(ranks, (None, None))
        met = [
            f"{'met' if value <= target else 'NOT met'}: {target:g} {unit}"
            for value, target, unit in (
                (m.wall_s, wall_target, "s"),
                (m.tree_peak_bytes / 2**30, gb_target, "GB"),
            )
            if target is not None
        ]
        print(
            f"{ranks:>6} ranks: {m.wall_s:6.1f} s wall, {m.cpu_s:6.1f} s CPU, "
            f"peak {m.tree_peak_bytes / 2**30:5.2f} GB "
            f"(tree; largest process {m.max_rss_bytes / 2**30:.2f} GB), "
            f"{total / files / 1024:.0f} KB/rank, verdict {'OK' if good else 'WRONG'}: {why}; "
            f"load average {load_average()}" + (f" ({'; '.join(met)})" if met else ""),
            flush=True,
        )
        if not args.no_phases:
            where, deep = phases(folder, args.cpus)
            print(f"        {where}", flush=True)
            print(f"        {limit(folder, args.cpus, deep)}", flush=True)
        if args.profile:
            profile(folder)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
