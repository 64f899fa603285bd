"""The one interface every renderer follows: it is made with where to write (a text stream,
or a rich ``Console`` for the renderers drawn with rich), and ``render(subject)`` writes one
rendering of its subject there.

=================  ===========================  ======================================
renderer           subject                      writes
=================  ===========================  ======================================
TerminalRenderer   ``Report``                   the report for people (rich ``Console``)
DumpRenderer       ``RankDump``                 one dump, ``flightrec show`` (``Console``)
JsonRenderer       ``Report``                   one JSON object, ``flightrec.report/1``
HtmlRenderer       ``Report``                   one self-contained HTML page
TraceRenderer      ``Report``                   a Chrome trace / Perfetto timeline
=================  ===========================  ======================================

Writing, not returning text, lets the terminal report go straight to its console (rich
measures the console it draws on) and the live reporter draw the same panel into its log.
``rendered`` gives the text of a stream renderer where a string is wanted (tests, a file
written only once the rendering succeeded).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

Subject = TypeVar("Subject", contravariant=True)
S = TypeVar("S")


class Renderer(Protocol[Subject]):
    """Writes a rendering of its subject to the output it was made with."""

    def render(self, subject: Subject, /) -> None:
        """Write the rendering of ``subject``."""


def rendered(kind: Callable[..., Renderer[S]], subject: S, **options: Any) -> str:
    """The text ``kind(out, **options)`` writes for ``subject``.

    Args:
        kind: a renderer class that writes to a text stream (``JsonRenderer``,
            ``HtmlRenderer``, ``TraceRenderer``).
        subject: what to render.
        options: the renderer's own options (``indent=2``, ``recent=200``).
    """
    out = io.StringIO()
    kind(out, **options).render(subject)
    return out.getvalue()
