#!/usr/bin/env bash
# The whole test suite on a fresh machine: system packages the tests use, the dev
# install at the exact versions of constraints.txt, then ruff, mypy and pytest.
# Last, the differential suite against SGLang 0.5.23's own cache (tests/conformance)
# and the SGLang integration (tests/sglang_linker),
# with the python of a separate venv that scripts/sglang_env.sh builds or reuses
# (in the background, while ruff, mypy and pytest run).
# Called by .ci/run and by the README. Prints no warning it did not cause: pip runs
# with -qq (the machine's own pip configuration may warn about its mirrors) and apt's
# chatter goes to a log that is shown only when apt fails.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1

SUDO=""
if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
need_apt=()
command -v dot >/dev/null 2>&1 || need_apt+=(graphviz)
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)  # the Redis store tests start their own
# the run-report test opens simulate --report's page in headless Chromium
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
# the SGLang oracle (scripts/sglang_env.sh) JIT-builds SGLang's page-hash extension;
# the project's own native page-hash chain (setup.py) is C
command -v g++ >/dev/null 2>&1 || need_apt+=(g++)
command -v gcc >/dev/null 2>&1 || need_apt+=(gcc)
[ -e /usr/include/openssl/sha.h ] || need_apt+=(libssl-dev)

if [ ${#need_apt[@]} -gt 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt_log=$(mktemp)
    if ! { $SUDO apt-get update -qq \
        && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"; } \
        >"$apt_log" 2>&1; then
        cat "$apt_log" >&2
        exit 1
    fi
    rm -f "$apt_log"
fi

PY="${PYTHON:-python3}"
# Exact versions (constraints.txt, written by scripts/lock.sh). torch first: its CPU
# build lies on local disk, so nothing pulls a CUDA build.
"$PY" -m pip install -qq -c constraints.txt "torch==2.13.0"
"$PY" -m pip install -qq -c constraints.txt -e ".[dev]"
# the native extensions (page-hash chain, live-page check, page copy) are optional for users (no
# compiler: the same answers from Python); here the tests require them
export UNICACHE_FSM_REQUIRE_NATIVE=1

# The SGLang oracle venv (scripts/sglang_env.sh: mostly downloads and one C++ build)
# is built or reused in the background while the checks below run; its log is shown
# once it is needed, in full if it failed.
oracle_log=$(mktemp)
PYTHONWARNINGS="ignore::DeprecationWarning,ignore::UserWarning" \
    setsid bash scripts/sglang_env.sh >"$oracle_log" 2>&1 &
oracle_pid=$!
# the vLLM venv (scripts/vllm_env.sh: downloads only), likewise, for tests/vllm
vllm_log=$(mktemp)
setsid bash scripts/vllm_env.sh >"$vllm_log" 2>&1 &
vllm_pid=$!
trap 'kill -- -"$oracle_pid" 2>/dev/null || true; kill -- -"$vllm_pid" 2>/dev/null || true' EXIT

bash scripts/core_check.sh  # `pip install unicache-fsm` without torch runs the engine, diagrams, check-trace
"$PY" -m ruff check .
"$PY" -m ruff format --check .
"$PY" -m mypy
# one pytest worker per core (pytest-xdist); PYTEST_WORKERS=0 runs in this process
"$PY" -m pytest -q -n "${PYTEST_WORKERS:-auto}" "$@"

if ! wait "$oracle_pid"; then
    cat "$oracle_log" >&2
    exit 1
fi
if ! wait "$vllm_pid"; then
    cat "$vllm_log" >&2
    exit 1
fi
trap - EXIT
cat "$oracle_log" "$vllm_log"
rm -f "$oracle_log" "$vllm_log"
# SGLang's vendored imports warn about their own deprecations; not ours to show
PYTHONWARNINGS="ignore::DeprecationWarning,ignore::UserWarning" bash scripts/conformance.sh -- -q -p no:warnings
# StoreLinker and ContractMonitor inside SGLang 0.5.23's real cache (tests/sglang_linker)
PYTHONWARNINGS="ignore::DeprecationWarning,ignore::UserWarning" bash scripts/sglang_integration.sh -q -p no:warnings
# the vLLM 0.33.0 offloading contract: monitor, differential suite, kit (tests/vllm)
PYTHONWARNINGS="ignore::DeprecationWarning,ignore::UserWarning" bash scripts/vllm_integration.sh -q -p no:warnings
