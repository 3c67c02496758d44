"""A seeded random walk through a kit state machine's rules: fuzzing without Hypothesis's
cost per step, with a shrunk, runnable program when something breaks.

Hypothesis's stateful engine spends about half a millisecond on each step choosing the
rule and its arguments; the kit's whole-system step itself costs about as much. The walk
runs the same rule bodies with every choice drawn from a `random.Random`, runs every
check (Hypothesis's invariants) after the setup and after every step, and calls
`teardown` at the end of each run, as Hypothesis does. On a failure it replays the
recorded program, deletes steps and simplifies arguments while the same failure
(exception type and the line that raised it) still happens, and raises `WalkFailure`
with the shrunk program as Python source that replays it.

Declaring a machine's rules once, for both drivers:

- `move(when=..., **domains)` — Hypothesis's ``rule`` (plus ``precondition(when)``),
  with each argument's domain: `Ints(lo, hi)`, `Bools()`, `OneOf(options)`, or `DATA`
  (choices made inside the body: Hypothesis's ``st.data()``; in the walk a `Choices`);
- `setup_move(**domains)` — ``initialize`` likewise; `check()` — ``invariant``;
- inside a body, `choose(data, options)`, `choose_int(data, lo, hi)`,
  `choose_bool(data)` and `choose_some(data, options, lo, hi)` draw from whichever
  driver runs it (under Hypothesis, with the strategies their names say).

The walk picks uniformly among the enabled moves whose `when` holds, after disabling
a random share of the moves for the whole run (swarm testing, as Hypothesis's stateful
engine does), so some runs hammer a few moves.

`fuzz(machine, seed=...)` runs a campaign; `run_walk` one run; `run_program` replays a
`Program`; `shrink` shrinks one; `reproduction` prints one as Python.

A replay is exact only where the machine is deterministic given its choices (the kit's
`SystemMachine` is: its store faults come from a seeded policy drawn in its setup).
"""

from __future__ import annotations

import enum
import inspect
import random
import sys
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import Any, Protocol, TypeVar, cast

import attrs
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule

from unicache_fsm.fsm.errors import UnicacheFsmError

__all__ = [
    "DATA",
    "Bools",
    "Choices",
    "Ints",
    "OneOf",
    "Program",
    "Replayed",
    "Step",
    "WalkFailure",
    "check",
    "choose",
    "choose_bool",
    "choose_int",
    "choose_some",
    "fuzz",
    "move",
    "reproduction",
    "run_program",
    "run_walk",
    "setup_move",
    "shrink",
]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

_NUMBERS = (type(None), bool, int, float)
_LITERALS = (*_NUMBERS, str)


# -- argument domains ----------------------------------------------------------------------


