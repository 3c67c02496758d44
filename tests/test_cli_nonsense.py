"""Nonsense on the command line: every subcommand refuses it before any work.

Each argument vector below is fed to `unicache_fsm.cli.main` in-process and must give
exit code 2, exactly one ``unicache-fsm: error:`` line on stderr naming the culprit,
no traceback, and nothing written: neither the working directory nor the folder of
input files (which also holds the named outputs) gains, loses or changes a file. A
handful run as ``python -m unicache_fsm``, where a crash of the process itself (a
segfault, a fork bomb, an allocation the size of the argument) must be ruled out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from unicache_fsm.cli import COMMANDS, EXIT_BAD_INPUT, main

SPEC = """
machine = "door"
initial = "closed"
[states.closed]
[states.open]
[[transitions]]
trigger = "open_it"
source = "closed"
dest = "open"
[[transitions]]
trigger = "close_it"
source = "open"
dest = "closed"
"""

DEEP = 100_000
DIGITS = "9" * 5000

# {F} is the folder of input files (built once, below), {T} a valid trace in it
VECTORS: list[tuple[list[str], str]] = [
    # -- the parser itself
    ([], "required: COMMAND"),
    (["frobnicate"], "invalid choice"),
    (["--bogus"], "COMMAND"),
    (["diagram", "--format"], "expected one argument"),
    # -- diagram
    (["diagram", "no_such_machine"], "unknown machine"),
    (["diagram", "{F}/missing.toml"], "no spec file"),
    (["diagram", "{F}/binary.toml"], "{F}/binary.toml): not UTF-8"),
    (["diagram", "{F}/deep.toml"], "nested too deep"),
    (["diagram", "{F}/empty.toml"], "invalid machine spec"),
    (["diagram", "{F}/fifo.toml"], "not a regular file"),
    (["diagram", "{F}/folder.toml"], "not a regular file"),
    (["diagram", "/dev/zero"], "no spec file"),
    (["diagram", "offload", "--format", "jpeg"], "invalid choice"),
    (["diagram", "offload", "--highlight", "nowhere"], "nowhere"),
    (["diagram", "--highlight", "queued"], "needs a MACHINE"),
    (["diagram", "offload", "--coverage", "{F}/deep.json"], "nested too deep"),
    (["diagram", "offload", "--coverage", "{F}/binary.toml"], "--coverage"),
    (["diagram", "offload", "--coverage", "{F}/digits.json"], "digits"),
    (["diagram", "offload", "--coverage", "{F}/missing.json"], "no such file"),
    (["diagram", "offload", "--coverage", "/dev/zero"], "not a regular file"),
    (["diagram", "offload", "--coverage", "{F}/fifo.toml"], "not a regular file"),
    (["diagram", "offload", "--coverage", ""], "--coverage must be a path"),
    (["diagram", "offload", "--coverage", "{F}/array.jsonl"], "coverage"),
    (["diagram", "offload", "-o", "{F}/file.txt/x.mmd"], "x.mmd"),
    (["diagram", "offload", "-o", "/proc/x.mmd"], "x.mmd"),
    (["diagram", "offload", "-o", "a\0b"], "--output must be a path"),
    (["diagram", "offload", "-o", "{F}"], "directory"),
    (["diagram", "offload", "--no-such-flag"], "unrecognized"),
    (["diagram", "offload", "extra"], "unrecognized"),
    (["diagram", "-f", "svg", "-o", "{F}/file.txt"], ""),
    # -- docs
    (["docs", "--specs-dir", "{F}/missing"], "not a directory"),
    (["docs", "--specs-dir", "{F}/file.txt"], "not a directory"),
    (["docs", "--specs-dir", "{F}/empty"], "no *.toml"),
    (["docs", "--specs-dir", "{F}/bad_specs"], "z.toml): not UTF-8"),
    (["docs", "--specs-dir", "{F}/deep_specs"], "nested too deep"),
    (["docs", "--specs-dir", "{F}/fifo_specs"], "not a regular file"),
    (["docs", "--specs-dir", "{F}/fifo_doc"], "a_door.md' exists and is not a regular file"),
    (["docs", "--specs-dir", ""], "--specs-dir must be a path"),
    (["docs", "--check", "extra"], "unrecognized"),
    # -- check-trace
    (["check-trace"], "required: FILE.jsonl"),
    (["check-trace", "{F}/missing.jsonl"], "no such file"),
    (["check-trace", "{F}/binary.toml"], "trace line 1: not JSON"),
    (["check-trace", "{F}/deep.json"], "nested too deep"),
    (["check-trace", "{F}/digits.jsonl"], "digits"),
    (["check-trace", "{F}/empty.toml"], "no trace records"),
    (["check-trace", "/dev/zero"], "not a regular file"),
    (["check-trace", "{F}/fifo.toml"], "not a regular file"),
    (["check-trace", "{F}/folder.toml"], "not a regular file"),
    (["check-trace", "{F}/array.jsonl"], "expected a JSON object"),
    (["check-trace", "{F}/stranger.jsonl"], "--spec"),
    (["check-trace", "--context", "-1", "{T}"], "--context must be 0 or more"),
    (["check-trace", "--context", "1e3", "{T}"], "--context"),
    (["check-trace", "--context", "99999999999", "{T}"], "at most"),
    (["check-trace", "--context", DIGITS, "{T}"], "--context"),
    (["check-trace", "--spec", "{F}/binary.toml", "{T}"], "not UTF-8"),
    (["check-trace", "--spec", "{F}/deep.toml", "{T}"], "nested too deep"),
    (["check-trace", "--spec", "{F}/missing.toml", "{T}"], "missing.toml"),
    (["check-trace", "--spec", "{F}/fifo_specs", "{T}"], "not a regular file"),
    (["check-trace", "--spec", "", "{T}"], "--spec must be a path"),
    # -- check-linker (refused before SGLang is looked for, so in any environment)
    (["check-linker"], "required: CONFIG_JSON_OR_@FILE"),
    (["check-linker", "{}", "--minutes", "nan"], "--minutes"),
    (["check-linker", "{}", "--minutes", "-0.5"], "--minutes"),
    (["check-linker", "{}", "--minutes", "inf"], "--minutes"),
    (["check-linker", "{}", "--minutes", "1e400"], "--minutes"),
    (["check-linker", "{}", "--seed", "-1"], "--seed"),
    (["check-linker", "{}", "--seed", DIGITS], "--seed"),
    (["check-linker", "{}", "--faults", "meteor"], "unknown fault kind"),
    (["check-linker", "{}", "--report", ""], "--report must be a path"),
    (["check-linker", "{}", "--report", "{F}/file.txt"], "is a file"),
    (["check-linker", "{}", "--report", "/proc/r"], "cannot be written"),
    (["check-linker", "@{F}/missing.json"], "no such file"),
    (["check-linker", "@{F}/fifo.toml"], "not a regular file"),
    # -- fuzz
    (["fuzz", "--minutes", "nan"], "--minutes"),
    (["fuzz", "--minutes", "inf"], "--minutes"),
    (["fuzz", "--minutes", "-inf"], "--minutes"),
    (["fuzz", "--minutes", "0"], "--minutes"),
    (["fuzz", "--minutes", "-1"], "--minutes"),
    (["fuzz", "--minutes", "1e400"], "--minutes"),
    (["fuzz", "--minutes", "1e-400"], "--minutes"),
    (["fuzz", "--minutes", "1441"], "at most 1440"),
    (["fuzz", "--minutes", "soon"], "--minutes"),
    (["fuzz", "--seed", "-1"], "--seed"),
    (["fuzz", "--seed", str(2**64)], "--seed"),
    (["fuzz", "--seed", "1.5"], "--seed"),
    (["fuzz", "--seed", "1", "--driver", "hypothesis"], "--seed drives the walk"),
    (["fuzz", "--page-size", "3"], "invalid choice"),
    (["fuzz", "--swa", "maybe"], "invalid choice"),
    (["fuzz", "--coverage", "{F}/missing/c.json"], "no folder"),
    (["fuzz", "--coverage", "{F}/folder.toml"], "not a regular file"),
    (["fuzz", "--coverage", "{F}/file.txt/c.json"], "no folder"),
    (["fuzz", "--coverage", "/proc/c.json"], "cannot be written"),
    # -- explore
    (["explore", "--pages", "0"], "--pages"),
    (["explore", "--pages", "1e9"], "--pages"),
    (["explore", "--pages", "1000000000"], "at most 64"),
    (["explore", "--pages", "nan"], "--pages"),
    (["explore", "--requests", "0"], "--requests"),
    (["explore", "--requests", "10"], "at most 9"),
    (["explore", "--page-size", "0"], "--page-size"),
    (["explore", "--page-size", "100000"], "--page-size"),
    (["explore", "--key-pages", "1000"], "--key-pages"),
    (["explore", "--swa-window", "-1"], "--swa-window"),
    (["explore", "--host-pages", "99999"], "--host-pages"),
    (["explore", "--store-pages", "-5"], "--store-pages"),
    (["explore", "--depth", "0"], "--depth"),
    (["explore", "--depth", "10000000"], "--depth"),
    (["explore", "--minutes", "nan"], "--minutes"),
    (["explore", "--minutes", "inf"], "--minutes"),
    (["explore", "--workers", "0"], "--workers"),
    (["explore", "--workers", "100000"], "at most 64"),
    (["explore", "--faults", "bogus"], "unknown fault kind"),
    (["explore", "--faults", "refuse_load,,"], "unknown fault kind"),
    (["explore", "--coverage", "{F}/missing/c.json"], "no folder"),
    (["explore", "--test-out", "{F}/file.txt/t.py"], "--test-out"),
    (["explore", "--test-out", "{F}/folder.toml"], "not a regular file"),
    # -- simulate
    (["simulate", "--requests", "0"], "--requests must be 1 or more"),
    (["simulate", "--requests", "1e9"], "--requests"),
    (["simulate", "--requests", "10000000"], "at most 1000000"),
    (["simulate", "--requests", DIGITS], "--requests"),
    (["simulate", "--page-size", "3"], "power of two"),
    (["simulate", "--page-size", "4096"], "--page-size"),
    (["simulate", "--pool-tokens", "1000000000000"], "--pool-tokens"),
    (["simulate", "--host-tokens", "-1"], "--host-tokens"),
    (["simulate", "--host-tokens", "3"], "--host-tokens"),
    (["simulate", "--swa-window", "0"], "--swa-window"),
    (["simulate", "--chunk-size", "0"], "--chunk-size"),
    (["simulate", "--chunk-size", "7"], "multiple of the page size"),
    (["simulate", "--pool-tokens", "100"], "too small for this workload"),
    (["simulate", "--torch-threads", "0"], "--torch-threads"),
    (["simulate", "--torch-threads", "1e12"], "--torch-threads"),
    (["simulate", "--torch-threads", "1000000000000"], "--torch-threads"),
    (["simulate", "--torch-threads", "100000"], "at most 256"),
    (["simulate", "--seed", "-1"], "--seed"),
    (["simulate", "--audit-every", "0"], "--audit-every"),
    (["simulate", "--workload", "nope"], "unknown workload"),
    (["simulate", "--faults", "bogus=1"], "bogus"),
    (["simulate", "--faults", "refuse_load=2"], "refuse_load"),
    (["simulate", "--faults", "refuse_load=nan"], "refuse_load"),
    (["simulate", "--executor", "nope"], "invalid choice"),
    (["simulate", "--store", "nope"], "--store 'nope'"),
    (["simulate", "--store", "file:"], "name the directory"),
    (["simulate", "--store", "file:{F}/file.txt"], "file.txt"),
    (["simulate", "--store", "file:/proc/x"], "/proc/x"),
    (["simulate", "--store", "file:{F}/not_a_store"], "not_a_store"),
    (["simulate", "--store", "file:{F}/nested_marker"], "nested_marker"),
    (["simulate", "--store", "redis://127.0.0.1:1"], "127.0.0.1:1"),
    (["simulate", "--store", "redis://localhost:port"], "redis://localhost:port"),
    (["simulate", "--report", "/proc/x"], "--report '/proc/x' cannot be written"),
    (["simulate", "--report", "{F}/file.txt"], "--report"),
    (["simulate", "--report", "{F}/file.txt/sub"], "under the file"),
    (["simulate", "--trace", "{F}/missing/t.jsonl"], "no folder"),
    (["simulate", "--trace", "{F}/folder.toml"], "not a regular file"),
    (["simulate", "--trace", "/proc/t.jsonl"], "cannot be written"),
    (["simulate", "--coverage", "{F}/missing/c.json"], "no folder"),
    (["simulate", "--trace", "{F}/t.jsonl", "--coverage", "/proc/c.json"], "--coverage"),
    (["simulate", "--json", "{F}/missing/s.json"], "no folder"),
    (["simulate", "--json", "{F}/folder.toml"], "not a regular file"),
    (["simulate", "--baseline", "{F}/missing.json"], "no such file"),
    (["simulate", "--baseline", "{F}/fifo.toml"], "not a regular file"),
    (["simulate", "--baseline", "{F}/deep.json"], "--baseline"),
    (["simulate", "--baseline", "{F}/digits.json"], "--baseline"),
    (["simulate", "--baseline", "{F}/binary.toml"], "not UTF-8"),
    (["simulate", "--baseline", "{F}/t.jsonl"], "lacks requests_served"),
    (["explore", "--page-size", "4", "--swa-window", "6"], "multiple of the page size 4"),
    (["explore", "--swa-window", "100000"], "--swa-window"),
]


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under `root`: size and modification time of each file."""
    out: dict[str, tuple[int, int]] = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        out[str(path.relative_to(root))] = (0, 0) if path.is_dir() else (st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of nonsense inputs (and of the outputs the vectors name)."""
    from unicache_fsm.store import FileStore
    from unicache_fsm.store.file import MARKER

    f = tmp_path_factory.mktemp("nonsense")
    (f / "binary.toml").write_bytes(bytes(range(256)))
    (f / "deep.toml").write_text("a = " + "[" * 2000 + "]" * 2000 + "\n")
    (f / "empty.toml").write_text("")
    (f / "deep.json").write_text("[" * DEEP + "]" * DEEP)
    (f / "digits.json").write_text('{"machines": {"offload": [["a", "b", "c", ' + DIGITS + "]]}}")
    (f / "digits.jsonl").write_text('{"seq": ' + DIGITS + "}\n")
    (f / "array.jsonl").write_text("[1, 2]\n")
    (f / "stranger.jsonl").write_text(
        json.dumps(
            {"seq": 1, "machine": "stranger", "model": "m", "source": "", "trigger": "<init>"}
            | {"dest": "x"}
        )
        + "\n"
    )
    (f / "t.jsonl").write_text(
        '{"seq": 1, "machine": "offload", "model": "m", "source": "", '
        '"trigger": "<init>", "dest": "queued"}\n'
    )
    (f / "file.txt").write_text("a file, not a folder\n")
    (f / "folder.toml").mkdir()
    os.mkfifo(f / "fifo.toml")
    (f / "empty").mkdir()
    for name, bad in (("bad_specs", "binary.toml"), ("deep_specs", "deep.toml")):
        (f / name).mkdir()
        (f / name / "a_door.toml").write_text(SPEC)  # valid, and its doc is stale
        (f / name / "z.toml").write_bytes((f / bad).read_bytes())
    (f / "fifo_specs").mkdir()
    (f / "fifo_specs" / "a_door.toml").write_text(SPEC)
    os.mkfifo(f / "fifo_specs" / "z.toml")
    (f / "fifo_doc").mkdir()
    (f / "fifo_doc" / "a_door.toml").write_text(SPEC)
    os.mkfifo(f / "fifo_doc" / "a_door.md")
    (f / "not_a_store").mkdir()
    (f / "not_a_store" / "notes.txt").write_text("mine\n")
    FileStore(f / "nested_marker").close()
    (f / "nested_marker" / MARKER).write_text("[" * DEEP + "]" * DEEP)
    return f


def _argv(template: list[str], inputs: Path) -> list[str]:
    return [a.replace("{F}", str(inputs)).replace("{T}", str(inputs / "t.jsonl")) for a in template]


def test_there_are_at_least_100_vectors_across_every_subcommand() -> None:
    assert len(VECTORS) >= 100
    named = {argv[0] for argv, _ in VECTORS if argv}
    assert {c.name for c in COMMANDS} <= named


@pytest.mark.parametrize(
    ("template", "needle"), VECTORS, ids=[" ".join(v)[:60] for v, _ in VECTORS]
)
def test_nonsense_is_one_line_exit_2_and_writes_nothing(
    template: list[str],
    needle: str,
    inputs: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    before = _tree(inputs)
    code = main(_argv(template, inputs))
    captured = capsys.readouterr()
    assert code == EXIT_BAD_INPUT, captured
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("unicache-fsm: error: "), lines[0]
    assert "Traceback" not in captured.err
    assert needle.replace("{F}", str(inputs)) in lines[0], lines[0]
    assert captured.out == ""
    assert list(tmp_path.iterdir()) == []
    assert _tree(inputs) == before


@pytest.mark.parametrize(
    "template",
    [
        ["simulate", "--torch-threads", "100000"],
        ["simulate", "--torch-threads", "1000000000000"],
        ["explore", "--workers", "100000"],
        ["explore", "--pages", "1000000000"],
    ],
    ids=lambda argv: " ".join(argv),
)
def test_the_process_itself_survives_nonsense(template: list[str], tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "unicache_fsm", *template],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert done.returncode == EXIT_BAD_INPUT, done  # a segfault is -11
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert template[1] in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_token_bound_is_the_simulations_pool_limit() -> None:
    from unicache_fsm.cli import MAX_TOKENS
    from unicache_fsm.scheduler.simulation import MAX_POOL_TOKENS

    assert MAX_TOKENS == MAX_POOL_TOKENS


def _help_of(text: str, flag: str) -> str:
    """The help paragraph of `flag` in a subcommand's ``--help`` output."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(flag + " "))
    end = next(
        (i for i in range(start + 1, len(lines)) if lines[i].strip().startswith("-")), len(lines)
    )
    return " ".join(" ".join(lines[start:end]).split())


@pytest.mark.parametrize(
    ("command", "flag", "bound"),
    [
        ("simulate", "--requests", "1000000"),
        ("simulate", "--page-size", "1024"),
        ("simulate", "--pool-tokens", "4194304"),
        ("simulate", "--host-tokens", "4194304"),
        ("simulate", "--swa-window", "4194304"),
        ("simulate", "--chunk-size", "4194304"),
        ("simulate", "--seed", "2**64-1"),
        ("simulate", "--torch-threads", "256"),
        ("simulate", "--audit-every", "1000000"),
        ("fuzz", "--minutes", "1440"),
        ("fuzz", "--seed", "2**64-1"),
        ("explore", "--pages", "64"),
        ("explore", "--requests", "9"),
        ("explore", "--page-size", "64"),
        ("explore", "--key-pages", "64"),
        ("explore", "--swa-window", "4096"),
        ("explore", "--host-pages", "64"),
        ("explore", "--store-pages", "64"),
        ("explore", "--depth", "1000000"),
        ("explore", "--minutes", "1440"),
        ("explore", "--workers", "64"),
        ("check-trace", "--context", "10000"),
    ],
)
def test_help_states_the_bound_of_every_numeric_argument(
    command: str, flag: str, bound: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([command, "--help"]) == 0
    assert bound in _help_of(capsys.readouterr().out, flag)
