#!/usr/bin/env bash
# Build (or reuse) the virtualenv that holds SGLang 0.5.23, the differential oracle of
# tests/conformance, next to the project itself, so ONE process holds both caches.
#
#   SGLANG_VENV=/path/to/venv bash scripts/sglang_env.sh [--quick]   # default: .venv-sglang here
#
# --quick: trust a matching stamp without the import check (~20 s); the suite itself
# still fails loudly when SGLang cannot be imported.
# Idempotent: a venv whose stamp matches this script, its pins and its shims, and that
# still imports both sides, is reused; when pyproject.toml, constraints.txt or the
# checkout changed, only the project's (editable) install is redone. Anything else is
# rebuilt from scratch.
#
# Route (see scripts/sglang-oracle-requirements.txt for every pin):
# - SGLang 0.5.23 is NOT pip-installed: its wheel pins CUDA builds (torch 2.14.1,
#   flashinfer, ...). We `pip download --no-deps` the wheel, check its sha256 and unpack
#   it into the venv; a .pth file puts it on sys.path.
# - torch is the local CPU build 2.13.0, the project's own torch. torchvision is an
#   import-time stand-in (scripts/sglang_oracle_shims.py), not a package: the registry's
#   torchvision wheels are CUDA builds that fail to load against CPU torch 2.13.0, and
#   the alternative (the CUDA torch 2.14.1 + torchvision 0.29.1) weighs ~6 GB and
#   replays nothing more -- the radix cache never calls torchvision.
# - SGLang's page hashing JIT-builds a C++ extension (needs g++, ninja, OpenSSL's
#   -lcrypto); it is built here once, into the venv (TORCH_EXTENSIONS_DIR), so a
#   missing compiler fails this script, not the suite.
# Works as root on a fresh Debian machine with only the package registries reachable.
# pip runs with -qq: the machine's own pip configuration may warn about its mirrors.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"

SGLANG_VERSION="0.5.23"
# sha256 of sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl (the registry's wheel).
SGLANG_WHEEL_SHA256="00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937"
VENV="${SGLANG_VENV:-$REPO/.venv-sglang}"
PY="${PYTHON:-python3}"
REQS="$REPO/scripts/sglang-oracle-requirements.txt"
SHIMS="$REPO/scripts/sglang_oracle_shims.py"
CONSTRAINTS=()
if [ -f "$REPO/constraints.txt" ]; then CONSTRAINTS=(-c "$REPO/constraints.txt"); fi

QUICK=0
if [ "${1:-}" = "--quick" ]; then QUICK=1; fi

started=$(date +%s)
log() { echo "[sglang_env] $*"; }

# The oracle's own stamp (a change rebuilds from scratch) and the project's (a change
# re-runs the project install only).
base_stamp() {
    cat "$REPO/scripts/sglang_env.sh" "$REQS" "$SHIMS" | sha256sum | cut -d' ' -f1
}
project_stamp() {
    local files=("$REPO/pyproject.toml" "$REPO/setup.py")
    if [ -f "$REPO/constraints.txt" ]; then files+=("$REPO/constraints.txt"); fi
    { echo "$REPO"; cat "${files[@]}"; } | sha256sum | cut -d' ' -f1
}
STAMP="$(base_stamp)"

install_project() {
    # UNICACHE_FSM_NO_NATIVE: this runs beside the test suite, whose processes have
    # loaded the native page-hash chain from the checkout (built by the main install);
    # an editable build would rewrite that file under them
    UNICACHE_FSM_NO_NATIVE=1 "$VENV/bin/python" -m pip install -qq --disable-pip-version-check \
        -e "$REPO[dev]" -r "$REQS" "${CONSTRAINTS[@]}"
    project_stamp > "$VENV/.unicache-project-stamp"
}

check_imports() {
    # Both sides in one process, from this checkout.
    "$VENV/bin/python" - "$REPO" "$SGLANG_VERSION" <<'EOF'
import importlib.metadata
import logging
import os
import sys

repo, version = sys.argv[1], sys.argv[2]
sys.path.insert(0, repo)
logging.disable(logging.WARNING)
import sglang.srt.mem_cache.unified_radix_cache  # noqa: F401
import unicache_fsm

got = importlib.metadata.version("sglang")
assert got == version, f"sglang {got} on sys.path, expected {version}"
assert os.path.realpath(unicache_fsm.__file__).startswith(os.path.realpath(repo)), unicache_fsm.__file__
EOF
}

if [ -x "$VENV/bin/python" ] && [ "$(cat "$VENV/.unicache-oracle-stamp" 2>/dev/null)" = "$STAMP" ]; then
    if [ "$(cat "$VENV/.unicache-project-stamp" 2>/dev/null)" != "$(project_stamp)" ]; then
        log "re-installing the project from $REPO (pyproject.toml / constraints.txt / checkout changed)"
        install_project
    fi
    if [ "$QUICK" = 1 ] || check_imports; then
        log "reusing $VENV (sglang $SGLANG_VERSION and the project from $REPO)"
        exit 0
    fi
    log "stamp matches but the imports fail: rebuilding"
fi

# -- system packages: a C++ compiler and OpenSSL headers for SGLang's hash extension --
SUDO=""
if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
need_apt=()
command -v g++ >/dev/null 2>&1 || need_apt+=(g++)
[ -e /usr/include/openssl/sha.h ] || need_apt+=(libssl-dev)
if [ ${#need_apt[@]} -gt 0 ]; then
    if ! command -v apt-get >/dev/null 2>&1; then
        log "missing ${need_apt[*]} and no apt-get to install them" >&2
        exit 1
    fi
    log "installing ${need_apt[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

log "building $VENV from scratch"
rm -rf "$VENV"
"$PY" -m venv "$VENV"
VPY="$VENV/bin/python"
PIP=("$VPY" -m pip install -qq --disable-pip-version-check)

# The CPU build of torch lies on local disk; name it first so nothing pulls a CUDA build.
"${PIP[@]}" "torch==2.13.0"
install_project

# -- SGLang itself: the wheel, unpacked, never installed -----------------------------
WHEELS="$(mktemp -d)"
trap 'rm -rf "$WHEELS"' EXIT
"$VPY" -m pip download -qq --disable-pip-version-check --no-deps -d "$WHEELS" "sglang==$SGLANG_VERSION"
WHEEL="$(ls "$WHEELS"/sglang-"$SGLANG_VERSION"-*.whl)"
got_sha="$(sha256sum "$WHEEL" | cut -d' ' -f1)"
if [ "$got_sha" != "$SGLANG_WHEEL_SHA256" ]; then
    log "$(basename "$WHEEL") has sha256 $got_sha, expected $SGLANG_WHEEL_SHA256" >&2
    exit 1
fi
SITE="$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
DEST="$VENV/sglang-$SGLANG_VERSION"
"$VPY" - "$WHEEL" "$DEST" <<'EOF'
import sys
import zipfile

wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as zf:
    zf.extractall(dest)
EOF
cp "$SHIMS" "$SITE/unicache_sglang_shims.py"
printf '%s\nimport unicache_sglang_shims\n' "$DEST" > "$SITE/unicache_sglang_oracle.pth"

# -- build SGLang's page-hash extension once (torch JIT, into the venv) ---------------
log "building SGLang's page-hash C++ extension"
"$VPY" - <<'EOF'
import logging

logging.disable(logging.WARNING)
from sglang.srt.mem_cache.cpp_utils.native_hash import _load_native_hash_module

_load_native_hash_module()
EOF

check_imports
echo "$STAMP" > "$VENV/.unicache-oracle-stamp"
log "built $VENV in $(( $(date +%s) - started )) s"
