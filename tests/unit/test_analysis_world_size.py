"""One damaged or foreign dump cannot decide the size of the job."""

from __future__ import annotations

from pathlib import Path

import pytest

from flightrec.analysis import analyze_dir
from flightrec.errors import CorruptDumpError
from flightrec.format.read import parse_dump, read_dump
from flightrec.format.schema import MAX_WORLD_SIZE
from flightrec.format.write import write_dump
from tests.unit.factories import Job, healthy


def test_a_dump_claiming_another_world_size_is_set_aside(tmp_path: Path) -> None:
    paths = healthy(Job(world_size=4)).write(tmp_path)
    odd = read_dump(paths[2])
    odd.header.world_size = 1 << 20  # a damaged header, still within the hard bound
    write_dump(odd, tmp_path, paths[2].name)
    report = analyze_dir(tmp_path)
    assert report.world_size == 4
    (problem,) = [p for p in report.run.problems if str(p.path) == str(paths[2])]
    assert "world size 1048576" in problem.reason and "say world size 4" in problem.reason


def test_a_world_size_beyond_any_job_is_corrupt(tmp_path: Path) -> None:
    dump = read_dump(healthy(Job(world_size=2)).write(tmp_path)[0])
    dump.header.world_size = MAX_WORLD_SIZE + 1
    with pytest.raises(CorruptDumpError, match="beyond any job"):
        parse_dump(dump.SerializeToString(), "huge.frdump")
