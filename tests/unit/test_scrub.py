"""Control characters never reach the analysis, whether or not equal tables were seen before."""

from __future__ import annotations

from pathlib import Path

from flightrec.analysis.model import RankDump
from flightrec.format.read import read_dump
from flightrec.format.wire import read_compact
from flightrec.readers import scrub
from flightrec.simulate import Fault, SimConfig, parse_layout, simulate


def _read(data: bytes, name: str) -> RankDump:
    view = read_compact(data, name)
    assert view is not None
    return RankDump(name, view)


def test_every_dump_with_a_control_character_is_scrubbed_and_clean_tables_are_remembered(
    tmp_path: Path,
) -> None:
    simulate(SimConfig(parse_layout("tp=2,pp=1", 2), 20, Fault.STALL, 1), tmp_path)
    path = sorted(tmp_path.glob("*.frdump"))[0]
    clean = _read(path.read_bytes(), "a")
    assert clean.dump.tables in scrub._CLEAN
    dump = read_dump(path)
    dump.strings[1] = "evil\x1b]0;title\x07name"
    dump.header.hostname = "host\x1b[2J"
    data = dump.SerializeToString()
    for name in ("b", "c"):  # the second read of the same bytes is scrubbed all the same
        d = _read(data, name)
        assert d.dump.tables not in scrub._CLEAN
        assert d.dump.strings[1] == "evil?]0;title?name"
        assert d.header.hostname == "host?[2J"
