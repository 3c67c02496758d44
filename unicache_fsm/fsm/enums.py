"""Enums generated from specs: a machine's states and triggers declared once, in its TOML.

Code fires triggers and compares states through ``str`` enums, never free strings. Those
enums are not written by hand: this module writes them as Python source from the specs,
``unicache-fsm docs`` writes that source into the package (so mypy and editors see every
member), and a test fails while a committed module differs from what it would write.

- `member_name(name)` — the rule that names a member: the last dotted segment of the
  spec's name, upper-cased (``prepared.queued`` -> ``QUEUED``, ``load_back`` ->
  ``LOAD_BACK``). The member's value is the spec's name itself.
- `MachineEnums(machine, triggers, states=None)` — the enum classes one machine gets: a
  trigger enum (every trigger, in declaration order) and, optionally, a state enum
  (every configuration, in document order: what a record's state slot holds). Only a
  machine whose configurations are single states can have a state enum (not a parallel
  one: its configurations are combinations, read through precomputed sets instead).
- `EnumModule(path, summary, machines)` — one generated module: its path inside the
  package, the first line of its docstring and the machines whose enums it holds.
- `BUNDLED_ENUM_MODULE` — this package's generated module, ``unicache_fsm/spec_enums.py``:
  the enums of every bundled machine. It imports nothing of ours (any layer may import
  it); the module that uses an enum imports it from there and re-exports it.
- `enum_module_source(module, specs)` — the module's source: deterministic (the same
  specs give the same bytes), ruff-format clean, headed by a comment saying it is
  generated and by which command; each member carries the spec's description as its
  docstring (a trigger's lists its transitions).
- `enum_sources(specs_dir, package_dir)` — (path, source) of the bundled module, from
  the ``<machine>.toml`` files in `specs_dir`; `stale_enum_modules` — those whose file
  differs (or is missing).

Bad input raises `InvalidSpecError` naming the machine (or module) and the culprits, and
nothing is written: a spec file that is missing or malformed, two names that give one
member name (``go`` and ``Go``), a name that gives a private member (``_x``), a state
enum asked of a machine whose configurations are not single states, a module path
outside the package, enum class names that are no identifier or repeat.
"""

from __future__ import annotations

import json
import keyword
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import attrs

from unicache_fsm.fsm.errors import InvalidSpecError, SpecProblem
from unicache_fsm.fsm.flat import flatten
from unicache_fsm.fsm.loader import load_spec
from unicache_fsm.fsm.spec import ANY_STATE, MachineSpec, StateKind

__all__ = [
    "BUNDLED_ENUM_MODULE",
    "GENERATED_BY",
    "PACKAGE_DIR",
    "EnumModule",
    "MachineEnums",
    "enum_module_source",
    "enum_sources",
    "member_name",
    "stale_enum_modules",
]

#: The command that writes the generated modules (named in their header).
GENERATED_BY = "unicache-fsm docs"

#: The folder of the ``unicache_fsm`` package (where the bundled modules are written).
PACKAGE_DIR = Path(__file__).resolve().parents[1]

LINE_LENGTH = 100  # the project's ruff line length
INDENT = "    "


@attrs.frozen
class MachineEnums:
    """The enum classes one machine gets: `triggers` always, `states` when not None."""

    machine: str
    triggers: str
    states: str | None = None


@attrs.frozen
class EnumModule:
    """One generated module: `path` inside the package (``"spec_enums.py"``), the
    first line of its docstring, and the machines whose enums it holds, in that order."""

    path: str
    summary: str
    machines: tuple[MachineEnums, ...]


#: The package's generated module: every bundled machine's enums, machines sorted by name.
#: It imports nothing of ours, so every layer may import it; the module that uses an enum
#: imports it from there and re-exports it.
BUNDLED_ENUM_MODULE = EnumModule(
    "spec_enums.py",
    "The states and triggers of every bundled machine, generated from its spec.",
    (
        MachineEnums("load_transaction", "LoadTrigger", "LoadState"),
        MachineEnums("node_residency", "ResidencyTrigger"),
        MachineEnums("offload", "OffloadTrigger", "OffloadState"),
        MachineEnums("sglang_linker", "SglangLinkerTrigger", "SglangLinkerState"),
        MachineEnums("sglang_load", "SglangLoadTrigger", "SglangLoadState"),
        MachineEnums("sglang_offload", "SglangOffloadTrigger", "SglangOffloadState"),
        MachineEnums("store_load", "StoreLoadTrigger", "StoreLoadState"),
        MachineEnums("store_offload", "StoreOffloadTrigger", "StoreOffloadState"),
        MachineEnums("vllm_block", "BlockTrigger", "BlockState"),
        MachineEnums("vllm_manager", "ManagerTrigger", "ManagerState"),
        MachineEnums("vllm_request", "RequestTrigger", "RequestState"),
        MachineEnums("vllm_transfer", "TransferTrigger", "TransferState"),
    ),
)

