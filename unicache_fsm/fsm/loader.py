"""Spec files: TOML text to a validated `MachineSpec`, and the bundled specs.

Primitives:

- `parse_spec(text, source)` — TOML text to a `MachineSpec`; raises `InvalidSpecError`
  listing every malformed field, unknown state and structural problem at once.
- `load_spec(path)` — the same for a file on disk.
- `load_specs(path)` — a spec file, or every ``*.toml`` of a directory (sorted by name).
- `bundled_spec(name)` — one of the machines that ship with the library (the
  ``specs/`` folder of the source tree, ``unicache_fsm/specs`` inside a wheel).
- `bundled_machines()` — the names of those machines, sorted.

The file format, every key and what it means when the machine runs, is
``docs/spec-format.md`` (a test holds its key tables equal to `MACHINE_KEYS`,
`STATE_KEYS` and `TRANSITION_KEYS`). In short, one machine per file::

    machine = "load_transaction"       # required: the machine's name
    initial = "idle"                   # required unless parallel = true
    [states.idle]                      # one table per state, in document order
    [states.prepared]
    [states.prepared.states.queued]    # children nest under `states`
    [[transitions]]
    trigger = "prepare"
    source = "idle"                    # a path, a list of paths, or "*"
    dest = "prepared.queued"
"""

from __future__ import annotations

import functools
import importlib.resources
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from unicache_fsm.fsm.errors import InvalidSpecError, SpecProblem
from unicache_fsm.fsm.spec import MAX_DEPTH, MachineSpec, StateKind, StateSpec, TransitionSpec
from unicache_fsm.fsm.validate import structural_problems

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

__all__ = [
    "MACHINE_KEYS",
    "STATE_KEYS",
    "TRANSITION_KEYS",
    "bundled_machines",
    "bundled_spec",
    "load_spec",
    "load_specs",
    "parse_spec",
    "specs_are_source",
    "specs_dir",
]

#: The keys a spec file may use, per table (``docs/spec-format.md`` documents each one;
#: a test keeps the two in step).
MACHINE_KEYS = frozenset(
    {"machine", "noun", "description", "initial", "parallel", "states", "transitions"}
)
STATE_KEYS = frozenset(
    {"initial", "final", "parallel", "on_enter", "on_exit", "description", "states"}
)
TRANSITION_KEYS = frozenset(
    {
        "trigger",
        "source",
        "dest",
        "conditions",
        "unless",
        "prepare",
        "before",
        "after",
        "requires",
        "description",
        "internal",
        "history",
    }
)
_NAME_LISTS = ("conditions", "unless", "prepare", "before", "after", "requires")


class _Collector:
    """Gathers malformed-field findings so that all are reported together."""

    def __init__(self) -> None:
        self.malformed: list[str] = []

    def str_field(self, where: str, table: Mapping[str, Any], key: str, default: str) -> str:
        value = table.get(key, default)
        if not isinstance(value, str):
            self.malformed.append(f"{where}.{key} (expected a string, got {value!r})")
            return default
        return value

    def bool_field(self, where: str, table: Mapping[str, Any], key: str) -> bool:
        value = table.get(key, False)
        if not isinstance(value, bool):
            self.malformed.append(f"{where}.{key} (expected true or false, got {value!r})")
            return False
        return value

    def names(self, where: str, table: Mapping[str, Any], key: str) -> tuple[str, ...]:
        value = table.get(key, [])
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.malformed.append(f"{where}.{key} (expected a list of names, got {value!r})")
            return ()
        return tuple(value)

    def unknown_keys(self, where: str, table: Mapping[str, Any], allowed: frozenset[str]) -> None:
        for key in table:
            if key not in allowed:
                self.malformed.append(f"{where}.{key} (unknown key; allowed: {sorted(allowed)})")


def _parse_state(c: _Collector, name: str, path: str, table: Any, depth: int = 1) -> StateSpec:
    where = f"states.{path}"
    if not isinstance(table, dict):
        c.malformed.append(f"{where} (expected a table, got {table!r})")
        return StateSpec(name=name, path=path)
    if depth > MAX_DEPTH:
        c.malformed.append(f"{where} (states nested deeper than {MAX_DEPTH} levels)")
        return StateSpec(name=name, path=path)
    c.unknown_keys(where, table, STATE_KEYS)
    sub = table.get("states", {})
    if not isinstance(sub, dict):
        c.malformed.append(f"{where}.states (expected a table of states)")
        sub = {}
    children = tuple(_parse_state(c, n, f"{path}.{n}", t, depth + 1) for n, t in sub.items())
    parallel = c.bool_field(where, table, "parallel")
    kind = StateKind.PARALLEL if parallel else StateKind.COMPOUND if children else StateKind.ATOMIC
    initial = table.get("initial")
    if initial is not None and not isinstance(initial, str):
        c.malformed.append(f"{where}.initial (expected a child state name, got {initial!r})")
        initial = None
    if kind is StateKind.COMPOUND and initial is None:
        initial = children[0].name  # the first child, as documented
    return StateSpec(
        name=name,
        path=path,
        kind=kind,
        children=children,
        initial=initial,
        final=c.bool_field(where, table, "final"),
        on_enter=c.names(where, table, "on_enter"),
        on_exit=c.names(where, table, "on_exit"),
        description=c.str_field(where, table, "description", ""),
    )


