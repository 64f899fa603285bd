"""The C reader of progress records (``flightrec.format._progress``) gives exactly what the
Python path gives (protobuf's parser, ``_problem``, ``record_of``): the same records and the
same refusal texts, on the records of a simulated job and on damaged and hostile bytes."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flightrec.format import flightrec_pb2 as pb
from flightrec.format import progress as progress_module
from flightrec.format.progress import (
    MAX_BYTES,
    Decoded,
    ProgressRecord,
    _by_group_py,
    _read_py,
    by_group,
    decode_many,
    encode_progress,
    progress,
)
from flightrec.simulate.faults import Fault
from flightrec.simulate.job import SimConfig, build_rank_dump, plan
from flightrec.simulate.layout import parse_layout

C = progress_module._progress
WORLD = 512
pytestmark = pytest.mark.skipif(C is None, reason="flightrec.format._progress is not built")


@pytest.fixture(scope="module")
def records() -> list[bytes]:
    """Every rank's record of a simulated 512-rank P2P deadlock (tp=8, pp=4)."""
    sim = plan(SimConfig(parse_layout("tp=8,pp=4", WORLD), entries=64,
                         fault=Fault.P2P_DEADLOCK, fault_rank=300))  # fmt: skip
    return [encode_progress(progress(build_rank_dump(sim, rank), 4)) for rank in range(WORLD)]