_CONTRACT = (
    "Each enum names exactly what its spec declares: a trigger enum every trigger, in "
    "declaration order; a state enum every configuration (what a record's state slot "
    "holds), in document order. A member's value is the spec's name (``str`` enums: they "
    "compare equal to the names the executors use), its name that name's last dotted "
    "segment upper-cased (``prepared.queued`` -> ``QUEUED``), its docstring the spec's "
    "description. Import them from the module that uses them (it re-exports them)."
)


def member_name(name: str) -> str:
    """The member name of a spec's state path or trigger (see the module docstring)."""
    return name.rpartition(".")[2].upper()


def _members(spec: MachineSpec, names: Sequence[str], what: str) -> list[str]:
    """`names` as member names, refusing clashes and private names."""
    by_member: dict[str, list[str]] = {}
    for name in names:
        by_member.setdefault(member_name(name), []).append(name)
    clashes = [" and ".join(v) for v in by_member.values() if len(v) > 1]
    private = [n for n in names if member_name(n).startswith("_")]
    problems = []
    if clashes:
        problems.append(SpecProblem(f"{what} names that give one enum member name", clashes))
    if private:
        problems.append(SpecProblem(f"{what} names that give a private enum member", private))
    if problems:
        raise InvalidSpecError(spec.name, spec.source, problems)
    return [member_name(n) for n in names]


def _state_paths(spec: MachineSpec) -> list[str]:
    """The configurations of `spec`, in document order, when each is one state (refused
    before any is enumerated when parallel regions make them combinations)."""
    if any(s.kind is StateKind.PARALLEL for s in (spec.root, *spec.states())):
        kind = "state enum of configurations that are not single states"
        raise InvalidSpecError(spec.name, spec.source, [SpecProblem(kind, [spec.name])])
    configs = set(flatten(spec).configs)
    return [s.path for s in spec.states() if s.path in configs]


def _doc_text(text: str) -> str:
    """`text` on one line, safe inside a triple-quoted docstring: backslashes doubled,
    characters that are not printable ASCII escaped (ruff refuses look-alikes of ASCII in
    docstrings), quotes escaped where they would close it."""
    text = " ".join(text.split()).replace("\\", "\\\\")
    text = "".join(c if c.isascii() and c.isprintable() else ascii(c)[1:-1] for c in text)
    # a quote followed by a quote, or by the closing quotes, is escaped: no run of three
    return "".join(
        '\\"' if c == '"' and text[i + 1 : i + 2] in ('"', "") else c for i, c in enumerate(text)
    )


def _docstring(paragraphs: Iterable[str], indent: str, *, blank: bool = True) -> list[str]:
    """A docstring of `paragraphs` wrapped at `indent`, a blank line between two (without
    `blank`: none, and each paragraph's next lines indented two more spaces); no lines
    when there is no text."""
    lines: list[str] = []
    for text in paragraphs:
        wrapped = textwrap.wrap(
            _doc_text(text),
            width=LINE_LENGTH - len(indent) - 6,  # room for both quotes
            subsequent_indent="" if blank else "  ",
            break_long_words=False,
            break_on_hyphens=False,
        )
        if wrapped:
            lines += [*([""] if lines and blank else []), *(indent + line for line in wrapped)]
    if not lines:
        return []
    lines[0] = indent + '"""' + lines[0][len(indent) :]
    lines[-1] += '"""'
    return lines


def _trigger_doc(spec: MachineSpec, trigger: str) -> list[str]:
    out = []
    for t in spec.transitions:
        if t.trigger == trigger:
            sources = "any state" if t.sources == (ANY_STATE,) else ", ".join(t.sources)
            arrow = f"{sources} -> {t.dest}"
            out.append(f"{arrow}: {t.description}" if t.description else arrow)
    return out


def _enum_class(name: str, doc: str, members: list[tuple[str, str, list[str]]]) -> list[str]:
    lines = [f"class {name}(str, enum.Enum):", *_docstring([doc], INDENT)]
    lines += [""] if members else []
    for member, value, paragraphs in members:
        lines.append(f"{INDENT}{member} = {json.dumps(value)}")
        lines += _docstring(paragraphs, INDENT, blank=False)
    return lines


