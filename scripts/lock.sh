#!/usr/bin/env bash
# Re-pin the dev environment: resolve the project's dependencies (with the dev extra)
# in a throw-away virtualenv and write every installed version to constraints.txt.
#
# Why a pip constraints file: pip is the only installer the test command needs (it
# takes torch from the machine's local CPU build), and `pip install -c constraints.txt`
# makes it install exactly these versions, transitive ones included, while
# pyproject.toml keeps the ranges a user's own environment may satisfy. Upgrading a pin
# is this script plus a deliberate commit of its diff; nothing upgrades behind CI's back.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" -m venv "$tmp/venv"
export PIP_DISABLE_PIP_VERSION_CHECK=1
"$tmp/venv/bin/pip" install -qq "torch==2.13.0"
"$tmp/venv/bin/pip" install -qq -e ".[dev]"
{
    echo "# Exact versions of everything the test command installs (scripts/lock.sh writes this;"
    echo "# regenerate deliberately and commit the diff). Used as: pip install -c constraints.txt"
    "$tmp/venv/bin/pip" freeze --exclude-editable \
        | sed -e 's/^torch==\([0-9.]*\)+cpu$/torch==\1/' \
        | LC_ALL=C sort -f
} > constraints.txt
echo "wrote constraints.txt ($(grep -vc '^#' constraints.txt) pins)"
