"""Load the dumps stored under a URL: downloaded (``readers.remote``), loaded as a folder, and
named by their object URLs again, so that the report never points into a deleted temporary
folder."""

from __future__ import annotations

import dataclasses

from flightrec.analysis.loading.loader import AnalysisOptions, Run, load_dir
from flightrec.analysis.model import FileProblem
from flightrec.errors import NoDumpsError
from flightrec.readers.remote import Downloaded, download


def load_url(url: str, options: AnalysisOptions | None = None) -> Run:
    """``load_dir`` for a URL (``s3://bucket/prefix``, any fsspec protocol).

    Args:
        url: the prefix (searched recursively, as a folder is) or one object.
        options: as for ``load_dir``.

    Returns:
        The run, its dumps' paths and its problems naming objects by URL; objects that could
        not be downloaded are among the problems.

    Raises:
        UsageError: the URL cannot be listed (no permission, no such bucket, endpoint down,
            fsspec or the protocol's package not installed).
        NoDumpsError: no readable dump under the URL.
    """
    with download(url) as got:
        try:
            run = load_dir(got.target, options)
        except NoDumpsError as exc:
            raise NoDumpsError(_no_dumps(got, str(exc))) from None
        return _by_url(run, got)


def _no_dumps(got: Downloaded, message: str) -> str:
    text = message.replace(str(got.target), got.url_of(str(got.target)), 1)
    if got.problems:
        where, why = got.problems[0]
        text += f"; {len(got.problems)} objects not downloaded, first {where}: {why}"
    return text


def _by_url(run: Run, got: Downloaded) -> Run:
    """The same run with every local path replaced by the URL it was downloaded from."""
    for d in run.dumps.values():
        d.path = got.url_of(d.path)
    for later in run.later.values():
        for d in later:
            d.path = got.url_of(d.path)
    problems = [FileProblem(where, why) for where, why in got.problems]
    problems += [FileProblem(got.url_of(p.path), p.reason) for p in run.problems]
    return dataclasses.replace(run, problems=tuple(problems))
