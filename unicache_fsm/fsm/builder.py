"""A machine defined in Python: `MachineBuilder`, validated like a spec file.

    b = MachineBuilder("door", initial="closed")
    b.state("closed")
    b.state("open", on_enter="log_open")
    b.transition("open", source="closed", dest="open", conditions="unlocked")
    b.transition("close", source="open", dest="closed")
    spec = b.build()          # a MachineSpec; InvalidSpecError listing every problem

`state(path, ...)` declares one state by its dotted path (a parent before its
children, in the order the spec file would list them); `transition(trigger, ...)` one
transition, in declaration order. The keyword arguments are the spec file's keys
(``docs/spec-format.md``), with ``source`` a path, a list of paths or ``"*"``. `build`
assembles the `MachineSpec` and runs the loader's validation on it
(`fsm.validate.check_spec`), plus what only a builder can get wrong: a state declared
twice, a child whose parent was never declared. A builder can go on being used after
`build` (each call builds anew). `fsm.writer.dump_spec` turns the result into a file.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from unicache_fsm.fsm.errors import InvalidSpecError, SpecProblem
from unicache_fsm.fsm.spec import MachineSpec, StateKind, StateSpec, TransitionSpec
from unicache_fsm.fsm.validate import check_spec

__all__ = ["MachineBuilder"]

Names = str | Sequence[str]


class MachineBuilder:
    """Collects states and transitions; `build` validates them into a `MachineSpec`."""

    def __init__(
        self,
        name: str,
        *,
        initial: str | None = None,
        parallel: bool = False,
        noun: str = "",
        description: str = "",
    ) -> None:
        self.name = name
        self.initial = initial
        self.parallel = parallel
        self.noun = noun
        self.description = description
        self._states: dict[str, dict[str, Any]] = {}
        self._transitions: list[dict[str, Any]] = []
        self._twice: list[str] = []

    def state(
        self,
        path: str,
        *,
        initial: str | None = None,
        parallel: bool = False,
        final: bool = False,
        on_enter: Names = (),
        on_exit: Names = (),
        description: str = "",
    ) -> MachineBuilder:
        """Declare the state at dotted `path` (returns the builder, for chaining)."""
        if path in self._states:
            self._twice.append(str(path))
        self._states[path] = {
            "initial": initial,
            "parallel": parallel,
            "final": final,
            "on_enter": on_enter,
            "on_exit": on_exit,
            "description": description,
        }
        return self

    def transition(
        self,
        trigger: str,
        *,
        source: Names,
        dest: str,
        conditions: Names = (),
        unless: Names = (),
        prepare: Names = (),
        before: Names = (),
        after: Names = (),
        requires: Names = (),
        internal: bool = False,
        history: str = "",
        description: str = "",
    ) -> MachineBuilder:
        """Declare one transition (returns the builder, for chaining); `history`
        (``"shallow"`` / ``"deep"``) enters `dest` through its history."""
        self._transitions.append(
            {
                "trigger": trigger,
                "sources": source,
                "dest": dest,
                "conditions": conditions,
                "unless": unless,
                "prepare": prepare,
                "before": before,
                "after": after,
                "requires": requires,
                "internal": internal,
                "history": history,
                "description": description,
            }
        )
        return self

    def build(self) -> MachineSpec:
        """The validated `MachineSpec` (`InvalidSpecError` listing every problem)."""
        problems: list[SpecProblem] = []
        if self._twice:
            problems.append(SpecProblem("state declared twice", sorted(set(self._twice))))
        paths = [p for p in self._states if isinstance(p, str)]
        orphans = [p for p in paths if "." in p and p.rpartition(".")[0] not in self._states]
        if orphans:
            problems.append(SpecProblem("state whose parent is not declared", orphans))
        if problems:
            raise InvalidSpecError(str(self.name), "<builder>", problems)
        children: dict[str, list[str]] = {}
        for path in paths:
            children.setdefault(path.rpartition(".")[0], []).append(path)

        def make(path: str) -> StateSpec:
            keys = self._states[path]
            kids = tuple(make(c) for c in children.get(path, ()))
            kind = (
                StateKind.PARALLEL
                if keys["parallel"]
                else StateKind.COMPOUND
                if kids
                else StateKind.ATOMIC
            )
            initial = keys["initial"]
            if kind is StateKind.COMPOUND and initial is None:
                initial = kids[0].name
            return StateSpec(
                name=path.rpartition(".")[2],
                path=path,
                kind=kind,
                children=kids,
                initial=initial,
                final=keys["final"],
                on_enter=keys["on_enter"],
                on_exit=keys["on_exit"],
                description=keys["description"],
            )

        top = tuple(make(p) for p in children.get("", ()))
        root = StateSpec(
            name="",
            path="",
            kind=StateKind.PARALLEL if self.parallel else StateKind.COMPOUND,
            children=top,
            initial=None if self.parallel else self.initial,
        )
        spec = MachineSpec(
            name=self.name,
            root=root,
            transitions=tuple(
                TransitionSpec(index=i, **t) for i, t in enumerate(self._transitions)
            ),
            noun=self.noun,
            description=self.description,
            source="<builder>",
        )
        check_spec(spec)
        return spec
