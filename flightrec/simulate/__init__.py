"""``flightrec simulate``: realistic dumps of a large 3D-parallel job with one injected fault.

Used to test the analyzer at scale and to benchmark it; the expected verdict comes from the
injected fault, never from the analyzer.
"""

from __future__ import annotations

from flightrec.simulate.faults import Fault
from flightrec.simulate.job import SimConfig, simulate
from flightrec.simulate.layout import Layout, parse_layout

__all__ = ["Fault", "Layout", "SimConfig", "parse_layout", "simulate"]
