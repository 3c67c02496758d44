"""Run every benchmark (or the named ones) and print their tables.

Usage: ``python benchmarks/run.py [--quick] [NAME ...]`` where NAME is a module
``benchmarks/bench_NAME.py`` (``dispatch``, ``pools``, ...). Each benchmark prints
ratios against baselines measured in the same process; nothing here asserts timings.

With ``tree`` among them, the side-by-side comparison with SGLang 0.5.23
(``bench_tree.py --vs-sglang``) runs too, under the differential suite's venv
(``$SGLANG_VENV``, default ``.venv-sglang``, built by ``scripts/sglang_env.sh``) with this
checkout on ``PYTHONPATH``; without that venv it is skipped, and the run says so.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def sglang_python() -> Path | None:
    """The oracle venv's python, or None when that venv is not there."""
    venv = Path(os.environ.get("SGLANG_VENV", REPO / ".venv-sglang"))
    py = venv / "bin" / "python"
    return py if py.exists() else None


def run_vs_sglang(quick: bool) -> int:
    """`bench_tree.py --vs-sglang` under the oracle venv's python, or a skip note."""
    py = sglang_python()
    print("== tree vs SGLang ==")
    if py is None:
        print(
            "skipped: no SGLang oracle venv ($SGLANG_VENV or .venv-sglang; build it with "
            "scripts/sglang_env.sh)"
        )
        print()
        return 0
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path)
    cmd = [str(py), "-W", "ignore", str(HERE / "bench_tree.py"), "--vs-sglang"]
    done = subprocess.run([*cmd, *(["--quick"] if quick else [])], env=env, check=False)
    print()
    return done.returncode


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
    if "tree" in names:
        sys.stdout.flush()
        status |= run_vs_sglang(args.quick)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
