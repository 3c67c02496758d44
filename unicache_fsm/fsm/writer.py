"""Spec write-back: a `MachineSpec` as the TOML text of a spec file.

- `dump_spec(spec)` — the text `fsm.loader.parse_spec` reads back into an equal spec
  (``parse_spec(dump_spec(s)) == s`` up to `MachineSpec.source`, which names where a
  spec came from). A spec written in Python (see `fsm.spec`) becomes a file this way.
  The spec is validated first (`fsm.validate.check_spec`: `InvalidSpecError`), so what
  is written always loads.

Every state's `initial` is written out (the loader's default, the first child, would
give the same spec); keys at their default are left out. Strings are TOML basic
strings (JSON's escapes are TOML's; DEL is escaped too), so any text survives the
round trip. Transitions are written in `index` order of declaration: read back, their
`index` is their position.
"""

from __future__ import annotations

import json

from unicache_fsm.fsm.spec import ANY_STATE, MachineSpec, StateKind, StateSpec
from unicache_fsm.fsm.validate import check_spec

__all__ = ["dump_spec"]


def _str(value: str) -> str:
    # JSON escapes every control character but DEL, which TOML wants escaped too; other
    # characters stay as they are (JSON's surrogate pairs are no TOML escape)
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def _names(names: tuple[str, ...]) -> str:
    return "[" + ", ".join(_str(n) for n in names) + "]"


def _state_lines(state: StateSpec) -> list[str]:
    header = ".states.".join(state.path.split("."))
    lines = ["", f"[states.{header}]"]
    if state.kind is StateKind.PARALLEL:
        lines.append("parallel = true")
    if state.kind is StateKind.COMPOUND and state.initial is not None:
        lines.append(f"initial = {_str(state.initial)}")
    if state.final:
        lines.append("final = true")
    for key in ("on_enter", "on_exit"):
        value: tuple[str, ...] = getattr(state, key)
        if value:
            lines.append(f"{key} = {_names(value)}")
    if state.description:
        lines.append(f"description = {_str(state.description)}")
    return lines


def dump_spec(spec: MachineSpec) -> str:
    """The TOML text of `spec` (see the module docstring)."""
    check_spec(spec)
    lines = [f"machine = {_str(spec.name)}"]
    if spec.noun:
        lines.append(f"noun = {_str(spec.noun)}")
    if spec.description:
        lines.append(f"description = {_str(spec.description)}")
    if spec.root.kind is StateKind.PARALLEL:
        lines.append("parallel = true")
    elif spec.root.initial is not None:
        lines.append(f"initial = {_str(spec.root.initial)}")
    for state in spec.states():
        lines += _state_lines(state)
    for t in spec.transitions:
        source = _str(ANY_STATE) if t.sources == (ANY_STATE,) else _names(t.sources)
        lines += ["", "[[transitions]]", f"trigger = {_str(t.trigger)}"]
        lines += [f"source = {source}", f"dest = {_str(t.dest)}"]
        for key in ("conditions", "unless", "prepare", "before", "after", "requires"):
            value: tuple[str, ...] = getattr(t, key)
            if value:
                lines.append(f"{key} = {_names(value)}")
        if t.internal:
            lines.append("internal = true")
        if t.history:
            lines.append(f"history = {_str(t.history)}")
        if t.description:
            lines.append(f"description = {_str(t.description)}")
    return "\n".join(lines) + "\n"