def _parse_transition(c: _Collector, i: int, table: Any) -> TransitionSpec | None:
    where = f"transitions[{i}]"
    if not isinstance(table, dict):
        c.malformed.append(f"{where} (expected a table, got {table!r})")
        return None
    c.unknown_keys(where, table, TRANSITION_KEYS)
    trigger = c.str_field(where, table, "trigger", "")
    dest = c.str_field(where, table, "dest", "")
    if not trigger:
        c.malformed.append(f"{where}.trigger (missing)")
    if not dest:
        c.malformed.append(f"{where}.dest (missing)")
    sources = c.names(where, table, "source")
    if not sources:
        c.malformed.append(f"{where}.source (missing)")
    lists = {k: c.names(where, table, k) for k in _NAME_LISTS}
    return TransitionSpec(
        trigger=trigger,
        sources=sources,
        dest=dest,
        index=i,
        description=c.str_field(where, table, "description", ""),
        internal=c.bool_field(where, table, "internal"),
        history=c.str_field(where, table, "history", ""),
        **lists,
    )


def parse_spec(text: str, source: str = "<string>") -> MachineSpec:
    """Parse and validate one machine spec written in TOML.

    Raises `InvalidSpecError` with every finding when the text is not valid TOML,
    has malformed fields, or describes a machine that `fsm.validate` rejects.
    """
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        problem = SpecProblem("toml syntax", [str(exc)])
        raise InvalidSpecError(Path(source).stem, source, [problem]) from None
    except RecursionError:  # inline tables or arrays nested beyond Python's stack
        problem = SpecProblem("toml syntax", ["values nested too deep to read"])
        raise InvalidSpecError(Path(source).stem, source, [problem]) from None
    c = _Collector()
    c.unknown_keys("machine", doc, MACHINE_KEYS)
    name = c.str_field("machine", doc, "machine", "")
    if not name:
        c.malformed.append("machine (missing: the machine's name)")
        name = Path(source).stem
    states = doc.get("states", {})
    if not isinstance(states, dict) or not states:
        c.malformed.append("states (missing: at least one [states.NAME] table)")
        states = {}
    children = tuple(_parse_state(c, n, n, t) for n, t in states.items())
    parallel = c.bool_field("machine", doc, "parallel")
    initial = doc.get("initial")
    if parallel:
        if initial is not None:
            c.malformed.append("initial (a parallel machine enters every region; remove it)")
        initial = None
    elif not isinstance(initial, str) or not initial:
        c.malformed.append("initial (missing: the name of the initial top-level state)")
        initial = children[0].name if children else None
    root = StateSpec(
        name="",
        path="",
        kind=StateKind.PARALLEL if parallel else StateKind.COMPOUND,
        children=children,
        initial=initial,
    )
    raw_transitions = doc.get("transitions", [])
    if not isinstance(raw_transitions, list):
        c.malformed.append("transitions (expected an array of [[transitions]] tables)")
        raw_transitions = []
    parsed = [_parse_transition(c, i, t) for i, t in enumerate(raw_transitions)]
    transitions = tuple(t for t in parsed if t is not None)
    spec = MachineSpec(
        name=name,
        root=root,
        transitions=transitions,
        noun=c.str_field("machine", doc, "noun", ""),
        description=c.str_field("machine", doc, "description", ""),
        source=source,
    )
    problems = [SpecProblem("malformed field", c.malformed)] if c.malformed else []
    problems.extend(structural_problems(spec))
    if problems:
        raise InvalidSpecError(name, source, problems)
    return spec


def load_spec(path: str | Path) -> MachineSpec:
    """Read, parse and validate a spec file (`InvalidSpecError` when it is not UTF-8,
    naming the line of the first bad byte)."""
    p = Path(path)
    data = p.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        problem = SpecProblem("not UTF-8", [f"line {line}: {exc.reason}"])
        raise InvalidSpecError(p.stem, str(p), [problem]) from None
    return parse_spec(text, str(p))


def load_specs(path: str | Path) -> list[MachineSpec]:
    """The spec at `path`, or every ``*.toml`` spec in the directory `path` (sorted).

    `InvalidSpecError` for the first invalid file, or for a directory without specs;
    `OSError` when `path` does not exist.
    """
    p = Path(path)
    if not p.is_dir():
        return [load_spec(p)]
    files = sorted(p.glob("*.toml"))
    if not files:
        problem = SpecProblem("no spec files", [f"no *.toml file in {str(p)!r}"])
        raise InvalidSpecError(p.name, str(p), [problem])
    return [load_spec(f) for f in files]


def specs_dir() -> Path:
    """Where the bundled spec files are: inside the installed package, else the source tree."""
    packaged = importlib.resources.files("unicache_fsm") / "specs"
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parents[2] / "specs"


def specs_are_source() -> bool:
    """Whether `specs_dir()` is the ``specs/`` folder of a source checkout (editable or
    plain), which `unicache-fsm docs` may rewrite, rather than a copy inside an installed
    package."""
    folder = specs_dir()
    return folder.name == "specs" and (folder.parent / "pyproject.toml").is_file()


def bundled_machines() -> tuple[str, ...]:
    """Names of the machines that ship with the library, sorted."""
    return tuple(sorted(p.stem for p in specs_dir().glob("*.toml")))


@functools.cache
def bundled_spec(name: str) -> MachineSpec:
    """One bundled machine by name (parsed once per process)."""
    path = specs_dir() / f"{name}.toml"
    if not path.is_file():
        known = ", ".join(bundled_machines())
        msg = f"no bundled machine {name!r}; known: {known}"
        raise InvalidSpecError(name, str(path), [SpecProblem("unknown machine", [msg])])
    return load_spec(path)
