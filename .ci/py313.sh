#!/usr/bin/env bash
# CI on Python 3.13: the unit tests and the recorder's integration tests in a Debian 13 root
# with torch from the package index for 3.13 (tools/pyenvs.sh builds it; as root, with
# mmdebstrap). A root kept in FLIGHTREC_PYROOTS from an earlier run is reused (about 3 min
# saved); FLIGHTREC_CI_PY313=0 skips this step, saying so.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${FLIGHTREC_CI_PY313:-1}" = 0 ]; then
    echo "Python 3.13 tests skipped (FLIGHTREC_CI_PY313=0)"
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "Python 3.13 tests need root (mmdebstrap, chroot), or FLIGHTREC_CI_PY313=0" >&2
    exit 1
fi
if ! command -v mmdebstrap >/dev/null; then  # a fresh CI machine: from Debian's packages
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq mmdebstrap >/dev/null
fi
export FLIGHTREC_PYROOTS=${FLIGHTREC_PYROOTS:-/tmp/flightrec-pyroots}
tools/pyenvs.sh build 3.13
tools/pyenvs.sh run 3.13 python -m pytest -q -p no:cacheprovider tests/unit tests/integration/test_recorder_*.py
