"""Check flightrec on every torch release users run, as a new user would, and print a table.

    python tools/torch_matrix.py [VERSION ...]      (default: every version in VERSIONS)

For each torch version: a fresh virtual environment (under ``--venvs``, default
/tmp/flightrec-torch-matrix; removed afterwards unless ``--keep``), ``pip install
torch==VERSION`` (the default wheel from the package index; this machine's pip configuration
may cap torch, which ``PIP_CONSTRAINT=/dev/null`` lifts for these installs only), then
``pip install`` of a copy of this working tree, exactly as a user installs the project. Then,
with the installed package only (the job runs in a folder of its own, never on this tree):

- ``flightrec doctor --json``: the recording path and which fast paths this torch allows;
- stall: a 4-rank gloo DDP job under torchrun with ``FLIGHTREC=1`` where rank 2 hangs
  (tools/matrix_job.py); the job's log must name rank 2, ``save_checkpoint_shard`` and the
  script, and ``flightrec analyze`` of its dumps must blame rank 2 first;
- black box: the same stall killed with SIGKILL before any dump (hang timeout 600 s);
  ``flightrec analyze`` of what is left (the black boxes) must blame rank 2 first;
- exit dump: a healthy run with ``FLIGHTREC_DUMP_ON_EXIT=1``: four dumps, and ``flightrec
  analyze`` finds nothing (exit status 0).

The table (GitHub markdown) goes to stdout; progress to stderr. Exit status 1 when a check
failed. docs/torch-versions.md publishes its output.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "tools" / "matrix_job.py"
VERSIONS = ("2.4.1", "2.6.0", "2.9.1", "2.12.1", "2.13.0", "2.14.1", "2.15.0")
TIMEOUT_S = 5
"""FLIGHTREC_TIMEOUT of the stall: the verdict is due within it plus 5 s."""
WAIT_S = 240.0
"""How long one job may take to show what is checked (imports of a CUDA build are slow)."""


@dataclass
class Row:
    version: str
    installed: str = ""
    doctor: dict[str, str] = field(default_factory=dict)
    checks: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(v.startswith("ok") for v in self.checks.values())


def say(*args: object) -> None:
    print(*args, file=sys.stderr, flush=True)


def run(cmd: list[str], timeout: float = 1800, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, **kw)  # type: ignore[call-overload, no-any-return]


def install(venv: Path, version: str) -> str:
    """The environment with torch ``version`` and flightrec; "" on success, else why not."""
    shutil.rmtree(venv, ignore_errors=True)
    run([sys.executable, "-m", "venv", str(venv)])
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    env = {**os.environ, "PIP_CONSTRAINT": "/dev/null", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    got = run([*pip, f"torch=={version}", "numpy"], env=env)
    if got.returncode:
        return "pip install torch failed: " + got.stderr.strip().splitlines()[-1]
    with tempfile.TemporaryDirectory() as tmp:  # a copy: pip's build files stay out of the tree
        files = run(["git", "ls-files", "-z", "-c", "-o", "--exclude-standard"], cwd=ROOT)
        for name in filter(None, files.stdout.split("\0")):
            if (ROOT / name).is_file():
                (Path(tmp) / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / name, Path(tmp) / name)
        got = run([*pip, tmp], env=env)
    if got.returncode:
        return "pip install flightrec failed: " + got.stderr.strip().splitlines()[-1]
    return ""


def doctor(venv: Path, work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTREC")}
    got = run([str(venv / "bin" / "flightrec"), "doctor", "--json"], cwd=work, env=env)
    try:
        items = json.loads(got.stdout)["items"]
    except (ValueError, KeyError):
        return {"doctor": f"failed: {got.stderr.strip()[-200:]}"}
    return {i["topic"]: f"{i['value']}" + (f" ({i['why']})" if i["why"] else "") for i in items}


def start_job(venv: Path, work: Path, shape: str, env: dict[str, str]) -> subprocess.Popen[str]:
    shutil.copy2(JOB, work / "matrix_job.py")
    full = {k: v for k, v in os.environ.items() if not k.startswith(("FLIGHTREC", "PYTHON"))}
    full.update({"FLIGHTREC": "1", "FLIGHTREC_DIR": str(work / "dumps"), "OMP_NUM_THREADS": "1"})
    full.update(env)
    log = open(work / f"{shape}.log", "w")  # noqa: SIM115 (closed with the process)
    return subprocess.Popen(
        [str(venv / "bin" / "python"), "-m", "torch.distributed.run", "--standalone",
         "--nproc-per-node", "4", "matrix_job.py", shape],
        cwd=work, env=full, stdout=log, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip


def wait_for(path: Path, proc: subprocess.Popen[str], *needles: str) -> bool:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        text = path.read_text(errors="replace")
        if all(n in text for n in needles):
            return True
        if proc.poll() is not None:
            return all(n in path.read_text(errors="replace") for n in needles)
        time.sleep(0.5)
    return False


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (torchrun starts its workers in sessions of their own, so
    killing its process group leaves them running)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the launcher and every process below it, at once (a hard death of the job)."""
    for pid in [*descendants(proc.pid), proc.pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=60)


