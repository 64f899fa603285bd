"""The C hot path writes the ring slot that flightrec.format.slot defines, byte for byte."""

from __future__ import annotations

import re
import struct

import pytest

from flightrec.format import slot
from flightrec.format.builder import IS_P2P

_fast = pytest.importorskip(
    "flightrec.recorder.hotpath._fast",
    reason="C hot path not built (tests/conftest.py builds it)",
)


def offsets() -> dict[str, int]:
    """Byte offset of every field of ``slot.SLOT``, in ``Slot`` order, then the repeated id."""
    codes = re.findall(r"\d*[a-zA-Z]", slot.SLOT.format.lstrip("<"))
    fields = [*slot.Slot._fields, "record_id_again"]
    out: dict[str, int] = {}
    at = 0
    for code in codes:
        if code.endswith("x"):
            at += int(code[:-1] or 1)
            continue
        out[fields[len(out)]] = at
        at += struct.calcsize("<" + code)
    assert at == slot.SLOT_SIZE and len(out) == len(fields)
    return out


def test_the_c_layout_is_the_slot_module_layout() -> None:
    layout = dict(_fast.LAYOUT)
    assert _fast.SLOT_SIZE == slot.SLOT_SIZE
    assert (layout.pop("ENQUEUED"), layout.pop("COMPLETED")) == (slot.ENQUEUED, slot.COMPLETED)
    assert layout.pop("IS_P2P") == IS_P2P
    assert layout == offsets()
    assert (layout["complete_ns"], layout["state"]) == (slot.OFF_COMPLETE, slot.OFF_STATE)
