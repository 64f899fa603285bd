#!/usr/bin/env bash
# CI on Python 3.13 with the newest torch on the package index (FLIGHTREC_TORCH_NEWEST, default
# 2.15.0): the main stage tests Python 3.11 with the pinned torch 2.13.0; this one tests the
# other end of both ranges at once.
#
#   .ci/newest.sh prepare   the Debian 13 root (Python 3.13) with that torch (tools/pyenvs.sh)
#   .ci/newest.sh test      the tests below in it
#   .ci/newest.sh           both
#
# The root is built with mmdebstrap from Debian's own packages, as root; torch is the default
# wheel from the index (a CUDA build of several GB, run on the CPU). This machine's pip
# configuration may cap torch below the newest release (/etc/xdg/pip): PIP_CONSTRAINT=/dev/null
# lifts the cap for the root's installs only. A root kept in FLIGHTREC_PYROOTS (default
# /tmp/flightrec-pyroots) from an earlier run is reused while it holds that torch.
# FLIGHTREC_CI_NEWEST=0 skips this step, saying so.
#
# Which tests: the unit tests of what Python's version changes (the C readers and loops built
# for it, the frame walk, torch's API at start-up), and the integration tests that touch what changes between torch releases: the signatures of
# torch.distributed's functions the wrappers are generated from (hooks, C path), the
# tensor-memory reader (layout), the black box, DDP's hooks, torch 2.15's hook-based recorder
# and the dumps it writes, object collectives, and one job-level check built on all of them (a
# stall's verdict in the log). The rest of the suite (analysis, reports, CLI, samples, the other
# live jobs, launchers) reads files or exercises flightrec's own machinery the same way on any
# torch and Python; running it twice would not fit a CI that must stay under 25 minutes. tools/torch_matrix.py runs the job-level checks (stall,
# black box, exit dump) on every release from 2.4 to 2.15.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${FLIGHTREC_CI_NEWEST:-1}" = 0 ]; then
    echo "Python 3.13 / newest-torch tests skipped (FLIGHTREC_CI_NEWEST=0)"
    exit 0
fi
export FLIGHTREC_TORCH=${FLIGHTREC_TORCH_NEWEST:-2.15.0}
export FLIGHTREC_PYROOTS=${FLIGHTREC_PYROOTS:-/tmp/flightrec-pyroots}

prepare() {
    if [ "$(id -u)" != 0 ]; then
        echo "Python 3.13 tests need root (mmdebstrap, chroot), or FLIGHTREC_CI_NEWEST=0" >&2
        exit 1
    fi
    if ! command -v mmdebstrap >/dev/null; then  # a fresh CI machine: from Debian's packages
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq mmdebstrap >/dev/null
    fi
    PIP_CONSTRAINT=/dev/null tools/pyenvs.sh build 3.13
}

run_tests() {
    local unit=(tests/unit/test_{torchapi,doctor,columns_fastread,native_fastread,lastarrivals}.py
        tests/unit/test_{recorder_hot,recorder_stacks,recorder_slot_layout,frames,dumpfile}.py
        tests/unit/test_{summary,issuing_thread,blackbox,progress_decode,relay}.py)
    tools/pyenvs.sh run 3.13 python -m pytest -q -p no:cacheprovider "${unit[@]}" \
        tests/integration/test_recorder_{hooks,fast,layout,blackbox,ddp}.py \
        tests/integration/test_native_forms_live.py tests/integration/test_object_collectives.py \
        "tests/integration/test_live_verdict.py::test_the_job_log_names_the_stalled_rank_the_collective_and_the_line"
}

case ${1:-all} in
    prepare) prepare ;;
    test) run_tests ;;
    all) prepare && run_tests ;;
    *) echo "usage: .ci/newest.sh [prepare|test]" >&2; exit 2 ;;
esac
