"""Native dumps recorded from real gloo jobs convert into the flightrec schema faithfully."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

import flightrec.readers.native as _native
from flightrec.format import flightrec_pb2 as pb
from flightrec.format.builder import IS_P2P, SEND
from flightrec.format.members import members_of
from flightrec.format.read import read_dump, validate
from flightrec.readers.native import convert_dir, convert_paths, parse_name, read_native, sniff
from tests.unit.paths import c_and_python

SAMPLES = Path(__file__).resolve().parents[2] / "samples" / "native"
FORMS = [("", "torch-native-pickle"), ("-json", "torch-native-json")]

# Every test here runs on the C reader of pickles (where built) and on the Python path.
reader_paths = c_and_python(_native, "_pickled")


def _folder(scenario: str, suffix: str) -> dict[int, pb.Dump]:
    dumps = read_native(SAMPLES / f"{scenario}{suffix}")
    assert isinstance(dumps, list)
    return {d.header.rank: d for d in dumps}


def _last(d: pb.Dump) -> tuple[str, int, str, tuple[int, ...], str]:
    e, i = d.entries, len(d.entries.record_id) - 1
    spec = d.tensor_specs[e.inputs[i]]
    return (
        d.groups[e.group[i]].name,
        e.seq[i],
        d.strings[e.op[i]],
        tuple(spec.dims),
        d.strings[spec.dtype[0]],
    )


@pytest.mark.parametrize(("suffix", "source"), FORMS)
def test_hang_sample(suffix: str, source: str) -> None:
    dumps = _folder("hang", suffix)
    assert sorted(dumps) == [0, 1, 2, 3]
    for rank, d in dumps.items():
        validate(d)
        assert d.header.source == source and d.header.reason == pb.CONVERTED
        assert d.header.world_size == 4 and d.header.backend == "gloo"
        (g,) = d.groups
        assert (g.name, g.desc, list(members_of(g)), g.members_known) == (
            "0",
            "default_pg",
            [0, 1, 2, 3],
            True,
        )
        assert list(d.entries.seq) == list(range(1, g.last_seq + 1))
        assert g.last_seq == (4 if rank == 2 else 5)
        assert "no start or completion times" in d.header.reason_detail
    assert _last(dumps[0]) == ("0", 5, "all_reduce", (4,), "float32")
    assert _last(dumps[2]) == ("0", 4, "broadcast", (4,), "float32")


def test_stacks_and_threads_come_from_the_pickle_form() -> None:
    d = _folder("hang", "")[0]
    e = d.entries
    stack = d.stacks[e.stack[len(e.record_id) - 1]]
    frames = [(d.strings[d.frames[f].file], d.strings[d.frames[f].name]) for f in stack.frames]
    assert frames[0][1] == "all_reduce"  # innermost first
    assert any(file.endswith("fr_job.py") and name == "_faulty" for file, name in frames)
    assert d.strings[e.thread[0]] == "python"
    assert all(t > 1_600_000_000 * 10**9 for t in e.enqueue_ns)  # wall clock, like the header
    assert d.header.wall_time_ns == d.header.mono_time_ns


@pytest.mark.parametrize("suffix", ["", "-json"])
def test_mismatch_samples_keep_op_and_shape(suffix: str) -> None:
    ops = _folder("op_mismatch", suffix)
    assert [_last(ops[r])[2] for r in range(4)] == [
        "broadcast",
        "all_reduce",
        "all_reduce",
        "all_reduce",
    ]
    assert {_last(ops[r])[1] for r in range(4)} == {5}
    sizes = _folder("size_mismatch", suffix)
    assert [_last(sizes[r])[3] for r in range(4)] == [(4,), (8,), (4,), (4,)]


@pytest.mark.parametrize("suffix", ["", "-json"])
def test_subgroup_membership_is_rebuilt_from_other_ranks(suffix: str) -> None:
    dumps = _folder("subgroup_hang", suffix)
    for rank, d in dumps.items():
        groups = {g.name: g for g in d.groups}
        sub = "1" if rank < 2 else "2"
        assert set(groups) == {"0", sub}
        assert list(members_of(groups[sub])) == ([0, 1] if rank < 2 else [2, 3])
        assert not groups[sub].members_known
        # torch 2.13 gloo leaves no complete world list when every rank is in a subgroup.
        assert list(members_of(groups["0"])) == [0, 1, 2, 3] and not groups["0"].members_known
        assert f"group '{sub}'" in d.header.reason_detail
    assert {g.name: g.last_seq for g in dumps[2].groups} == {"0": 4, "2": 3}
    assert {g.name: g.last_seq for g in dumps[3].groups} == {"0": 4, "2": 2}


def test_one_file_read_alone_uses_its_siblings() -> None:
    d = read_native(SAMPLES / "subgroup_hang" / "nccl_trace_rank_3")
    assert not isinstance(d, list)
    assert {g.name: list(members_of(g)) for g in d.groups} == {"0": [0, 1, 2, 3], "2": [2, 3]}


def test_pickle_and_json_forms_agree() -> None:
    for scenario in ("hang", "op_mismatch", "size_mismatch", "subgroup_hang"):
        a, b = _folder(scenario, ""), _folder(scenario, "-json")
        for rank in range(4):
            assert [_last(a[rank])] == [_last(b[rank])]
            assert list(a[rank].entries.seq) == list(b[rank].entries.seq)
            assert [(g.name, list(members_of(g))) for g in a[rank].groups] == [
                (g.name, list(members_of(g))) for g in b[rank].groups
            ]


def _nccl_entry(record_id: int, name: str, **extra: object) -> dict[str, object]:
    entry: dict[str, object] = {
        "record_id": record_id,
        "pg_id": 1,
        "process_group": ("5", "pp"),
        "collective_seq_id": 0,
        "p2p_seq_id": record_id,
        "op_id": record_id,
        "profiling_name": name,
        "time_created_ns": 1_700_000_000_000_000_000 + record_id,
        "input_sizes": [[2, 3]],
        "input_dtypes": ["BFloat16"],
        "output_sizes": [[2, 3]],
        "output_dtypes": ["BFloat16"],
        "state": "completed",
        "time_discovered_started_ns": 1_700_000_000_000_000_100,
        "time_discovered_completed_ns": 1_700_000_000_000_000_200,
        "retired": True,
        "timeout_ms": 600000,
        "is_p2p": True,
        "frames": [],
    }
    entry.update(extra)
    return entry


def test_nccl_p2p_peers_become_global_ranks(tmp_path: Path) -> None:
    # An NCCL-style dump (torch 2.4 format "2.2"): pg_config names its groups; P2P names
    # group-local ranks. Rank 3 is local rank 1 of group "5" = [2, 3].
    dump = {
        "version": "2.2",
        "pg_config": {"5": {"name": "5", "desc": "pp", "ranks": "[2, 3]"}},
        "entries": [
            _nccl_entry(7, "nccl:send 1->0"),
            _nccl_entry(8, "nccl:recv 1<-0", state="started", time_discovered_completed_ns=None),
            _nccl_entry(9, "nccl:send 1->0"),
        ],
    }
    path = tmp_path / "host7_nccl_trace_rank_3"
    path.write_bytes(pickle.dumps(dump, protocol=2))
    assert sniff(path)
    (d,), errors, _ = convert_paths([path])
    assert not errors
    assert d.header.hostname == "host7" and d.header.rank == 3
    (g,) = d.groups
    assert (g.name, list(members_of(g)), g.members_known) == ("5", [2, 3], True)
    assert [(p.peer, p.sends, p.recvs) for p in g.p2p] == [(2, 2, 1)]
    e = d.entries
    assert list(e.peer) == [2, 2, 2]
    assert list(e.p2p_seq) == [1, 1, 2]
    assert [f & (IS_P2P | SEND) for f in e.flags] == [IS_P2P | SEND, IS_P2P, IS_P2P | SEND]
    assert list(e.state) == [pb.COMPLETED, pb.STARTED, pb.COMPLETED]
    assert e.complete_ns[1] == 0 and e.start_ns[1] > 0
    assert d.strings[d.tensor_specs[e.inputs[0]].dtype[0]] == "bfloat16"
    assert d.header.entries_recorded == 10 and g.dropped == 0


@pytest.mark.parametrize(
    ("profiling_name", "op"),
    [
        ("nccl:_all_gather_base", "all_gather_into_tensor"),
        ("gloo:_allgather_base", "all_gather_into_tensor"),
        ("nccl:_reduce_scatter_base", "reduce_scatter_tensor"),
        ("nccl:allreduce", "all_reduce"),
        ("nccl:all_reduce", "all_reduce"),
    ],
)
def test_backend_op_names_become_the_python_api_names(
    tmp_path: Path, profiling_name: str, op: str
) -> None:
    dump = {
        "version": "2.2",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
        "entries": [
            _nccl_entry(
                1,
                profiling_name,
                process_group=("0", "default_pg"),
                collective_seq_id=1,
                p2p_seq_id=0,
                is_p2p=False,
            )
        ],
    }
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(pickle.dumps(dump, protocol=2))
    (d,), errors, _ = convert_paths([path])
    assert not errors
    assert d.strings[d.entries.op[0]] == op


@pytest.mark.parametrize(
    ("name", "rank", "host"),
    [
        ("rank_3", 3, ""),
        ("nccl_trace_rank_12", 12, ""),
        ("comm_lib_trace_rank_0", 0, ""),
        ("node-a1-comm_lib_trace_rank_7", 7, "node-a1"),
        ("gpu17.cluster_nccl_trace_rank_5.json", 5, "gpu17.cluster"),
    ],
)
def test_names(name: str, rank: int, host: str) -> None:
    parsed = parse_name(name)
    assert parsed is not None and (parsed.rank, parsed.host) == (rank, host)


@pytest.mark.parametrize(
    "name", ["flightrec-rank00003-123-000-api_call.frdump", "expected.json", "rank_x"]
)
def test_other_names_are_not_native(name: str) -> None:
    assert parse_name(name) is None


def _legacy_dump(
    rank: int, uids: dict[int, list[int]], entries: list[tuple[int, int, str]]
) -> bytes:
    # Format 1.4 (torch 2.3): no process_group tuple, seq_id, pg_config {pg_id: [ranks]}.
    raw = [
        {
            "record_id": i,
            "pg_id": uid,
            "seq_id": seq,
            "op_id": i,
            "profiling_name": name,
            "time_created_ns": 1_700_000_000_000_000_000 + i,
            "input_sizes": [[4]],
            "output_sizes": [[4]],
            "state": "completed",
            "time_discovered_started_ns": None,
            "time_discovered_completed_ns": 1_700_000_000_000_000_500 + i,
            "retired": True,
            "frames": [],
        }
        for i, (uid, seq, name) in enumerate(entries)
    ]
    return pickle.dumps({"version": "1.4", "entries": raw, "pg_config": uids}, protocol=2)


def test_format_1x_groups_are_named_by_members(tmp_path: Path) -> None:
    # Rank 1 is in [0,1] (its pg_id 1); rank 2 is not, so its pg_id 1 is [2,3].
    (tmp_path / "nccl_trace_rank_1").write_bytes(
        _legacy_dump(
            1,
            {0: [0, 1, 2, 3], 1: [0, 1]},
            [(0, 1, "nccl:all_reduce"), (1, 1, "nccl:all_gather"), (0, 2, "nccl:all_reduce")],
        )
    )
    (tmp_path / "nccl_trace_rank_2").write_bytes(
        _legacy_dump(
            2, {0: [0, 1, 2, 3], 1: [2, 3]}, [(0, 1, "nccl:all_reduce"), (1, 1, "nccl:broadcast")]
        )
    )
    dumps = read_native(tmp_path)
    assert isinstance(dumps, list)
    by_rank = {d.header.rank: d for d in dumps}
    g1 = {g.name: (list(members_of(g)), g.desc, g.members_known) for g in by_rank[1].groups}
    assert g1 == {"[0,1,2,3]": ([0, 1, 2, 3], "default_pg", True), "[0,1]": ([0, 1], "", True)}
    g2 = {g.name for g in by_rank[2].groups}
    assert g2 == {"[0,1,2,3]", "[2,3]"}
    e = by_rank[1].entries
    assert [by_rank[1].groups[i].name for i in e.group] == ["[0,1,2,3]", "[0,1]", "[0,1,2,3]"]
    assert list(e.seq) == [1, 1, 2] and set(e.state) == {pb.COMPLETED}
    assert by_rank[1].header.world_size == 4 and by_rank[1].header.backend == "nccl"


def test_folder_cache_follows_changes(tmp_path: Path) -> None:
    import shutil

    for f in (SAMPLES / "subgroup_hang").glob("nccl_trace_rank_*"):
        shutil.copy(f, tmp_path / f.name)
    first = read_native(tmp_path / "nccl_trace_rank_3")
    assert not isinstance(first, list)
    assert {g.name: list(members_of(g)) for g in first.groups}["2"] == [2, 3]
    (tmp_path / "nccl_trace_rank_2").unlink()
    again = read_native(tmp_path / "nccl_trace_rank_3")
    assert not isinstance(again, list)
    # Without rank 2's dump nothing shows that rank 2 belongs to group "2".
    assert {g.name: list(members_of(g)) for g in again.groups}["2"] == [3]


def _nccl_job(tmp_path: Path, shared: bool) -> Path:
    """A 2-rank NCCL-style job whose dumps list their groups (so each converts alone)."""
    frames = [{"filename": "train.py", "name": "step", "line": 7}]
    sizes, dtypes = [[2, 3]], ["BFloat16"]
    for rank in range(2):
        entries = []
        for i in range(1, 100):  # more than the 64 entries sampled to guess the sharing
            entry = _nccl_entry(
                i,
                "nccl:all_reduce" if i % 3 else "nccl:broadcast",
                process_group=("0", "default_pg"),
                collective_seq_id=i,
                p2p_seq_id=0,
                is_p2p=False,
                # Shared lists (as the pickle memo keeps them) or a fresh copy per entry.
                frames=frames if shared else [dict(f) for f in frames],
                input_sizes=sizes if shared else [list(s) for s in sizes],
                input_dtypes=dtypes if shared else list(dtypes),
            )
            entries.append(entry)
        dump = {
            "version": "2.10",
            "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
            "entries": entries,
        }
        (tmp_path / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(dump, protocol=2))
    return tmp_path


def test_shared_and_private_lists_convert_alike(tmp_path: Path) -> None:
    # Entries are validated once per distinct object; sharing must not change the result.
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = read_native(_nccl_job(tmp_path / "a", shared=True) / "nccl_trace_rank_1")
    b = read_native(_nccl_job(tmp_path / "b", shared=False) / "nccl_trace_rank_1")
    assert isinstance(a, pb.Dump) and isinstance(b, pb.Dump)
    for d in (a, b):
        e = d.entries
        stacks = {tuple(d.frames[f].line for f in d.stacks[s].frames) for s in e.stack}
        assert stacks == {(7,)}
        assert [d.strings[d.tensor_specs[i].dtype[0]] for i in e.inputs] == ["bfloat16"] * 99
        assert [d.strings[o] for o in e.op] == ["all_reduce", "all_reduce", "broadcast"] * 33
    a.header.wall_time_ns = a.header.mono_time_ns = 0
    b.header.wall_time_ns = b.header.mono_time_ns = 0
    assert a.header == b.header and list(a.entries.seq) == list(b.entries.seq)


def test_a_dump_that_lists_its_groups_converts_without_its_siblings(tmp_path: Path) -> None:
    folder = _nccl_job(tmp_path, shared=True)
    # A damaged sibling that claims other members: it must not even be read.
    (folder / "nccl_trace_rank_0").write_bytes(
        pickle.dumps(
            {
                "version": "2.10",
                "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"}},
                "entries": [],
            },
            protocol=2,
        )
    )
    d = read_native(folder / "nccl_trace_rank_1")
    assert isinstance(d, pb.Dump)
    assert d.header.world_size == 2
    assert [(g.name, list(members_of(g)), g.members_known, g.backend) for g in d.groups] == [
        ("0", [0, 1], True, "nccl")
    ]
    assert "disagree" not in d.header.reason_detail


@pytest.mark.parametrize("scenario", ["hang", "subgroup_hang-json", "op_mismatch"])
def test_the_analyzer_view_holds_what_read_native_converts(scenario: str) -> None:
    from flightrec.analysis.model import RankDump
    from flightrec.readers.native.view import read_native_view

    for path in sorted((SAMPLES / scenario).iterdir()):
        if not sniff(path):
            continue
        via_pb = RankDump(str(path), read_native(path))  # type: ignore[arg-type]
        direct = RankDump(str(path), read_native_view(path))
        assert direct.dump.meta == via_pb.dump.meta
        assert direct.dump.groups == via_pb.dump.groups
        for name, column in via_pb.columns.items():
            assert list(direct.columns[name]) == list(column), name


def test_flightrec_convert_writes_member_grids(tmp_path: Path) -> None:
    # A 1,024-rank world and strided subgroups in pg_config: each written in a few bytes.
    world = 1024
    groups = {
        "0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(world)))},
        "1": {"name": "1", "desc": "dp", "ranks": str(list(range(3, world, 8)))},
        "2": {"name": "2", "desc": "odd", "ranks": "[3, 5, 900]"},
    }
    for rank in (3, 11):
        trace = {"version": "2.10", "pg_config": groups, "entries": []}
        (tmp_path / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(trace))
    result = convert_dir(tmp_path, tmp_path / "out")
    assert not result.errors and len(result.written) == 2
    for path in result.written:
        d = read_dump(path)
        by_name = {g.name: g for g in d.groups}
        world_group, dp = by_name["0"], by_name["1"]
        assert not world_group.ranks and members_of(world_group) == range(world)
        assert not dp.ranks and members_of(dp) == range(3, world, 8)
        if "2" in by_name:  # irregular: its explicit list
            assert list(by_name["2"].ranks) == [3, 5, 900]
        assert path.stat().st_size < 2000
