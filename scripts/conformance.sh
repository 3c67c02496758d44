#!/usr/bin/env bash
# The differential suite (tests/conformance) against SGLang 0.5.23, with the oracle
# venv's python (built or reused by scripts/sglang_env.sh; $SGLANG_VENV, default
# .venv-sglang). The main `pytest` run ignores tests/conformance.
#
#   scripts/conformance.sh [options] [-- pytest args]
#     --config NAMES    only these configurations (comma-separated, e.g. swa8-p4,full-p1)
#     --profile NAME    dev (30 sequences per configuration) | ci (200, default) | fuzz (3000)
#     --examples N      sequences per configuration, overriding the profile
#     --mutant PATCH    run the suite against a copy of this checkout with PATCH applied
#                       (git apply); exits 0 when the suite FAILS (mutant caught), 1 when
#                       it passes (mutant survived)
#     --cli ARGS...     run `python -m conformance ARGS` instead of pytest (run one
#                       configuration, replay a program, check the behaviour catalogue);
#                       after --mutant, against the mutant (`--cli census`: caught when
#                       any generated program diverges; no shrinking, so minutes faster)
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
export SGLANG_VENV="${SGLANG_VENV:-$REPO/.venv-sglang}"
MUTANT=""
CLI=0
while [ $# -gt 0 ]; do
    case "$1" in
        --config) export UNICACHE_CONFORMANCE_CONFIGS="$2"; shift 2 ;;
        --profile) export UNICACHE_FSM_PROFILE="$2"; shift 2 ;;
        --examples) export UNICACHE_CONFORMANCE_EXAMPLES="$2"; shift 2 ;;
        --mutant) MUTANT="$(realpath "$2")"; shift 2 ;;
        --cli) CLI=1; shift; break ;;
        --) shift; break ;;
        *) break ;;
    esac
done

bash "$REPO/scripts/sglang_env.sh" --quick
PY="$SGLANG_VENV/bin/python"

if [ -z "$MUTANT" ]; then
    if [ "$CLI" = 1 ]; then
        exec env PYTHONPATH="$REPO:$REPO/tests" "$PY" -m conformance "$@"
    fi
    exec "$PY" -m pytest tests/conformance "$@"
fi

# -- mutation check: the same suite against a mutated copy ----------------------------
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
git ls-files -co --exclude-standard -z | tar --null -cf - -T - | tar -xf - -C "$WORK"
(cd "$WORK" && git apply "$MUTANT")
echo "[conformance] mutant $(basename "$MUTANT") applied in $WORK"
set +e
if [ "$CLI" = 1 ]; then  # e.g. --cli census: exit 1 when any program diverges
    (cd "$WORK" && env PYTHONPATH="$WORK:$WORK/tests" "$PY" -m conformance "$@")
else
    (cd "$WORK" && "$PY" -m pytest tests/conformance -x -q "$@")
fi
rc=$?
set -e
if [ "$rc" = 1 ]; then
    echo "[conformance] mutant $(basename "$MUTANT") CAUGHT (the suite failed)"
    exit 0
elif [ "$rc" = 0 ]; then
    echo "[conformance] mutant $(basename "$MUTANT") SURVIVED (the suite passed)" >&2
    exit 1
fi
echo "[conformance] the suite could not run against the mutant (pytest exit $rc)" >&2
exit "$rc"
