"""Where ``flightrec trigger`` finds a job: the endpoint file, torchrun's command line, and the
start-up line that tells the user."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flightrec.recorder.exchange.endpoint import (
    Endpoint,
    parse_address,
    parse_file,
    read_file,
    render_file,
    write_file,
)
from flightrec.recorder.startup import lowest_on_node, startup_line


def test_the_endpoint_file_reads_back(tmp_path: Path) -> None:
    ep = Endpoint("node-7.cluster", 29500, "train-a", 16, 4242, 1700000000.5)
    path = write_file(str(tmp_path / "new"), ep)
    assert path.name == ".flightrec-endpoint"
    assert read_file(path) == ep
    assert [p.name for p in path.parent.iterdir()] == [".flightrec-endpoint"]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "store 127.0.0.1:29500\n",  # no magic line
        "flightrec endpoint 1\nstore nowhere\n",
        "flightrec endpoint 1\nstore host:99999\n",
        "flightrec endpoint 1\nstore bad host:1\n",
    ],
)
def test_what_is_not_an_endpoint_file(text: str) -> None:
    assert parse_file(text) is None


def test_untrusted_fields_fall_back() -> None:
    ep = parse_file("flightrec endpoint 1\nstore [::1]:5\nworld lots\npid -3\nwritten x\n")
    assert ep == Endpoint("::1", 5, "", 0, 0, 0.0)
    assert render_file(Endpoint("h", 1)).startswith("flightrec endpoint 1\nstore h:1\n")


def test_addresses() -> None:
    assert parse_address("127.0.0.1:29400") == ("127.0.0.1", 29400)
    assert parse_address("[fe80::1]:80") == ("fe80::1", 80)
    assert parse_address("host") is None and parse_address(":80") is None


def test_torchrun_command_lines() -> None:
    pytest.importorskip("torch.distributed.run")
    from flightrec.recorder.exchange.endpoint import agent_rendezvous

    run = ["/usr/bin/python3", "-m", "torch.distributed.run"]
    c10d = ["--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint", "head:29555", "train.py"]
    assert agent_rendezvous([*run, *c10d, "--lr", "1"]) == ("head", 29555)
    assert agent_rendezvous(
        ["/venv/bin/torchrun", "--rdzv_backend", "c10d", "--rdzv_endpoint=head", "t.py"]
    ) == ("head", 29400)  # torchrun's default port for c10d
    assert agent_rendezvous([*run, "--standalone", "--nproc-per-node=4", "t.py"]) is None
    assert agent_rendezvous([*run, "--master-port=1234", "t.py"]) is None  # static
    assert agent_rendezvous([*run, "--no-such-flag"]) is None
    assert agent_rendezvous(["python", "train.py"]) is None


def test_the_startup_line(monkeypatch: pytest.MonkeyPatch) -> None:
    line = startup_line("1.2.3", 0, 8, "s3://bucket/run", 60.0, True, "10.0.0.1:29500")
    assert line == (
        "flightrec 1.2.3: tracing on (rank 0 of 8 ranks); dumps in s3://bucket/run; hang timeout "
        "60 s; verdict in the log: on; dump now with: flightrec trigger --host 10.0.0.1 --port 29500"
    )
    local = startup_line("1.2.3", 4, 8, "dumps", 2.5, False, "")
    assert f"dumps in {os.path.abspath('dumps')};" in local
    assert local.endswith("hang timeout 2.5 s; verdict in the log: off")
    for name in ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert lowest_on_node(0) and not lowest_on_node(3)
    monkeypatch.setenv("SLURM_LOCALID", "0")
    assert lowest_on_node(3)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert not lowest_on_node(0)