def analyze(venv: Path, work: Path) -> tuple[int, dict[str, object]]:
    got = run([str(venv / "bin" / "flightrec"), "analyze", str(work / "dumps"), "--json"], cwd=work)
    try:
        report = json.loads(got.stdout)
    except ValueError:
        return got.returncode, {}
    first = report["findings"][0] if report.get("findings") else {}
    return got.returncode, first


def blames_rank_2(status: int, first: dict[str, object]) -> str:
    if status != 1 or not first:
        return f"FAIL: analyze exit {status}, no finding"
    if first.get("ranks") != [2]:
        return f"FAIL: first finding {first.get('kind')} {first.get('ranks')}"
    where = "with the line" if "save_checkpoint_shard" in str(first.get("summary")) else "no line"
    return f"ok: {first.get('kind')} [2], {where}"


def check_stall(venv: Path, work: Path) -> str:
    proc = start_job(venv, work, "stall", {"FLIGHTREC_TIMEOUT": str(TIMEOUT_S)})
    log = work / "stall.log"
    named = wait_for(log, proc, "Verdict", "Rank 2", "save_checkpoint_shard", "matrix_job.py:")
    time.sleep(2)  # the other ranks' dumps land
    kill(proc)
    if not named:
        return "FAIL: no verdict naming rank 2 and its line in the log"
    return blames_rank_2(*analyze(venv, work)).replace("ok: ", "ok: log and ")


def check_killed(venv: Path, work: Path) -> str:
    proc = start_job(venv, work, "killed", {"FLIGHTREC_TIMEOUT": "600"})
    if not wait_for(work / "killed.log", proc, "STALLING"):
        kill(proc)
        return "FAIL: the job never stalled"
    time.sleep(3)  # the others are in the gradient all-reduce
    kill(proc)
    return blames_rank_2(*analyze(venv, work))


def check_exit(venv: Path, work: Path) -> str:
    proc = start_job(venv, work, "healthy", {"FLIGHTREC_DUMP_ON_EXIT": "1"})
    try:
        proc.wait(timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        kill(proc)
        return "FAIL: the healthy job did not end"
    dumps = sorted((work / "dumps").rglob("*.frdump"))
    status, first = analyze(venv, work)
    if proc.returncode or len(dumps) != 4 or status != 0:
        return f"FAIL: exit {proc.returncode}, {len(dumps)} dumps, analyze exit {status} {first}"
    return "ok: 4 dumps, no finding"


CHECKS = (("stall", check_stall), ("black box", check_killed), ("exit dump", check_exit))


def check(version: str, venvs: Path, keep: bool) -> Row:
    row = Row(version)
    started = time.monotonic()
    venv = venvs / version
    say(f"== torch {version}: installing into {venv}")
    why = install(venv, version)
    if why:
        row.checks["install"] = f"FAIL: {why}"
        return row
    got = run([str(venv / "bin" / "python"), "-c", "import torch; print(torch.__version__)"])
    row.installed = got.stdout.strip()
    try:
        for name, fn in CHECKS:
            with tempfile.TemporaryDirectory() as tmp:
                if name == "stall":
                    row.doctor = doctor(venv, Path(tmp))
                row.checks[name] = fn(venv, Path(tmp))
                say(f"   {name}: {row.checks[name]}")
    finally:
        if not keep:
            shutil.rmtree(venv, ignore_errors=True)
    row.seconds = time.monotonic() - started
    return row


DOCTOR = ("recording path", "torch internals", "tensor-memory reader", "PyTorch's recorder")


def table(rows: list[Row]) -> str:
    head = ["torch", *DOCTOR, *(name for name, _ in CHECKS)]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        cells = [r.installed or r.version]
        cells += [r.doctor.get(topic, "-").split(" (/")[0] for topic in DOCTOR]
        cells += [r.checks.get(name, r.checks.get("install", "-")) for name, _ in CHECKS]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("versions", nargs="*", default=list(VERSIONS))
    parser.add_argument("--venvs", type=Path, default=Path("/tmp/flightrec-torch-matrix"))
    parser.add_argument("--keep", action="store_true", help="keep each environment")
    args = parser.parse_args()
    rows = []
    for version in args.versions:
        rows.append(check(version, args.venvs, args.keep))
        say(f"   {'ok' if rows[-1].ok else 'FAILED'} in {rows[-1].seconds:.0f} s")
        say(table(rows[-1:]).splitlines()[-1])  # the row, as soon as it is known
    print(table(rows))
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
