"""Native dumps never execute code: crafted pickles and rank lists are refused, not run."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest

import flightrec.readers.native as _native
from flightrec.errors import CorruptDumpError, DumpError, NotADumpError, UnsafeDumpError
from flightrec.readers import read_any
from flightrec.readers.native import convert_paths, load_native, read_native, reader, sniff
from tests.unit.paths import c_and_python

SAMPLES = Path(__file__).resolve().parents[2] / "samples" / "native"

# Every test here runs on the C reader of pickles (where built) and on the Python path.
reader_paths = c_and_python(_native, "_pickled")


class _Touch:
    """Unpickling this with pickle.load would create ``target``."""

    def __init__(self, target: Path) -> None:
        self.target = str(target)

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (self.target, "w"))


class _Shell:
    def __init__(self, target: Path) -> None:
        self.target = str(target)

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.target}",))


def _crafted(tmp_path: Path, payload: object, name: str = "nccl_trace_rank_1") -> Path:
    dump = {"version": "2.10", "entries": [payload], "pg_config": {}}
    path = tmp_path / name
    path.write_bytes(pickle.dumps(dump, protocol=2))
    return path


@pytest.mark.parametrize("payload", [_Touch, _Shell])
def test_crafted_pickle_creates_nothing_and_names_the_file(tmp_path: Path, payload: type) -> None:
    target = tmp_path / "pwned"
    path = _crafted(tmp_path, payload(target))
    # Control: the file really is an exploit when loaded the way fr_trace loads it.
    control = tmp_path / "control"
    control_path = _crafted(tmp_path, payload(control), "nccl_trace_rank_9")
    with open(control_path, "rb") as f:
        pickle.load(f)
    assert control.exists()
    control_path.unlink()

    with pytest.raises(UnsafeDumpError) as info:
        load_native(path)
    assert not target.exists()
    message = str(info.value)
    assert str(path) in message and "\n" not in message
    assert "refusing" in message


def test_crafted_rank_does_not_stop_the_others(tmp_path: Path) -> None:
    for f in (SAMPLES / "hang").glob("nccl_trace_rank_*"):
        shutil.copy(f, tmp_path / f.name)
    bad = _crafted(tmp_path, _Touch(tmp_path / "pwned"), "nccl_trace_rank_2")
    paths = sorted(str(p) for p in tmp_path.iterdir() if sniff(p))
    dumps, errors, _job = convert_paths(paths)
    assert sorted(d.header.rank for d in dumps) == [0, 1, 3]
    assert [e.path for e in errors] == [str(bad)]
    assert isinstance(errors[0], UnsafeDumpError)
    assert not (tmp_path / "pwned").exists()
    # Reading one good file beside the bad one still works (the bad sibling is skipped).
    single = read_native(tmp_path / "nccl_trace_rank_0")
    assert not isinstance(single, list) and single.header.rank == 0


def _json_dump(ranks: object) -> dict[str, object]:
    return {
        "version": "2.10",
        "entries": [],
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": ranks}},
    }


@pytest.mark.parametrize(
    "ranks",
    [
        "__import__('os').system('touch {target}')",
        "[0, 1] + [__import__('os').system('touch {target}')]",
        "[i for i in range(4)]",
        "(0, 1)",
    ],
)
def test_json_rank_list_holding_code_is_rejected(tmp_path: Path, ranks: str) -> None:
    target = tmp_path / "pwned"
    path = tmp_path / "comm_lib_trace_rank_0"
    path.write_text(json.dumps(_json_dump(ranks.format(target=target))))
    with pytest.raises(UnsafeDumpError, match="not a list of integers"):
        load_native(path)
    assert not target.exists()


def test_plain_rank_lists_are_parsed(tmp_path: Path) -> None:
    path = tmp_path / "comm_lib_trace_rank_0"
    path.write_text(json.dumps(_json_dump("[0, 1, 2, 3]")))
    assert load_native(path).pg_config[0].ranks == (0, 1, 2, 3)
    path.write_text(json.dumps(_json_dump("[]")))
    assert load_native(path).pg_config[0].ranks is None


def _truncated(data: bytes) -> bytes:
    return data[: len(data) // 2]


@pytest.mark.parametrize(
    ("name", "make", "error"),
    [
        ("nccl_trace_rank_0", lambda d: _truncated(d), CorruptDumpError),
        ("nccl_trace_rank_0", lambda d: d + b"junk", CorruptDumpError),
        ("nccl_trace_rank_0", lambda d: b"\x80\x02garbage" * 10, CorruptDumpError),
        ("nccl_trace_rank_0", lambda d: b"", NotADumpError),
        ("nccl_trace_rank_0", lambda d: b"hello world", NotADumpError),
        ("nccl_trace_rank_0", lambda d: pickle.dumps([1, 2, 3], protocol=2), NotADumpError),
        (
            "nccl_trace_rank_0",
            lambda d: pickle.dumps({"entries": [{"record_id": "x"}]}, protocol=2),
            CorruptDumpError,
        ),
        ("comm_lib_trace_rank_0", lambda d: b'{"entries": [', CorruptDumpError),
        ("comm_lib_trace_rank_0", lambda d: b'{"entries": NaN}', CorruptDumpError),
        ("comm_lib_trace_rank_0", lambda d: b"{" + b"[" * 100000, CorruptDumpError),
    ],
)
def test_damaged_native_files_raise_dump_errors(
    tmp_path: Path, name: str, make: object, error: type
) -> None:
    data = (SAMPLES / "hang" / "nccl_trace_rank_0").read_bytes()
    path = tmp_path / name
    path.write_bytes(make(data))  # type: ignore[operator]
    with pytest.raises(error) as info:
        load_native(path)
    assert isinstance(info.value, DumpError) and str(path) in str(info.value)


def test_shared_subobjects_cannot_blow_up_the_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A smaller budget keeps the test fast; the mechanism is the same as with the default.
    monkeypatch.setattr(reader, "MAX_CELLS", 200_000)
    # Pickle memo sharing: one entry of 4,096 tensors referenced 100,000 times is a small
    # file that describes 400 million sizes; the reader must stop, not grind through it.
    one: list[object] = [1]
    entry = {
        "profiling_name": "gloo:all_reduce",
        "input_sizes": [one] * 4096,
        "input_dtypes": ["Float"] * 4096,
    }
    path = tmp_path / "rank_0"
    path.write_bytes(pickle.dumps({"entries": [entry] * 100_000}, protocol=2))
    assert path.stat().st_size < 1_000_000
    with pytest.raises(CorruptDumpError):
        load_native(path)


def test_oversized_files_are_refused_before_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import flightrec.readers.native as native

    monkeypatch.setattr(native, "MAX_NATIVE_BYTES", 1000)
    path = tmp_path / "rank_0"
    path.write_bytes(b"\x80\x02" + b"\x00" * 5000)
    with pytest.raises(NotADumpError, match="larger than any"):
        load_native(path)


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_every_pickle_protocol_is_refused_its_globals(tmp_path: Path, protocol: int) -> None:
    # Protocols 0-1 use INST/GLOBAL, 2-3 GLOBAL+REDUCE, 4-5 STACK_GLOBAL: all reach find_class.
    from flightrec.readers.native.unpickle import load_plain_pickle

    target = tmp_path / "pwned"
    data = pickle.dumps({"entries": [_Shell(target)]}, protocol=protocol)
    with pytest.raises(UnsafeDumpError, match=r"(posix|os|nt)\.system"):
        load_plain_pickle(data, "crafted")
    assert not target.exists()
    # What torch writes (dicts, lists, tuples, str, int, float, bool, None) loads in every
    # protocol. (bytes and sets need a global before protocol 3/4 and are refused there.)
    plain = {"a": (1, [2.5, None, True, "s", -(2**70)])}
    assert load_plain_pickle(pickle.dumps(plain, protocol), "ok") == plain


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("record_id", -5, None),  # read as 0 (the schema's record ids are unsigned)
        ("frames", [{"filename": "f.py", "name": "g", "line": 1 << 40}], CorruptDumpError),
        ("frames", [{"filename": 3, "name": "g", "line": 1}], CorruptDumpError),
        ("input_sizes", [[2, 1.5]], CorruptDumpError),
        ("input_sizes", [[2, 1 << 64]], CorruptDumpError),
        ("input_sizes", [[None, True]], None),  # None and bools are read as numbers
        ("input_dtypes", [["Float"]], CorruptDumpError),
        ("process_group", ("0", ["tp"]), CorruptDumpError),
        ("process_group", ("0", 5), CorruptDumpError),
        ("process_group", ("0", "default_pg", "extra"), None),
        ("process_group", ["0", "default_pg"], None),  # the JSON form's lists
        ("process_group", None, None),
        ("time_discovered_started_ns", [1], CorruptDumpError),  # among None values
        ("time_discovered_started_ns", "12", None),
        ("collective_seq_id", "12", None),
        ("time_created_ns", 2.5, CorruptDumpError),
    ],
)
def test_every_field_is_type_checked(
    tmp_path: Path, field: str, value: object, error: type | None
) -> None:
    # Values are checked a column at a time; a bad value in one entry among many well-formed
    # ones must still be found, and an unusual but valid one read like the others.
    good = {
        "record_id": 0,
        "process_group": ("0", "default_pg"),
        "collective_seq_id": 1,
        "profiling_name": "nccl:all_reduce",
        "time_created_ns": 1,
        "input_sizes": [[2, 3]],
        "input_dtypes": ["Float"],
        "state": "completed",
        "frames": [{"filename": "f.py", "name": "g", "line": 1}],
    }
    entries = [dict(good, record_id=i, collective_seq_id=i + 1) for i in range(50)]
    entries[17][field] = value
    dump = {
        "version": "2.10",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
        "entries": entries,
    }
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(pickle.dumps(dump, protocol=2))
    if error is None:
        (d,), errors, _ = convert_paths([path])
        assert not errors and len(d.entries.record_id) == 50
    else:
        with pytest.raises(error) as info:
            load_native(path)
        assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_a_parser_message_quoting_the_file_stays_one_line(tmp_path: Path) -> None:
    # A damaged FLOAT opcode: the unpickler's message quotes the garbage, newline included.
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(b"\x80\x02F\x1b]0;x\x07\n.")
    with pytest.raises(CorruptDumpError) as info:
        read_any(path)
    message = str(info.value)
    assert "\n" not in message and "\x1b" not in message and "\x07" not in message
    assert str(path) in message


def test_entries_sharing_one_shape_keep_their_own_dtypes(tmp_path: Path) -> None:
    # The pickle memo shares one sizes list between entries; their dtypes lists may still
    # differ, and each entry keeps its own signature.
    sizes = [[2, 3]]
    floats = ["Float"]
    entries = [
        {
            "record_id": i,
            "process_group": ("0", "default_pg"),
            "collective_seq_id": i + 1,
            "profiling_name": "nccl:all_reduce",
            "input_sizes": sizes,
            "input_dtypes": ["Double"] if i == 70 else floats,
            "state": "completed",
        }
        for i in range(100)
    ]
    dump = {
        "version": "2.10",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
        "entries": entries,
    }
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(pickle.dumps(dump, protocol=2))
    (d,), errors, _ = convert_paths([path])
    assert not errors
    dtypes = [d.strings[d.tensor_specs[i].dtype[0]] for i in d.entries.inputs]
    assert dtypes == ["float32"] * 70 + ["float64"] + ["float32"] * 29
