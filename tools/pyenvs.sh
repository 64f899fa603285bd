#!/usr/bin/env bash
# Build and use one Debian root per Python version, to test flightrec on the Pythons users run.
#
#   tools/pyenvs.sh build [VERSION ...]        make the roots (default: 3.13 3.14)
#   tools/pyenvs.sh run VERSION [COMMAND ...]  copy this working tree into the root's /src and
#                                              run COMMAND there (default: the unit tests)
#
# Run as root (mmdebstrap, chroot and bind mounts need it). Each root is made with mmdebstrap
# from Debian's own packages: Debian 13 ("trixie", the stable suite) has Python 3.13, the
# unstable suite has 3.14. Some mirrors serve release files past their Valid-Until date (old
# snapshots, slow mirrors): apt is told to accept them (Acquire::Check-Valid-Until "false").
# torch comes from the package index for that Python (the build users get by default: a CUDA
# wheel of several GB), installed with this machine's own pip and certificate configuration,
# copied into the root; local wheel folders and file:// indexes it names are bind-mounted,
# read-only, while a command runs.
#
# Environment: FLIGHTREC_PYROOTS (where the roots live; default /tmp/flightrec-pyroots, never
# inside the repository), FLIGHTREC_MIRROR (Debian mirror), FLIGHTREC_TORCH (torch version,
# default 2.13.0), FLIGHTREC_SUITE_3_13 / FLIGHTREC_SUITE_3_14 (suites, to pick others).
set -euo pipefail

HERE=$(cd "$(dirname "$0")/.." && pwd)
ROOTS=${FLIGHTREC_PYROOTS:-/tmp/flightrec-pyroots}
MIRROR=${FLIGHTREC_MIRROR:-http://deb.debian.org/debian}
TORCH=${FLIGHTREC_TORCH:-2.13.0}
PACKAGES=python3,python3-dev,python3-venv,gcc,libc6-dev,ca-certificates

die() { echo "pyenvs: $*" >&2; exit 2; }

suite_of() {
    case $1 in
        3.13) echo "${FLIGHTREC_SUITE_3_13:-trixie}" ;;
        3.14) echo "${FLIGHTREC_SUITE_3_14:-unstable}" ;;
        *) die "no Debian suite known for Python $1 (3.13 or 3.14)" ;;
    esac
}

root_of() { echo "$ROOTS/py${1/./}"; }

# Every path named by this machine's pip configuration (config files, PIP_* variables): the
# files are copied into the root, the folders bind-mounted while a command runs (for a local
# index, the folder above its simple/, where its files usually lie).
pip_paths() {
    {
        for f in /etc/pip.conf /etc/xdg/pip/pip.conf "$HOME/.config/pip/pip.conf" \
            "$HOME/.pip/pip.conf"; do
            [ -f "$f" ] && echo "$f" && sed -n 's/^[^#;=]*=//p' "$f"
        done
        env | sed -n 's/^\(PIP_[A-Z_]*\|REQUESTS_CA_BUNDLE\|SSL_CERT_FILE\|SSL_CERT_DIR\)=//p'
    } | tr ' ' '\n' | sed -n 's#^file://##; s#/simple/\{0,1\}$##; s#^\(/.*\)#\1#p' | sort -u
}

copy_config() {
    local root=$1 path
    while read -r path; do
        if [ -f "$path" ]; then
            mkdir -p "$root$(dirname "$path")"
            cp -f "$path" "$root$path"
        elif [ -d "$path" ]; then
            mkdir -p "$root$path" # a mount point; mounted in run_in
        fi
    done < <(pip_paths)
    # Files next to a config (a constraints file, a certificate the config names by a
    # relative path) come along with their folder.
    [ -d /etc/xdg/pip ] && mkdir -p "$root/etc/xdg" && cp -rf /etc/xdg/pip "$root/etc/xdg/"
    cp -f /etc/resolv.conf /etc/hosts "$root/etc/"
}

