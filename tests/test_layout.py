"""The package's layering rules, read off its source (AST), so a change that breaks one
fails here with the file and line.

- The tree core (``unicache_fsm/tree/`` outside ``tree/components/``) is
  component-generic: it names no specific component (no ``FULL`` / ``SWA`` /
  ``MAMBA``, no component class, no ``swa_enabled``) and imports no component module
  but ``components.base`` and the registry (``components/__init__``). What a component
  does lives in its own module.
- No module reaches another module's private names: no ``from unicache_fsm.x import
  _name`` and no ``module._name`` on an imported module of the package.
- One serving system: ``serving/`` imports neither the scheduler nor the kit, the
  scheduler does not import the kit, and both run the very same `System`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import unicache_fsm

PACKAGE = Path(unicache_fsm.__file__).resolve().parent
TREE = PACKAGE / "tree"
COMPONENT_NAMES = {
    "FULL",
    "SWA",
    "MAMBA",
    "swa_enabled",
    "FullComponent",
    "SwaComponent",
    "MambaComponent",
}


def _tree_core_files() -> list[Path]:
    return [p for p in sorted(TREE.rglob("*.py")) if "components" not in p.relative_to(TREE).parts]


def component_mentions(source: str) -> list[str]:
    """Each place in `source`'s code (not its docstrings) that names a component."""
    found = []
    for node in ast.walk(ast.parse(source)):
        name = None
        if isinstance(node, ast.Attribute):
            name = node.attr
        elif isinstance(node, ast.Name):
            name = node.id
        elif isinstance(node, ast.ImportFrom) and node.module:
            parts = node.module.split(".")
            inside = parts[:3] == ["unicache_fsm", "tree", "components"]
            if inside and parts[3:] not in ([], ["base"]):
                found.append(f"line {node.lineno}: imports {node.module}")
            name = next((a.name for a in node.names if a.name in COMPONENT_NAMES), None)
        if name in COMPONENT_NAMES:
            found.append(f"line {getattr(node, 'lineno', '?')}: {name}")
    return found


def test_the_checker_sees_a_component_name() -> None:
    assert component_mentions("x = ComponentType.SWA\n") == ["line 1: SWA"]
    assert component_mentions("from unicache_fsm.tree.components.swa import X\n") == [
        "line 1: imports unicache_fsm.tree.components.swa"
    ]
    assert component_mentions('"""SWA and FULL in prose are fine."""\n') == []


def test_the_tree_core_names_no_specific_component() -> None:
    files = _tree_core_files()
    assert len(files) >= 8, files  # walk, tree, locks, eviction, host, offload, state, audit...
    offenders = {
        str(p.relative_to(PACKAGE)): hits
        for p in files
        if (hits := component_mentions(p.read_text(encoding="utf-8")))
    }
    assert offenders == {}


def private_reaches(source: str) -> list[str]:
    """Each place in `source` that imports or reads another package module's `_name`."""
    found = []
    tree = ast.parse(source)
    modules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("unicache_fsm"):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"line {node.lineno}: imports {node.module}.{alias.name}")
                modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("unicache_fsm"):
                    modules.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
        ):
            found.append(f"line {node.lineno}: reads {node.value.id}.{node.attr}")
    return found


def test_the_private_name_checker_sees_a_reach() -> None:
    assert private_reaches("from unicache_fsm.tree.params import _as_key\n") == [
        "line 1: imports unicache_fsm.tree.params._as_key"
    ]
    assert private_reaches("from unicache_fsm.pools import kv\nkv._pages(1)\n") == [
        "line 2: reads kv._pages"
    ]
    assert private_reaches("import os\nos._exit(0)\nself._x = 1\n") == []


def test_no_module_reaches_another_modules_private_names() -> None:
    offenders = {
        str(p.relative_to(PACKAGE)): hits
        for p in sorted(PACKAGE.rglob("*.py"))
        if (hits := private_reaches(p.read_text(encoding="utf-8")))
    }
    assert offenders == {}


def package_imports(source: str) -> list[tuple[int, str]]:
    """(line, module) for each import of a module of the package in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("unicache_fsm"):
            found.append((node.lineno, node.module or ""))
        elif isinstance(node, ast.Import):
            ours = [a.name for a in node.names if a.name.startswith("unicache_fsm")]
            found += [(node.lineno, name) for name in ours]
    return found


def _imports_of(package: str, forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    return {
        str(p.relative_to(PACKAGE)): hits
        for p in sorted((PACKAGE / package).rglob("*.py"))
        if (
            hits := [
                f"line {line}: {module}"
                for line, module in package_imports(p.read_text(encoding="utf-8"))
                if module.startswith(forbidden)
            ]
        )
    }


def test_the_import_reader_sees_both_forms() -> None:
    source = "import unicache_fsm.scheduler\nfrom unicache_fsm.testing import System\nimport os\n"
    assert package_imports(source) == [(1, "unicache_fsm.scheduler"), (2, "unicache_fsm.testing")]


def test_the_serving_system_sits_below_the_scheduler_and_the_kit() -> None:
    above = ("unicache_fsm.scheduler", "unicache_fsm.testing", "unicache_fsm.cli")
    assert _imports_of("serving", above) == {}
    assert _imports_of("scheduler", ("unicache_fsm.testing",)) == {}
    assert _imports_of("testing", ("unicache_fsm.scheduler",)) == {}


def test_the_scheduler_and_the_kit_run_the_same_system() -> None:
    from unicache_fsm import serving, testing
    from unicache_fsm.scheduler import SimConfig, Simulation
    from unicache_fsm.testing import machines

    assert testing.System is serving.System is machines.System
    sim = Simulation(SimConfig(requests=1, pool_tokens=1024))
    try:
        assert type(sim.system) is serving.System
    finally:
        sim.store.close()
