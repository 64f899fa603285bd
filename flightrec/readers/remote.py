"""Dumps in object storage: ``flightrec analyze s3://bucket/prefix`` downloads, then reads.

The objects under a URL are listed with fsspec, downloaded (a bounded number at a time) into a
temporary folder that mirrors their keys, and read from there by the same readers as any
local folder, with the same safety: nothing from a file is executed (native pickles go
through the restricted reader), and no object larger than ``MAX_DUMP_BYTES`` is downloaded.
An object that cannot be fetched is one ``(url, reason)`` line; the rest are still analysed.

fsspec and the protocol's package (s3fs for ``s3://``, gcsfs for ``gs://``) are optional
(``pip install 'torch-flightrec[s3]'``); without them a URL is a usage error saying so.
Credentials and endpoints come from the protocol's usual settings (for S3: the AWS
environment variables and files, ``AWS_ENDPOINT_URL`` for another endpoint).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from flightrec.errors import NoDumpsError, UsageError
from flightrec.format.location import is_url
from flightrec.format.schema import MAX_DUMP_BYTES
from flightrec.readers import looks_like_dump

__all__ = ["Downloaded", "download", "is_url"]

DOWNLOADS = 16
"""Objects downloaded at a time: enough to hide a store's per-request latency, few enough
not to flood one endpoint (a 16,384-rank job's dumps still arrive in a few minutes)."""
MAX_OBJECTS = 1 << 20
"""Objects listed under one URL at most: far beyond the largest job's dump files."""
FREE_MARGIN_BYTES = 256 * 1024 * 1024
"""Room the temporary folder keeps free after the download (the analysis writes nothing
there, but the disk is shared)."""
CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class Downloaded:
    """What a download gave: the local folder, what could not be fetched, how to name files.

    Attributes:
        url: the URL the folder stands for (no trailing slash).
        folder: the temporary folder holding the objects under their keys' relative paths.
        target: what to analyse: ``folder``, or the one file when the URL named an object.
        problems: ``(object url, reason)`` for each object that could not be fetched.
        skipped: objects left alone silently (too large and not named like a dump, hidden,
            or with a key that would escape the folder).
    """

    url: str
    folder: Path
    target: Path
    problems: tuple[tuple[str, str], ...]
    skipped: int

    def url_of(self, local: str) -> str:
        """The object URL a downloaded file came from (``local`` unchanged if not ours)."""
        try:
            rel = Path(local).relative_to(self.folder).as_posix()
        except ValueError:
            return local
        return self.url if rel == "." else f"{self.url}/{rel}"


def _filesystem(url: str) -> tuple[Any, str]:
    try:
        from fsspec.core import url_to_fs
    except ImportError:
        raise UsageError(
            f"{url}: reading dumps from a URL needs fsspec and the protocol's package "
            "(pip install 'torch-flightrec[s3]' for s3://)"
        ) from None
    try:
        fs, root = url_to_fs(url)
    except (ImportError, ValueError) as exc:  # an unknown protocol, or its package missing
        raise UsageError(f"{url}: {_one_line(exc)}") from None
    return fs, str(root).rstrip("/")


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, PermissionError) and "denied" not in text.lower():
        text = f"permission denied ({text})"
    return text[:300]


def _relative(key: str, root: str) -> str | None:
    """``key`` below ``root`` as a safe relative path; None for one that could escape the
    download folder (``..``, an absolute part) or is hidden (a temporary of a writer)."""
    if key == root:
        return PurePosixPath(key).name or None
    if not key.startswith(root + "/"):
        return None
    parts = key[len(root) + 1 :].split("/")  # as stored: "a/./x" and "a//x" are refused too
    if not parts or any(p in ("", ".", "..") or p.startswith(".") or "\\" in p for p in parts):
        return None
    return "/".join(parts)


