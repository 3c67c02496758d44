"""Every README block marked runnable runs and succeeds, and the quickstart prints what
the README says it prints.

A block is runnable when its info string is ``bash runnable`` or ``python runnable``
(the set-up commands, and blocks that need SGLang or a GPU, are not marked). Each runs
in a fresh working directory; a ``text output`` block right after one lists lines its
standard output must contain, each verbatim.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"^```([^\n]*)\n(.*?)^```\n", re.M | re.S)


def runnable_blocks() -> list[tuple[str, str, list[str]]]:
    """(language, code, expected output lines) of each runnable block, in order."""
    blocks = BLOCK.findall(README.read_text(encoding="utf-8"))
    found = []
    for i, (info, code) in enumerate(blocks):
        words = info.split()
        if words[1:] != ["runnable"]:
            continue
        nxt = blocks[i + 1] if i + 1 < len(blocks) else ("", "")
        expected = nxt[1].splitlines() if nxt[0].split() == ["text", "output"] else []
        found.append((words[0], code, expected))
    return found


def test_the_readme_marks_the_quickstart_and_the_examples_runnable() -> None:
    blocks = runnable_blocks()
    assert [lang for lang, _, _ in blocks] == ["bash", "python", "python"]
    assert "unicache-fsm simulate" in blocks[0][1] and blocks[0][2], "quickstart output"


@pytest.mark.parametrize("index", range(len(runnable_blocks())))
def test_a_runnable_block_runs(index: int, tmp_path: Path) -> None:
    lang, code, expected = runnable_blocks()[index]
    command = ["bash", "-euo", "pipefail", "-c", code] if lang == "bash" else [sys.executable]
    done = subprocess.run(
        command,
        input=None if lang == "bash" else code,
        cwd=tmp_path,
        env={"PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin", "COLUMNS": "100"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line.rstrip() for line in done.stdout.splitlines()]
    for line in expected:
        assert line.rstrip() in lines, f"{line!r} not printed:\n{done.stdout}"
