"""Renderers over an analysis ``Report``: ``terminal`` (rich), ``json`` and ``trace`` (a timeline).

Each reads the report alone and recomputes nothing; ``dump`` shows one dump file.
"""
