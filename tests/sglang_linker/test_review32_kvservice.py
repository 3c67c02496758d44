"""Review of issue 32's kit on a second, independent third-party linker.

- `KvServiceLinker` (tests/sglang_linker/thirdparty/kvservice.py: an in-process KV
  service, every transfer completed later by a worker thread) holds every obligation.
- Each of its mutants (tests/sglang_linker/review32_mutants.py) is caught with seed 1 by
  the scenario suite alone (``seconds=0``: no machine run), and the test names the
  obligation that fails.
- The command line under attack: a module that raises or exits at import, a constructor
  that exits or hangs -- exit 2 and one line; a linker that raises KeyboardInterrupt or
  SystemExit from its calls -- exit 1 with a verdict; a linker that prints -- exit 0.
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import pytest

from sglang_linker.review32_mutants import MUTANTS
from unicache_fsm.cli import main
from unicache_fsm.integrations.linker_kit import rig
from unicache_fsm.integrations.linker_kit.check import check_linker
from unicache_fsm.integrations.linker_kit.obligations import Obligation, Outcome

KVSERVICE = "sglang_linker.thirdparty.kvservice"
MUTANTS_MODULE = "sglang_linker.review32_mutants"
_SERVICES = itertools.count()


def _config(cls: str, module: str, latency_ms: int = 1) -> str:
    # a fresh service per check: a run expects its backing store empty at its start
    extra = {"service": f"review32-{next(_SERVICES)}-{time.monotonic_ns()}"}
    extra["latency_ms"] = latency_ms
    return json.dumps({"linker": cls, "linker_module_path": module, "linker_extra_config": extra})


def test_the_kv_service_linker_holds_every_obligation() -> None:
    result = check_linker(_config("KvServiceLinker", KVSERVICE), seconds=1, seed_value=1)
    assert result.verdicts.ok, result.verdicts.failed
    for obligation in Obligation:
        assert result.verdicts.outcome(obligation)[0] is Outcome.PASS, obligation
    assert "Full+SWA" in result.summary and "machine on Full:" in result.summary


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_each_kv_service_mutant_is_caught(mutant: str) -> None:
    expected = MUTANTS[mutant]
    started = time.monotonic()
    result = check_linker(_config(mutant, MUTANTS_MODULE), seconds=0, seed_value=1)
    took = time.monotonic() - started
    assert result.violation is not None, f"{mutant} was not caught"
    assert result.violation.obligation is expected, result.violation
    assert result.verdicts.outcome(expected)[0] is Outcome.FAIL
    print(f"{mutant}: {expected.value} caught in {took:.1f} s ({result.summary})")


def _one_line_exit_2(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], captured.err
    assert "Traceback" not in captured.out + captured.err


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ("raise RuntimeError('needs a license key')", "raised RuntimeError: needs a license key"),
        ("import sys\nsys.exit('no config')", "raised SystemExit: no config"),
    ],
)
def test_a_module_that_fails_at_import_is_one_line_and_exit_2(
    body: str,
    says: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    name = f"review32_broken_{abs(hash(body))}"
    (tmp_path / f"{name}.py").write_text(body + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = json.dumps({"linker": "L", "linker_module_path": name})
    _one_line_exit_2(["check-linker", config, "--report", str(tmp_path / "r")], says, capsys)
    assert not (tmp_path / "r").exists()


def test_a_constructor_that_exits_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config("ConstructorExits", MUTANTS_MODULE)
    argv = ["check-linker", config, "--report", str(tmp_path / "r")]
    _one_line_exit_2(argv, "raised SystemExit: no kv service configured", capsys)


def test_a_constructor_that_hangs_is_one_line_and_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(rig, "BUILD_S", 1.0)  # the bound, shortened for CI (default 10 s)
    started = time.monotonic()
    config = _config("ConstructorHangs", MUTANTS_MODULE)
    argv = ["check-linker", config, "--report", str(tmp_path / "r")]
    _one_line_exit_2(argv, "did not return within 1 s", capsys)
    assert time.monotonic() - started < 30


@pytest.mark.parametrize(
    ("mutant", "says"),
    [
        ("LookupInterrupts", "lookup raised KeyboardInterrupt"),
        ("OffloadExits", "offload raised SystemExit"),
    ],
)
def test_a_linker_raising_base_exceptions_gets_a_verdict_not_a_traceback(
    mutant: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(mutant, MUTANTS_MODULE)
    argv = ["check-linker", config, "--minutes", "0", "--report", str(tmp_path / "r")]
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert "no-escape" in captured.out and "FAIL" in captured.out, captured.out
    assert says in (tmp_path / "r" / "obligations.txt").read_text()
    assert "Traceback" not in captured.out + captured.err


def test_a_linker_that_prints_still_gets_its_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config("Chatty", MUTANTS_MODULE)
    argv = ["check-linker", config, "--minutes", "0", "--report", str(tmp_path / "r")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "lookup req-" in out and "landed-bytes" in out and "scenarios on Full" in out
