"""Run every benchmark (or the named ones) and print their tables.

Usage: ``python benchmarks/run.py [--quick] [NAME ...]`` where NAME is a module
``benchmarks/bench_NAME.py`` (``dispatch``, ``pools``, ...). Each benchmark prints
ratios against baselines measured in the same process; nothing here asserts timings.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def available() -> list[str]:
    return sorted(p.stem.removeprefix("bench_") for p in HERE.glob("bench_*.py"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run unicache_fsm benchmarks.")
    parser.add_argument("names", nargs="*", help=f"subset of: {', '.join(available())}")
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    args = parser.parse_args(argv)
    names = args.names or available()
    unknown = sorted(set(names) - set(available()))
    if unknown:
        print(f"run.py: error: unknown benchmark(s) {unknown}; known: {available()}")
        return 2
    status = 0
    for name in names:
        path = HERE / f"bench_{name}.py"
        spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        print(f"== {name} ==")
        status |= module.main(["--quick"] if args.quick else [])
        print()
    return status


if __name__ == "__main__":
    raise SystemExit(main())
