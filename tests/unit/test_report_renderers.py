"""Every renderer follows one interface (``flightrec.report.renderer.Renderer``): made with
where to write, ``render(subject)`` writes there and returns nothing."""

from __future__ import annotations

import io
import json

from rich.console import Console

from flightrec.analysis import RankDump, Report, analyze
from flightrec.report.dump import DumpRenderer
from flightrec.report.html import HtmlRenderer
from flightrec.report.json import JsonRenderer
from flightrec.report.renderer import Renderer, rendered
from flightrec.report.terminal import TerminalRenderer
from flightrec.report.trace import TraceRenderer
from tests.unit.factories import Job, healthy


def _stalled() -> Report:
    job = healthy(Job())
    job.collective(ranks=[0, 1, 3], complete=False)
    job.stall(2)
    return analyze(job.run())


def test_every_report_renderer_writes_to_what_it_was_made_with() -> None:
    report = _stalled()
    for make in (
        JsonRenderer,
        HtmlRenderer,
        TraceRenderer,
        lambda out: TerminalRenderer(Console(file=out, width=100)),
    ):
        out = io.StringIO()
        renderer: Renderer[Report] = make(out)
        assert renderer.render(report) is None  # type: ignore[func-returns-value]
        assert out.getvalue().strip(), make


def test_the_dump_renderer_writes_to_its_console() -> None:
    job = healthy(Job())
    out = io.StringIO()
    renderer: Renderer[RankDump] = DumpRenderer(Console(file=out, width=100))
    assert renderer.render(job.run().dumps[0]) is None  # type: ignore[func-returns-value]
    assert "Process groups" in out.getvalue()


def test_rendered_gives_the_text_a_stream_renderer_writes() -> None:
    report = _stalled()
    out = io.StringIO()
    JsonRenderer(out, indent=2).render(report)
    assert rendered(JsonRenderer, report, indent=2) == out.getvalue()
    assert json.loads(out.getvalue())["findings"][0]["ranks"] == [2]
