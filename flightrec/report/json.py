"""The machine-readable report: one JSON object, schema ``flightrec.report/1`` (docs/report-schema.json)."""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TextIO

from flightrec.text import compress

if TYPE_CHECKING:  # the renderer only reads the report; no import cycle at run time
    from flightrec.analysis import Report
    from flightrec.analysis.model import Finding

SCHEMA = "flightrec.report/1"


def to_json(value: object) -> Any:
    """A value of the analysis model as JSON-ready data.

    A dataclass becomes an object of its fields in order; a field with a default is left out
    while it holds its default (an optional fact that does not apply), and a field whose
    metadata says ``json: False`` is never written. Mapping keys become strings, tuples lists,
    enums their values.

    Args:
        value: evidence, or anything inside it.

    Returns:
        Plain dicts, lists and scalars.
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            if f.metadata.get("json", True) is False:
                continue
            v = getattr(value, f.name)
            if f.default is not dataclasses.MISSING and v == f.default:
                continue
            out[f.name] = to_json(v)
        return out
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [to_json(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    return value


def finding_to_dict(f: Finding) -> dict[str, Any]:
    """One finding as the JSON contract spells it; ``evidence`` and ``consequences`` extra."""
    out: dict[str, Any] = {
        "kind": f.kind.value,
        "ranks": list(f.ranks),
        "process_group": f.process_group,
        "pg_ranks": list(f.pg_ranks),
        "seq": f.seq,
        "op": f.op,
        "summary": f.summary,
    }
    if f.field is not None:
        out["field"] = f.field
    if f.evidence is not None:
        # The numbers a reader acts on, next to the verdict; the rest stays in ``evidence``.
        for key in f.evidence.HEADLINE:
            out[key] = to_json(getattr(f.evidence, key))
    if f.consequences:
        out["consequences"] = [
            {
                "process_group": c.process_group,
                "pg_ranks": list(c.pg_ranks),
                "seq": c.seq,
                "op": c.op,
                "waiting_ranks": list(c.waiting),
                "waited_s": round(c.waited_s, 3),
                **({"sender": c.p2p[0], "receiver": c.p2p[1]} if c.p2p else {}),
                # Of waiting_ranks, those whose process has ended since (they wait no more).
                **({"ended_ranks": list(c.ended)} if c.ended else {}),
            }
            for c in f.consequences
        ]
    if f.explains:
        # Findings this one explains, folded into it rather than blaming the ranks it held up.
        out["explains"] = to_json(f.explains)
    if f.advice is not None:
        # What to do next (restart, or fix the code) and how sure.
        out["recommendation"] = to_json(f.advice)
    evidence: dict[str, Any] = to_json(f.evidence) if f.evidence is not None else {}
    if f.call_shift is not None:
        evidence["call_shift"] = to_json(f.call_shift)
    if f.exception is not None:
        evidence["exception"] = to_json(f.exception)
    if f.thread_exceptions:
        evidence["thread_exceptions"] = to_json(f.thread_exceptions)
    if f.below_timeout is not None:
        evidence.update(to_json(f.below_timeout))
    if evidence:
        out["evidence"] = evidence
    return out


# In the compact report, rank lists longer than this are spelled as ranges ("0-131071 except 517").
COMPACT_LIST = 16


def _compact(value: Any) -> Any:
    """``value`` with every list of more than ``COMPACT_LIST`` ranks as a string of ranges."""
    if isinstance(value, dict):
        return {k: _compact(v) for k, v in value.items()}
    if isinstance(value, list):
        if len(value) > COMPACT_LIST and all(type(v) is int for v in value):
            return compress(value)
        return [_compact(v) for v in value]
    return value


def rank_evidence(report: Report, rank: int) -> dict[str, Any]:
    """What the report knows about one rank: its dump and where it was at dump time."""
    d = report.run.dumps.get(rank)
    state = report.states.get(rank)
    out: dict[str, Any] = {"rank": rank, "dump": d.path if d is not None else None}
    if d is not None:
        out["process"] = d.describe_process()
    if state is not None:
        out["state"] = to_json(state)
        out["where"] = state.describe()
    out["blamed_by"] = [i for i, f in enumerate(report.findings) if rank in f.ranks]
    return out


def compact_report_to_dict(report: Report, ranks: tuple[int, ...] = ()) -> dict[str, Any]:
    """The report for jobs too large to list every rank (``--json --compact``).

    The same keys as ``report_to_dict``, except: rank lists of more than ``COMPACT_LIST``
    ranks (``ranks_with_dump``, ``missing_ranks``, ``pg_ranks``, ``waiting_ranks``, ...) are
    strings of ranges as ``flightrec.text.compress`` spells them, ``dumps`` (a path per
    rank) is left out, a finding lists its first ``COMPACT_LIST`` consequences (and says
    how many there are in ``consequence_count``), and ``rank_evidence`` holds the dump, process and state of each rank
    asked for in ``ranks`` (and of every rank a finding blames).
    """
    out: dict[str, Any] = _compact(report_to_dict(report, dumps=False))
    out["dump_count"] = len(report.run.dumps)
    for finding in out["findings"]:
        waits = finding.get("consequences", [])
        if len(waits) > COMPACT_LIST:
            finding["consequences"] = waits[:COMPACT_LIST]
            finding["consequence_count"] = len(waits)
    wanted = sorted({*ranks, *(r for f in report.findings for r in f.ranks)})
    out["rank_evidence"] = [rank_evidence(report, r) for r in wanted]
    return out


def report_to_dict(report: Report, dumps: bool = True) -> dict[str, Any]:
    """The whole report as a JSON-ready dict (``dumps``: with the path of every rank's dump)."""
    run = report.run
    out = {
        "schema": SCHEMA,
        "world_size": report.world_size,
        "ranks_with_dump": list(report.ranks_with_dump),
        "missing_ranks": list(run.missing_ranks),
        "findings": [finding_to_dict(f) for f in report.findings],
        "dumps": {str(r): d.path for r, d in sorted(run.dumps.items())} if dumps else None,
        "problems": [{"path": p.path, "reason": p.reason} for p in run.problems],
        "notes": list(report.notes),
    }
    if not dumps:
        del out["dumps"]
    return out


class JsonRenderer:
    """Renders a report as one JSON object (a single line unless ``indent`` is given).

    Args:
        out: where to write.
        indent: pretty-print with this indent.
        compact: the compact form (``compact_report_to_dict``), for the largest jobs.
        ranks: with ``compact``, ranks whose own evidence to add.
    """

    def __init__(
        self,
        out: TextIO,
        indent: int | None = None,
        compact: bool = False,
        ranks: tuple[int, ...] = (),
    ) -> None:
        self.out = out
        self.indent = indent
        self.compact = compact
        self.ranks = ranks

    def render(self, report: Report) -> None:
        """Write the JSON text, newline-terminated."""
        data = (
            compact_report_to_dict(report, self.ranks) if self.compact else report_to_dict(report)
        )
        # One string, then one write: json.dump would encode piece by piece in Python.
        self.out.write(json.dumps(data, indent=self.indent, default=str) + "\n")