@attrs.frozen
class Ints:
    """Integers in ``[lo, hi]``."""

    lo: int
    hi: int

    def __attrs_post_init__(self) -> None:
        if not self.lo <= self.hi:
            msg = f"Ints({self.lo}, {self.hi}): the lowest value is above the highest"
            raise ValueError(msg)

    def strategy(self) -> st.SearchStrategy[int]:
        return st.integers(self.lo, self.hi)

    def draw(self, rng: random.Random) -> int:
        return rng.randint(self.lo, self.hi)

    def simplest(self) -> int:
        return self.lo

    def simpler(self, value: int) -> tuple[int, ...]:
        """Smaller values to try in a shrink, simplest first."""
        tries = {self.lo, self.lo + (value - self.lo) // 2, value - 1}
        return tuple(sorted(v for v in tries if self.lo <= v < value))


@attrs.frozen
class Bools:
    """True or False."""

    def strategy(self) -> st.SearchStrategy[bool]:
        return st.booleans()

    def draw(self, rng: random.Random) -> bool:
        return rng.random() < 0.5

    def simplest(self) -> bool:
        return False

    def simpler(self, value: bool) -> tuple[bool, ...]:
        return (False,) if value else ()


def _as_tuple(options: Iterable[Any]) -> tuple[Any, ...]:
    return tuple(options)


@attrs.frozen
class OneOf:
    """One of `options` (literals: they are printed in a reproduction)."""

    options: tuple[Any, ...] = attrs.field(converter=_as_tuple)

    def __attrs_post_init__(self) -> None:
        if not self.options:
            msg = "OneOf(): no options to choose from"
            raise ValueError(msg)

    def strategy(self) -> st.SearchStrategy[Any]:
        return st.sampled_from(self.options)

    def draw(self, rng: random.Random) -> Any:
        return self.options[rng.randrange(len(self.options))]

    def simplest(self) -> Any:
        return self.options[0]

    def simpler(self, value: Any) -> tuple[Any, ...]:
        at = self.options.index(value) if value in self.options else 0
        return tuple(dict.fromkeys(self.options[: min(at, 1)] + self.options[max(0, at - 1) : at]))


class _Data:
    """The domain of choices made inside a rule body (`DATA`)."""

    def strategy(self) -> st.SearchStrategy[Any]:
        return st.data()

    def __repr__(self) -> str:
        return "DATA"


DATA = _Data()
Domain = Ints | Bools | OneOf | _Data


# -- choices inside a body ---------------------------------------------------------------


class Choices(Protocol):
    """What a rule body draws from in the walk (Hypothesis passes its ``DataObject``)."""

    def pick(self, options: Sequence[T]) -> T: ...

    def pick_int(self, lo: int, hi: int) -> int: ...


def _literal(options: Sequence[Any]) -> bool:
    """Whether a choice among `options` is recorded as the value itself: numbers,
    booleans and None (a configuration reads better so, and pins it in a replay);
    anything else (names such as request ids, which shift when a shrink deletes the move
    that made them; objects) by its index."""
    return all(type(o) in _NUMBERS for o in options)


class _Recorder:
    """Choices drawn from `rng`, recorded: a number (or None) as itself, any other as its
    index (a tree node is named by its place in the list the body offers)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.made: list[Any] = []

    def pick(self, options: Sequence[T]) -> T:
        i = self.rng.randrange(len(options))
        self.made.append(options[i] if _literal(options) else i)
        return options[i]

    def pick_int(self, lo: int, hi: int) -> int:
        v = self.rng.randint(lo, hi)
        self.made.append(v)
        return v


class Replayed:
    """Choices replayed from a recording (what a reproduction passes as ``data``): a
    number (or None) comes back as recorded, any other option by its index; past the
    recording, or out of range (in a shrunk program), the first option, the lowest
    integer."""

    def __init__(self, *made: Any) -> None:
        self.made = made
        self.at = 0

    def _next(self) -> Any:
        self.at += 1
        return self.made[self.at - 1] if self.at <= len(self.made) else None

    def pick(self, options: Sequence[T]) -> T:
        if not options:
            msg = "Replayed.pick: no options to pick from"
            raise ValueError(msg)
        got = self._next()
        if _literal(options):
            return got if got is not None or None in options else options[0]
        return options[got % len(options)] if isinstance(got, int) else options[0]

    def pick_int(self, lo: int, hi: int) -> int:
        got = self._next()
        return min(max(got, lo), hi) if isinstance(got, int) else lo

    def __repr__(self) -> str:
        return f"Replayed({', '.join(map(repr, self.made))})"


def choose(data: Any, options: Sequence[T], label: str | None = None) -> T:
    """One of `options` (a non-empty sequence), from Hypothesis's data or the walk's
    (any `Choices`)."""
    pick = getattr(data, "pick", None)
    if pick is not None:
        return pick(options)  # type: ignore[no-any-return]
    return data.draw(st.sampled_from(options), label=label)  # type: ignore[no-any-return]


def choose_int(data: Any, lo: int, hi: int, label: str | None = None) -> int:
    """An integer in ``[lo, hi]``, from Hypothesis's data or the walk's (any `Choices`)."""
    pick_int = getattr(data, "pick_int", None)
    if pick_int is not None:
        return pick_int(lo, hi)  # type: ignore[no-any-return]
    return data.draw(st.integers(lo, hi), label=label)  # type: ignore[no-any-return]


def choose_bool(data: Any, label: str | None = None) -> bool:
    """True or False, from Hypothesis's data (``st.booleans()``) or the walk's."""
    pick = getattr(data, "pick", None)
    if pick is not None:
        return pick((False, True))  # type: ignore[no-any-return]
    return data.draw(st.booleans(), label=label)  # type: ignore[no-any-return]


def choose_some(
    data: Any, options: Sequence[T], min_size: int, max_size: int, label: str | None = None
) -> list[T]:
    """`min_size` to `max_size` picks from `options` (repeats allowed), from Hypothesis's
    data (``st.lists(st.sampled_from(options), ...)``) or the walk's."""
    pick = getattr(data, "pick", None)
    if pick is not None:
        return [pick(options) for _ in range(choose_int(data, min_size, max_size))]
    strategy = st.lists(st.sampled_from(options), min_size=min_size, max_size=max_size)
    return data.draw(strategy, label=label)  # type: ignore[no-any-return]


# -- declaring moves -----------------------------------------------------------------------

_MOVE = "unicache_walk_move"


@attrs.frozen
class _MoveSpec:
    name: str
    function: Callable[..., Any]
    domains: dict[str, Domain]
    when: Callable[[Any], bool] | None
    kind: str  # "setup", "move" or "check"

    @property
    def takes_data(self) -> bool:
        return any(d is DATA for d in self.domains.values())


def _mark(kind: str, when: Callable[[Any], bool] | None, domains: dict[str, Domain]) -> Any:
    def accept(fn: F) -> F:
        for name, d in domains.items():
            given: object = d  # typed as a domain; checked, since callers may pass anything
            if not isinstance(given, (Ints, Bools, OneOf, _Data)):
                msg = (
                    f"{fn.__name__}: argument {name!r} has domain {d!r}; "
                    "use Ints, Bools, OneOf or DATA"
                )
                raise TypeError(msg)
        strategies: dict[str, st.SearchStrategy[Any]] = {
            name: d.strategy() for name, d in domains.items()
        }
        wrapped: Any
        if kind == "setup":
            wrapped = cast(Any, initialize)(**strategies)(fn)
        elif kind == "check":
            wrapped = invariant()(fn)
        else:
            wrapped = cast(Any, rule)(**strategies)(fn)
        if when is not None:
            wrapped = precondition(when)(wrapped)
        setattr(wrapped, _MOVE, _MoveSpec(fn.__name__, fn, dict(domains), when, kind))
        return wrapped  # type: ignore[no-any-return]

    return accept


def move(*, when: Callable[[Any], bool] | None = None, **domains: Domain) -> Callable[[F], F]:
    """A rule for both drivers: Hypothesis's ``rule`` (and ``precondition(when)``) with
    each argument's domain."""
    return _mark("move", when, domains)  # type: ignore[no-any-return]


def setup_move(**domains: Domain) -> Callable[[F], F]:
    """An initialize rule for both drivers (run once, before any move)."""
    return _mark("setup", None, domains)  # type: ignore[no-any-return]


def check(*, when: Callable[[Any], bool] | None = None) -> Callable[[F], F]:
    """An invariant for both drivers: run after the setup and after every move."""
    return _mark("check", when, {})  # type: ignore[no-any-return]


@attrs.frozen
class _Table:
    setups: tuple[_MoveSpec, ...]
    moves: tuple[_MoveSpec, ...]
    checks: tuple[_MoveSpec, ...]
    by_name: dict[str, _MoveSpec]


_TABLES: weakref.WeakKeyDictionary[type, _Table] = weakref.WeakKeyDictionary()


def _table(machine: type) -> _Table:
    """The moves, setups and checks `machine` declares (by name, as Hypothesis finds
    its rules: an override without a decorator is no move)."""
    table = _TABLES.get(machine)
    if table is None:
        specs = [s for name in dir(machine) if (s := getattr(getattr(machine, name), _MOVE, None))]
        by_kind = {k: tuple(s for s in specs if s.kind == k) for k in ("setup", "move", "check")}
        if not by_kind["move"]:
            msg = f"{machine.__name__} declares no move (decorate its rules with walk.move)"
            raise TypeError(msg)
        table = _Table(
            by_kind["setup"], by_kind["move"], by_kind["check"], {s.name: s for s in specs}
        )
        _TABLES[machine] = table
    return table


# -- programs ------------------------------------------------------------------------------


@attrs.frozen
class Step:
    """One move (or setup) as run: its arguments and the choices its body made."""

    move: str
    args: tuple[tuple[str, Any], ...] = ()
    choices: tuple[Any, ...] = ()


@attrs.frozen
class Program:
    """The setups, then the moves, of one run."""

    setup: tuple[Step, ...]
    steps: tuple[Step, ...]


def _call(machine: Any, spec: _MoveSpec, step: Step, data: Any) -> None:
    kwargs = dict(step.args)
    if spec.takes_data:
        for name, d in spec.domains.items():
            if d is DATA:
                kwargs[name] = data
    spec.function(machine, **kwargs)


def _run_checks(machine: Any, checks: Sequence[_MoveSpec]) -> None:
    for c in checks:
        if c.when is None or c.when(machine):
            c.function(machine)


def _teardown_quietly(machine: Any) -> None:
    try:
        machine.teardown()
    except Exception:  # the failure already raised is the one reported
        return


def run_program(machine: type, program: Program) -> Program:
    """Replay `program` on a fresh `machine` (setups, checks, each move whose `when`
    holds then, checks after each, `teardown`); return the program as it ran (moves
    whose `when` did not hold are left out). Whatever it raises propagates."""
    ran, error = _replay(machine, program)
    if error is not None:
        raise error
    return ran


def _replay(machine: type, program: Program) -> tuple[Program, BaseException | None]:
    """`run_program`, returning the failure with the program as it ran up to it."""
    table = _table(machine)
    state = machine()
    ran: list[Step] = []
    try:
        for step in program.setup:
            _call(state, table.by_name[step.move], step, Replayed(*step.choices))
        _run_checks(state, table.checks)
        for step in program.steps:
            spec = table.by_name.get(step.move)
            if spec is None or spec.kind != "move" or (spec.when and not spec.when(state)):
                continue
            ran.append(step)
            _call(state, spec, step, Replayed(*step.choices))
            _run_checks(state, table.checks)
    except Exception as exc:
        _teardown_quietly(state)
        return Program(program.setup, tuple(ran)), exc
    try:
        state.teardown()
    except Exception as exc:
        return Program(program.setup, tuple(ran)), exc
    return Program(program.setup, tuple(ran)), None


def run_walk(machine: type, rng: random.Random, steps: int) -> tuple[Program, BaseException | None]:
    """One run of up to `steps` moves on a fresh `machine`, every choice from `rng`;
    return the program it ran (up to and including a failing move) and the failure,
    if any (a failing teardown too)."""
    table = _table(machine)
    state = machine()
    setup: list[Step] = []
    ran: list[Step] = []
    p_off = rng.random()  # swarm testing: a share of the moves is off for this run
    enabled = [m for m in table.moves if rng.random() >= p_off] or list(table.moves)
    checks = table.checks
    try:
        for spec in table.setups:
            _run_step(state, spec, rng, setup)
        _run_checks(state, checks)
        for _ in range(steps):
            able = [m for m in enabled if m.when is None or m.when(state)]
            if not able:
                able = [m for m in table.moves if m.when is None or m.when(state)]
                if not able:
                    break
            _run_step(state, able[rng.randrange(len(able))], rng, ran)
            _run_checks(state, checks)
    except Exception as exc:
        _teardown_quietly(state)
        return Program(tuple(setup), tuple(ran)), exc
    try:
        state.teardown()
    except Exception as exc:
        return Program(tuple(setup), tuple(ran)), exc
    return Program(tuple(setup), tuple(ran)), None


def _run_step(state: Any, spec: _MoveSpec, rng: random.Random, into: list[Step]) -> None:
    """Draw `spec`'s arguments, run it, and record it in `into` with the choices its
    body made (also when it raised)."""
    args = tuple(
        (name, d.draw(rng)) for name, d in spec.domains.items() if not isinstance(d, _Data)
    )
    step = Step(spec.name, args)
    data = _Recorder(rng) if spec.takes_data else None
    try:
        _call(state, spec, step, data)
    finally:
        into.append(step if data is None else attrs.evolve(step, choices=tuple(data.made)))


# -- shrinking -----------------------------------------------------------------------------


def _signature(error: BaseException) -> tuple[type, str, int]:
    """What makes two failures the same (as Hypothesis judges it): the exception type
    and the line that raised it."""
    tb: TracebackType | None = error.__traceback__
    where = ("", 0)
    while tb is not None:
        where = (tb.tb_frame.f_code.co_filename, tb.tb_lineno)
        tb = tb.tb_next
    return type(error), *where


def shrink(
    machine: type,
    program: Program,
    error: BaseException,
    *,
    max_replays: int = 500,
    seconds: float = 60.0,
) -> Program:
    """A shorter, simpler `program` that fails as `error` did (same exception type,
    raised on the same line): chunks of moves deleted, halving the chunk size down to
    single moves, then arguments made simpler (a value everywhere at once, then each
    argument alone: its domain's simplest value, half-way there, one less), repeated
    while that helps, within `max_replays` replays and `seconds`. Returns `program`
    (as it ran) when nothing smaller fails the same way."""
    table = _table(machine)
    target = _signature(error)
    deadline = time.perf_counter() + seconds
    left = [max_replays]

    def attempt(steps: Sequence[Step]) -> Program | None:
        if left[0] <= 0 or time.perf_counter() > deadline:
            return None
        left[0] -= 1
        ran, got = _replay(machine, Program(program.setup, tuple(steps)))
        return ran if got is not None and _signature(got) == target else None

    current = attempt(program.steps) or program
    changed = True
    while changed and left[0] > 0:
        changed = False
        size = max(1, len(current.steps) // 2)
        while size >= 1:
            i = 0
            while i < len(current.steps):
                smaller = attempt([*current.steps[:i], *current.steps[i + size :]])
                if smaller is not None:
                    current, changed = smaller, True
                else:
                    i += size
            size //= 2
        # an argument value everywhere at once (two moves on one document, say)
        for arg, value in sorted({a for s in current.steps for a in s.args}, key=repr):
            simplest = _simplest(table, current.steps, arg, value)
            if simplest is None:
                continue
            together = [
                attrs.evolve(
                    s, args=tuple((k, simplest if (k, v) == (arg, value) else v) for k, v in s.args)
                )
                for s in current.steps
            ]
            got = attempt(together)
            if got is not None and len(got.steps) == len(current.steps):
                current, changed = got, True
        for i, step in enumerate(current.steps):
            domains = table.by_name[step.move].domains
            for k, (name, value) in enumerate(step.args):
                domain = domains[name]
                assert not isinstance(domain, _Data)
                for less in domain.simpler(value):
                    args = (*step.args[:k], (name, less), *step.args[k + 1 :])
                    simpler = [*current.steps]
                    simpler[i] = attrs.evolve(step, args=args)
                    got = attempt(simpler)
                    if got is not None and len(got.steps) == len(current.steps):
                        current, step, changed = got, simpler[i], True
                        break
    return current


def _simplest(table: _Table, steps: Sequence[Step], arg: str, value: Any) -> Any:
    """The simplest value of `arg` over every move taking it with `value`, when they all
    agree on it and it differs from `value`; else None."""
    domains = [table.by_name[s.move].domains[arg] for s in steps if (arg, value) in s.args]
    found = {d.simplest() for d in domains if not isinstance(d, _Data)}
    if len(found) != 1:
        return None
    (simplest,) = found
    return None if simplest == value else simplest


# -- reproductions -------------------------------------------------------------------------


def _importable(cls: type) -> bool:
    if "<locals>" in cls.__qualname__:
        return False
    found: Any = sys.modules.get(cls.__module__)
    for part in cls.__qualname__.split("."):
        found = getattr(found, part, None)
    return found is cls


def _source(value: Any, imports: set[str]) -> str | None:
    """`value` as Python source (literals, tuples of them, enum members), else None."""
    if type(value) in _LITERALS:
        return repr(value)
    if isinstance(value, enum.Enum):
        owner = type(value)
        imports.add(f"from {owner.__module__} import {owner.__qualname__.split('.')[0]}")
        return f"{owner.__qualname__}.{value.name}"
    if isinstance(value, tuple):
        parts = [_source(v, imports) for v in value]
        if any(p is None for p in parts):
            return None
        return f"({', '.join(parts)}{',' if len(parts) == 1 else ''})"  # type: ignore[arg-type]
    return None


def reproduction(machine: type, program: Program) -> str:
    """`program` as a Python script that replays it: the machine (its nearest importable
    class, with the configuration attributes `machine.walk_config` names pinned), each
    setup and move called with its arguments and recorded choices (`Replayed`), the
    checks after each, and `teardown`. Methods a local subclass overrides cannot be
    written out: a comment names them."""
    imports = {"from unicache_fsm.testing.walk import Replayed"}
    table = _table(machine)
    base = next(c for c in machine.__mro__ if _importable(c))
    imports.add(f"from {base.__module__} import {base.__qualname__.split('.')[0]}")
    lines: list[str] = []
    name = base.__qualname__
    if base is not machine:
        body = []
        for attr in getattr(machine, "walk_config", ()):
            value = getattr(machine, attr)
            if value != getattr(base, attr, None):
                text = _source(value, imports)
                body.append(f"    {attr} = {text}" if text else f"    # {attr}: {value!r}")
        local = sorted(
            k
            for c in machine.__mro__[: machine.__mro__.index(base)]
            for k, v in vars(c).items()
            if inspect.isfunction(v) and not k.startswith("__")
        )
        if local:
            body.append(f"    # not written out: {machine.__qualname__}'s own {', '.join(local)}")
        lines += ["", "", f"class Machine({name}):", *(body or ["    pass"])]
        name = "Machine"
    lines += ["", "", f"state = {name}()"]
    checks = [f"state.{c.name}()" for c in table.checks]
    for i, step in enumerate((*program.setup, *program.steps)):
        spec = table.by_name[step.move]
        args = dict(step.args)
        parts = []
        for arg, d in spec.domains.items():
            if d is DATA:
                parts.append(f"{arg}={Replayed(*step.choices)!r}")
            else:
                parts.append(f"{arg}={_source(args[arg], imports) or repr(args[arg])}")
        lines.append(f"state.{step.move}({', '.join(parts)})")
        if i >= len(program.setup) - 1:
            lines += checks
    lines.append("state.teardown()")
    return "\n".join([*sorted(imports), *lines]) + "\n"


# -- campaigns -----------------------------------------------------------------------------


class WalkFailure(UnicacheFsmError, AssertionError):
    """A walk broke something. `error` is what was raised (also the ``__cause__``),
    `program` the shrunk program that raises it again, `found` how many moves the
    failing run had made, `source` the program as a Python script (`reproduction`),
    `seed` and `run` the campaign's seed and the failing run's index, `replays`
    whether replaying the recorded run failed the same way (False: the machine is not
    deterministic given its choices, and `program` is the run as recorded)."""

    def __init__(
        self,
        error: BaseException,
        program: Program,
        found: int,
        source: str,
        seed: int,
        run: int,
        replays: bool,
    ) -> None:
        self.error = error
        self.program = program
        self.found = found
        self.source = source
        self.seed = seed
        self.run = run
        self.replays = replays
        head = (str(error).splitlines() or [""])[0]
        how = (
            f"shrunk from {found} to {len(program.steps)} moves"
            if replays
            else f"{found} moves, NOT replayed: the machine is not deterministic"
        )
        super().__init__(
            f"{type(error).__name__}: {head}\n"
            f"run {run} of seed {seed}, {how}; this script replays it:\n\n{source}"
        )


def fuzz(
    machine: type,
    *,
    seed: int,
    runs: int | None = None,
    seconds: float | None = None,
    steps: int = 50,
    shrink_replays: int = 500,
    on_run: Callable[[int], None] | None = None,
) -> int:
    """Walk `machine` run after run (run ``i`` draws from ``Random(f"{seed}/{i}")``,
    up to `steps` moves each) until `runs` runs or `seconds` have passed, whichever
    bound is given first; return the runs done. `on_run(done)` is called after each
    run. On a failure, shrink it and raise `WalkFailure`."""
    if runs is None and seconds is None:
        msg = "fuzz: give runs or seconds (or both), else the walk never ends"
        raise ValueError(msg)
    if steps < 1:
        msg = f"fuzz: steps must be at least 1, got {steps}"
        raise ValueError(msg)
    start = time.perf_counter()
    done = 0
    while (runs is None or done < runs) and (
        seconds is None or time.perf_counter() - start < seconds
    ):
        found, error = run_walk(machine, random.Random(f"{seed}/{done}"), steps)
        if error is not None:
            raise _failure(machine, found, error, seed, done, shrink_replays) from error
        done += 1
        if on_run is not None:
            on_run(done)
    return done


def _failure(
    machine: type, found: Program, error: BaseException, seed: int, run: int, replays: int
) -> WalkFailure:
    again, got = _replay(machine, found)
    same = got is not None and _signature(got) == _signature(error)
    program = shrink(machine, again, error, max_replays=replays) if same else found
    return WalkFailure(
        error, program, len(found.steps), reproduction(machine, program), seed, run, same
    )
