"""Command line for someone iterating on the tree (run with the oracle venv's python and
``PYTHONPATH=<repo>:<repo>/tests``, or ``scripts/conformance.sh --cli ...``):

- ``census [--configs A,B] [--examples N] [--seed S]`` -- run N generated programs per
  configuration without shrinking; print how many agree and, for the others, which
  observable differed first.
- ``run CONFIG [--examples N] [--seed S]`` -- the differential test for one
  configuration, Hypothesis shrinking included; prints every distinct shrunk mismatch.
- ``behaviours`` -- issue 11's behaviours 1-9 (`behaviours.py`): agree or diverge.
- ``replay FILE`` -- run a program saved as printed by a mismatch report
  (``config = ...`` / ``program = (...)``) and print both sides' trace.
"""

from __future__ import annotations

import argparse
import collections
import logging
import sys
import time

from hypothesis import HealthCheck, Phase, given, seed, settings

from conformance import model
from conformance.behaviours import BEHAVIOURS
from conformance.harness import Divergence, OracleError, run_program
from conformance.model import CONFIGS, Config, Program, config_named
from conformance.project_side import ProjectSide
from conformance.sglang_side import SglangSide
from conformance.strategies import programs


def _generate(config: Config, n: int, at: int) -> list[Program]:
    """Up to `n` distinct programs (Hypothesis's generation repeats itself now and then)."""
    found: dict[Program, None] = {}

    @seed(at)
    @settings(
        max_examples=3 * n,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(programs(config))
    def collect(program: Program) -> None:
        if len(found) < n:
            found[program] = None

    collect()
    return list(found)


def census(configs: list[Config], n: int, at: int) -> int:
    total_bad = 0
    for config in configs:
        sglang, project = SglangSide(config), ProjectSide(config)
        kinds: collections.Counter[str] = collections.Counter()
        ops_ok = ops_all = 0
        started = time.perf_counter()
        progs = _generate(config, n, at)
        for program in progs:
            try:
                h = run_program(config, program, sglang, project)
                ops_ok += len(program)
                ops_all += len(program)
                kinds["agree" + (f" ({h.stopped_by})" if h.stopped_by else "")] += 1
            except Divergence as exc:
                kinds[exc.observable] += 1
                index = int(str(exc).split(" at op #")[1].split(" ")[0])
                ops_ok += index
                ops_all += len(program)
            except OracleError as exc:
                kinds["ORACLE ERROR"] += 1
                print(exc)
        agree = sum(v for k, v in kinds.items() if k.startswith("agree"))
        total_bad += len(progs) - agree
        took = time.perf_counter() - started
        print(
            f"{config.name:18} {agree:4}/{len(progs)} agree; ops agreeing up to the first "
            f"divergence {ops_ok}/{ops_all}; {took:.1f} s"
        )
        for kind, count in kinds.most_common():
            if not kind.startswith("agree") or "(" in kind:
                print(f"    {count:4}  {kind}")
    return 1 if total_bad else 0


def run_one(config: Config, n: int, at: int | None) -> int:
    sglang, project = SglangSide(config), ProjectSide(config)

    @settings(max_examples=n, deadline=None, suppress_health_check=list(HealthCheck))
    @given(programs(config))
    def compare(program: Program) -> None:
        run_program(config, program, sglang, project)

    if at is not None:
        compare = seed(at)(compare)
    try:
        compare()
    except BaseException as exc:  # an ExceptionGroup when several mismatches shrank
        for e in getattr(exc, "exceptions", [exc]):
            print("=" * 78)
            print(e)
        return 1
    print(f"{config.name}: {n} programs agree")
    return 0


def behaviours() -> int:
    bad = 0
    for b in BEHAVIOURS:
        config = config_named(b.config)
        try:
            run_program(config, b.program, SglangSide(config), ProjectSide(config))
            print(f"behaviour {b.number}: agree   ({b.title})")
        except Divergence as exc:
            bad += 1
            first = str(exc).splitlines()[:3]
            print(f"behaviour {b.number}: DIVERGE ({b.title})\n    " + "\n    ".join(first))
    return 1 if bad else 0


def replay(path: str) -> int:
    scope: dict[str, object] = {}
    exec("from conformance.model import *", scope)  # the printed program's names
    with open(path) as f:
        exec(f.read(), scope)
    config, program = scope["config"], scope["program"]
    assert isinstance(config, model.Config)
    try:
        h = run_program(config, program, SglangSide(config), ProjectSide(config))  # type: ignore[arg-type]
    except (Divergence, OracleError) as exc:
        print(exc)
        return 1
    print("\n".join(h.trace))
    print("agree" + (f" (stopped by {h.stopped_by})" if h.stopped_by else ""))
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.disable(logging.WARNING)
    parser = argparse.ArgumentParser(prog="python -m conformance")
    sub = parser.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("census")
    c.add_argument("--configs", default="")
    c.add_argument("--examples", type=int, default=200)
    c.add_argument("--seed", type=int, default=0)
    r = sub.add_parser("run")
    r.add_argument("config")
    r.add_argument("--examples", type=int, default=200)
    r.add_argument("--seed", type=int, default=None)
    sub.add_parser("behaviours")
    p = sub.add_parser("replay")
    p.add_argument("file")
    args = parser.parse_args(argv)
    if args.cmd == "census":
        names = [n for n in args.configs.split(",") if n]
        configs = [config_named(n) for n in names] if names else list(CONFIGS)
        return census(configs, args.examples, args.seed)
    if args.cmd == "run":
        return run_one(config_named(args.config), args.examples, args.seed)
    if args.cmd == "behaviours":
        return behaviours()
    return replay(args.file)


if __name__ == "__main__":
    sys.exit(main())