# run_in ROOT COMMAND: COMMAND (a bash script) in ROOT, in a mount namespace of its own, so the
# mounts go away with it; PIP_* and certificate variables pass through.
run_in() {
    local root=$1 script=$2 mounts="" path
    while read -r path; do
        [ -d "$path" ] && mounts+="mount --bind -o ro '$path' '$root$path'; "
    done < <(pip_paths)
    unshare --mount --propagation private bash -c "
        set -e
        mount -t proc proc '$root/proc'
        mount --rbind /dev '$root/dev'
        mount --bind -o ro /sys '$root/sys'
        $mounts
        exec chroot '$root' /usr/bin/env HOME=/root PATH=/opt/venv/bin:/usr/bin:/bin bash -euo pipefail -c \"\$0\"
    " "$script"
}

build() {
    local version=$1 root suite
    root=$(root_of "$version")
    suite=$(suite_of "$version")
    if [ ! -x "$root/usr/bin/python3" ]; then
        command -v mmdebstrap >/dev/null || die "mmdebstrap is not installed (apt-get install mmdebstrap)"
        [ "$(id -u)" = 0 ] || die "run as root"
        mkdir -p "$ROOTS"
        rm -rf "$root"
        echo "pyenvs: Debian $suite root for Python $version in $root"
        mmdebstrap --variant=apt --quiet --aptopt='Acquire::Check-Valid-Until "false"' \
            --include="$PACKAGES" "$suite" "$root" "$MIRROR"
    fi
    local got
    got=$(chroot "$root" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    [ "$got" = "$version" ] || die "$root has Python $got, not $version (suite $suite moved on?)"
    copy_config "$root"
    if [ ! -x "$root/opt/venv/bin/python" ] || ! chroot "$root" /opt/venv/bin/python -c \
        "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH')" 2>/dev/null; then
        echo "pyenvs: torch==$TORCH from the package index for Python $version"
        run_in "$root" "rm -rf /opt/venv; python3 -m venv /opt/venv
            pip install -q torch==$TORCH 2>&1 | { grep -v '^WARNING: Location' || true; }
            python -c 'import torch'"
    fi
    # The project and its test extra, from a copy of the tree. A test requirement with no wheel
    # for this Python (grpcio-tools for 3.14: only the generated-code check needs it) is
    # skipped with a line saying so, rather than built from source.
    sync_tree "$root"
    cat >"$root/tmp/pyenvs-deps.sh" <<'EOF'
cd /src
quiet() { "$@" 2>&1 | { grep -v '^WARNING: Location' || true; }; }
quiet pip install -q .
rm -rf build ./*.egg-info
python -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["test"], sep="\n")' |
    while read -r req; do
        pip install -q --only-binary=:all: "$req" >/tmp/pip.log 2>&1 ||
            echo "pyenvs: $req: no wheel for this Python, skipped"
    done
python -c 'import torch, flightrec, sys; print("pyenvs: Python", sys.version.split()[0], "torch", torch.__version__)'
EOF
    run_in "$root" "bash /tmp/pyenvs-deps.sh"
}

# This working tree (tracked and untracked-but-not-ignored files) as the root's /src; built
# extensions and caches there are kept between runs, stale sources are not.
sync_tree() {
    local root=$1
    mkdir -p "$root/src"
    find "$root/src" -type f ! -name '*.so' -delete
    (cd "$HERE" && git ls-files -z -c -o --exclude-standard | tar --null -T - -cf -) |
        tar -xf - -C "$root/src"
}

run() {
    local version=$1 root
    shift
    root=$(root_of "$version")
    [ -x "$root/opt/venv/bin/python" ] || die "no root for Python $version: tools/pyenvs.sh build $version"
    # One command per root at a time: the next one's copy of the tree would pull files from
    # under it.
    exec 9>"$root/tmp/pyenvs.lock"
    flock 9
    sync_tree "$root"
    local cmd="python -m pytest -q tests/unit"
    if [ $# -gt 0 ]; then
        cmd=$(printf '%q ' "$@")
    fi
    run_in "$root" "cd /src && $cmd"
}

case ${1:-} in
    build)
        shift
        [ $# -gt 0 ] || set -- 3.13 3.14
        for v in "$@"; do build "$v"; done
        ;;
    run)
        shift
        [ $# -gt 0 ] || die "usage: tools/pyenvs.sh run VERSION [COMMAND ...]"
        run "$@"
        ;;
    *)
        sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
        exit 2
        ;;
esac
