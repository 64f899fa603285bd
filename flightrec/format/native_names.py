"""How PyTorch's native Flight Recorder names things, and what flightrec calls them.

Two producers read native entries: the native-dump reader (``flightrec.readers.native``) and
the recorder's in-process harvest (``flightrec.recorder.native.harvest``). Both turn a
profiling name (``"gloo:allreduce"``, ``"nccl:send 0->1"``) and c10 dtype names into the
torch.distributed spellings the rest of flightrec uses, so a mismatch reads the same for
every source; the tables live here, below both.
"""

from __future__ import annotations

import re

P2P_NAME = re.compile(r"(?P<a>\d{1,9})\s*(?P<arrow>->|<-)\s*(?P<b>\d{1,9})")
SEND_RECV = frozenset({"send", "recv"})

DTYPES = {
    "Float": "float32",
    "Double": "float64",
    "Half": "float16",
    "BFloat16": "bfloat16",
    "Long": "int64",
    "Int": "int32",
    "Short": "int16",
    "Char": "int8",
    "Byte": "uint8",
    "Bool": "bool",
    "ComplexFloat": "complex64",
    "ComplexDouble": "complex128",
    "ComplexHalf": "complex32",
    "Float8_e4m3fn": "float8_e4m3fn",
    "Float8_e5m2": "float8_e5m2",
    "Float8_e4m3fnuz": "float8_e4m3fnuz",
    "Float8_e5m2fnuz": "float8_e5m2fnuz",
    "UInt16": "uint16",
    "UInt32": "uint32",
    "UInt64": "uint64",
}
"""c10 ScalarType names (what the recorder writes) to torch dtype names (what flightrec uses)."""

OPS = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "_allgather_base": "all_gather_into_tensor",
    "_all_gather_base": "all_gather_into_tensor",  # ProcessGroupNCCL's name for it
    "allgather_into_tensor_coalesced": "all_gather_into_tensor_coalesced",
    "_reduce_scatter_base": "reduce_scatter_tensor",
    "reduce_scatter_base": "reduce_scatter_tensor",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all_single",
    "all_to_all_base": "all_to_all_single",
}
"""Backend-internal spellings of collectives to the torch.distributed API names."""

Call = tuple[str, str, int, int]
"""(backend, op, local_src, local_dst) parsed from a profiling name."""


def parse_profiling_name(name: str) -> Call:
    """Backend, flightrec op name and (for P2P) group-local sender and receiver of a name.

    ``"send 0->1"`` names sender then receiver; ``"recv 1<-0"`` names receiver then sender;
    -1 where there is none (``"recv 1<-?"``: a receive from any source; torchcomms' and the
    hook-based recorder's names on some backends carry no peers at all).
    """
    # "<backend>:<op>[ <peers>]": the op and peers hold no colon, a backend's name may (torch
    # writes whatever name a plugin registered: "nccl2", "c10d", "my:plugin").
    head, _, meta = name.strip().partition(" ")
    backend, colon, op = head.rpartition(":")
    if not colon:  # older or third-party writers without the "backend:" prefix
        backend, op = "", head
    op = OPS.get(op, op)
    src = dst = -1
    m = P2P_NAME.search(meta)
    if m and op in SEND_RECV:
        a, b = int(m["a"]), int(m["b"])
        src, dst = (a, b) if m["arrow"] == "->" else (b, a)
    return backend, op, src, dst


def dtype_name(c10_name: str) -> str:
    """torch's name of a c10 ScalarType name ("Float" -> "float32")."""
    return DTYPES.get(c10_name) or c10_name.lower()
