"""Recorder settings, read once from the environment (docs/design.md "Turning it on").

A bad value never stops the job: it costs one warning on the ``flightrec`` logger and the
default is used instead.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from flightrec.format.location import is_url, local_path

log = logging.getLogger("flightrec")

TRUE_VALUES = ("1", "true", "yes")

DEFAULT_DIR = "./flightrec_dumps"
DEFAULT_UPLOAD_RETRIES = 3
DEFAULT_METRICS_ADDR = "0.0.0.0"
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_BUFFER = 2000
DEFAULT_STACK_DEPTH = 16
DEFAULT_SLOW_CHECK_S = 60.0
"""One slow check a minute: one small store write per rank (docs/slow-ranks.md states the
load), and a slowdown that lasts minutes is named within two minutes."""
MIN_SLOW_CHECK_S = 0.5
# Bounds that keep a typo from allocating gigabytes or walking absurd stacks.
MAX_BUFFER = 1 << 20
MAX_STACK_DEPTH = 256
MAX_UPLOAD_RETRIES = 10


@dataclass(frozen=True, slots=True)
class Config:
    """Everything the recorder reads from the environment."""

    enabled: bool = False
    """FLIGHTREC: trace torch.distributed."""
    directory: str = DEFAULT_DIR
    """FLIGHTREC_DIR: where dump files go (created if missing). When FLIGHTREC_DIR is a URL,
    the local spool (FLIGHTREC_SPOOL) instead: dumps and the black box are written here."""
    timeout_s: float = DEFAULT_TIMEOUT_S
    """FLIGHTREC_TIMEOUT: seconds an operation may stay incomplete before the watchdog fires."""
    buffer: int = DEFAULT_BUFFER
    """FLIGHTREC_BUFFER: ring capacity in entries."""
    stack_depth: int = DEFAULT_STACK_DEPTH
    """FLIGHTREC_STACK_DEPTH: Python frames kept per entry; 0 turns stacks off."""
    dump_on_exit: bool = False
    """FLIGHTREC_DUMP_ON_EXIT: dump at normal exit too."""
    job_id: str = ""
    """FLIGHTREC_JOB_ID or TORCHELASTIC_RUN_ID: the job's name in its dumps; empty when unknown.
    The store namespace is FLIGHTREC_JOB_ID alone (``store_namespace``)."""
    blackbox: bool = True
    """FLIGHTREC_BLACKBOX: keep the ring in a memory-mapped file under FLIGHTREC_DIR (on
    unless set to something other than 1/true/yes) so a rank that dies hard leaves evidence."""
    native: bool = True
    """FLIGHTREC_NATIVE: at dump time, merge in what PyTorch's own Flight Recorder saw in this
    process (collectives issued outside Python's torch.distributed calls), numbered as the
    ProcessGroup numbers them (on unless set to something other than 1/true/yes)."""
    raw_stacks: bool = True
    """FLIGHTREC_RAW_STACKS: keep faulthandler armed so that a process whose Python cannot run
    for FLIGHTREC_TIMEOUT seconds (the GIL held in a C call) still leaves its threads' stacks
    beside its black box (on unless set to something other than 1/true/yes)."""
    verdict: bool = True
    """FLIGHTREC_VERDICT: when a hang is declared, exchange summaries through the job's store
    and print the verdict into the job's log (on unless set to something other than
    1/true/yes)."""
    upload_url: str = ""
    """FLIGHTREC_DIR when it is a URL (``s3://bucket/prefix``, any fsspec protocol): each dump
    written to ``directory`` is then uploaded there by flightrec's own thread; "" otherwise."""
    upload_retries: int = DEFAULT_UPLOAD_RETRIES
    """FLIGHTREC_UPLOAD_RETRIES: further tries of an upload that failed (0..10)."""
    metrics_port: int = 0
    """FLIGHTREC_METRICS_PORT: serve Prometheus metrics on this port + LOCAL_RANK; 0: off."""
    metrics_addr: str = DEFAULT_METRICS_ADDR
    """FLIGHTREC_METRICS_ADDR: the address the metrics server binds (all interfaces by
    default, so that Prometheus on another host can scrape it)."""
    slow_check_s: float = DEFAULT_SLOW_CHECK_S
    """FLIGHTREC_SLOW_CHECK: seconds between in-job checks for a persistently late rank (one
    line in the log when one is found, docs/slow-ranks.md); 0 turns the check off. Values
    below 0.5 (but 0) are read as 0.5."""
    host_relay: bool = True
    """FLIGHTREC_HOST_RELAY: a host's ranks hear of dump requests, and answer them, through
    one connection to the store (``exchange.relay``; on unless 0/false/...): the store's
    server then pays per host, not per rank, when a hang is declared."""
    ddp_hook: bool = True
    """FLIGHTREC_DDP_HOOK: record DDP's gradient all-reduces through flightrec's Python
    communication hook (on unless 0/false/...; DDP then keeps its C++ hook, and its
    all-reduces come from PyTorch's recorder only).

    PyTorch's recorder sees the reducer's all-reduces at no cost to the job, but on gloo
    with no completion time, and with a failed one marked like a finished one: a hang in one
    is then invisible to the metrics (nothing pending) and the slow check (no times). The hook
    records each bucket as flightrec's own entry, with its completion or failure, for a
    Python call and two takes of the GIL per bucket (docs/benchmarks.md, "DDP")."""


def is_true(value: str | None) -> bool:
    """True for the values docs/design.md lists as "on" (1/true/yes, any case, spaces ignored)."""
    return (value or "").strip().lower() in TRUE_VALUES


def _number(env: Mapping[str, str], name: str, default: float, lo: float, hi: float) -> float:
    raw = env.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not lo <= value <= hi:  # also rejects NaN
        log.warning(
            "flightrec: ignoring %s=%r (expected %g..%g); using %g", name, raw, lo, hi, default
        )
        return default
    return value


def _integer(env: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
    raw = env.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        value = lo - 1
    if not lo <= value <= hi:
        log.warning(
            "flightrec: ignoring %s=%r (expected an integer %d..%d); using %d",
            name,
            raw,
            lo,
            hi,
            default,
        )
        return default
    return value


def _slow_check(env: Mapping[str, str]) -> float:
    value = _number(env, "FLIGHTREC_SLOW_CHECK", DEFAULT_SLOW_CHECK_S, 0.0, 1e7)
    return 0.0 if value == 0 else max(MIN_SLOW_CHECK_S, value)


def job_id_from_env(env: Mapping[str, str]) -> str:
    """The job id the user or the launcher named, or "" (torchrun's placeholder "none" counts as unset)."""
    for name in ("FLIGHTREC_JOB_ID", "TORCHELASTIC_RUN_ID"):
        value = env.get(name, "").strip()
        if value and value != "none":
            return value
    return ""


def store_namespace(env: Mapping[str, str]) -> str:
    """The job's namespace for dump requests in its store: FLIGHTREC_JOB_ID, or "".

    Only the variable a user sets on purpose, so that ``flightrec trigger`` run from another
    shell (where the launcher's TORCHELASTIC_RUN_ID is not set) finds the same keys.
    """
    return env.get("FLIGHTREC_JOB_ID", "").strip()


def from_env(env: Mapping[str, str] | None = None) -> Config:
    """Parse the FLIGHTREC_* variables.

    Args:
        env: the environment to read; ``os.environ`` when omitted.

    Returns:
        The settings, with defaults where a variable is unset or invalid.
    """
    env = os.environ if env is None else env
    directory = local_path(env.get("FLIGHTREC_DIR", "").strip()) or DEFAULT_DIR
    upload_url = ""
    if is_url(directory):
        # The black box and every dump are written locally first (a hard crash must still
        # leave them, and the job must never wait on the network): the URL is where dumps go
        # next, from the spool.
        upload_url = directory.rstrip("/")
        directory = env.get("FLIGHTREC_SPOOL", "").strip() or DEFAULT_DIR
    return Config(
        enabled=is_true(env.get("FLIGHTREC")),
        directory=directory,
        upload_url=upload_url,
        upload_retries=_integer(
            env, "FLIGHTREC_UPLOAD_RETRIES", DEFAULT_UPLOAD_RETRIES, 0, MAX_UPLOAD_RETRIES
        ),
        metrics_port=_integer(env, "FLIGHTREC_METRICS_PORT", 0, 0, 65535),
        metrics_addr=env.get("FLIGHTREC_METRICS_ADDR", "").strip() or DEFAULT_METRICS_ADDR,
        timeout_s=_number(env, "FLIGHTREC_TIMEOUT", DEFAULT_TIMEOUT_S, 0.001, 1e7),
        buffer=_integer(env, "FLIGHTREC_BUFFER", DEFAULT_BUFFER, 1, MAX_BUFFER),
        stack_depth=_integer(env, "FLIGHTREC_STACK_DEPTH", DEFAULT_STACK_DEPTH, 0, MAX_STACK_DEPTH),
        dump_on_exit=is_true(env.get("FLIGHTREC_DUMP_ON_EXIT")),
        job_id=job_id_from_env(env),
        blackbox=env.get("FLIGHTREC_BLACKBOX") is None or is_true(env.get("FLIGHTREC_BLACKBOX")),
        native=env.get("FLIGHTREC_NATIVE") is None or is_true(env.get("FLIGHTREC_NATIVE")),
        raw_stacks=env.get("FLIGHTREC_RAW_STACKS") is None
        or is_true(env.get("FLIGHTREC_RAW_STACKS")),
        verdict=env.get("FLIGHTREC_VERDICT") is None or is_true(env.get("FLIGHTREC_VERDICT")),
        slow_check_s=_slow_check(env),
        ddp_hook=env.get("FLIGHTREC_DDP_HOOK") is None or is_true(env.get("FLIGHTREC_DDP_HOOK")),
        host_relay=env.get("FLIGHTREC_HOST_RELAY") is None
        or is_true(env.get("FLIGHTREC_HOST_RELAY")),
    )
