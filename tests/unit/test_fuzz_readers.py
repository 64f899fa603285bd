"""Fuzzing the dump readers: damaged bytes get one clear DumpError line, never a crash.

Each seed is a real file from the shipped samples (a flightrec dump, the same job's dumps with
their groups as schema 1.2 member grids, a black-box ring and its tables journal, a native
pickle, a native JSON dump). Hypothesis truncates it, overwrites bytes, splices in
random bytes, or replaces it whole, and the damaged file is read the way ``flightrec
analyze`` reads any file. A reader may accept the bytes (a flipped byte in a timestamp is
still a dump) or refuse them with a ``DumpError`` naming the file in one line; anything else
is a bug. Accepted dumps are then analyzed beside the other ranks' real dumps, which must
not crash either. ``benchmarks/fuzz_readers.py`` runs the same check far longer.
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flightrec.analysis import analyze_dir
from flightrec.errors import DumpError, FlightrecError
from flightrec.format.members import set_members
from flightrec.format.read import read_dump
from flightrec.readers import read_any

SAMPLES = Path(__file__).resolve().parents[2] / "samples"


def _seed(folder: str, pattern: str) -> Path:
    return sorted((SAMPLES / folder).glob(pattern))[0]


def _grid_seed() -> Path:
    """A schema 1.2 dump whose groups are ``RankGrid``s: subgroup_hang's dumps, rewritten.

    Written once per process into a temporary folder (removed at exit) with its peers, so
    the damaged file is analyzed beside them like the other seeds.
    """
    folder = Path(tempfile.mkdtemp(prefix="flightrec-fuzz-grid-"))
    atexit.register(shutil.rmtree, folder, True)
    for path in sorted((SAMPLES / "subgroup_hang").glob("*-000-*.frdump")):
        dump = read_dump(path)
        dump.schema_minor = 2
        for g in dump.groups:
            ranks = list(g.ranks)
            g.ClearField("ranks")
            set_members(g, ranks)
        (folder / path.name).write_bytes(dump.SerializeToString())
    return sorted(folder.glob("flightrec-rank00003-*.frdump"))[0]


SEEDS = {
    "flightrec": _seed("stalled_rank", "flightrec-rank00002-*-000-*.frdump"),
    "flightrec-grid": _grid_seed(),
    "blackbox": _seed("crashed_rank", "flightrec-rank00001-*.ring"),
    "blackbox-tables": _seed("crashed_rank", "flightrec-rank00001-*.ring.tables"),
    "native-pickle": _seed("native/hang", "nccl_trace_rank_2"),
    "native-json": _seed("native/hang-json", "*rank_2"),
}


def damage(data: bytes, how: tuple[str, int, bytes]) -> bytes:
    """Apply one mutation: ("truncate", at, _), ("overwrite", at, b), ("insert", at, b), ("replace", _, b)."""
    kind, at, chunk = how
    at = at % (len(data) + 1)
    if kind == "truncate":
        return data[:at]
    if kind == "overwrite":
        return data[:at] + chunk + data[at + len(chunk) :]
    if kind == "insert":
        return data[:at] + chunk + data[at:]
    return chunk


mutations = st.tuples(
    st.sampled_from(["truncate", "overwrite", "overwrite", "insert", "replace"]),
    st.integers(min_value=0, max_value=1 << 20),
    st.binary(min_size=1, max_size=64),
)


def check_file(seed: Path, data: bytes, workdir: Path) -> str:
    """Write ``data`` under the seed's name beside copies of its peers; read and analyze it.

    Returns:
        "accepted" or "refused".

    Raises:
        AssertionError: a reader or the analysis failed other than with a one-line flightrec error.
    """
    folder = workdir / "job"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(seed.parent, folder)
    target = folder / seed.name
    target.write_bytes(data)
    # A black box's tables journal is read with its ring: damage the one, read the other.
    read = target.with_name(target.name.removesuffix(".tables"))
    try:
        read_any(read)
        outcome = "accepted"
    except DumpError as exc:
        text = str(exc)
        assert str(read) in text and "\n" not in text, text
        outcome = "refused"
    with contextlib.suppress(FlightrecError):
        analyze_dir(folder)
    return outcome


@pytest.mark.parametrize("kind", list(SEEDS))
@settings(
    max_examples=25,  # brief in CI: each example reads and analyzes a whole job folder
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)
@given(how=mutations)
def test_damaged_files_are_read_or_refused_in_one_line(
    kind: str, how: tuple[str, int, bytes], tmp_path: Path
) -> None:
    seed = SEEDS[kind]
    check_file(seed, damage(seed.read_bytes(), how), tmp_path)