def _machine_classes(spec: MachineSpec, enums: MachineEnums) -> list[list[str]]:
    triggers = spec.triggers()
    members = zip(_members(spec, triggers, "trigger"), triggers, strict=True)
    doc = f"The triggers of the `{spec.name}` machine, in declaration order."
    classes = [
        _enum_class(enums.triggers, doc, [(m, t, _trigger_doc(spec, t)) for m, t in members])
    ]
    if enums.states is not None:
        paths = _state_paths(spec)
        states = zip(_members(spec, paths, "state"), paths, strict=True)
        descriptions = {s.path: s.description for s in spec.states()}
        doc = f"The configurations of the `{spec.name}` machine (a record's state slot)."
        classes.append(
            _enum_class(enums.states, doc, [(m, p, [descriptions[p]]) for m, p in states])
        )
    return classes


def _check_module(module: EnumModule) -> None:
    """Refuse a `module` whose path is not a ``.py`` file inside the package, or whose
    enum class names are no identifiers or repeat."""
    names = [n for m in module.machines for n in (m.triggers, m.states) if n is not None]
    path = Path(module.path)
    outside = path.is_absolute() or ".." in path.parts or path.suffix != ".py"
    found = {
        "enum module path that is no .py file inside the package": [module.path] if outside else [],
        "enum class names that are no identifier": [
            n for n in names if not n.isidentifier() or keyword.iskeyword(n)
        ],
        "enum class names given twice": sorted({n for n in names if names.count(n) > 1}),
    }
    problems = [SpecProblem(kind, culprits) for kind, culprits in found.items() if culprits]
    if problems:
        raise InvalidSpecError(module.path, module.path, problems)


def enum_module_source(module: EnumModule, specs: Mapping[str, MachineSpec]) -> str:
    """The Python source of `module`, from `specs` (machine name -> its spec)."""
    _check_module(module)
    for m in module.machines:
        spec = specs.get(m.machine)
        if spec is None or spec.name != m.machine:
            found = "none" if spec is None else f"machine {spec.name!r}"
            problem = SpecProblem("no spec for a generated enum", [f"{m.machine}: {found}"])
            raise InvalidSpecError(m.machine, "" if spec is None else spec.source, [problem])
    files = ", ".join(f"specs/{m.machine}.toml" for m in module.machines)
    header = (
        f"Generated from {files} by `{GENERATED_BY}`: do not edit. Edit the specs, then run "
        f"`{GENERATED_BY}` (tests/test_spec_enums.py fails while this file differs from "
        "what it writes)."
    )
    lines = ["# " + line for line in textwrap.wrap(header, width=LINE_LENGTH - 2)]
    lines += _docstring([module.summary, _CONTRACT], "")
    lines += ["", "import enum"]  # every class is public: no `__all__` to restate them
    for m in module.machines:
        for cls in _machine_classes(specs[m.machine], m):
            lines += ["", "", *cls]
    return "\n".join(lines) + "\n"


def enum_sources(
    specs_dir: Path,
    package_dir: Path = PACKAGE_DIR,
    modules: Sequence[EnumModule] = (BUNDLED_ENUM_MODULE,),
) -> list[tuple[Path, str]]:
    """(target path, source) of each of `modules`, read from the ``<machine>.toml`` files
    in `specs_dir` and placed under `package_dir`. Every spec is read and every module
    rendered before this returns, so a caller that writes afterwards never half-writes."""
    specs: dict[str, MachineSpec] = {}
    for module in modules:
        for m in module.machines:
            path = specs_dir / f"{m.machine}.toml"
            if not path.is_file():
                problem = SpecProblem("no spec file for a generated enum", [str(path)])
                raise InvalidSpecError(m.machine, str(path), [problem])
            specs[m.machine] = load_spec(path)
    return [(package_dir / module.path, enum_module_source(module, specs)) for module in modules]


def stale_enum_modules(
    specs_dir: Path,
    package_dir: Path = PACKAGE_DIR,
    modules: Sequence[EnumModule] = (BUNDLED_ENUM_MODULE,),
) -> list[tuple[Path, str]]:
    """The (path, source) pairs of `enum_sources` whose file is missing or differs."""
    return [
        (path, text)
        for path, text in enum_sources(specs_dir, package_dir, modules)
        if not path.is_file() or path.read_bytes() != text.encode("utf-8")
    ]