def same(data: bytes, rank: int, world: int = WORLD) -> ProgressRecord | str:
    c = C.decode(data, rank, world)
    python = _read_py(data, rank, world)
    assert c == python, (data.hex(), rank, c, python)
    assert type(c) is type(python)
    return c


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append(n & 0x7F | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def field(number: int, wire: int, body: bytes = b"") -> bytes:
    return varint(number << 3 | wire) + body


def test_the_records_of_a_job_read_alike(records: list[bytes]) -> None:
    for rank, data in enumerate(records):
        got = same(data, rank)
        assert isinstance(got, ProgressRecord) and got.rank == rank
    assert any(isinstance(same(d, r).wait_op, str) and same(d, r).wait_group
               for r, d in enumerate(records))  # fmt: skip
    # Another rank's record, another world: refused alike.
    assert same(records[3], 4) == "says it is rank 3"
    assert same(records[3], 3, 64) == f"says the world has {WORLD} ranks, not 64"


def test_damaged_records_are_refused_alike(records: list[bytes]) -> None:
    pick = random.Random(50)
    refused = accepted = 0
    for _ in range(20_000):
        rank = pick.randrange(WORLD)
        data = bytearray(records[rank])
        how = pick.randrange(6)
        if how == 0:  # a few bytes replaced
            for _ in range(pick.randrange(1, 4)):
                data[pick.randrange(len(data))] = pick.randrange(256)
        elif how == 1:  # one bit flipped
            data[pick.randrange(len(data))] ^= 1 << pick.randrange(8)
        elif how == 2:  # cut
            data = data[: pick.randrange(len(data))]
        elif how == 3:  # bytes inserted
            at = pick.randrange(len(data) + 1)
            data[at:at] = bytes(pick.randrange(256) for _ in range(pick.randrange(1, 8)))
        elif how == 4:  # tags of groups, packed fields and fixed widths appended
            tags = [0x7B, 0x7C, 0x83, 0x84, 0x01, 0x0B, 0x0C, 0x35, 0x31, 0x72, 0x32, 0x3A]
            data += bytes([pick.choice(tags)]) * pick.randrange(1, 5)
        else:  # noise
            data = bytearray(pick.randrange(256) for _ in range(pick.randrange(40)))
        got = same(bytes(data), rank)
        refused += isinstance(got, str)
        accepted += not isinstance(got, str)
    assert refused > 1000 and accepted > 1000  # (both sides of every check were reached)


@pytest.mark.parametrize(
    "data",
    [
        field(15, 3) + field(15, 4),  # an unknown group
        field(15, 3) * 100 + field(15, 4) * 100,  # nested as deep as protobuf allows
        field(15, 3) * 101 + field(15, 4) * 101,  # one deeper
        field(15, 3) + field(16, 4),  # closed by another number
        field(15, 4),  # an end of group where none is open
        field(1, 3) + field(1, 4),  # a known field as a group
        b"\x00\x01",  # field number 0
        b"\x0e",  # wire types 6 and 7
        b"\x0f",
        b"\x88\x80\x80\x80\x00\x05",  # a five-byte tag
        b"\x88\x80\x80\x80\x80\x00\x05",  # a six-byte one
        b"\xf8\xff\xff\xff\x1f\x05",  # a tag beyond 32 bits
        field(1, 0, b"\xff" * 9 + b"\x7f"),  # a varint of ten bytes, bits beyond 64
        field(1, 0, b"\x80" * 10 + b"\x01"),  # of eleven
        field(2, 0, b"\xff" * 9 + b"\x01"),  # a uint32 cut to its low 32 bits
        field(11, 0, b"\xfd\xff\xff\xff\xff\xff\x01"),  # a sint32 from a long varint
        field(5, 2, b"\x80" * 9 + b"\x02"),  # a length that wraps to 0
        field(1, 2, b"\x01\x05"),  # a known scalar, length-delimited: unknown
        field(5, 0, b"\x05"),  # a string as a varint: unknown
        field(6, 1, b"\x00" * 8) + field(14, 5, b"\x00" * 4),  # fixed widths: unknown
        field(6, 5, b"\x00" * 3),  # cut
        field(14, 2, b"\x03\x01\x02\x03") + field(14, 0, b"\x04"),  # packed and not
        field(14, 2, b"\x06\xff\xff\xff\xff\xff\x01"),  # a packed uint32 beyond 32 bits
        field(6, 2, b"\x01\x80\x01"),  # a packed varint running past its field
        field(6, 2, b"\x00"),  # an empty packed field
        field(9, 2, b"\x01\xff"),  # not UTF-8
        field(9, 2, b"\x03\xed\xa0\x80"),  # a surrogate
        field(9, 2, b"\x02\xc0\x80"),  # an overlong form
        field(9, 2, b"\x04\xf4\x90\x80\x80"),  # beyond U+10FFFF
        field(9, 2, b"\x01\x00"),  # a control character (kept)
        field(9, 2, b"\x01a") + field(9, 2, b"\x01b") + field(1, 0, b"\x01") + field(1, 0, b"\x02"),
        field(99, 2, b"\x02\xff\xfe"),  # unknown bytes need not be UTF-8
    ],
)
def test_the_wire_format_is_read_as_protobuf_reads_it(data: bytes) -> None:
    head = pb.Progress(rank=5, world_size=8, wait_peer=-1).SerializeToString()
    same(data, 5, 8)
    same(head + data, 5, 8)
    same(data + head, 5, 8)


def test_the_checks_and_their_texts_are_the_same() -> None:
    def msg(**fields: object) -> bytes:
        base: dict[str, object] = {"rank": 5, "world_size": 8, "wait_peer": -1}
        return pb.Progress(**{**base, **fields}).SerializeToString()  # type: ignore[arg-type]

    cols = {"group": ["a"], "issued": [1], "pending": [0], "size": [4]}
    cases = {
        msg(rank=6): "says it is rank 6",
        msg(world_size=9): "says the world has 9 ranks, not 8",
        msg(group=["a"]): "its group columns disagree",
        msg(**{**cols, "size": []}): "its group columns disagree",
        msg(**cols, wait_group=2): "waits in a group it does not list",
        msg(**cols, wait_peer=8): "waits on a peer outside the world",
        msg(**cols, wait_peer=-2): "waits on a peer outside the world",
        msg(**{**cols, "size": [9]}): "a group larger than the world",
        msg(**cols, wait_op="é" * 161): "a text longer than a progress record keeps",
        msg(**{**cols, "group": ["é" * 65]}): "a text longer than a progress record keeps",
        b"\x0a" * (MAX_BYTES + 1): f"{MAX_BYTES + 1} bytes, more than the {MAX_BYTES} a "
        "progress record may have",
        b"\xff\xff": "not a flightrec progress record (unparseable)",
    }
    for data, why in cases.items():
        assert same(data, 5, 8) == why
    many = {f"g{i}": i for i in range(65)}
    assert same(msg(group=list(many), issued=list(many.values()), pending=[0] * 65,
                    size=[1] * 65), 5, 8) == "its group columns disagree"  # fmt: skip
    assert isinstance(same(msg(**cols, wait_op="é" * 160, wait_group=1, wait_peer=7), 5, 8), tuple)
    assert same(msg(), 5, 1 << 24) == f"says the world has 8 ranks, not {1 << 24}"
    huge = (1 << 24) + 1  # a world beyond MAX_RANK, whatever the record says
    assert same(msg(world_size=huge), 5, huge) == f"says the world has {huge} ranks, not {huge}"


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=80), st.integers(0, 9))
def test_arbitrary_bytes_read_alike(data: bytes, rank: int) -> None:
    same(data, rank, 10)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 20), st.sampled_from([0, 1, 2, 5]), st.binary(max_size=12)),
        max_size=12,
    ),
    st.integers(0, 3),
)
def test_arbitrary_fields_read_alike(fields: list[tuple[int, int, bytes]], rank: int) -> None:
    data = b""
    for number, wire, body in fields:
        if wire == 0:
            data += field(number, 0, varint(int.from_bytes(body[:10] or b"\0", "little")))
        elif wire == 2:
            data += field(number, 2, varint(len(body)) + body)
        else:
            data += field(number, wire, (body + b"\0" * 8)[: 8 if wire == 1 else 4])
    same(data, rank, 4)


def test_a_round_reads_alike_at_once_and_one_by_one(records: list[bytes]) -> None:
    raw = {rank: data for rank, data in enumerate(records)}
    raw[7] = b"\xff"
    raw[9] = records[10]
    at_once: Decoded = {}
    decode_many(raw, WORLD, at_once)
    one_by_one = {rank: (data, _read_py(data, rank, WORLD)) for rank, data in raw.items()}
    assert at_once == one_by_one
    assert at_once[7][1] == "not a flightrec progress record (unparseable)"
    good = {r: p for r, (_, p) in at_once.items() if isinstance(p, ProgressRecord)}
    assert by_group(good) == _by_group_py(good) and len(good) == WORLD - 2
