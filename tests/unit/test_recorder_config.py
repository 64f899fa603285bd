"""FLIGHTREC_* parsing: defaults, valid values, and one warning per bad value."""

from __future__ import annotations

import logging

import pytest

from flightrec.recorder.config import (
    DEFAULT_BUFFER,
    DEFAULT_TIMEOUT_S,
    Config,
    from_env,
    store_namespace,
)


def test_unset_means_off_with_defaults() -> None:
    assert from_env({}) == Config()
    assert not from_env({"FLIGHTREC": "0"}).enabled
    assert not from_env({"FLIGHTREC": "no"}).enabled


@pytest.mark.parametrize("value", ["1", "true", "YES", " yes "])
def test_on_values(value: str) -> None:
    assert from_env({"FLIGHTREC": value}).enabled


def test_values_are_read() -> None:
    cfg = from_env(
        {
            "FLIGHTREC": "1",
            "FLIGHTREC_DIR": "/tmp/x",
            "FLIGHTREC_TIMEOUT": "2.5",
            "FLIGHTREC_BUFFER": "64",
            "FLIGHTREC_STACK_DEPTH": "0",
            "FLIGHTREC_DUMP_ON_EXIT": "1",
            "TORCHELASTIC_RUN_ID": "job-7",
        }
    )
    assert cfg == Config(True, "/tmp/x", 2.5, 64, 0, True, "job-7")


def test_job_id_prefers_flightrec_and_ignores_torchrun_placeholder() -> None:
    assert from_env({"TORCHELASTIC_RUN_ID": "none"}).job_id == ""
    env = {"FLIGHTREC_JOB_ID": "mine", "TORCHELASTIC_RUN_ID": "theirs"}
    assert from_env(env).job_id == "mine"


def test_store_namespace_is_what_the_user_set_and_nothing_else() -> None:
    # The trigger, run from another shell, sees no TORCHELASTIC_RUN_ID: the job must not use it.
    assert store_namespace({"TORCHELASTIC_RUN_ID": "rdzv-7"}) == ""
    assert store_namespace({"FLIGHTREC_JOB_ID": " run-42 ", "TORCHELASTIC_RUN_ID": "x"}) == "run-42"


@pytest.mark.parametrize(
    ("name", "value"),
    [("FLIGHTREC_TIMEOUT", "soon"), ("FLIGHTREC_TIMEOUT", "-1"), ("FLIGHTREC_TIMEOUT", "nan"),
     ("FLIGHTREC_BUFFER", "0"), ("FLIGHTREC_BUFFER", "1.5"), ("FLIGHTREC_STACK_DEPTH", "-3")],
)  # fmt: skip
def test_bad_value_warns_once_and_uses_default(
    name: str, value: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="flightrec"):
        cfg = from_env({name: value})
    assert cfg.timeout_s == DEFAULT_TIMEOUT_S and cfg.buffer == DEFAULT_BUFFER
    assert cfg.stack_depth == 16
    assert len(caplog.records) == 1 and name in caplog.records[0].getMessage()


def test_ddp_hook_on_unless_turned_off() -> None:
    """DDP's buckets count (metrics, slow check, failures) by default, whether or not
    PyTorch's recorder also sees them; FLIGHTREC_DDP_HOOK=0 leaves DDP's C++ hook alone."""
    on = {"FLIGHTREC": "1"}
    assert from_env(on).ddp_hook
    for more in (
        {"FLIGHTREC_NATIVE": "0"},
        {"TORCH_FR_BUFFER_SIZE": "0"},
        {"FLIGHTREC_DDP_HOOK": "1"},
    ):
        assert from_env({**on, **more}).ddp_hook, more
    for off in ("0", "false", "no", " OFF "):
        assert not from_env({**on, "FLIGHTREC_DDP_HOOK": off}).ddp_hook, off


def test_host_relay_on_unless_turned_off() -> None:
    on = {"FLIGHTREC": "1"}
    assert from_env(on).host_relay and from_env({**on, "FLIGHTREC_HOST_RELAY": "1"}).host_relay
    for off in ("0", "false", "no"):
        assert not from_env({**on, "FLIGHTREC_HOST_RELAY": off}).host_relay, off
