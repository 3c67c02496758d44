"""``unicache-fsm check-linker`` and the linker kit, on linkers this project did not write.

- The third-party `DirLinker` (tests/sglang_linker/thirdparty) holds every obligation.
- Each of its mutants (tests/sglang_linker/mutants.py: one realistic bug each) is caught,
  with seed 1 and a 2-second machine budget (most fall to a scenario first); the test
  names the obligation and prints the time it took to catch.
- The project's own `StoreLinker` holds every obligation on the memory, file and Redis
  stores (and the old launch name `StorePlugin` still builds it).
- The CLI: exit 0 / 1 / 2, the table, the written report and a failing program that
  runs as a pytest file; bad input in one line.
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path
from typing import Any

import pytest

from sglang_linker.mutants import MUTANTS
from unicache_fsm.cli import main
from unicache_fsm.integrations.linker_kit.check import check_linker
from unicache_fsm.integrations.linker_kit.obligations import (
    BadLinkerError,
    LinkerViolation,
    Obligation,
    Outcome,
)

DIRLINKER = "sglang_linker.thirdparty.dirlinker"


def _config(cls: str, module: str, **extra: Any) -> str:
    return json.dumps({"linker": cls, "linker_module_path": module, "linker_extra_config": extra})


def test_the_third_party_linker_holds_every_obligation(tmp_path: Path) -> None:
    result = check_linker(_config("DirLinker", DIRLINKER, root=str(tmp_path)), seconds=3)
    assert result.verdicts.ok, result.verdicts.failed
    for obligation in Obligation:
        assert result.verdicts.outcome(obligation)[0] is Outcome.PASS, obligation
    assert "Full+SWA" in result.summary and "machine on Full:" in result.summary


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_each_mutant_is_caught(mutant: str, tmp_path: Path) -> None:
    expected = MUTANTS[mutant]
    config = _config(mutant, "sglang_linker.mutants", root=str(tmp_path))
    started = time.monotonic()
    if expected is Obligation.SIGNATURES:
        with pytest.raises(BadLinkerError) as info:
            check_linker(config, seconds=2, seed_value=1)
        assert "cannot run under SGLang 0.5.23" in str(info.value)
        print(f"{mutant}: refused before anything ran: {info.value}")
        return
    result = check_linker(config, seconds=2, seed_value=1)
    took = time.monotonic() - started
    assert result.violation is not None, f"{mutant} was not caught"
    assert result.violation.obligation is expected, result.violation
    assert result.verdicts.outcome(expected)[0] is Outcome.FAIL
    assert result.program is not None and "def test_shortest_failing_program" in result.program
    print(f"{mutant}: {expected.value} caught in {took:.1f} s ({result.summary})")


@pytest.mark.parametrize(
    ("missing", "mutant"),
    [
        ("abstract, missing finish_layer_wise_loading", "NoFinishLayerWiseLoading"),
        ("forward_stream", "NoForwardStream"),
        ("offload(transfers, session_id=...) fails", "NoSessionId"),
    ],
)
def test_an_old_revisions_linker_is_refused_in_one_line_naming_what_is_missing(
    missing: str, mutant: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = _config(mutant, "sglang_linker.mutants", root=str(tmp_path))
    assert main(["check-linker", config, "--report", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and missing in err
    assert not (tmp_path / "r").exists()  # nothing ran


def test_the_cli_passes_the_reference_and_writes_its_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "linker.json"
    config.write_text(_config("DirLinker", DIRLINKER, root=str(tmp_path / "pages")))
    report = tmp_path / "report"
    argv = ["check-linker", f"@{config}", "--minutes", "0.02", "--seed", "3", "--report"]
    assert main([*argv, str(report)]) == 0
    out = capsys.readouterr().out
    assert "landed-bytes" in out and "covered 20 scenarios on Full" in out
    assert {p.name for p in report.iterdir()} == {"obligations.txt", "coverage.json", "coverage.md"}
    assert "stateDiagram-v2" in (report / "coverage.md").read_text()


def test_the_cli_fails_a_mutant_and_its_program_replays_the_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config("CancelLies", "sglang_linker.mutants", root=str(tmp_path / "pages"))
    report = tmp_path / "report"
    assert main(["check-linker", config, "--minutes", "0.02", "--report", str(report)]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "nothing-queued" in out
    program = report / "test_shortest_failing_program.py"
    spec = importlib.util.spec_from_file_location("shortest_program", program)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(LinkerViolation) as info:
        module.test_shortest_failing_program()
    assert info.value.obligation is Obligation.NOTHING_QUEUED


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ("{not json", "is not JSON"),
        ('{"linker": "X", "linker_module_path": "m", "extra": 1}', "unknown fields"),
        ('{"linker": "X", "linker_module_path": "no_such_module_here"}', "cannot import module"),
        (_config("NoSuchClass", DIRLINKER), "has no attribute 'NoSuchClass'"),
        (_config("PageError", DIRLINKER), "is not a subclass"),
        (_config("DirLinker", DIRLINKER), "building it through SGLang's factory raised KeyError"),
        ("@/no/such/config.json", "CONFIG '/no/such/config.json': no such file"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    config: str, says: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["check-linker", config, "--report", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and says in err, err


def _store_config(store_kind: str, tmp_path: Path) -> str:
    module = "unicache_fsm.integrations.sglang"
    if store_kind == "memory":
        return _config("StorePlugin", "unicache_fsm.integrations.linker_kit.store_plugin")
    if store_kind == "file":
        return _config("StoreLinker", module, store=f"file:{tmp_path / 'store'}")
    from redis_helpers import fresh_namespace, shared_server

    return _config("StoreLinker", module, store=shared_server().url, namespace=fresh_namespace())


def test_the_projects_store_linker_holds_every_obligation(store_kind: str, tmp_path: Path) -> None:
    result = check_linker(_store_config(store_kind, tmp_path), seconds=3)
    assert result.verdicts.ok, result.verdicts.failed
    shared = result.verdicts.outcome(Obligation.SHARING)[0]
    assert shared is (Outcome.NOT_APPLICABLE if store_kind == "memory" else Outcome.PASS)


def test_the_kit_is_reachable_from_the_sglang_integration_and_the_testing_kit() -> None:
    from unicache_fsm import testing
    from unicache_fsm.integrations import sglang
    from unicache_fsm.integrations.linker_kit.machine import LinkerMachine

    assert sglang.check_linker is check_linker and testing.check_linker is check_linker
    assert testing.LinkerMachine is LinkerMachine and sglang.LinkerMachine is LinkerMachine
