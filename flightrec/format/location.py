"""Where dumps live: a local folder, or a URL that fsspec opens (``s3://bucket/prefix``).

Both sides need the same answer for the same string: the recorder (``FLIGHTREC_DIR``, dumps
spooled locally and uploaded) and the readers (``flightrec analyze s3://...``).
"""

from __future__ import annotations

import re

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def url_scheme(location: str) -> str:
    """The protocol of a URL (``s3``, ``gs``, ``memory``...); "" for a local path.

    ``file://`` URLs count as local paths: nothing needs uploading or downloading.
    """
    m = _SCHEME.match(location.strip())
    if m is None or m.group(1).lower() == "file":
        return ""
    return m.group(1).lower()


def is_url(location: str) -> bool:
    """Whether ``location`` names remote storage (a URL of any protocol but ``file``)."""
    return bool(url_scheme(location))


def local_path(location: str) -> str:
    """``location`` as a local path: ``file:///x`` -> ``/x``; anything else unchanged."""
    text = location.strip()
    if text.lower().startswith("file://"):
        return text[len("file://") :]
    return location


def join_url(url: str, relative: str) -> str:
    """``url`` with a relative ``a/b`` path appended (one slash between)."""
    return url.rstrip("/") + "/" + relative.lstrip("/")
