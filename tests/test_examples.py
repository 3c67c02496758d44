"""Every example runs and succeeds, so the examples cannot rot; each imports only the
public namespace, the three jobs' examples stay short, and none leaves files behind.

- Imports (an AST walk over ``examples/*.py``): `unicache_fsm`, `unicache_fsm.testing`
  and the standard library; the SGLang example also SGLang itself, the torch its pools
  are made of, and `unicache_fsm.integrations.sglang`, the plug.
- The three jobs (embed the load machine in a loop, fuzz a store, draw and check a
  machine) are at most 15 logical lines of code each (statements as `tokenize` counts
  them; docstrings, comments and blank lines aside; a parenthesised import is one).
- Each job's script runs as a user runs it (a subprocess) in a fresh working directory
  with its own TMPDIR: both are empty afterwards.
"""

from __future__ import annotations

import ast
import importlib.util
import io
import json
import os
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

from redis_helpers import REDIS_SKIP
from unicache_fsm import cli, read_trace

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
JOBS = ("scheduler_loop", "fuzz_your_store", "draw_diagrams")
PUBLIC = {"unicache_fsm", "unicache_fsm.testing"}
PLUGS = {"sglang_external_cache": ("sglang", "torch", "unicache_fsm.integrations.sglang")}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found - {"__future__"}


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.py")), ids=lambda p: p.stem)
def test_an_example_imports_only_the_public_namespace(path: Path) -> None:
    plugs = PLUGS.get(path.stem, ())
    for name in _imports(path):
        top = name.split(".")[0]
        allowed = (
            name in PUBLIC
            or (top in sys.stdlib_module_names and top != "unicache_fsm")
            or any(name == p or name.startswith(p + ".") for p in plugs)
        )
        assert allowed, f"{path.name} imports {name}"


def code_lines(source: str) -> int:
    """Logical lines of code: NEWLINE tokens of statements that are not a docstring."""
    tree = ast.parse(source)
    docstrings = {
        body[0].lineno
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and (body := node.body)
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    }
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    lines = 0
    first: int | None = None
    for tok in tokens:
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.INDENT, tokenize.DEDENT):
            continue
        if tok.type == tokenize.NEWLINE:
            if first is not None and first not in docstrings:
                lines += 1
            first = None
        elif first is None and tok.type != tokenize.ENDMARKER:
            first = tok.start[0]
    return lines


def test_code_lines_counts_statements_not_docstrings_or_comments() -> None:
    source = '"""Doc."""\n\nimport sys  # c\n\n\ndef f():\n    """Doc."""\n    return (1,\n 2)\n'
    assert code_lines(source) == 3  # import, def, return


@pytest.mark.parametrize("name", JOBS)
def test_each_job_is_at_most_fifteen_lines_of_code(name: str) -> None:
    lines = code_lines((EXAMPLES / f"{name}.py").read_text(encoding="utf-8"))
    assert lines <= 15, f"{name}.py has {lines} lines of code"


def _run_clean(tmp_path: Path, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run an example in a fresh cwd and TMPDIR; both must be empty afterwards."""
    cwd, tmp = tmp_path / "cwd", tmp_path / "tmp"
    cwd.mkdir(parents=True)
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / f"{name}.py"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert list(cwd.iterdir()) == [] and list(tmp.iterdir()) == [], "left files behind"
    return done


def test_embed_example_loads_the_shared_prefix_back(tmp_path: Path) -> None:
    done = _run_clean(tmp_path, "scheduler_loop")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "request a: miss, 0 pages loaded so far",
        "request b: committed, 8 pages loaded so far",
    ]


def test_fuzz_example_catches_the_leak(tmp_path: Path) -> None:
    """The ``--leaky`` run (the passing run, 100 programs on each machine, takes ~16 s:
    `tests/test_testing_leaky_store.py` shows a correct store passing both machines)."""
    leaky = _run_clean(tmp_path, "fuzz_your_store", "--leaky")
    assert leaky.returncode == 1, leaky.stderr
    assert leaky.stdout.startswith("StoreMachine: contains(")
    assert "the test evicted it" in leaky.stdout


def test_draw_example_draws_refuses_and_checks(tmp_path: Path) -> None:
    done = _run_clean(tmp_path, "draw_diagrams")
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert out[0] == "stateDiagram-v2" and "    closed --> locked : lock" in out
    refused = [line for line in out if line.startswith("refused: cannot open door ")]
    assert len(refused) == 1 and refused[0].endswith("in state 'locked'; allowed: unlock")
    assert out[-1] == "the door is locked; 4 records, legal: True"


@pytest.mark.parametrize("name", ["tcp", "order"])
def test_an_example_without_a_trace_option_leaves_nothing(tmp_path: Path, name: str) -> None:
    done = _run_clean(tmp_path, name)
    assert done.returncode == 0, done.stderr


def test_the_sglang_example_without_sglang_is_one_line(tmp_path: Path) -> None:
    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("SGLang is importable here: tests/sglang_linker runs this example")
    done = _run_clean(tmp_path, "sglang_external_cache")
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("SglangUnavailableError: "), done.stderr
    assert "sglang_env.sh" in lines[0]


def _main(name: str) -> object:
    spec = importlib.util.spec_from_file_location(f"_example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


@REDIS_SKIP
def test_shared_store_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert _main("shared_store")(["--requests", "60"]) == 0  # type: ignore[operator]
    out = capsys.readouterr().out
    assert out.count("  shared: the second process loaded") == 2  # file and Redis
    assert "NOT shared" not in out


def test_tcp_example_trace_checks_and_a_teleport_is_caught(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace.jsonl"
    assert _main("tcp")(["--trace", str(trace)]) == 0  # type: ignore[operator]
    out = capsys.readouterr().out
    assert "guard 'ack_matches' rejected it" in out
    assert "server   done" in out and "client   done" in out
    spec = str(EXAMPLES / "tcp.toml")
    assert cli.main(["check-trace", "--spec", spec, str(trace)]) == 0
    assert "every step is legal" in capsys.readouterr().out
    # forge: the server, live in syn_received, is "initialized" straight into established
    records = list(read_trace(trace))
    i = next(i for i, r in enumerate(records) if r["dest"] == "syn_received")
    forged = {**records[i], "source": "", "trigger": "<init>", "dest": "established"}
    records.insert(i + 1, forged)
    for seq, record in enumerate(records, start=1):
        record["seq"] = seq
    bad = tmp_path / "teleport.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    assert cli.main(["check-trace", "--spec", spec, str(bad)]) == 1
    out = capsys.readouterr().out
    assert f"illegal step at record {i + 2}, seq {i + 2}" in out
    assert "'server' initialized again while live in 'syn_received'" in out


def test_order_example_runs_on_both_executors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "order.jsonl"
    assert _main("order")(["--trace", str(trace)]) == 0  # type: ignore[operator]
    out = capsys.readouterr().out
    assert "executors agree: True" in out
    assert "refused: guard 'payment_captured'" in out and "refund 99" in out
    assert cli.main(["check-trace", "--spec", str(EXAMPLES), str(trace)]) == 0
