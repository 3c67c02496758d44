"""States and triggers declared once: `unicache_fsm.spec_enums` is generated from the
specs (`unicache_fsm.fsm.enums`, written by ``unicache-fsm docs``) and must stay what the
generator writes now, so a spec that gains a state or a trigger fails here until the
module is regenerated. The modules that use the enums re-export the generated classes,
and no module of the package restates a spec's states or triggers by hand."""

from __future__ import annotations

import ast
import enum
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import unicache_fsm
from unicache_fsm import spec_enums
from unicache_fsm.fsm import loader
from unicache_fsm.fsm.enums import (
    BUNDLED_ENUM_MODULE,
    EnumModule,
    MachineEnums,
    enum_module_source,
    enum_sources,
    member_name,
    stale_enum_modules,
)
from unicache_fsm.fsm.errors import InvalidSpecError
from unicache_fsm.fsm.flat import flatten
from unicache_fsm.fsm.loader import parse_spec

PACKAGE = Path(unicache_fsm.__file__).resolve().parent
ROOT = PACKAGE.parent
GENERATED = PACKAGE / BUNDLED_ENUM_MODULE.path


def test_the_committed_module_is_what_the_generator_writes_now(tmp_path: Path) -> None:
    ((target, text),) = enum_sources(loader.specs_dir(), tmp_path)
    assert target == tmp_path / "spec_enums.py"
    assert GENERATED.read_text(encoding="utf-8") == text, "run `unicache-fsm docs`"
    assert stale_enum_modules(loader.specs_dir()) == []


def test_every_bundled_machine_has_its_enums_generated() -> None:
    machines = [m.machine for m in BUNDLED_ENUM_MODULE.machines]
    assert sorted(machines) == machines == list(loader.bundled_machines())


@pytest.mark.parametrize("enums", BUNDLED_ENUM_MODULE.machines, ids=lambda m: m.machine)
def test_each_enum_names_exactly_what_its_spec_declares(enums: MachineEnums) -> None:
    spec = loader.bundled_spec(enums.machine)
    triggers: type[enum.Enum] = getattr(spec_enums, enums.triggers)
    assert [m.value for m in triggers] == list(spec.triggers())
    mirrors = [triggers]
    if enums.states is not None:
        states: type[enum.Enum] = getattr(spec_enums, enums.states)
        leaves = [s.path for s in spec.states() if not s.children]  # in document order
        assert [m.value for m in states] == leaves
        assert sorted(leaves) == sorted(flatten(spec).configs)
        mirrors.append(states)
    for mirror in mirrors:
        assert issubclass(mirror, str)
        assert [m.name for m in mirror] == [member_name(m.value) for m in mirror]


def test_the_modules_that_use_an_enum_re_export_the_generated_class() -> None:
    from unicache_fsm.integrations import protocol
    from unicache_fsm.linker import load, offload
    from unicache_fsm.store import jobs
    from unicache_fsm.tree import residency

    users = {
        load: ["LoadState", "LoadTrigger"],
        offload: ["OffloadState", "OffloadTrigger"],
        jobs: ["StoreLoadState", "StoreLoadTrigger", "StoreOffloadState", "StoreOffloadTrigger"],
        residency: ["ResidencyTrigger"],
        protocol: [
            f"Sglang{m}{k}" for m in ("Linker", "Load", "Offload") for k in ("State", "Trigger")
        ],
    }
    for module, names in users.items():
        for name in names:
            assert name in module.__all__, (module.__name__, name)
            assert getattr(module, name) is getattr(spec_enums, name), (module.__name__, name)
    # vLLM's machines import only beside vLLM: their import of the generated enums is read
    machines = PACKAGE / "integrations" / "vllm" / "machines.py"
    imported = {
        a.name
        for node in ast.walk(ast.parse(machines.read_text(encoding="utf-8")))
        if isinstance(node, ast.ImportFrom) and node.module == "unicache_fsm.spec_enums"
        for a in node.names
    }
    assert imported == {
        f"{m}{k}" for m in ("Manager", "Block", "Request", "Transfer") for k in ("State", "Trigger")
    }


def hand_enums(source: str) -> dict[str, frozenset[str]]:
    """The string values of each enum class `source` defines."""
    found = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and any("Enum" in ast.unparse(b) for b in node.bases):
            found[node.name] = frozenset(
                s.value.value
                for s in node.body
                if isinstance(s, ast.Assign) and isinstance(s.value, ast.Constant)
                if isinstance(s.value.value, str)
            )
    return found


def test_the_restatement_reader_sees_a_hand_enum() -> None:
    source = 'import enum\nclass T(str, enum.Enum):\n    A = "a"\n    B = "b"\n'
    assert hand_enums(source) == {"T": frozenset({"a", "b"})}


