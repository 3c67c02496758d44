#!/usr/bin/env bash
# The core install, as a user of the engine alone gets it: `pip install unicache-fsm`
# (no extra) in a fresh virtualenv, which must bring neither torch nor NumPy,
# Hypothesis or xxhash; then, from outside the checkout (so the installed package
# runs, not the source tree), the engine's own examples (a TCP connection, an order
# workflow), a diagram of a user spec and `check-trace` of a user machine's trace.
# Called by scripts/test.sh; exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
PY="${PYTHON:-python3}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export PIP_DISABLE_PIP_VERSION_CHECK=1
"$PY" -m venv "$tmp/venv"
# the native extensions serve the KV-cache hot paths only: not built here
UNICACHE_FSM_NO_NATIVE=1 "$tmp/venv/bin/pip" install -qq -c constraints.txt "$root"
py="$tmp/venv/bin/python"
cli="$tmp/venv/bin/unicache-fsm"
cd "$tmp"
"$py" - <<'EOF'
import importlib.util
import sys

heavy = [m for m in ("torch", "numpy", "hypothesis", "xxhash") if importlib.util.find_spec(m)]
if heavy:
    sys.exit(f"core_check: the core install pulled in {', '.join(heavy)}")
import unicache_fsm

unicache_fsm.CompiledExecutor  # the engine from the front door, loaded lazily
EOF
"$py" "$root/examples/tcp.py" --trace "$tmp/tcp.jsonl" >/dev/null
"$py" "$root/examples/order.py" >/dev/null
"$cli" diagram "$root/examples/order.toml" | grep -q "stateDiagram"
"$cli" check-trace "$tmp/tcp.jsonl" --spec "$root/examples/tcp.toml" >/dev/null
# a KV-cache command on the core install: exit 2 and one line naming the extra
rc=0
"$cli" simulate --requests 2 >/dev/null 2>"$tmp/kv.err" || rc=$?
if [ "$rc" != 2 ] || [ "$(wc -l <"$tmp/kv.err")" != 1 ] || ! grep -q "unicache-fsm\[kv\]" "$tmp/kv.err"; then
    echo "core_check: simulate on the core install did not ask for the kv extra (exit $rc):" >&2
    cat "$tmp/kv.err" >&2
    exit 1
fi
echo "core_check: the core install (no torch, NumPy, Hypothesis, xxhash) runs the engine"
