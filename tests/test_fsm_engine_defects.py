"""Issue 35, defects N1-N9: each one as a user meets it, through the public API."""

from __future__ import annotations

import asyncio
import functools
import gc
import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from unicache_fsm.cli import main
from unicache_fsm.fsm.compiled import AsyncCompiledExecutor, CompiledExecutor
from unicache_fsm.fsm.conformance import check_trace, read_trace, spec_lookup
from unicache_fsm.fsm.errors import AwaitableGuardError, InvalidSpecError, TraceInputError
from unicache_fsm.fsm.loader import load_spec, parse_spec
from unicache_fsm.fsm.reference import AsyncReferenceExecutor, ReferenceExecutor
from unicache_fsm.fsm.spec import MachineSpec, StateKind, StateSpec, TransitionSpec

SYNC = (CompiledExecutor, ReferenceExecutor)

DOOR = """
machine = "door"
initial = "closed"
[states.closed]
[states.open]
[[transitions]]
trigger = "open"
source = "closed"
dest = "open"
conditions = ["unlocked"]
[[transitions]]
trigger = "close"
source = "open"
dest = "closed"
"""


class Door:
    def __init__(self, answer: Any = True) -> None:
        self.answer = answer
        self.state = ""

    def unlocked(self) -> Any:
        return self.answer


def _one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


# -- N1: a misspelt initial with a "*" transition ---------------------------------------
MISSPELT = """
machine = "m"
initial = "idel"
[states.idle]
[states.done]
final = true
[[transitions]]
trigger = "stop"
source = "*"
dest = "done"
"""


def test_n1_misspelt_initial_with_any_source_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(InvalidSpecError) as info:
        parse_spec(MISSPELT)
    assert info.value.names("initial that is not a child") == ("machine (initial 'idel')",)
    nested = MISSPELT.replace('initial = "idel"', 'initial = "idle"').replace(
        "[states.idle]", '[states.idle]\ninitial = "b"\n[states.idle.states.a]'
    )
    with pytest.raises(InvalidSpecError) as info:
        parse_spec(nested)
    assert info.value.names("initial that is not a child") == ("idle (initial 'b')",)
    path = tmp_path / "m.toml"
    path.write_text(MISSPELT, encoding="utf-8")
    assert "initial that is not a child" in _one_line_error(capsys, ["diagram", str(path)])


# -- N2: a parallel state without regions ------------------------------------------------
def test_n2_parallel_state_without_children_is_refused() -> None:
    text = DOOR.replace("[states.open]", "[states.open]\nparallel = true")
    with pytest.raises(InvalidSpecError) as info:
        parse_spec(text)
    assert info.value.names("parallel state without regions") == ("open",)


# -- N4: awaitables on a sync executor ---------------------------------------------------
async def _async_yes(self: Any) -> bool:
    return True


class WrappedAsyncGuard(Door):
    @functools.wraps(_async_yes)
    def unlocked(self) -> Any:  # a plain function returning a coroutine, wraps'd
        return _async_yes(self)


class AwaitableGuard(Door):
    def unlocked(self) -> Any:
        return asyncio.sleep(0, result=False)  # a coroutine: truthy, never awaited


@pytest.mark.parametrize("cls", SYNC)
def test_n4_an_async_guard_behind_wraps_is_refused_by_sync_executors(cls: type) -> None:
    with pytest.raises(InvalidSpecError) as info:
        cls(parse_spec(DOOR), WrappedAsyncGuard)
    assert info.value.names("coroutine function on a sync executor") == ("unlocked",)


@pytest.mark.parametrize("cls", SYNC)
def test_n4_a_guard_returning_an_awaitable_fails_on_a_sync_executor(cls: type) -> None:
    ex = cls(parse_spec(DOOR), AwaitableGuard)
    door = AwaitableGuard()
    ex.initialize(door)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(AwaitableGuardError, match="'unlocked'"):
            ex.fire(door, "open")
        with pytest.raises(AwaitableGuardError):
            ex.may_fire(door, "open")
        gc.collect()
    assert door.state == "closed"
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)]