def test_no_module_restates_a_spec_by_hand() -> None:
    declared = {}
    for machine in loader.bundled_machines():
        spec = loader.bundled_spec(machine)
        declared[frozenset(spec.triggers())] = f"{machine} triggers"
        declared[frozenset(flatten(spec).configs)] = f"{machine} configurations"
    restated = {
        f"{path.relative_to(PACKAGE)}: {name}": declared[values]
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != GENERATED and "Enum" in (text := path.read_text(encoding="utf-8"))
        for name, values in hand_enums(text).items()
        if values in declared
    }
    assert restated == {}


# -- a planted drift -----------------------------------------------------------------------

EXTRA_TRIGGER = """
[[transitions]]
trigger = "zap"
source = "queued"
dest = "failed"
description = "A planted trigger."
"""

EXTRA_STATE = """
[states.parked]
description = "A planted state."

[[transitions]]
trigger = "park"
source = "queued"
dest = "parked"

[[transitions]]
trigger = "abandon"
source = "parked"
dest = "failed"
"""


@pytest.mark.parametrize(
    ("spec", "planted", "member"),
    [
        (
            "offload",
            EXTRA_TRIGGER,
            '    ZAP = "zap"\n    """queued -> failed: A planted trigger."""',
        ),
        ("store_load", EXTRA_STATE, '    PARKED = "parked"\n    """A planted state."""'),
    ],
)
def test_a_spec_that_gains_a_trigger_or_state_makes_the_module_stale(
    tmp_path: Path, spec: str, planted: str, member: str
) -> None:
    specs = tmp_path / "specs"
    shutil.copytree(loader.specs_dir(), specs)
    edited = specs / f"{spec}.toml"
    edited.write_text(edited.read_text(encoding="utf-8") + planted, encoding="utf-8")
    ((target, text),) = stale_enum_modules(specs)
    assert target == GENERATED
    assert member in text and member not in GENERATED.read_text(encoding="utf-8")


def test_docs_finds_and_fixes_a_planted_drift_and_a_broken_module_in_a_checkout(
    tmp_path: Path,
) -> None:
    # a copy of the checkout (package, specs, pyproject): `docs` rewrites only that copy
    for name in ("unicache_fsm", "specs"):
        shutil.copytree(ROOT / name, tmp_path / name)  # compiled files too: a faster start
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    edited = tmp_path / "specs" / "offload.toml"
    edited.write_text(edited.read_text(encoding="utf-8") + EXTRA_TRIGGER, encoding="utf-8")
    generated = tmp_path / "unicache_fsm" / "spec_enums.py"
    # and a module cut short (a crash while it was written): `docs` must not need it
    generated.write_text(GENERATED.read_text(encoding="utf-8")[:2000], encoding="utf-8")
    broken = generated.read_bytes()
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}

    def docs(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "unicache_fsm", "docs", *args]
        return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True)

    checked = docs("--check")
    assert checked.returncode == 1, checked.stderr
    stale = [line.split()[1] for line in checked.stdout.splitlines()]
    assert stale == [str(tmp_path / "specs" / "offload.md"), str(generated)]
    assert generated.read_bytes() == broken  # --check writes nothing
    written = docs()
    assert written.returncode == 0, written.stderr
    assert written.stdout.splitlines()[-1] == "11 of 13 docs were up to date"
    assert '    ZAP = "zap"\n' in generated.read_text(encoding="utf-8")
    assert docs("--check").returncode == 0


# -- the generator on specs of its own -----------------------------------------------------


def machine(text: str) -> str:
    return 'machine = "m"\ninitial = "a"\n' + text


def source_of(spec_text: str, states: str | None = "MState") -> str:
    spec = parse_spec(spec_text)
    module = EnumModule("m.py", "Enums of m.", (MachineEnums("m", "MTrigger", states),))
    return enum_module_source(module, {"m": spec})


def test_a_member_is_named_by_the_last_segment_upper_cased() -> None:
    assert member_name("prepared.queued") == "QUEUED"
    assert member_name("load_back") == "LOAD_BACK"
    assert member_name("idle") == "IDLE"


#: descriptions that a docstring must escape or wrap: quotes (three, and one at the end),
#: a backslash, a control character, a look-alike of ASCII, a word longer than a line, many
#: words
AWKWARD = [
    'A "quoted" word, """ three quotes, a back\\slash, a \x07 bell, an en dash \u2013, then "',
    "x" * 120 + " and a short tail",
    "many words " * 30,
    'ends in three quotes """',
    "ends in a backslash \\",
]


