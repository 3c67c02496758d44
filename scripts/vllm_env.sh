#!/usr/bin/env bash
# Build (or reuse) the virtualenv that holds vLLM 0.33.0's KV-offloading code
# (vllm/v1/kv_offload: the OffloadingManager contract, its CPU manager with the LRU and
# ARC policies, the spec factory) next to the project itself, for tests/vllm.
#
#   VLLM_VENV=/path/to/venv bash scripts/vllm_env.sh [--quick]   # default: .venv-vllm here
#
# --quick: trust a matching stamp without the import check; the suite itself still
# fails loudly when vLLM cannot be imported.
# Idempotent: a venv whose stamp matches this script and its pins, and that still
# imports both sides, is reused; when pyproject.toml, constraints.txt or the checkout
# changed, only the project's (editable) install is redone. Anything else is rebuilt.
#
# Route (see scripts/vllm-requirements.txt for every pin):
# - vLLM 0.33.0 is NOT pip-installed: its wheel pins CUDA builds (torch 2.14.0,
#   flashinfer, cutlass, ...). We `pip download --no-deps` the wheel (336 MB), check
#   its sha256 and unpack only its Python files (57 MB) and its metadata; a .pth file
#   puts them on sys.path. The metadata keeps its name and version (importlib.metadata
#   answers 0.33.0) but not its Requires-Dist lines, so pip does not judge pins it was
#   never asked to install.
# - torch is the local CPU build 2.13.0, the project's own torch. Nothing of vLLM's
#   compiled code is loaded: the offloading manager is pure Python on the scheduler side.
# Works as root on a fresh Debian machine with only the package registries reachable.
# pip runs with -qq: the machine's own pip configuration may warn about its mirrors.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"

VLLM_VERSION="0.33.0"
# sha256 of vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl (the registry's wheel).
VLLM_WHEEL_SHA256="4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa"
VENV="${VLLM_VENV:-$REPO/.venv-vllm}"
PY="${PYTHON:-python3}"
REQS="$REPO/scripts/vllm-requirements.txt"
CONSTRAINTS=()
if [ -f "$REPO/constraints.txt" ]; then CONSTRAINTS=(-c "$REPO/constraints.txt"); fi

QUICK=0
if [ "${1:-}" = "--quick" ]; then QUICK=1; fi

started=$(date +%s)
log() { echo "[vllm_env] $*"; }

base_stamp() {
    cat "$REPO/scripts/vllm_env.sh" "$REQS" | sha256sum | cut -d' ' -f1
}
project_stamp() {
    local files=("$REPO/pyproject.toml" "$REPO/setup.py")
    if [ -f "$REPO/constraints.txt" ]; then files+=("$REPO/constraints.txt"); fi
    { echo "$REPO"; cat "${files[@]}"; } | sha256sum | cut -d' ' -f1
}
STAMP="$(base_stamp)"

install_project() {
    # UNICACHE_FSM_NO_NATIVE: this runs beside the test suite, whose processes have
    # loaded the native extensions from the checkout (built by the main install); an
    # editable build would rewrite those files under them
    UNICACHE_FSM_NO_NATIVE=1 "$VENV/bin/python" -m pip install -qq --disable-pip-version-check \
        -e "$REPO[dev]" -r "$REQS" "${CONSTRAINTS[@]}"
    project_stamp > "$VENV/.unicache-project-stamp"
}

check_imports() {
    # Both sides in one process, from this checkout, and one lookup through vLLM's manager.
    "$VENV/bin/python" - "$REPO" "$VLLM_VERSION" <<'PYEOF'
import importlib.metadata
import logging
import os
import sys

repo, version = sys.argv[1], sys.argv[2]
sys.path.insert(0, repo)
logging.disable(logging.WARNING)
from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

import unicache_fsm

got = importlib.metadata.version("vllm")
assert got == version, f"vllm {got} on sys.path, expected {version}"
assert os.path.realpath(unicache_fsm.__file__).startswith(os.path.realpath(repo)), unicache_fsm.__file__
manager = CPUOffloadingManager(num_chunks=2)
assert manager.lookup(make_offload_key(b"k", 0), ReqContext("r")) is LookupResult.MISS
PYEOF
}

if [ -x "$VENV/bin/python" ] && [ "$(cat "$VENV/.unicache-vllm-stamp" 2>/dev/null)" = "$STAMP" ]; then
    if [ "$(cat "$VENV/.unicache-project-stamp" 2>/dev/null)" != "$(project_stamp)" ]; then
        log "re-installing the project from $REPO (pyproject.toml / constraints.txt / checkout changed)"
        install_project
    fi
    if [ "$QUICK" = 1 ] || check_imports; then
        log "reusing $VENV (vllm $VLLM_VERSION and the project from $REPO)"
        exit 0
    fi
    log "stamp matches but the imports fail: rebuilding"
fi

log "building $VENV from scratch"
rm -rf "$VENV"
"$PY" -m venv "$VENV"
VPY="$VENV/bin/python"
# The CPU build of torch lies on local disk; name it first so nothing pulls a CUDA build.
"$VPY" -m pip install -qq --disable-pip-version-check "torch==2.13.0"
install_project

# -- vLLM itself: the wheel's Python files, unpacked, never installed ------------------
WHEELS="$(mktemp -d)"
trap 'rm -rf "$WHEELS"' EXIT
"$VPY" -m pip download -qq --disable-pip-version-check --no-deps -d "$WHEELS" "vllm==$VLLM_VERSION"
WHEEL="$(ls "$WHEELS"/vllm-"$VLLM_VERSION"-*.whl)"
got_sha="$(sha256sum "$WHEEL" | cut -d' ' -f1)"
if [ "$got_sha" != "$VLLM_WHEEL_SHA256" ]; then
    log "$(basename "$WHEEL") has sha256 $got_sha, expected $VLLM_WHEEL_SHA256" >&2
    exit 1
fi
SITE="$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
DEST="$VENV/vllm-$VLLM_VERSION"
"$VPY" - "$WHEEL" "$DEST" "$VLLM_VERSION" <<'PYEOF'
import sys
import zipfile
from pathlib import Path

wheel, dest, version = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
info = f"vllm-{version}.dist-info/"
with zipfile.ZipFile(wheel) as zf:
    zf.extractall(dest, [n for n in zf.namelist() if n.endswith(".py")])
    zf.extractall(dest, [info + "METADATA", info + "top_level.txt"])
meta = dest / info / "METADATA"
lines = meta.read_text().splitlines(keepends=True)
meta.write_text("".join(l for l in lines if not l.startswith("Requires-Dist:")))
PYEOF
printf '%s\n' "$DEST" > "$SITE/unicache_vllm.pth"

check_imports
echo "$STAMP" > "$VENV/.unicache-vllm-stamp"
log "built $VENV in $(( $(date +%s) - started )) s"