@pytest.mark.parametrize("cls", (AsyncCompiledExecutor, AsyncReferenceExecutor))
def test_n4_async_executors_await_the_awaitable_answer(cls: type) -> None:
    ex = cls(parse_spec(DOOR), AwaitableGuard)
    door = AwaitableGuard()
    ex.initialize(door)
    assert asyncio.run(ex.may_fire(door, "open")) is False


# -- N5: trace rules per machine ---------------------------------------------------------
DOC = """
machine = "doc"
initial = "draft"
[states.draft]
[states.published]
[states.archived]
final = true
[[transitions]]
trigger = "publish"
source = "draft"
dest = "published"
[[transitions]]
trigger = "archive"
source = "published"
dest = "archived"
"""


def _rec(seq: int, model: str, source: str, trigger: str, dest: str) -> dict[str, Any]:
    return {
        "seq": seq,
        "machine": "doc",
        "model": model,
        "source": source,
        "trigger": trigger,
        "dest": dest,
    }


def test_n5_a_user_machine_gets_no_copy_rule() -> None:
    records = [
        _rec(1, "a", "", "<init>", "draft"),
        _rec(2, "a", "draft", "publish", "published"),
        _rec(3, "b", "", "<init>", "published"),  # b teleports next to a
    ]
    lookup = spec_lookup([parse_spec(DOC)], None)
    result = check_trace(records, lookup)
    assert result.violation is not None and result.violation.index == 3
    assert "not the initial configuration 'draft'" in result.violation.reason
    assert check_trace(records, lookup, copies={"doc"}).ok  # the rule, opted into


def test_n5_a_seq_gap_is_a_violation() -> None:
    records = [
        _rec(7, "a", "", "<init>", "draft"),
        _rec(8, "a", "draft", "publish", "published"),
        _rec(10, "a", "published", "archive", "archived"),
    ]
    result = check_trace(records, spec_lookup([parse_spec(DOC)], None))
    assert result.violation is not None and result.violation.index == 3
    assert "records missing" in result.violation.reason
    del records[2]
    assert check_trace(records, spec_lookup([parse_spec(DOC)], None)).ok


# -- N6: one line, the right line, for unreadable input ----------------------------------
def _trace_file(tmp_path: Path, lines: list[bytes]) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


GOOD = [
    json.dumps(_rec(1, "a", "", "<init>", "draft")).encode(),
    json.dumps(_rec(2, "a", "draft", "publish", "published")).encode(),
]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nested too deep"),
        (b'{"seq": ' + b"7" * 5000 + b"}", "not readable"),
        (b'{"seq": 2, "machine": "d\xffoc"}', "not UTF-8"),
    ],
)
def test_n6_an_unreadable_trace_line_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], line: bytes, reason: str
) -> None:
    path = _trace_file(tmp_path, [*GOOD, line, GOOD[0]])
    with pytest.raises(TraceInputError) as info:
        list(read_trace(path))
    assert info.value.where == "line 3" and reason in info.value.reason
    spec = tmp_path / "doc.toml"
    spec.write_text(DOC, encoding="utf-8")
    err = _one_line_error(capsys, ["check-trace", str(path), "--spec", str(spec)])
    assert "line 3" in err


def test_n6_a_spec_file_that_is_not_utf8_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "door.toml"
    path.write_bytes(DOOR.encode().replace(b'"open"\n', b'"op\xe9n"\n', 1))
    with pytest.raises(InvalidSpecError) as info:
        load_spec(path)
    assert info.value.kinds() == {"not UTF-8"} and "line 7" in str(info.value)  # the trigger line
    assert "not UTF-8" in _one_line_error(capsys, ["diagram", str(path)])


