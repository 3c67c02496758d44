"""The repository documents itself: links resolve inside it, and every test that
`docs/deviations.md` names as pinning a deviation exists."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

from unicache_fsm.fsm import loader

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


SPEC_FORMAT = ROOT / "docs" / "spec-format.md"


def _documented_keys(section: str) -> set[str]:
    text = SPEC_FORMAT.read_text(encoding="utf-8")
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(\w+)` \|", body, re.M))


@pytest.mark.parametrize(
    ("section", "keys"),
    [
        ("Machine keys", loader.MACHINE_KEYS),
        ("State keys", loader.STATE_KEYS),
        ("Transition keys", loader.TRANSITION_KEYS),
    ],
)
def test_the_spec_format_documents_exactly_the_keys_the_loader_accepts(
    section: str, keys: frozenset[str]
) -> None:
    assert _documented_keys(section) == set(keys)


def test_the_spec_format_documents_every_kind_of_spec_problem() -> None:
    sources = [ROOT / "unicache_fsm" / "fsm" / f for f in ("validate.py", "loader.py")]
    kinds = {
        kind
        for source in sources
        for kind in re.findall(
            r'(?:add|SpecProblem)\(\s*"([^"{]+)"', source.read_text(encoding="utf-8")
        )
    }
    assert {"unreachable state", "toml syntax", "initial that is not a child"} <= kinds
    validation = SPEC_FORMAT.read_text(encoding="utf-8").split("\n## Validation\n", 1)[1]
    quoted = re.findall(r"`([^`]+)`", validation.split("\n## ", 1)[0])
    documented = {" ".join(q.split()) for q in quoted}
    assert kinds - {"unknown machine", "no spec files"} <= documented


@pytest.mark.parametrize(
    "source", sorted((ROOT / "unicache_fsm").rglob("*.py")), ids=lambda p: p.name
)
def test_a_class_docstring_states_its_contract_instead_of_pointing_away(source: Path) -> None:
    for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ClassDef):
            doc = ast.get_docstring(node) or ""
            assert not doc.startswith("See the module docstring"), f"{source.name}: {node.name}"
