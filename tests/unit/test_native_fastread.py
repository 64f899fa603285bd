"""The C reader of native pickles (``_pickled.c``) reads what the Python path reads, or declines.

The Python path (``load_plain_pickle``, then ``entries.check_columns``) is
the definition. For every pickle, the C reader must either answer None (the Python path
then reads the file and explains what is wrong with it) or answer exactly what the Python
path makes of it: the same entry columns, value for value, the same interned signatures and
stacks in the same order, and the same rest of the dump. Checked on PyTorch's own dumps
(the shipped samples, written by torch's C++ pickler), on a simulated job, and on arbitrary
generated dumps, whose share of answers (not declines) is checked too, so that a reader
declining everything cannot pass.
"""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flightrec.readers.native as native
from flightrec.errors import DumpError
from flightrec.format.native_names import DTYPES, dtype_name
from flightrec.readers.native import reader
from flightrec.readers.native.entries import check_columns, from_c
from flightrec.readers.native.reader import Reader
from flightrec.readers.native.unpickle import load_plain_pickle

SAMPLES = Path(__file__).resolve().parents[2] / "samples" / "native"

pytestmark = pytest.mark.skipif(native._pickled is None, reason="_pickled is not built")


def _read(data: bytes) -> Any:
    assert native._pickled is not None
    return native._pickled.read(data, dtype_name, reader.MAX_CELLS)


def _python(data: bytes) -> tuple[dict[object, object], Any]:
    obj = load_plain_pickle(data, "x")
    assert isinstance(obj, dict)
    checked = check_columns(Reader("x"), obj["entries"])
    assert checked is not None
    return {k: v for k, v in obj.items() if k != "entries"}, checked


def _agree(data: bytes) -> bool:
    """Whether the C reader answered (False: it declined); asserts the answer is Python's."""
    reading = _read(data)
    if reading is None:
        return False
    rest, entries = _python(data)  # must not raise where C answered
    assert reading[0] == rest
    ours = from_c(reading)
    for field in dataclasses.fields(entries):
        want, got = getattr(entries, field.name), getattr(ours, field.name)
        assert list(got) == list(want), field.name
        if field.name in ("tensor_sigs", "stacks"):  # exact types: tuples of tuples of ints
            assert repr(got) == repr(tuple(want)), field.name
    return True


def test_torch_written_samples_read_alike() -> None:
    files = [
        p for p in sorted(SAMPLES.glob("*/nccl_trace_rank_*")) if p.read_bytes()[:1] == b"\x80"
    ]
    assert len(files) >= 16
    for path in files:
        assert _agree(path.read_bytes()), path


def test_simulated_job_reads_alike(tmp_path: Path) -> None:
    from flightrec.simulate.faults import Fault
    from flightrec.simulate.job import SimConfig, simulate
    from flightrec.simulate.layout import parse_layout

    config = SimConfig(layout=parse_layout("tp=2,pp=4", 16), entries=300, fault=Fault.STALL)
    simulate(config, tmp_path, form="native")
    files = sorted(tmp_path.glob("nccl_trace_rank_*"))
    assert len(files) >= 15
    for path in files:
        assert _agree(path.read_bytes()), path


# -- arbitrary dumps -----------------------------------------------------------------------

_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=8)
_NAMES = st.sampled_from(
    ["nccl:all_reduce", "gloo:allreduce", "nccl:send 0->1", "nccl:recv 1<-0", "broadcast", ""]
)
_INT = st.one_of(
    st.integers(-5, 5),
    st.integers(-(2**63), 2**63 - 1),
    st.booleans(),
    st.integers(2**63, 2**70),  # beyond 64 bits: both refuse or decline
)
_DTYPE = st.one_of(st.sampled_from([*DTYPES, "float32", "Weird"]), _TEXT, st.none())


def _seq(inner: st.SearchStrategy[Any], max_size: int) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(inner, max_size=max_size), st.lists(inner, max_size=max_size).map(tuple)
    )


