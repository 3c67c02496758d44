"""One command-line style (issue 34): defaults in every ``--help``, the SWA window in
tokens everywhere, rich summaries and quiet progress off a terminal, which limit ended
an exploration, diagram images of several machines in one folder of their own."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from unicache_fsm.cli import COMMANDS, main

TINY = ["explore", "--pages", "2", "--requests", "1", "--key-pages", "1", "--workers", "1"]


class _Recording(argparse.ArgumentParser):
    """A parser that keeps every action it is given (the public `add_argument` result)."""

    def __init__(self) -> None:
        self.recorded: list[argparse.Action] = []
        super().__init__(add_help=False)

    def add_argument(self, *args, **kwargs):  # type: ignore[no-untyped-def,override]
        action = super().add_argument(*args, **kwargs)
        self.recorded.append(action)
        return action


def _help_of(text: str, flag: str) -> str:
    """The help paragraph of `flag` in a ``--help`` output, on one line."""
    lines = text.splitlines()
    start = next(
        i for i, line in enumerate(lines) if re.match(rf"\s+(?:-\w(?: \S+)?, )?{flag}\b", line)
    )
    end = next(
        (i for i in range(start + 1, len(lines)) if lines[i].strip().startswith("-")), len(lines)
    )
    return " ".join(" ".join(lines[start:end]).split())


@pytest.mark.parametrize("command", [c for c in COMMANDS], ids=lambda c: c.name)
def test_every_option_with_a_default_states_it_in_help(
    command: object, capsys: pytest.CaptureFixture[str]
) -> None:
    recorder = _Recording()
    command.add_arguments(recorder)  # type: ignore[attr-defined]
    assert main([command.name, "--help"]) == 0  # type: ignore[attr-defined]
    text = capsys.readouterr().out
    for action in recorder.recorded:
        if not action.option_strings or isinstance(action.default, bool):
            continue
        flag = action.option_strings[-1]
        assert "default" in _help_of(text, flag), (command.name, flag)  # type: ignore[attr-defined]


def test_simulate_help_shows_page_size_and_seed_defaults(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["simulate", "--help"]) == 0
    text = capsys.readouterr().out
    assert "default 16" in _help_of(text, "--page-size")
    assert "0 (default)" in _help_of(text, "--seed")
    assert "default: compiled" in _help_of(text, "--executor")


# -- the SWA window in tokens ----------------------------------------------------------


def test_explore_swa_window_is_tokens_and_must_be_whole_pages(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([*TINY, "--page-size", "2", "--swa-window", "3", "--depth", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--swa-window 3 is in tokens" in err and "use 2 or 4" in err
    assert main([*TINY, "--page-size", "4", "--swa-window", "1", "--depth", "1"]) == 2
    assert "use 4" in capsys.readouterr().err
    assert main([*TINY, "--page-size", "2", "--swa-window", "4", "--depth", "1"]) == 0
    assert "FULL+SWA (window 2 pages)" in capsys.readouterr().out  # 4 tokens = 2 pages
    assert main([*TINY, "--page-size", "2", "--depth", "1"]) == 0  # default: one page
    assert "FULL+SWA (window 1 pages)" in capsys.readouterr().out
    assert main([*TINY, "--page-size", "1", "--swa-window", "65", "--depth", "1"]) == 2
    assert "at most 64 pages" in capsys.readouterr().err


# -- explore says which limit ended it -------------------------------------------------


def test_explore_names_the_limit_that_stopped_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*TINY, "--swa-window", "0", "--faults", "none", "--depth", "3"]) == 0
    out, err = capsys.readouterr()
    assert re.search(r"^result\s+depth limit 3 reached", out, re.M), out
    assert "depth or time" not in out
    assert err.splitlines() == [err.strip()] and "depth 3 of 3" in err  # one plain line

    assert main([*TINY, "--swa-window", "0", "--faults", "none", "--minutes", "0.0001"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^result\s+time limit 0\.006 s reached", out, re.M), out

    assert main([*TINY, "--swa-window", "0", "--faults", "none"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^result\s+exhausted: every reachable state checked", out, re.M), out
    assert re.search(r"^states\s+\d+ distinct", out, re.M)


# -- rich output, plain off a terminal -------------------------------------------------


def test_fuzz_prints_an_aligned_summary_and_one_progress_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["fuzz", "--minutes", "0.01", "--page-size", "1", "--swa", "off", "--seed", "3"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    rows = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in out.splitlines())
    assert set(rows) == {"runs", "coverage", "result"}, out
    assert "(seed 3;" in rows["runs"] and rows["result"] == "no invariant broken"
    assert "\x1b[" not in out + err  # no terminal codes in a log
    assert len(err.splitlines()) == 1 and err.startswith("fuzzing (seconds):")


def test_check_trace_output_in_a_pipe_is_plain(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    assert main(["simulate", "--requests", "5", "--no-warm-up", "--trace", str(trace)]) == 0
    done = subprocess.run(
        [sys.executable, "-m", "unicache_fsm", "check-trace", str(trace)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # progress only on a terminal; the result says the count
    assert re.search(r"^result\s+\d+ records, \d+ models: every step is legal$", done.stdout, re.M)
    assert "\x1b[" not in done.stdout


# -- diagram images ----------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("dot") is None, reason="needs Graphviz")
def test_images_of_every_machine_go_into_one_new_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["diagram", "--format", "svg"]) == 0
    written = capsys.readouterr().out.split()
    assert [p.name for p in tmp_path.iterdir()] == ["unicache-fsm-diagrams"]
    assert len(written) > 1
    assert all(Path(p).parent == Path("unicache-fsm-diagrams") for p in written)
    assert all((tmp_path / p).is_file() for p in written)


def test_table_cells_and_summaries_are_text_not_markup(capsys: pytest.CaptureFixture[str]) -> None:
    from unicache_fsm.console import print_summary, print_table

    print_table(None, ["setting", "value"], [("store", "file:/runs/[bold]a[/bold]")])
    print_summary([("trace", "/tmp/[red]t[/red].jsonl")])
    out = capsys.readouterr().out
    assert "file:/runs/[bold]a[/bold]" in out and "/tmp/[red]t[/red].jsonl" in out
