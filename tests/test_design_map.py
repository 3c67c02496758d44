"""docs/design.md's package map stays true to the package.

- "Package map" names every module of `unicache_fsm/` once, and nothing that is not one;
- "Modules over 500 lines" names exactly the modules longer than 500 lines, each with a
  reason it stays whole.

The checks read the document as a reviewer does (the first column of each table) and
are shown to fail on a planted stale map.
"""

from __future__ import annotations

import re
from pathlib import Path

import unicache_fsm

PACKAGE = Path(unicache_fsm.__file__).resolve().parent
DESIGN = Path(__file__).resolve().parents[1] / "docs" / "design.md"
LIMIT = 500


def _section(text: str, title: str) -> str:
    """The body of the section headed `title` (up to the next heading of its level or
    higher)."""
    match = re.search(rf"^(#+) {re.escape(title)}\n", text, re.M)
    assert match, f"docs/design.md has no section {title!r}"
    level = len(match.group(1))
    rest = text[match.end() :]
    end = re.search(rf"^#{{1,{level}}} ", rest, re.M)
    return rest[: end.start()] if end else rest


def _first_column(section: str) -> list[tuple[str, str]]:
    """(path, rest of the row) of every table row whose first cell is one `path.py`."""
    rows = []
    for line in section.splitlines():
        m = re.match(r"^\| `([^`]+\.py)` \|(.*)\|\s*$", line)
        if m:
            rows.append((m.group(1), m.group(2).strip()))
    return rows


def _modules() -> dict[str, int]:
    return {
        f.relative_to(PACKAGE).as_posix(): len(f.read_text(encoding="utf-8").splitlines())
        for f in PACKAGE.rglob("*.py")
    }


def _map_problems(text: str, modules: dict[str, int]) -> list[str]:
    whole = _section(text, "Package map")
    big = _section(whole, "Modules over 500 lines")
    listed = [path for path, _ in _first_column(whole.replace(big, ""))]
    problems = [f"listed twice: {p}" for p in sorted({p for p in listed if listed.count(p) > 1})]
    problems += [f"missing from the map: {p}" for p in sorted(set(modules) - set(listed))]
    problems += [f"not a module: {p}" for p in sorted(set(listed) - set(modules))]
    named = dict(_first_column(big))
    over = {p for p, n in modules.items() if n > LIMIT}
    problems += [f"over {LIMIT} lines, not named: {p}" for p in sorted(over - set(named))]
    problems += [f"named, but not over {LIMIT} lines: {p}" for p in sorted(set(named) - over)]
    problems += [f"no reason given: {p}" for p, why in named.items() if len(why) < 20]
    return problems


def test_the_package_map_names_every_module_and_every_long_one() -> None:
    assert _map_problems(DESIGN.read_text(encoding="utf-8"), _modules()) == []


def test_a_stale_map_is_caught() -> None:
    text = DESIGN.read_text(encoding="utf-8")
    modules = _modules()
    grown = dict(modules, **{"tree/walk.py": LIMIT + 1})
    assert "over 500 lines, not named: tree/walk.py" in _map_problems(text, grown)
    added = dict(modules, **{"store/new_backend.py": 10})
    assert "missing from the map: store/new_backend.py" in _map_problems(text, added)
    gone = {k: v for k, v in modules.items() if k != "linker/matching.py"}
    assert "not a module: linker/matching.py" in _map_problems(text, gone)
    shrunk = dict(modules, **{"store/base.py": 100})
    assert "named, but not over 500 lines: store/base.py" in _map_problems(text, shrunk)
    no_reason = re.sub(r"(\| `store/base.py` \|)[^\n]*", r"\1 long |", text)
    assert "no reason given: store/base.py" in _map_problems(no_reason, modules)