def test_any_description_gives_a_clean_module_whose_docstrings_are_the_spec(
    tmp_path: Path,
) -> None:
    n = len(AWKWARD)
    toml = machine(
        "".join(f"[states.s{i}]\ndescription = {json.dumps(d)}\n" for i, d in enumerate(AWKWARD))
        + "".join(
            f'[[transitions]]\ntrigger = "go"\nsource = "s{i}"\ndest = "s{(i + 1) % n}"\n'
            f"description = {json.dumps(d)}\n"
            for i, d in enumerate(AWKWARD)
        )
    ).replace('initial = "a"', 'initial = "s0"')
    text = source_of(toml)
    namespace: dict[str, Any] = {}
    exec(compile(text, "m.py", "exec"), namespace)
    assert [(m.name, m.value) for m in namespace["MState"]] == [
        (f"S{i}", f"s{i}") for i in range(n)
    ]
    classes = {n.name: n for n in ast.parse(text).body if isinstance(n, ast.ClassDef)}
    docs = [n.value.value for n in classes["MState"].body[1:] if isinstance(n, ast.Expr)]
    assert [" ".join(d.split()) for d in docs] == [" ".join(d.split()) for d in AWKWARD]
    (go,) = [n.value.value for n in classes["MTrigger"].body[1:] if isinstance(n, ast.Expr)]
    arrows = " ".join(f"s{i} -> s{(i + 1) % n}: {d}" for i, d in enumerate(AWKWARD))
    assert " ".join(go.split()) == " ".join(arrows.split())
    path = tmp_path / "m.py"
    path.write_text(text, encoding="utf-8")
    config = ["--config", str(ROOT / "pyproject.toml")]
    for command in (["format", "--check"], ["check"]):
        ruff = subprocess.run(
            [sys.executable, "-m", "ruff", *command, *config, str(path)],
            capture_output=True,
            text=True,
        )
        assert ruff.returncode == 0, ruff.stdout + ruff.stderr
    assert source_of(toml) == text  # deterministic


GO = '[[transitions]]\ntrigger = "{}"\nsource = "{}"\ndest = "{}"\n'


@pytest.mark.parametrize(
    ("spec_text", "states", "kind", "names"),
    [
        (
            "[states.a]\n[states.b]\n" + GO.format("go", "a", "b") + GO.format("Go", "b", "a"),
            None,
            "trigger names that give one enum member name",
            ("go and Go",),
        ),
        (
            "[states.a]\n[states.b]\nfinal = true\n" + GO.format("_go", "a", "b"),
            None,
            "trigger names that give a private enum member",
            ("_go",),
        ),
        (
            '[states.a]\ninitial = "done"\n[states.a.states.done]\n'
            '[states.b]\ninitial = "done"\n[states.b.states.done]\nfinal = true\n'
            + GO.format("go", "a", "b"),
            "MState",
            "state names that give one enum member name",
            ("a.done and b.done",),
        ),
    ],
)
def test_names_that_cannot_be_members_are_refused_by_name(
    spec_text: str, states: str | None, kind: str, names: tuple[str, ...]
) -> None:
    spec = parse_spec(machine(spec_text))  # a valid machine...
    module = EnumModule("m.py", "Enums of m.", (MachineEnums("m", "MTrigger", states),))
    with pytest.raises(InvalidSpecError) as caught:  # ...whose names make no enum
        enum_module_source(module, {"m": spec})
    assert caught.value.machine == "m"
    assert caught.value.names(kind) == names


def test_a_parallel_machine_gets_a_trigger_enum_but_no_state_enum() -> None:
    spec_text = (
        'machine = "m"\nparallel = true\n'
        '[states.x]\ninitial = "a"\n[states.x.states.a]\n[states.x.states.b]\n'
        '[states.y]\ninitial = "c"\n[states.y.states.c]\n[states.y.states.d]\n'
        + GO.format("go", "x.a", "x.b")
        + GO.format("go", "x.b", "x.a")
        + GO.format("on", "y.c", "y.d")
        + GO.format("on", "y.d", "y.c")
    )
    namespace: dict[str, Any] = {}
    exec(source_of(spec_text, None), namespace)
    assert [m.value for m in namespace["MTrigger"]] == ["go", "on"]
    with pytest.raises(InvalidSpecError) as caught:
        source_of(spec_text)
    assert caught.value.kinds() == {"state enum of configurations that are not single states"}


def test_a_missing_spec_or_a_bad_class_name_is_refused_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    shutil.copy(loader.specs_dir() / "offload.toml", tmp_path)
    with pytest.raises(InvalidSpecError) as caught:
        enum_sources(tmp_path, tmp_path)  # the bundled module needs every spec
    assert caught.value.kinds() == {"no spec file for a generated enum"}
    clash = EnumModule("m.py", "x", (MachineEnums("offload", "T", "T"),))
    bad = EnumModule("m.py", "x", (MachineEnums("offload", "class", "1x"),))
    with pytest.raises(InvalidSpecError) as caught:
        enum_sources(tmp_path, tmp_path, [clash])
    assert caught.value.names("enum class names given twice") == ("T",)
    with pytest.raises(InvalidSpecError) as caught:
        enum_sources(tmp_path, tmp_path, [bad])
    assert caught.value.names("enum class names that are no identifier") == ("class", "1x")
    for path in ("../escape.py", "/abs.py", "enums.txt"):
        outside = EnumModule(path, "x", (MachineEnums("offload", "T"),))
        with pytest.raises(InvalidSpecError) as caught:
            enum_sources(tmp_path, tmp_path, [outside])
        assert caught.value.kinds() == {"enum module path that is no .py file inside the package"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["offload.toml"]
