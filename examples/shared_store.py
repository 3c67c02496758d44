"""Two serving instances share one external store: the second loads what the first computed.

Run ``python examples/shared_store.py``. For each shared backend — a file store in a
fresh directory, and Redis (a real ``redis-server`` started on a free loopback port,
when it is installed) — two separate ``unicache-fsm simulate`` processes serve the same
workload one after the other, pointed at the same store:

1. the first starts from an empty store: it computes every prefix and offloads it;
2. the second starts with an empty device cache, so every prefix it does not compute
   itself comes from the store, that is, from what the first process computed. It
   reports external hits, and every load it commits is verified against recomputing
   the same KV (``loads_verified``; ``loads_mismatched`` must be 0).

Exit status 0 when both backends behave so (Redis is skipped, and said so, without a
``redis-server`` on PATH). ``--requests N`` sets the workload size (default 80).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from unicache_fsm.testing import RedisServer

FIELDS = ("requests_served", "external_hit_rate", "loads_committed", "loads_verified")


def simulate(store: str, requests: int) -> dict[str, Any]:
    """Run one ``unicache-fsm simulate`` process on `store`; its JSON report."""
    command = [sys.executable, "-m", "unicache_fsm", "simulate", "--store", store]
    command += ["--requests", str(requests), "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"simulate --store {store} failed: {done.stderr.strip()}")
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def share(label: str, store: str, requests: int) -> bool:
    """Two processes on one store; True when the second loads what the first computed."""
    first = simulate(store, requests)
    second = simulate(store, requests)
    print(f"{label}: --store {store}")
    for name, report in (("first ", first), ("second", second)):
        figures = ", ".join(f"{field} {report[field]}" for field in FIELDS)
        print(f"  {name} process: {figures}, loads_mismatched {report['loads_mismatched']}")
    ok = bool(
        first["external_hit_rate"] == 0
        and second["external_hit_rate"] > 0
        and second["loads_verified"] == second["loads_committed"] > 0
        and first["loads_mismatched"] == second["loads_mismatched"] == 0
        and first["requests_served"] == second["requests_served"] == requests
    )
    verdict = "shared" if ok else "NOT shared as expected"
    print(
        f"  {verdict}: the second process loaded {second['loads_committed']} prefixes only "
        f"the first computed, every one equal to recompute: {second['loads_mismatched'] == 0}"
    )
    return ok


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=80)
    args = parser.parse_args(argv)
    ok = True
    with tempfile.TemporaryDirectory(prefix="unicache-shared-") as directory:
        ok &= share("file store", f"file:{directory}", args.requests)
    if shutil.which("redis-server") is not None:
        with RedisServer() as server:
            ok &= share("Redis store", server.url, args.requests)
    else:
        print("Redis store: skipped (redis-server is not installed)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
