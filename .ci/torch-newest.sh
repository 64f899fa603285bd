#!/usr/bin/env bash
# CI on the newest torch on the package index (FLIGHTREC_TORCH_NEWEST, default 2.15.0; the main
# stage tests the pinned 2.13.0): the tests where the torch release matters, in a virtual
# environment of its own with the default wheel (a CUDA build, run on the CPU).
#
# Which tests: those that touch what changes between torch releases, namely the signatures of
# torch.distributed's functions the wrappers are generated from (hooks, C path), the
# tensor-memory reader (layout), the black box, DDP's hooks, PyTorch's own recorder (read
# in-process, and the dumps torch 2.15 writes read by `flightrec analyze`), object collectives
# and one job-level check built on all of them (a stall's verdict in the log). The rest of the
# suite (analysis, reports, CLI, samples, the other live jobs) reads files or exercises
# flightrec's own machinery the same way on any torch; running it twice would add about
# 8 minutes to a CI that must stay under 25. tools/torch_matrix.py runs the job-level checks
# (stall, black box, exit dump) on every release from 2.4 to 2.15.
#
# The environment is kept in FLIGHTREC_TORCH_NEWEST_VENV (default /tmp/flightrec-torch-newest)
# and reused while it holds that torch (the wheel is several GB: 1.5 to 7 minutes to fetch);
# FLIGHTREC_CI_TORCH_NEWEST=0 skips this step, saying so. This machine's pip configuration may
# cap torch below the newest release (/etc/xdg/pip): PIP_CONSTRAINT=/dev/null lifts the cap for
# this environment's installs only.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${FLIGHTREC_CI_TORCH_NEWEST:-1}" = 0 ]; then
    echo "newest-torch tests skipped (FLIGHTREC_CI_TORCH_NEWEST=0)"
    exit 0
fi
PY=${PYTHON:-python3}
TORCH=${FLIGHTREC_TORCH_NEWEST:-2.15.0}
VENV=${FLIGHTREC_TORCH_NEWEST_VENV:-/tmp/flightrec-torch-newest}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
pip_() { PIP_CONSTRAINT=/dev/null "$VENV/bin/python" -m pip install -q "$@" 2>&1 | { grep -v '^WARNING: Location' || true; }; }

if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH')" 2>/dev/null; then
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
    pip_ "torch==$TORCH"
fi
# The project (for its start-up hook: the tests import this tree, built in place by .ci/run)
# and what the tests below import.
pip_ . pytest pytest-xdist hypothesis numpy setuptools
rm -rf build ./*.egg-info
"$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)'
"$VENV/bin/python" -m pytest -q -p no:cacheprovider \
    tests/integration/test_recorder_hooks.py tests/integration/test_recorder_fast.py \
    tests/integration/test_recorder_layout.py tests/integration/test_recorder_blackbox.py \
    tests/integration/test_recorder_ddp.py tests/integration/test_native_live.py \
    tests/integration/test_native_forms_live.py tests/integration/test_object_collectives.py \
    "tests/integration/test_live_verdict.py::test_the_job_log_names_the_stalled_rank_the_collective_and_the_line" \
    tests/unit/test_doctor.py tests/unit/test_torchapi.py
