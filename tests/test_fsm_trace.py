"""Traces, coverage and trace conformance, from a real simulation run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from unicache_fsm.cli import main
from unicache_fsm.fsm.conformance import check_trace, read_trace
from unicache_fsm.fsm.coverage import Coverage
from unicache_fsm.fsm.diagram import render_dot, render_mermaid
from unicache_fsm.fsm.errors import TraceInputError
from unicache_fsm.fsm.loader import bundled_spec


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("trace")
    trace = folder / "run.jsonl"
    rc = main(["simulate", "--requests", "60", "--pool-tokens", "1536", "--trace", str(trace)])
    assert rc == 0
    return trace, trace.with_suffix(".coverage.json")


def test_a_recorded_trace_replays_cleanly(run: tuple[Path, Path]) -> None:
    result = check_trace(read_trace(run[0]))
    assert result.ok and result.records > 100 and result.models > 10


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda r: {**r, "trigger": "commit"}, "no 'commit'"),
        (lambda r: {**r, "source": "aborted"}, "the model is in"),
    ],
)
def test_the_first_illegal_step_is_reported(run: tuple[Path, Path], mutate, reason) -> None:  # type: ignore[no-untyped-def]
    records = list(read_trace(run[0]))
    i = next(i for i, r in enumerate(records) if r["trigger"] == "submit")
    records[i] = mutate(records[i])
    records[i + 1] = {**records[i + 1], "trigger": "bogus"}  # a later error is not the first
    result = check_trace(records)
    assert result.violation is not None
    assert result.violation.record["seq"] == records[i]["seq"]
    assert reason in result.violation.reason
    assert f"seq {records[i]['seq']}" in result.violation.describe()


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda r: {**r, "machine": "nope"}, "unknown machine 'nope'"),
        (lambda r: {k: v for k, v in r.items() if k != "dest"}, "lacks dest"),
    ],
)
def test_a_record_that_cannot_be_checked_is_bad_input(
    run: tuple[Path, Path], mutate, reason
) -> None:  # type: ignore[no-untyped-def]
    """Changed on purpose (issue 18): an unknown machine or a missing field is not an
    illegal step of a machine but a trace the checker cannot read (exit 2, not 1)."""
    records = list(read_trace(run[0]))
    i = next(i for i, r in enumerate(records) if r["trigger"] == "submit")
    records[i] = mutate(records[i])
    with pytest.raises(TraceInputError) as info:
        check_trace(records)
    assert info.value.where == f"record {i + 1}"
    assert reason in str(info.value)


def test_check_trace_cli_exit_codes(run: tuple[Path, Path], tmp_path: Path) -> None:
    assert main(["check-trace", str(run[0])]) == 0
    bad = tmp_path / "bad.jsonl"
    records = list(read_trace(run[0]))
    records[3] = {**records[3], "source": "nowhere"}
    bad.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["check-trace", str(bad)]) == 1


def test_coverage_file_round_trips_and_marks_arrows(run: tuple[Path, Path]) -> None:
    cov = Coverage.load(run[1])
    spec = bundled_spec("offload")
    declared = cov.declared(spec)
    assert declared[(0, "queued")] > 0  # submit: queued -> pending
    text = render_mermaid(spec, coverage=declared)
    assert f"({declared[(0, 'queued')]}x)" in text
    missing = cov.missing(spec)
    for label in missing:
        trigger = label.split(":")[0]
        assert any(trigger in line and "never taken" in line for line in text.splitlines())
    dot = render_dot(
        bundled_spec("node_residency"), coverage=cov.declared(bundled_spec("node_residency"))
    )
    assert "style=dashed" in dot and "penwidth" in dot
    again = Coverage()
    again.merge(cov)
    assert again.counts == cov.counts


# -- forged traces (issue 18, item 2) ----------------------------------------------------


def _load_trace() -> list[dict[str, object]]:
    """A legal load_transaction trace of two loads, one committed, one in flight."""
    steps = [
        ("r1", "", "<init>", "idle"),
        ("r1", "idle", "prepare", "prepared.queued"),
        ("r2", "", "<init>", "idle"),
        ("r1", "prepared.queued", "start", "prepared.loading"),
        ("r1", "prepared.loading", "land", "prepared.landed"),
        ("r1", "prepared.landed", "commit", "committed"),
        ("r2", "idle", "prepare", "prepared.queued"),
    ]
    return [
        {"seq": i, "machine": "load_transaction", "model": m, "source": s, "trigger": t, "dest": d}
        for i, (m, s, t, d) in enumerate(steps, start=1)
    ]


def test_the_legal_load_trace_is_legal() -> None:
    result = check_trace(_load_trace())
    assert result.ok and result.records == 7 and result.models == 2


def _forged(at: int, **fields: object) -> list[dict[str, object]]:
    """The legal trace with a copy of its record `at` changed by `fields` inserted after
    it (as record ``at + 1``); every seq renumbered in order unless `fields` gives one."""
    records = _load_trace()
    records.insert(at, {**records[at - 1], **fields})
    for i, r in enumerate(records, start=1):
        if not (r is records[at] and "seq" in fields):
            r["seq"] = i
    return records


@pytest.mark.parametrize(
    ("records", "index", "reason"),
    [
        # a second <init> of a live load teleports it: idle -> committed
        (
            _forged(7, model="r2", source="", trigger="<init>", dest="committed"),
            8,
            "initialized again while live in 'prepared.queued'",
        ),
        (_forged(1, model="r3", source="idle", dest="idle"), 2, "source 'idle'"),
        (_forged(3, model="r3", source="", dest="committed"), 4, "neither the initial"),
        (_forged(5, seq=2), 6, "seq 2 does not follow seq 5"),
    ],
)
def test_forged_traces_are_rejected_naming_the_record(
    records: list[dict[str, object]], index: int, reason: str
) -> None:
    result = check_trace(records)
    assert result.violation is not None, records
    assert result.violation.index == index
    assert reason in result.violation.reason
    assert f"record {index}" in result.violation.describe()


def test_a_finished_model_may_be_initialized_again() -> None:
    records = _load_trace()
    records.append({**records[0], "seq": 8})  # r1 is committed (final): its id is recycled
    assert check_trace(records).ok


def test_a_live_model_may_be_copied_into_its_configuration() -> None:
    records = _load_trace()
    copy = {**records[0], "model": "r9", "dest": "prepared.queued", "seq": 8}
    assert check_trace([*records, copy]).ok  # r2 is live in prepared.queued
    gone = {**copy, "dest": "prepared.loading"}  # no live load is there
    assert not check_trace([*records, gone]).ok


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("[1, 2, 3]", "expected a JSON object, got [1, 2, 3]"),
        ("42", "expected a JSON object, got 42"),
        ('"text"', 'expected a JSON object, got "text"'),
        ("null", "expected a JSON object, got null"),
        (
            '{"seq": 9, "machine": "load_transaction", "model": "r1", "source": "idle", '
            '"trigger": "prepare", "dest": ["x"]}',
            "dest must be a string",
        ),
        (
            '{"seq": 9, "machine": "load_transaction", "model": 1, "source": "", '
            '"trigger": "<init>", "dest": "idle"}',
            "model must be a string, got 1",
        ),
        (
            '{"seq": true, "machine": "load_transaction", "model": "r1", "source": "", '
            '"trigger": "<init>", "dest": "idle"}',
            "seq must be an integer",
        ),
        (
            '{"seq": 9, "machine": {"a": 1}, "model": "r1", "source": "", '
            '"trigger": "<init>", "dest": "idle"}',
            "machine must be a string",
        ),
        ("{not json", "line 8: not JSON"),
    ],
)
def test_unreadable_records_exit_2_in_one_line(
    line: str, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.jsonl"
    legal = "".join(json.dumps(r) + "\n" for r in _load_trace())
    trace.write_text(legal + line + "\n", encoding="utf-8")
    assert main(["check-trace", str(trace)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert needle in err, err
    assert "line 8" in err or "record 8" in err


def test_ids_1_and_quoted_1_are_never_merged() -> None:
    records: list[object] = [
        {
            "seq": 1,
            "machine": "offload",
            "model": "1",
            "source": "",
            "trigger": "<init>",
            "dest": "queued",
        },
        {
            "seq": 2,
            "machine": "offload",
            "model": 1,
            "source": "queued",
            "trigger": "submit",
            "dest": "pending",
        },
    ]
    with pytest.raises(TraceInputError, match="record 2: model must be a string"):
        check_trace(records)


def test_bad_utf8_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(b'\xff\xfe\n{"seq": 1}\n')
    assert main(["check-trace", str(trace)]) == 2
    assert "not UTF-8" in capsys.readouterr().err


# -- machines of one's own (issue 18, item 1) ------------------------------------------

DOOR = """
machine = "door"
initial = "closed"
[states.closed]
[states.open]
[states.gone]
final = true
[[transitions]]
trigger = "open_it"
source = "closed"
dest = "open"
[[transitions]]
trigger = "close_it"
source = "open"
dest = "closed"
[[transitions]]
trigger = "remove"
source = ["closed", "open"]
dest = "gone"
"""


def _door_trace(tmp_path: Path, last_dest: str = "closed") -> Path:
    rows = [
        ("", "<init>", "closed"),
        ("closed", "open_it", "open"),
        ("open", "close_it", last_dest),
    ]
    trace = tmp_path / "door.jsonl"
    trace.write_text(
        "".join(
            json.dumps(
                {
                    "seq": i,
                    "machine": "door",
                    "model": "front",
                    "source": s,
                    "trigger": t,
                    "dest": d,
                }
            )
            + "\n"
            for i, (s, t, d) in enumerate(rows, start=1)
        )
    )
    return trace


@pytest.mark.parametrize("as_folder", [False, True])
def test_check_trace_of_a_machine_of_ones_own(
    as_folder: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "door.toml").write_text(DOOR)
    where = specs if as_folder else specs / "door.toml"
    trace = _door_trace(tmp_path)
    assert main(["check-trace", "--spec", str(where), str(trace)]) == 0
    assert "3 records, 1 models: every step is legal" in capsys.readouterr().out
    bad = _door_trace(tmp_path, last_dest="gone")
    assert main(["check-trace", "--spec", str(where), str(bad)]) == 1
    out = capsys.readouterr().out
    assert "record 3, seq 3" in out and "cannot reach 'gone'" in out


def test_check_trace_without_the_spec_says_how_to_give_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check-trace", str(_door_trace(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert "unknown machine 'door'" in err and "--spec" in err
    assert err.count("\n") == 1


def test_check_trace_refuses_a_machine_defined_twice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("a.toml", "b.toml"):
        (tmp_path / name).write_text(DOOR)
    assert main(["check-trace", "--spec", str(tmp_path), str(_door_trace(tmp_path))]) == 2
    assert "defined twice" in capsys.readouterr().err


def test_check_trace_bad_arguments_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _door_trace(tmp_path)
    assert main(["check-trace", "--context", "-1", str(trace)]) == 2
    assert "--context must be 0 or more" in capsys.readouterr().err
    assert main(["check-trace", "--spec", str(tmp_path / "missing.toml"), str(trace)]) == 2
    assert "missing.toml" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["check-trace", "--spec", str(empty), str(trace)]) == 2
    assert "no *.toml file" in capsys.readouterr().err
