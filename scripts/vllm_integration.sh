#!/usr/bin/env bash
# The vLLM tests (tests/vllm): the monitor's planted-misuse tests, the differential
# suite against vLLM 0.33.0's own CPU manager (LRU and ARC) and the conformance kit's
# mutants. They run with the vLLM venv's python (built or reused by scripts/vllm_env.sh;
# $VLLM_VENV, default .venv-vllm); the main `pytest` run ignores tests/vllm. Under CI a
# missing vLLM fails the run instead of collecting nothing.
#
#   scripts/vllm_integration.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
export VLLM_VENV="${VLLM_VENV:-$PWD/.venv-vllm}"
bash scripts/vllm_env.sh --quick
exec "$VLLM_VENV/bin/python" -m pytest tests/vllm -p no:cacheprovider "$@"
