"""The repository documents itself: links resolve inside it, and every test that
`docs/deviations.md` names as pinning a deviation exists."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
PINNED_BY = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_relative_links_resolve_inside_the_repository(doc: Path) -> None:
    for target in LINK.findall(doc.read_text(encoding="utf-8")):
        if "://" in target or target.startswith("mailto:"):
            continue
        path = (doc.parent / target).resolve()
        assert path.is_relative_to(ROOT), f"{doc.name} links outside the repository: {target}"
        assert path.exists(), f"{doc.name} links to a missing path: {target}"


def test_no_tracked_file_refers_to_a_folder_beside_the_clone() -> None:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (an sdist): nothing to list")
    found = subprocess.run(
        ["git", "grep", "-n", "-F", "../" + "shared"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert found.returncode == 1, found.stdout  # 1: no match


def test_every_deviation_names_tests_that_exist() -> None:
    text = (ROOT / "docs" / "deviations.md").read_text(encoding="utf-8")
    sections = text.split("\n## ")[1:]
    assert sections, "docs/deviations.md lists no deviation"
    for section in sections:
        title = section.splitlines()[0]
        pins = PINNED_BY.findall(section)
        assert pins, f"deviation {title!r} names no test that pins it"
        for file, name in pins:
            source = (ROOT / file).read_text(encoding="utf-8")
            assert re.search(rf"^(async )?def {name}\(", source, re.M), f"{title}: {file}::{name}"
