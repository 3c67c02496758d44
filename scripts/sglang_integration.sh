#!/usr/bin/env bash
# The SGLang integration tests (tests/sglang_linker): StoreLinker and ContractMonitor
# inside SGLang 0.5.23's real UnifiedRadixCache on CPU, on the memory, file and Redis
# stores. They run with the SGLang oracle venv's python (the differential suite's:
# built or reused by scripts/sglang_env.sh; $SGLANG_VENV, default .venv-sglang); the
# main `pytest` run ignores tests/sglang_linker. Under CI a missing SGLang fails every
# test instead of skipping it, and a missing redis-server fails the Redis ones.
#
#   scripts/sglang_integration.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
export SGLANG_VENV="${SGLANG_VENV:-$PWD/.venv-sglang}"
bash scripts/sglang_env.sh --quick
exec "$SGLANG_VENV/bin/python" -m pytest tests/sglang_linker -p no:cacheprovider "$@"
