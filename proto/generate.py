"""Regenerate the committed Python code for proto/flightrec.proto.

Usage (from the repository root, with the ``dev`` extra installed)::

    python proto/generate.py          # rewrite flightrec/format/flightrec_pb2.py and .pyi
    python proto/generate.py --check  # exit 1 if the committed code is stale

The generator (grpcio-tools' bundled protoc and mypy-protobuf) is pinned in the ``dev`` extra
to an old protoc on purpose: generated code demands a protobuf runtime at least as new as the
protoc that wrote it, and training nodes often carry an older protobuf than the newest.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
OUT_DIR = ROOT / "flightrec" / "format"
GENERATED = ("flightrec_pb2.py", "flightrec_pb2.pyi")


def generate(out: Path) -> None:
    """Run protoc (with the mypy-protobuf plugin) on flightrec.proto into ``out``."""
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{PROTO_DIR}",
        f"--python_out={out}",
        f"--mypy_out={out}",
        str(PROTO_DIR / "flightrec.proto"),
    ]
    plugin = shutil.which("protoc-gen-mypy", path=str(Path(sys.executable).parent))
    if plugin:
        cmd.insert(3, f"--plugin=protoc-gen-mypy={plugin}")
    subprocess.run(cmd, check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        stale = [
            name
            for name in GENERATED
            if not (OUT_DIR / name).exists()
            or (OUT_DIR / name).read_bytes() != (Path(tmp) / name).read_bytes()
        ]
        if args.check:
            for name in stale:
                print(f"stale: flightrec/format/{name} (run: python proto/generate.py)")
            return 1 if stale else 0
        for name in GENERATED:
            shutil.copyfile(Path(tmp) / name, OUT_DIR / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
