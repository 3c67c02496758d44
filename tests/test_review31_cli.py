"""Review of issue 31, the CLI: ``diagram -o`` is checked like every other output
before anything is drawn, so a FIFO (which would block the run forever), a device or a
directory under the output's name gets exit 2 and one line naming ``-o``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from unicache_fsm.cli import EXIT_BAD_INPUT, main


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    code = main(argv)
    err = capsys.readouterr().err.splitlines()
    assert code == EXIT_BAD_INPUT
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("fmt", ["mermaid", "dot"])
def test_diagram_refuses_a_device_as_output(capsys: pytest.CaptureFixture[str], fmt: str) -> None:
    line = _refused(capsys, ["diagram", "offload", "-f", fmt, "-o", "/dev/full"])
    assert "-o '/dev/full'" in line
    assert "not a regular file" in line


def test_diagram_refuses_a_directory_as_one_text_output(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    line = _refused(capsys, ["diagram", "offload", "-o", str(tmp_path)])
    assert f"-o {str(tmp_path)!r} is a directory" in line
    assert list(tmp_path.iterdir()) == []


def _run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    """The CLI as its own process: a run that blocks on a FIFO fails the test by its
    timeout instead of hanging the suite."""
    return subprocess.run(
        [sys.executable, "-m", "unicache_fsm", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _assert_refused(done: subprocess.CompletedProcess[str], fifo: Path) -> None:
    assert done.returncode == EXIT_BAD_INPUT, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, lines
    assert f"-o {str(fifo)!r} exists and is not a regular file" in lines[0]
    assert fifo.is_fifo()  # untouched


def test_diagram_refuses_a_fifo_as_output(tmp_path: Path) -> None:
    fifo = tmp_path / "offload.mmd"
    os.mkfifo(fifo)
    _assert_refused(_run_cli("diagram", "offload", "-o", str(fifo)), fifo)


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz draws the images")
def test_diagram_refuses_a_fifo_among_the_images_of_a_folder(tmp_path: Path) -> None:
    """Several machines into a folder: one image's name taken by a FIFO refuses the
    run before any image is written."""
    fifo = tmp_path / "offload.svg"
    os.mkfifo(fifo)
    _assert_refused(_run_cli("diagram", "-f", "svg", "-o", str(tmp_path)), fifo)
    assert [p.name for p in tmp_path.iterdir()] == ["offload.svg"]