@pytest.mark.parametrize("how", ["tables", "inline"])
def test_n6_a_spec_nested_1000_deep_is_refused(
    how: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if how == "tables":
        deep = "[states." + ".states.".join(["a"] * 1000) + "]\n"
    else:
        deep = "[states.a]\nstates = " + "{ a = " * 1000 + "{}" + " }" * 1000 + "\n"
    text = 'machine = "m"\ninitial = "a"\n' + deep
    with pytest.raises(InvalidSpecError) as info:
        parse_spec(text)
    assert "nested" in str(info.value)
    path = tmp_path / "deep.toml"
    path.write_text(text, encoding="utf-8")
    assert "nested" in _one_line_error(capsys, ["diagram", str(path)])


# -- N7: names are matched whole ---------------------------------------------------------
def test_n7_a_trailing_newline_does_not_pass_as_a_name() -> None:
    with pytest.raises(InvalidSpecError) as info:
        parse_spec(DOOR.replace("[states.open]", '[states."open\\n"]'))
    assert "invalid state name" in info.value.kinds()
    with pytest.raises(InvalidSpecError) as info:
        parse_spec(DOOR.replace('["unlocked"]', '["cb\\n"]'))
    assert info.value.names("invalid callback name") == ("cb\n",)


# -- N8: dunders and the state slot are not callbacks ------------------------------------
def test_n8_dunder_callbacks_are_refused() -> None:
    with pytest.raises(InvalidSpecError) as info:
        parse_spec(DOOR.replace("[states.open]", '[states.open]\non_enter = ["__init__"]'))
    assert info.value.names("invalid callback name") == ("__init__",)


class StateMethod(Door):
    def state_(self) -> None:  # pragma: no cover - never bound
        pass


@pytest.mark.parametrize("cls", SYNC)
def test_n8_a_callback_named_like_the_state_slot_is_refused(cls: type) -> None:
    spec = parse_spec(DOOR.replace("[states.open]", '[states.open]\non_enter = ["state"]'))

    class Model(Door):
        def state(self) -> None:  # type: ignore[override]  # pragma: no cover
            pass

    with pytest.raises(InvalidSpecError) as info:
        cls(spec, Model)
    assert info.value.names("callback named like the state attribute") == ("state",)


# -- N9: a spec written in Python is validated -------------------------------------------
def _python_spec(dest: str = "open", **root: Any) -> MachineSpec:
    states = [StateSpec("closed", "closed"), StateSpec("open", "open")]
    root_spec = StateSpec("", "", StateKind.COMPOUND, states, "closed", **root)
    return MachineSpec(
        "door",
        root_spec,
        [
            TransitionSpec("open", ["closed"], dest, 0),
            TransitionSpec("close", "open", "closed", 1),
        ],
    )


@pytest.mark.parametrize("cls", (*SYNC, AsyncCompiledExecutor, AsyncReferenceExecutor))
def test_n9_a_python_spec_with_an_unknown_dest_is_refused(cls: type) -> None:
    with pytest.raises(InvalidSpecError) as info:
        cls(_python_spec("nowhere"), Door)
    assert info.value.names("unknown state") == ("nowhere",)
    with pytest.raises(InvalidSpecError):
        spec_lookup([_python_spec("nowhere")])


def test_n9_a_python_spec_with_lists_runs_like_its_toml_twin() -> None:
    spec = _python_spec()
    assert spec.transitions[0].sources == ("closed",) and spec.transitions[1].sources == ("open",)
    ex = CompiledExecutor(spec, Door)
    door = Door()
    ex.initialize(door)
    ex.fire(door, "open")
    assert door.state == "open"


def test_n9_a_python_spec_with_wrong_types_names_each_field() -> None:
    spec = MachineSpec(
        "door",
        StateSpec(
            "",
            "",
            StateKind.COMPOUND,
            [StateSpec("closed", "closed", final=1), StateSpec("open", "wrong")],  # type: ignore[arg-type]
            "closed",
        ),
        [TransitionSpec(7, "closed", "open", 0), TransitionSpec("b", "open", "closed", 0)],  # type: ignore[arg-type]
    )
    with pytest.raises(InvalidSpecError) as info:
        CompiledExecutor(spec, Door)
    err = info.value
    assert set(err.names("field of the wrong type")) == {
        "closed.final (expected a bool)",
        "transitions[0].trigger (expected a string)",
    }
    assert err.names("inconsistent state tree") == ("'wrong' (expected path 'open')",)
    assert err.names("inconsistent transition index") == ("transitions[1] (index 0)",)
