#!/usr/bin/env bash
# CI: headless Chromium and its WebDriver from the system's packages, for
# tests/integration/test_html_browser.py (which skips, saying why, where they are missing).
# Debian/Ubuntu with apt-get only; anywhere else it says so and leaves the tests to skip.
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
    echo "browser: $(chromium --version 2>/dev/null)"
    exit 0
fi
if ! command -v apt-get >/dev/null; then
    echo "browser: no apt-get here; the browser tests will skip" >&2
    exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
    if ! command -v sudo >/dev/null; then
        echo "browser: not root and no sudo; the browser tests will skip" >&2
        exit 0
    fi
    SUDO="sudo -n"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq chromium chromium-driver >/dev/null
echo "browser: $(chromium --version 2>/dev/null)"
