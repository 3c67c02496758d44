#!/usr/bin/env bash
# Regenerate docs/img/report.png, the README's picture of `simulate --report`: the
# quickstart's run, its page opened in headless Chromium (as tests/test_run_report.py
# opens it), the top of the page captured at 1280x1000. Needs chromium and the
# report extra (`pip install 'unicache-fsm[report]'`; the dev install has it).
set -euo pipefail
cd "$(dirname "$0")/.."
chrome=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$chrome" ]; then
    echo "report_screenshot.sh: no chromium binary (apt-get install chromium)" >&2
    exit 2
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python -m unicache_fsm simulate --requests 60 --pool-tokens 1376 --report "$work/report" >/dev/null
"$chrome" --headless --no-sandbox --disable-gpu --hide-scrollbars \
    --virtual-time-budget=15000 --window-size=1280,1000 \
    --screenshot="$work/report.png" "file://$work/report/index.html" 2>/dev/null
mkdir -p docs/img
cp "$work/report.png" docs/img/report.png
echo "docs/img/report.png"
