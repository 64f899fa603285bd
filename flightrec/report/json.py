"""The machine-readable report: one JSON object, schema ``flightrec.report/1`` (DESIGN.md)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from flightrec.analysis.model import FindingKind

if TYPE_CHECKING:  # the renderer only reads the report; no import cycle at run time
    from flightrec.analysis import Report
    from flightrec.analysis.model import Finding

SCHEMA = "flightrec.report/1"
# Straggler evidence also given at the top level of its finding.
STRAGGLER_FIELDS = (
    "last_share",
    "median_lateness_ms",
    "p90_lateness_ms",
    "others_waited_s",
    "job_delay_s",
    "confidence",
)


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
    if f.kind is FindingKind.STRAGGLER:
        # The numbers a reader acts on, next to the verdict; the rest stays in ``evidence``.
        for key in STRAGGLER_FIELDS:
            if key in f.evidence:
                out[key] = f.evidence[key]
    if f.consequences:
        out["consequences"] = [
            {
                "process_group": c.process_group,
                "pg_ranks": list(c.pg_ranks),
                "seq": c.seq,
                "op": c.op,
                "waiting_ranks": list(c.waiting),
                "waited_s": round(c.waited_s, 3),
            }
            for c in f.consequences
        ]
    if f.evidence:
        out["evidence"] = dict(f.evidence)
    return out


def report_to_dict(report: Report) -> dict[str, Any]:
    """The whole report as a JSON-ready dict."""
    run = report.run
    return {
        "schema": SCHEMA,
        "world_size": report.world_size,
        "ranks_with_dump": list(report.ranks_with_dump),
        "missing_ranks": list(run.missing_ranks),
        "findings": [finding_to_dict(f) for f in report.findings],
        "dumps": {str(r): d.path for r, d in sorted(run.dumps.items())},
        "problems": [{"path": p.path, "reason": p.reason} for p in run.problems],
        "notes": list(run.notes),
    }


class JsonRenderer:
    """Renders a report as one JSON object (a single line unless ``indent`` is given)."""

    def __init__(self, indent: int | None = None) -> None:
        self.indent = indent

    def render(self, report: Report) -> str:
        """The JSON text, newline-terminated."""
        return json.dumps(report_to_dict(report), indent=self.indent, default=str) + "\n"
