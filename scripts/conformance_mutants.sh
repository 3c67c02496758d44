#!/usr/bin/env bash
# The mutation check of the differential suite: each patch in tests/conformance/mutants/
# reverts one of SGLang 0.5.23's behaviours (issue 11, 1-8) in a copy of this checkout;
# a census of generated programs (every configuration, no shrinking) must diverge from
# SGLang on each. Prints one line per mutant; exits 1 when any mutant survives.
#
#   scripts/conformance_mutants.sh [--examples N] [PATCH...]   # default: all, 200 each
set -euo pipefail
cd "$(dirname "$0")/.."
EXAMPLES=200
if [ "${1:-}" = "--examples" ]; then EXAMPLES="$2"; shift 2; fi
PATCHES=("$@")
[ ${#PATCHES[@]} -gt 0 ] || PATCHES=(tests/conformance/mutants/*.patch)
survived=0
summary=()
for patch in "${PATCHES[@]}"; do
    name="$(basename "$patch" .patch)"
    log="$(mktemp)"
    if bash scripts/conformance.sh --mutant "$patch" --cli census --examples "$EXAMPLES" >"$log" 2>&1; then
        verdict="caught"
    else
        verdict="SURVIVED"
        survived=1
    fi
    diverged="$(awk '/agree; ops/ {split($2, a, "/"); bad += a[2] - a[1]; all += a[2]} END {printf "%d/%d programs diverge", bad, all}' "$log")"
    summary+=("$(printf '%-40s %-9s %s' "$name" "$verdict" "$diverged")")
    echo "${summary[-1]}"
    [ "$verdict" = caught ] || tail -40 "$log" >&2
    rm -f "$log"
done
exit "$survived"
