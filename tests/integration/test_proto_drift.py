"""The committed generated code must match proto/flightrec.proto."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from flightrec.format import flightrec_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]


def test_generated_descriptor_matches_proto_source(tmp_path: Path) -> None:
    protoc = pytest.importorskip("grpc_tools.protoc")
    out = tmp_path / "flightrec.desc"
    rc = protoc.main(
        ["protoc", f"-I{ROOT / 'proto'}", f"--descriptor_set_out={out}", "flightrec.proto"]
    )
    assert rc == 0
    from google.protobuf import descriptor_pb2

    fresh = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    committed = descriptor_pb2.FileDescriptorProto.FromString(pb.DESCRIPTOR.serialized_pb)
    # protoc adds json_name to descriptor sets but strips it from generated code.
    for message in fresh.message_type:
        for field in message.field:
            field.ClearField("json_name")
    assert fresh == committed, "flightrec_pb2.py is stale: run python proto/generate.py"


def test_generate_check_passes_on_committed_code() -> None:
    pytest.importorskip("grpc_tools.protoc")
    pytest.importorskip("mypy_protobuf")
    result = subprocess.run(
        [sys.executable, str(ROOT / "proto" / "generate.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
