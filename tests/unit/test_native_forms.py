"""The native forms torch 2.14 and 2.15 write, read by content (samples/native/hook_hang,
torchft_hang, torchcomms_hang) and the pieces that read them."""

from __future__ import annotations

import pickle
import shutil
import sys
from pathlib import Path

import pytest

from flightrec.analysis import AnalysisOptions, analyze_dir
from flightrec.format.native_names import parse_profiling_name
from flightrec.readers.native import load_native
from flightrec.readers.native.torchcomms import per_group, recorder_wide
from flightrec.readers.native.torchft import quorum_of

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "samples" / "native"
sys.path.insert(0, str(SAMPLES))
from construct_torchcomms import dump as torchcomms_dump  # noqa: E402


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        ("nccl2:all_reduce", ("nccl2", "all_reduce", -1, -1)),  # torch 2.15's default NCCL
        ("c10d:allreduce", ("c10d", "all_reduce", -1, -1)),  # the hook's fallback name
        ("relay:send 0->1", ("relay", "send", 0, 1)),
        ("gloo:recv 3<-?", ("gloo", "recv", -1, -1)),  # recv from any source: no peer
        ("my:plugin:recv 1<-0", ("my:plugin", "recv", 0, 1)),  # a colon in a backend's name
        ("ncclx:send", ("ncclx", "send", -1, -1)),  # torchcomms: no peer in the name
        ("allreduce", ("", "all_reduce", -1, -1)),
    ],
)
def test_profiling_names_split_from_the_right(name: str, parsed: tuple[object, ...]) -> None:
    assert parse_profiling_name(name) == parsed


def test_the_hook_based_recorders_entries_have_no_times_and_read_as_a_hang() -> None:
    d = load_native(SAMPLES / "hook_hang" / "comm_lib_trace_rank_0")
    es = d.entries
    assert set(es.backend) == {"relay"} and not any(es.started_ns) and not any(es.completed_ns)
    assert list(es.seq) == [1, 2, 3, 4, 5]  # the hook numbers per group, as torch does


def test_nccl2_entries_from_the_same_writer_read_the_same(tmp_path: Path) -> None:
    """torch 2.15's default NCCL ("nccl2") is recorded by the same hook, whose writer names an
    entry ``<backend>:<op>`` (FlightRecorderHook): only a GPU writes it, so the real CPU dumps
    of the hook are renamed the way that writer would name them."""
    job = tmp_path / "nccl2"
    shutil.copytree(SAMPLES / "hook_hang", job)
    for path in job.glob("comm_lib_trace_rank_*"):
        data = pickle.loads(path.read_bytes())  # our own sample: trusted
        for e in data["entries"]:
            e["profiling_name"] = e["profiling_name"].replace("relay:", "nccl2:")
        path.write_bytes(pickle.dumps(data, protocol=2))
    first = analyze_dir(str(job)).findings[0]
    assert (first.kind, first.ranks, first.seq, first.op) == ("not_arrived", (2,), 5, "all_reduce")
    assert set(load_native(job / "comm_lib_trace_rank_0").entries.backend) == {"nccl2"}


def test_torchcomms_numbers_are_renumbered_per_group() -> None:
    d = load_native(SAMPLES / "torchcomms_hang" / "comm_lib_trace_rank_0")
    es = d.entries
    world = [s for name, s in zip(es.pg_name, es.seq, strict=True) if name == "world"]
    pair = [s for name, s in zip(es.pg_name, es.seq, strict=True) if name == "tp01"]
    assert world == [1, 2, 3, 4, 5] and pair == [1, 2, 3, 4]


def test_a_torch_ring_is_not_taken_for_a_torchcomms_one() -> None:
    d = load_native(SAMPLES / "subgroup_hang" / "nccl_trace_rank_0")
    assert not recorder_wide(d) and per_group(d) is d


def test_a_wrapped_torchcomms_ring_keeps_the_recorder_wide_number(tmp_path: Path) -> None:
    data = torchcomms_dump(0)
    entries = data["entries"]
    assert isinstance(entries, list)
    for e in entries:
        e["collective_seq_id"] += 100  # what a ring that overwrote its oldest entries holds
    path = tmp_path / "comm_lib_trace_rank_0"
    path.write_bytes(pickle.dumps(data, protocol=2))
    assert list(load_native(path).entries.seq) == list(range(101, 101 + len(entries)))


def test_torchft_files_are_known_by_folder_and_name(tmp_path: Path) -> None:
    assert quorum_of(str(tmp_path / "trace_quorum_12" / "5")) == "trace_quorum_12"
    assert quorum_of(str(tmp_path / "trace_quorum_12" / "rank_5")) == ""
    assert quorum_of(str(tmp_path / "quorum_12" / "5")) == ""


def test_torchft_dumps_are_put_in_global_terms() -> None:
    d = load_native(SAMPLES / "torchft_hang" / "trace_quorum_2" / "3")
    assert d.job_id == "trace_quorum_2" and d.rank == 3
    assert {c.name: c.ranks for c in d.pg_config} == {"replica1/0": (2, 3)}
    assert set(d.entries.pg_name) == {"replica1/0"}


def test_each_quorum_is_a_job_and_the_newest_is_analyzed() -> None:
    report = analyze_dir(str(SAMPLES / "torchft_hang"))
    assert report.findings[0].ranks == (3,)
    older = analyze_dir(str(SAMPLES / "torchft_hang"), AnalysisOptions(job="trace_quorum_1"))
    assert not older.findings  # quorum 1 was healthy