def _list(fs: Any, url: str, root: str) -> dict[str, int]:
    """Every object under ``root`` with its size (one object when ``url`` names one)."""
    try:
        # The listing first: a missing bucket fails it at once (s3fs's isfile takes seconds).
        found = fs.find(root, detail=True)
        if (not found or list(found) == [root]) and fs.isfile(root):
            return {root: int(fs.size(root) or 0)}
    except Exception as exc:
        raise UsageError(f"{url}: cannot list: {_one_line(exc)}") from None
    objects: dict[str, int] = {}
    for key, info in found.items():
        if info.get("type", "file") != "file":
            continue
        objects[str(key)] = int(info.get("size") or 0)
        if len(objects) > MAX_OBJECTS:
            raise UsageError(f"{url}: more than {MAX_OBJECTS:,} objects; name a narrower prefix")
    return objects


def _fetch(fs: Any, key: str, dest: Path, limit: int) -> str | None:
    """Copy one object to ``dest``, never more than ``limit`` bytes; the problem, or None."""
    got = 0
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        with fs.open(key, "rb") as src, open(dest, "wb") as out:
            while True:
                # The listing's size is not trusted: an object may have grown since.
                chunk = src.read(min(CHUNK, limit + 1 - got))
                if not chunk:
                    break
                got += len(chunk)
                if got > limit:
                    raise _TooLarge()
                out.write(chunk)
    except _TooLarge:
        dest.unlink(missing_ok=True)
        return f"larger than {limit:,} bytes; not downloaded"
    except Exception as exc:
        dest.unlink(missing_ok=True)
        return f"cannot download: {_one_line(exc)}"
    return None


class _TooLarge(Exception):
    pass


@contextlib.contextmanager
def download(
    url: str, *, parallel: int = DOWNLOADS, limit: int = MAX_DUMP_BYTES
) -> Iterator[Downloaded]:
    """Download every object under ``url`` into a temporary folder, removed afterwards.

    Args:
        url: ``s3://bucket/prefix`` (any fsspec URL): a "folder" (searched recursively, as a
            local folder is) or one object.
        parallel: objects downloaded at a time.
        limit: the largest object downloaded, in bytes; a larger one named like a dump is a
            problem, any other is skipped silently (a checkpoint beside the dumps).

    Yields:
        The download: ``folder`` to read, ``problems`` to report, ``url_of`` for names.

    Raises:
        UsageError: fsspec or the protocol's package is missing, or the URL cannot be listed
            (no such bucket, no permission, endpoint down): one line saying so.
        NoDumpsError: nothing is stored under the URL.
    """
    url = url.strip().rstrip("/")
    fs, root = _filesystem(url)
    objects = _list(fs, url, root)
    if not objects:
        raise NoDumpsError(f"{url}: no objects there")
    base = root if not (len(objects) == 1 and root in objects) else str(PurePosixPath(root).parent)
    wanted: list[tuple[str, str]] = []
    problems: list[tuple[str, str]] = []
    skipped = 0
    total = 0
    for key, size in sorted(objects.items()):
        rel = _relative(key, base)
        if rel is None:
            skipped += 1
            continue
        if size > limit:
            if looks_like_dump(Path(rel)):
                problems.append((f"{url}/{rel}", f"larger than {limit:,} bytes; not downloaded"))
            else:
                skipped += 1
            continue
        wanted.append((key, rel))
        total += size
    folder = Path(tempfile.mkdtemp(prefix="flightrec-remote-"))
    try:
        free = shutil.disk_usage(folder).free
        if total + FREE_MARGIN_BYTES > free:
            raise UsageError(
                f"{url}: {total:,} bytes to download, but only {free:,} free in {folder.parent} "
                "(set TMPDIR to a larger disk)"
            )

        def one(item: tuple[str, str]) -> tuple[str, str | None]:
            key, rel = item
            return rel, _fetch(fs, key, folder / rel, limit)

        with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(wanted) or 1))) as pool:
            for rel, problem in pool.map(one, wanted):
                if problem is not None:
                    problems.append((f"{url}/{rel}", problem))
        if base == root:
            yield Downloaded(url, folder, folder, tuple(problems), skipped)
        else:  # one object: analysed as a single local file would be
            name = PurePosixPath(root).name
            yield Downloaded(url.rsplit("/", 1)[0], folder, folder / name, tuple(problems), skipped)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
