"""Renderers over an analysis ``Report``: ``terminal`` (rich) and ``json``.

Kept import-light: ``ranges`` is used by the analysis passes for their summaries.
"""
