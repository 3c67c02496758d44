"""A KV-cache command on a core-only install (no torch, NumPy, Hypothesis, xxhash) says in
one line which extra to install, instead of a traceback; the engine's commands still run.

The core install itself is exercised by scripts/core_check.sh in a fresh virtualenv; here
the missing modules are hidden from a subprocess (``sys.modules[name] = None`` makes their
import raise `ModuleNotFoundError`, as an absent package does)."""

from __future__ import annotations

import subprocess
import sys

import pytest

HIDE = "import sys\nfor m in {mods!r}: sys.modules[m] = None\n"
RUN = "from unicache_fsm.cli import main\nsys.exit(main({argv!r}))\n"


def _run(mods: list[str], argv: list[str]) -> subprocess.CompletedProcess[str]:
    code = HIDE.format(mods=mods) + RUN.format(argv=argv)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


KV = ["torch", "numpy", "hypothesis", "xxhash"]


@pytest.mark.parametrize(
    ("command", "missing"),
    [
        (["simulate", "--requests", "2"], ["torch"]),
        (["simulate", "--requests", "2"], KV),
        (["fuzz", "--minutes", "0.01"], KV),
    ],
)
def test_kv_command_without_the_kv_extra_is_one_line(
    command: list[str], missing: list[str]
) -> None:
    done = _run(missing, command)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "unicache-fsm[kv]" in lines[0]
    assert any(f"({m} is not installed)" in lines[0] for m in missing), lines[0]
    assert "Traceback" not in done.stderr


def test_engine_commands_run_without_torch() -> None:
    done = _run(KV, ["diagram", "offload"])
    assert done.returncode == 0, done.stderr
    assert "stateDiagram" in done.stdout