_SIZES = st.one_of(st.none(), _seq(_seq(st.integers(-3, 2**40), 3), 3))
_DTYPES = st.one_of(st.none(), _seq(_DTYPE, 4))
_FRAME = st.fixed_dictionaries(
    {},
    optional={
        "name": st.one_of(_TEXT, st.none()),
        "filename": st.one_of(st.sampled_from(["a.py", "b.py"]), st.none()),
        "line": st.one_of(st.integers(-2, 40), st.none(), st.just(2**32), st.booleans()),
    },
)
_GROUP = st.one_of(
    st.none(),
    st.tuples(st.sampled_from(["0", "1", "tp"]), st.sampled_from(["default_pg", "tp", ""])),
    _seq(st.one_of(st.sampled_from(["0", "x"]), st.none()), 3),
)
_OPTIONAL = {
    "profiling_name": st.one_of(_NAMES, st.none()),
    "process_group": _GROUP,
    "record_id": st.one_of(_INT, st.none()),
    "is_p2p": st.one_of(st.booleans(), st.none(), st.integers(0, 2)),
    "input_sizes": _SIZES,
    "input_dtypes": _DTYPES,
    "output_sizes": _SIZES,
    "output_dtypes": _DTYPES,
    "pg_id": st.one_of(_INT, st.none()),
    "p2p_seq_id": st.one_of(_INT, st.none()),
    "state": st.one_of(st.sampled_from(["scheduled", "started", "completed"]), st.none()),
    "time_created_ns": st.one_of(_INT, st.none()),
    "time_discovered_started_ns": st.one_of(_INT, st.none()),
    "time_discovered_completed_ns": st.one_of(_INT, st.none()),
    "thread_name": st.one_of(_TEXT, st.none()),
    "timeout_ms": st.one_of(_INT, st.none()),
    "duration_ms": st.one_of(st.floats(allow_nan=False), st.none()),  # never read
}


@st.composite
def _dumps(draw: st.DrawFn) -> bytes:
    frames = draw(st.lists(_FRAME, min_size=1, max_size=4))  # shared objects, as torch does
    n = draw(st.integers(1, 6))
    entries = []
    for _ in range(n):
        e = draw(st.fixed_dictionaries({"collective_seq_id": _INT}, optional=_OPTIONAL))
        if draw(st.booleans()):
            picks = draw(st.lists(st.integers(0, len(frames) - 1), max_size=5))
            stack = [frames[i] if draw(st.booleans()) else dict(frames[i]) for i in picks]
            e["frames"] = stack if draw(st.booleans()) else tuple(stack)
        entries.append(e)
    if len(entries) > 1 and draw(st.booleans()):
        entries[1] = entries[0]  # one dict twice, through the memo
    dump = {
        "version": draw(st.sampled_from(["2.10", "2.2"])),
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
        "pg_status": {"0": {"last_enqueued_collective": draw(st.integers(0, 9))}},
        "entries": entries if draw(st.booleans()) else tuple(entries),
    }
    return pickle.dumps(dump, protocol=draw(st.integers(2, 5)))


_seen = {"answered": 0, "declined": 0}


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_dumps())
def test_arbitrary_dumps_read_alike_or_decline(data: bytes) -> None:
    try:
        answered = _agree(data)
    except DumpError:
        # Python refused the dump (a value of the wrong shape): C must have declined.
        assert _read(data) is None
        answered = False
    _seen["answered" if answered else "declined"] += 1


def test_arbitrary_dumps_are_mostly_answered() -> None:
    """The generator above reaches both outcomes (run after it, in the same process)."""
    if not _seen["answered"] and not _seen["declined"]:
        pytest.skip("runs after test_arbitrary_dumps_read_alike_or_decline only")
    total = _seen["answered"] + _seen["declined"]
    assert _seen["answered"] >= total // 4, _seen
    assert _seen["declined"] >= 1, _seen


# -- what it leaves to Python --------------------------------------------------------------


class _Evil:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("never",))


def _entry(**extra: object) -> dict[str, object]:
    return {"collective_seq_id": 1, "profiling_name": "nccl:all_reduce", **extra}


@pytest.mark.parametrize(
    "data",
    [
        pickle.dumps({"entries": [_entry(x=_Evil())]}, protocol=2),  # a global
        pickle.dumps({"entries": [_entry(x=b"bytes")]}, protocol=4),
        pickle.dumps({"entries": [_entry(record_id=2**64)]}, protocol=2),
        pickle.dumps({"entries": [_entry(x={1, 2})]}, protocol=4),  # a set
        pickle.dumps({"entries": [{"seq_id": 3}]}, protocol=2),  # format 1.x
        pickle.dumps({"entries": []}, protocol=2),
        pickle.dumps({"entries": [_entry()]}, protocol=2) + b"x",  # trailing bytes
        pickle.dumps({"entries": [_entry()]}, protocol=2)[:-7],  # truncated
        pickle.dumps({"entries": [_entry(), 3]}, protocol=2),
        pickle.dumps({"entries": [_entry(input_sizes=[[1]] * 2, input_dtypes="Float")]}),
        pickle.dumps({"entries": [_entry(frames=[{"line": 2**32}])]}),
        pickle.dumps({"entries": [_entry(input_sizes=[[0] * 65])]}),
        pickle.dumps({"entries": [_entry(state=3)]}),
        pickle.dumps({"entries": [{**_entry(), 7: 1}]}),  # a key that is not a string
        pickle.dumps(["entries"], protocol=2),
        pickle.dumps({"entries": [_entry()]}, protocol=0),
        b"\x80\x02}q\x00(X\x07\x00\x00\x00entriesq\x01]q\x02(}q\x03h\x05ea.",  # unset memo
        b"\x80\x02\xff",
        b"\x80\x02}r\xff\xff\xff\x00.",  # a memo index no writer uses (a 256 MB memo)
    ],
)
def test_what_it_declines(data: bytes) -> None:
    assert _read(data) is None


