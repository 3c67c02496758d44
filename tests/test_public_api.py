"""The front door: what `import unicache_fsm` offers, and the error hierarchy.

- `unicache_fsm.__all__` is the public namespace, locked here: a name added or removed
  by accident fails this test (update `PUBLIC` on purpose).
- Every name resolves lazily; importing the package (or the CLI) imports no torch.
- Every exception class the package defines (private ones aside) derives from
  `UnicacheFsmError`, and the hierarchy drawn in `unicache_fsm.fsm.errors`' docstring is
  exactly the one the code defines.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys

import pytest

import unicache_fsm
from unicache_fsm.fsm import errors

PUBLIC = [
    "CompiledExecutor",
    "DiagramFormat",
    "EvictParams",
    "Executor",
    "ExternalLinker",
    "ExternalStore",
    "FileStore",
    "GuardRejectedError",
    "IllegalTransitionError",
    "InsertParams",
    "KVPool",
    "LinkerConfig",
    "MachineBuilder",
    "MemoryStore",
    "PagedAllocator",
    "PoolName",
    "RadixTree",
    "RedisStore",
    "ReferenceExecutor",
    "SWAAllocator",
    "SingleRank",
    "System",
    "TraceRecorder",
    "TreeConfig",
    "UnicacheFsmError",
    "__version__",
    "bundled_machines",
    "bundled_spec",
    "check_trace",
    "load_spec",
    "open_store",
    "parse_spec",
    "read_trace",
    "render_image",
    "render_mermaid",
    "spec_lookup",
]


def test_the_public_namespace_is_locked() -> None:
    assert unicache_fsm.__all__ == PUBLIC  # the exact list: an addition is deliberate
    for name in unicache_fsm.__all__:
        assert getattr(unicache_fsm, name) is not None, name
    assert dir(unicache_fsm) == PUBLIC  # no Any, TYPE_CHECKING, importlib


def test_the_kit_namespace_lists_what_it_exports() -> None:
    import unicache_fsm.testing as kit

    assert dir(kit) == sorted(kit.__all__)
    for name in ("StoreMachine", "SystemMachine", "check_store", "RedisServer"):
        assert getattr(kit, name) is not None, name


@pytest.mark.parametrize(
    "name",
    [
        "PoolName",
        "parse_spec",
        "render_mermaid",
        "render_image",
        "DiagramFormat",
        "IllegalTransitionError",
        "System",
        "check_trace",
        "TraceRecorder",
    ],
)
def test_the_names_the_docs_use_come_from_the_front_door(name: str) -> None:
    assert name in unicache_fsm.__all__
    assert getattr(unicache_fsm, name) is not None


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        unicache_fsm.Nope  # noqa: B018


def test_the_front_door_names_the_classes_of_the_subpackages() -> None:
    from unicache_fsm.linker.linker import ExternalLinker
    from unicache_fsm.store import MemoryStore
    from unicache_fsm.tree import RadixTree

    assert unicache_fsm.ExternalLinker is ExternalLinker
    assert unicache_fsm.RadixTree is RadixTree
    assert unicache_fsm.MemoryStore is MemoryStore


@pytest.mark.parametrize(
    "code",
    [
        "import unicache_fsm",
        "import unicache_fsm.cli",
        "from unicache_fsm import UnicacheFsmError, load_spec, CompiledExecutor",
    ],
)
def test_importing_the_package_imports_no_torch(code: str) -> None:
    probe = f"import sys\n{code}\nprint('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def _package_errors(unimportable: list[str] | None = None) -> dict[str, type[BaseException]]:
    """Every public exception class of the package, by name; the modules that could not
    be imported here (optional integrations whose engine is absent) go to `unimportable`."""
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(unicache_fsm.__path__, "unicache_fsm."):
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # an optional integration whose engine is not installed
            assert ".integrations." in info.name, info.name
            if unimportable is not None:
                unimportable.append(info.name)
            continue
        for name, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and obj.__module__ == module.__name__
                and not name.startswith("_")
            ):
                found[name] = obj
    return found


def render_hierarchy(classes: dict[str, type[BaseException]]) -> list[str]:
    """The tree under `UnicacheFsmError`, two spaces per level, children sorted, each
    line ``Name (module)``."""
    lines: list[str] = []

    def walk(cls: type[BaseException], depth: int) -> None:
        lines.append(f"{'  ' * depth}{cls.__name__} ({cls.__module__})")
        children = [c for c in classes.values() if cls in c.__bases__]
        for child in sorted(children, key=lambda c: c.__name__):
            walk(child, depth + 1)

    walk(errors.UnicacheFsmError, 0)
    return lines


def test_every_error_of_the_package_derives_from_the_root() -> None:
    classes = _package_errors()
    assert len(classes) > 40
    strays = sorted(n for n, c in classes.items() if not issubclass(c, errors.UnicacheFsmError))
    assert strays == []


def test_the_errors_docstring_draws_the_whole_hierarchy() -> None:
    """With or without the optional engines: the classes of an integration that cannot
    be imported here are left out of the comparison (they must be leaves)."""
    absent: list[str] = []
    drawn = render_hierarchy(_package_errors(absent))
    doc = errors.__doc__ or ""
    block = doc.split("```text\n", 1)[1].split("```", 1)[0].splitlines()

    def importable(line: str) -> bool:
        module = line.rsplit("(", 1)[-1].rstrip(")")
        return not any(module == a or module.startswith(f"{a}.") for a in absent)

    assert [line for line in block if importable(line)] == drawn, "\n".join(drawn)
