#!/usr/bin/env bash
# The framework stage: Lightning, accelerate, transformers, Ray Train and DeepSpeed installed in
# an environment of their own (the pinned CPU torch first, and kept: every framework is installed
# against it as a constraint), then the tests that run each one as its users do
# (tests/integration/frameworks; docs/frameworks.md). Run from .ci/run, or alone.
#
# CI runs one case of each framework's kind of fault naming (a stall named at the user's line,
# a mismatch named through the framework's own call, a healthy run, Ray's training thread):
# 7 of the 17 jobs. FRAMEWORK_TESTS=all runs every case (about 20 minutes on 2 busy cores).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
start=$SECONDS

"$PY" -m venv "$WORK/venv"
# --no-compile: byte-compiling Ray's, torch's and transformers' files at install is most of
# the install's time; Python compiles what the tests import anyway.
"$WORK/venv/bin/pip" install -q --no-compile torch==2.13.0
echo "torch==2.13.0" >"$WORK/torch.txt"
"$WORK/venv/bin/pip" install -q --no-compile -c "$WORK/torch.txt" . -r .ci/frameworks.txt \
    pytest pytest-xdist setuptools
rm -rf build ./*.egg-info
version=$("$WORK/venv/bin/python" -c "import torch; print(torch.__version__)")
[ "$version" = "2.13.0+cpu" ] || { echo "the frameworks replaced torch: $version" >&2; exit 1; }
echo "frameworks installed in $((SECONDS - start)) s"

select=()
if [ "${FRAMEWORK_TESTS:-ci}" != all ]; then
    cases="(lightning and (ddp or mismatch)) or (accelerate and (mismatch or healthy))"
    cases="$cases or (hf_trainer and stall) or ray_train or (deepspeed and mismatch)"
    select=(-k "$cases")
fi
"$WORK/venv/bin/python" -m pytest -q -p no:cacheprovider tests/integration/frameworks "${select[@]}"
echo "framework stage: $((SECONDS - start)) s"
