"""Type stub of the optional C reader of progress records (``_progress.c``); see that file."""

from collections.abc import Mapping

from flightrec.format.progress import Decoded, ProgressRecord

_Bytes = bytes | bytearray | memoryview

def use(
    record_type: type[ProgressRecord],
    max_bytes: int,
    max_groups: int,
    max_name: int,
    max_text: int,
    max_world: int,
    /,
) -> None: ...
def decode(data: _Bytes, rank: int, world_size: int, /) -> ProgressRecord | str: ...
def decode_into(raw: Mapping[int, bytes], world_size: int, into: Decoded, /) -> None: ...
def by_group(
    records: Mapping[int, ProgressRecord], /
) -> dict[str, tuple[list[int], list[int]]]: ...
