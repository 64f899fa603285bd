"""The per-rank index agrees with a plain reading of the ring, entry by entry.

``index_rank`` selects and fingerprints with C-level tricks (byte translation, 64-bit keys
built from one-byte columns, with a tuple fallback for wider columns); this checks both paths
against records materialised one by one.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from flightrec.analysis.loading.loader import AnalysisOptions, load_dir
from flightrec.analysis.loading.rankindex import RankIndex, index_rank
from flightrec.analysis.matching.matching import _progress, match
from flightrec.analysis.matching.signature import signature
from flightrec.analysis.model import RankDump
from flightrec.format import flightrec_pb2 as pb
from flightrec.format.read import read_dump
from flightrec.format.wire import read_compact
from flightrec.simulate import Fault, SimConfig, parse_layout, simulate


def fast_read(data: bytes, path: str) -> RankDump | None:
    """``format.wire``'s view as the loader wraps it (None where the wire reader declines)."""
    view = read_compact(data, path)
    return None if view is None else RankDump(path, view)


def _check(d: RankDump) -> None:
    ri = index_rank(d)
    e = d.dump.entries
    for local, gi in enumerate(ri.groups):
        mine = [i for i in range(len(d)) if e.group[i] == local]
        collectives = [i for i in mine if not e.flags[i] & pb.IS_P2P]
        assert list(gi.positions) == collectives
        assert list(gi.seqs) == [e.seq[i] for i in collectives]
        if any(e.flags[i] & pb.IS_P2P for i in range(len(d))):
            assert list(gi.p2p_positions) == [i for i in mine if e.flags[i] & pb.IS_P2P]
        assert gi.signature_ids is not None
        assert [ri.signatures[s] for s in gi.signature_ids] == [
            signature(d.record(i)) for i in collectives
        ]
    states = list(e.state)
    assert list(ri.incomplete) == [i for i, s in enumerate(states) if s != pb.COMPLETED]


@pytest.mark.parametrize(
    ("ranks", "fault"),
    [(64, Fault.DTYPE_MISMATCH), (512, Fault.P2P_DEADLOCK)],
    ids=["one-byte-peers", "wide-peers"],
)
def test_index_matches_the_records(tmp_path: Path, ranks: int, fault: Fault) -> None:
    simulate(SimConfig(parse_layout("tp=8,pp=4", ranks), 200, fault, 17), tmp_path)
    files = sorted(p for p in tmp_path.iterdir() if p.suffix == ".frdump")
    codes = set()
    for path in files[:: max(1, len(files) // 12)]:
        fast = fast_read(path.read_bytes(), str(path))
        assert fast is not None
        codes.add(fast.columns["peer"].typecode)
        _check(fast)
        _check(RankDump(str(path), read_dump(path)))
    # the two parametrisations exercise the two ways of keying raw signatures
    assert codes == {"b"} if ranks == 64 else "h" in codes


def test_ranks_with_equal_rings_share_one_index_and_each_is_still_right(tmp_path: Path) -> None:
    # Pipeline stages: P2P peers differ from rank to rank where the collectives are alike.
    simulate(SimConfig(parse_layout("tp=4,pp=4", 64), 200, Fault.P2P_DEADLOCK, 5), tmp_path)
    dumps = [fast_read(p.read_bytes(), str(p)) for p in sorted(tmp_path.glob("*.frdump"))]
    assert all(
        d is not None and any(d.columns["flags"][i] & pb.IS_P2P for i in range(len(d)))
        for d in dumps
    )
    for d in dumps:
        assert d is not None
        _check(d)  # every rank, shared index or not, against its own records
    shared = {id(index_rank(d).groups) for d in dumps if d is not None}
    assert len(shared) <= len(dumps) // 2


def test_a_rank_whose_collective_differs_gets_its_own_index(tmp_path: Path) -> None:
    simulate(SimConfig(parse_layout("tp=8,pp=1", 8), 50, Fault.STALL, 3), tmp_path)
    path = sorted(tmp_path.glob("*.frdump"))[1]
    dump = read_dump(path)
    at = next(i for i in range(len(dump.entries.seq)) if not dump.entries.flags[i] & pb.IS_P2P)
    dump.entries.peer[at] += 1  # another root for one collective: a different signature
    same, other = fast_read(path.read_bytes(), "a"), fast_read(dump.SerializeToString(), "b")
    assert same is not None and other is not None
    assert same.dump.tables == other.dump.tables
    _check(same)
    _check(other)
    assert index_rank(same).groups is not index_rank(other).groups


def test_equal_indexes_from_different_processes_are_shared_again(tmp_path: Path) -> None:
    simulate(SimConfig(parse_layout("tp=4,pp=4", 64), 200, Fault.STALL, 9), tmp_path)
    dumps = [fast_read(p.read_bytes(), str(p)) for p in sorted(tmp_path.glob("*.frdump"))]
    # Each pickled on its own, as loader processes and batches hand them over: nothing shared.
    received = [pickle.loads(pickle.dumps(index_rank(d))) for d in dumps if d is not None]
    assert len({id(ri.groups) for ri in received}) == len(dumps)
    seen: dict[bytes, RankIndex] = {}
    interned = [ri.intern(seen) for ri in received]
    assert len({id(ri.groups) for ri in interned}) <= len(dumps) // 2
    for ri, again in zip(received, interned, strict=True):
        assert again.incomplete == ri.incomplete
        assert again.signatures == ri.signatures
        assert [(list(g.seqs), list(g.positions), g.signature_ids) for g in again.groups] == [
            (list(g.seqs), list(g.positions), g.signature_ids) for g in ri.groups
        ]


def test_progress_is_worked_out_once_per_shared_index_and_right_for_every_rank(
    tmp_path: Path,
) -> None:
    # A stalled rank: its group's peers wait in a collective it never entered; all else alike.
    simulate(SimConfig(parse_layout("tp=4,pp=2", 32), 120, Fault.STALL, 4), tmp_path)
    m = match(load_dir(str(tmp_path), AnalysisOptions(workers=1)))
    shared = 0
    objects = set()
    for key, info in m.groups.items():
        for rank, got in info.progress.items():
            d = m.dump(rank)
            local = d.group_keys.index(key)
            gi = index_rank(d).groups[local]
            assert got == _progress(d, local, gi, m.incomplete[rank]), (key, rank)
            shared += 1
            objects.add(id(got))
    assert len(objects) <= shared // 2  # ranks with equal rings share theirs
    states = {info.progress[r].last_completed for info in m.groups.values() for r in info.progress}
    assert len(states) > 1  # and the stalled group's ranks differ from the rest
