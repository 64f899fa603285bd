#!/usr/bin/env bash
# The framework stage: Lightning, accelerate, transformers, Ray Train and DeepSpeed installed in
# an environment of their own (the pinned CPU torch first, and kept: every framework is installed
# against it as a constraint), then the tests that run each one as its users do
# (tests/integration/frameworks; docs/frameworks.md). Run from .ci/run, or alone:
#
#   .ci/frameworks.sh prepare   the environment, in FLIGHTREC_FRAMEWORKS_VENV
#   .ci/frameworks.sh test      the tests, in it
#   .ci/frameworks.sh           both (in a temporary environment where the variable is not set)
#
# CI runs one case of each kind of naming (a stall named at the user's line in Lightning's DDP,
# a mismatch named through accelerate's own call): 2 of the 17 jobs, which is what fits a CI of
# 25 minutes on 2 cores. Ray Train's job needs 4 CPU slots and minutes of start-up on 2 cores:
# it timed out beside the other CI stages, so it runs with FRAMEWORK_TESTS=all only.
# FRAMEWORK_TESTS=all runs every case (about 20 minutes on 2 busy cores), DeepSpeed's included
# (its CPU op alone is about 2 minutes of compiling).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
VENV=${FLIGHTREC_FRAMEWORKS_VENV:-}
if [ -z "$VENV" ]; then
    [ "${1:-all}" = all ] || { echo "FLIGHTREC_FRAMEWORKS_VENV names the environment to $1" >&2; exit 2; }
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    VENV=$tmp/venv
fi

# pip's notes on index folders this machine's configuration names but lacks, left out.
pip_() { "$VENV/bin/pip" "$@" 2>&1 | { grep -v '^WARNING: Location' || true; }; }

prepare() {
    local start=$SECONDS
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
    # --no-compile: byte-compiling Ray's, torch's and transformers' files at install is most of
    # the install's time; Python compiles what the tests import anyway.
    pip_ install -q --no-compile torch==2.13.0
    echo "torch==2.13.0" >"$VENV/torch.txt"
    # The project from a copy of the tree: .ci/run builds in this one at the same time.
    mkdir -p "$VENV/src"
    git ls-files -z -c -o --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$VENV/src"
    pip_ install -q --no-compile -c "$VENV/torch.txt" "$VENV/src" \
        -r .ci/frameworks.txt pytest pytest-xdist setuptools
    rm -rf "$VENV/src"
    local version
    version=$("$VENV/bin/python" -c "import torch; print(torch.__version__)")
    [ "$version" = "2.13.0+cpu" ] || { echo "the frameworks replaced torch: $version" >&2; exit 1; }
    echo "frameworks installed in $((SECONDS - start)) s"
}

run_tests() {
    local start=$SECONDS select=()
    if [ "${FRAMEWORK_TESTS:-ci}" != all ]; then
        local cases="(lightning and ddp) or (accelerate and mismatch)"
        select=(-k "$cases")
    fi
    "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/integration/frameworks "${select[@]}"
    echo "framework tests: $((SECONDS - start)) s"
}

case ${1:-all} in
    prepare) prepare ;;
    test) run_tests ;;
    all) prepare && run_tests ;;
    *) echo "usage: .ci/frameworks.sh [prepare|test]" >&2; exit 2 ;;
esac