def test_a_declined_file_still_gets_pythons_sentence(tmp_path: Path) -> None:
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(pickle.dumps({"entries": [_entry(x=_Evil())]}, protocol=2))
    with pytest.raises(DumpError, match="refusing to load"):
        native.load_native(path)
    path.write_bytes(pickle.dumps({"entries": [_entry(state=3)]}, protocol=2))
    with pytest.raises(DumpError, match="state is int, expected a string"):
        native.load_native(path)


def test_shared_lists_are_read_once_and_alike() -> None:
    """Entries that share one sizes list but differ in dtypes get their own signatures."""
    sizes = [[4, 4]]
    entries = [
        _entry(input_sizes=sizes, input_dtypes=["Float"], frames=None),
        _entry(input_sizes=sizes, input_dtypes=["Half"]),
        _entry(input_sizes=sizes, input_dtypes=["Float"], output_sizes=sizes),
        _entry(input_sizes=[[4, 4]], input_dtypes=["float32"]),  # the same signature as 0
    ]
    data = pickle.dumps({"entries": entries}, protocol=4)
    assert _agree(data)
    ours = from_c(_read(data))
    assert list(ours.inputs) == [1, 2, 1, 1]
    assert list(ours.outputs) == [0, 0, 3, 0]
    assert ours.tensor_sigs[1] == (((4, 4), "float32"),)
    assert ours.tensor_sigs[3] == (((4, 4), ""),)


@pytest.mark.parametrize(
    "entries",
    [
        [_entry(frames=[{"line": -1, "name": None}, {"line": True}, {}, {"line": None}])],
        [_entry(frames=[{"filename": "a.py", "name": "f", "line": i} for i in range(70)])],
        [_entry(input_sizes=[[i] for i in range(4100)], input_dtypes=["Float"] * 4100)],
        [_entry(input_sizes=[[1], [2]], input_dtypes=["Float"]), _entry(input_dtypes=["Half"])],
        [_entry(input_sizes=[[1]], input_dtypes=["Float", "Half", 3])],  # extras never read
        [_entry(record_id=None), _entry(record_id=-4), _entry(record_id=True)],
        [_entry(pg_id=None), _entry(pg_id=-3), _entry(pg_id=2**63 - 1)],
        [_entry(process_group=["x"]), _entry(process_group=("a", "b", "c")), _entry()],
        [_entry(process_group=[]), _entry(process_group=[None, "d"])],
        [_entry(is_p2p=2), _entry(is_p2p=0), _entry(is_p2p=None), _entry(is_p2p=True)],
        [_entry(thread_name="h\u00e9\ud800", state="completed", profiling_name="nccl:send 1->0")],
        [_entry(time_created_ns=-1, timeout_ms=-(2**63), p2p_seq_id=False)],
    ],
)
def test_edges_read_alike(entries: list[dict[str, object]]) -> None:
    for protocol in (2, 5):
        assert _agree(pickle.dumps({"entries": entries, "version": "2.10"}, protocol=protocol))


def test_the_work_budget_is_the_python_readers(monkeypatch: pytest.MonkeyPatch) -> None:
    """One entry shared 100,000 times through the memo: read quickly either way, but past a
    lowered budget the C reader declines and the Python reader refuses, as it always did."""
    entry = _entry(input_sizes=[[1]] * 64, input_dtypes=["Float"] * 64)
    data = pickle.dumps({"entries": [entry] * 100_000}, protocol=2)
    assert _agree(data)
    monkeypatch.setattr(reader, "MAX_CELLS", 200_000)
    assert _read(data) is None
    with pytest.raises(DumpError, match="more values than any Flight Recorder dump"):
        _python(data)


def test_an_opcode_across_the_end_of_a_frame_is_left_to_python() -> None:
    """Python's unpickler cannot read an opcode across the end of a frame (protocol 4+); a
    frame length shortened by damage must not make the C reader answer what Python refuses."""
    data = pickle.dumps({"entries": [_entry(frames=[{"line": 3}])] * 3}, protocol=5)
    assert data[2] == 0x95  # FRAME, its length in the next 8 bytes
    n = int.from_bytes(data[3:11], "little")
    declined = 0
    for cut in range(1, 40):
        bad = data[:3] + (n - cut).to_bytes(8, "little") + data[11:]
        try:
            answered = _agree(bad)
        except DumpError:
            assert _read(bad) is None
            answered = False
        declined += not answered
    assert declined >= 15  # (a cut at an opcode boundary reads alike on both paths)
