#!/usr/bin/env bash
# The framework stage: Lightning, accelerate, transformers, Ray Train and DeepSpeed installed in
# an environment of their own (the pinned CPU torch first, and kept: every framework is installed
# against it as a constraint), then the tests that run each one as its users do
# (tests/integration/frameworks; docs/frameworks.md). Run from .ci/run, or alone.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
start=$SECONDS

"$PY" -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q torch==2.13.0
echo "torch==2.13.0" >"$WORK/torch.txt"
"$WORK/venv/bin/pip" install -q -c "$WORK/torch.txt" . -r .ci/frameworks.txt pytest pytest-xdist setuptools
rm -rf build ./*.egg-info
version=$("$WORK/venv/bin/python" -c "import torch; print(torch.__version__)")
[ "$version" = "2.13.0+cpu" ] || { echo "the frameworks replaced torch: $version" >&2; exit 1; }
echo "frameworks installed in $((SECONDS - start)) s"

"$WORK/venv/bin/python" -m pytest -q -p no:cacheprovider tests/integration/frameworks
echo "framework stage: $((SECONDS - start)) s"
