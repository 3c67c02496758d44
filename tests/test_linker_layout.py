"""The linker package's split, read off its source (AST): `ExternalLinker` is composed of
one mixin per concept module over one state, so a private name (``self._x``) is a
module's own — a method or attribute two modules share has a public name. (The
package-wide layout test sees ``from m import _x`` and ``m._x``; it cannot see a mixin
calling another module's private method through ``self``.)
"""

from __future__ import annotations

import ast
from pathlib import Path

import unicache_fsm.linker
from unicache_fsm.linker import linker as linker_mod
from unicache_fsm.linker.linker import ExternalLinker
from unicache_fsm.linker.state import LinkerState

LINKER = Path(unicache_fsm.linker.__file__).resolve().parent
OWNERS = ("self", "linker")  # a mixin's receiver, a concept function's first argument


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def foreign_private_reads(source: str) -> list[str]:
    """Each ``self._x`` / ``linker._x`` read in `source` whose `_x` the module itself
    neither defines (a function, class or method) nor assigns (``self._x = ...``)."""
    tree = ast.parse(source)
    defined: set[str] = set()
    reads: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            defined.add(node.name)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in OWNERS
            and _private(node.attr)
        ):
            if isinstance(node.ctx, ast.Store):
                defined.add(node.attr)
            else:
                reads.append((node.lineno, f"{node.value.id}.{node.attr}"))
    return [f"line {n}: {r}" for n, r in reads if r.split(".", 1)[1] not in defined]


def test_the_checker_sees_a_method_of_another_module() -> None:
    # a landing module ending a load through the aborting module's private method
    mutant = (
        "class Landing:\n"
        "    def finish_loads(self):\n"
        "        self._abort(load, reason)\n"
        "        self._take_completions()\n"
        "    def _take_completions(self):\n"
        "        self._seen = linker._forget(load)\n"
        "        return self._seen\n"
    )
    assert foreign_private_reads(mutant) == ["line 3: self._abort", "line 6: linker._forget"]


def test_no_linker_module_reads_another_modules_private_names() -> None:
    sources = sorted(LINKER.glob("*.py"))
    assert {"linker.py", "state.py"} < {p.name for p in sources}
    offenders = {
        p.name: hits
        for p in sources
        if (hits := foreign_private_reads(p.read_text(encoding="utf-8")))
    }
    assert offenders == {}


def test_the_linker_is_composed_over_one_state() -> None:
    """Every base of `ExternalLinker` is a `LinkerState` defined in its own module of the
    package, and every method of the class resolves to one of them (none is a
    wrapper defined in `linker.py`)."""
    bases = [c for c in ExternalLinker.__mro__ if c not in (ExternalLinker, LinkerState, object)]
    assert bases and all(issubclass(c, LinkerState) for c in bases)
    modules = [c.__module__ for c in bases]
    assert len(set(modules)) == len(modules)
    assert all(m.startswith("unicache_fsm.linker.") for m in modules)
    own = {n for n in vars(ExternalLinker) if not n.startswith("__")}
    assert own == set()
    assert linker_mod.__all__ == ["ExternalLinker", "LinkerConfig", "LinkerMatch", "LinkerStats"]
