#!/usr/bin/env bash
# The whole test suite on a fresh machine: system packages the tests use, the dev
# install, then ruff, mypy and pytest. Called by .ci/run and by the README.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
need_apt=()
command -v dot >/dev/null 2>&1 || need_apt+=(graphviz)

if [ ${#need_apt[@]} -gt 0 ] && command -v apt-get >/dev/null 2>&1; then
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

PY="${PYTHON:-python3}"
# The CPU build of torch lies on local disk; name it first so nothing pulls a CUDA build.
"$PY" -m pip install -q "torch==2.13.0"
"$PY" -m pip install -q -e ".[dev]"

"$PY" -m ruff check .
"$PY" -m ruff format --check .
"$PY" -m mypy
"$PY" -m pytest -q "$@"
