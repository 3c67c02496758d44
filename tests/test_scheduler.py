"""The reference scheduler loop and `unicache-fsm simulate`, end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from unicache_fsm.cli import main
from unicache_fsm.scheduler import SimConfig, SimConfigError, Simulation, make_workload
from unicache_fsm.serving.invariants import InvariantViolation
from unicache_fsm.store.faults import FaultKind
from unicache_fsm.tree import RadixTree
from unicache_fsm.tree.residency import ExecutorKind

SMALL = {"requests": 120, "pool_tokens": 4096, "audit_every": 1}  # audit every step


def _run(**kw: object) -> Simulation:
    sim = Simulation(SimConfig(**{**SMALL, **kw}))  # type: ignore[arg-type]
    sim.run()
    return sim


def test_multi_turn_loads_from_the_store_and_every_load_matches_recompute() -> None:
    sim = _run()
    r = sim.report
    assert r.requests_served == 120
    assert r.external_hit_rate > 0 and r.loads_committed > 0
    assert r.loads_verified == r.loads_committed and r.loads_mismatched == 0
    assert r.audits_passed == r.steps + 1
    assert r.offloads_published > 0
    assert r.transitions["load_transaction"] >= 4 * r.loads_committed
    assert r.device_hit_tokens + r.loaded_tokens + r.computed_tokens == r.prompt_tokens


def test_random_prompts_never_hit_the_store() -> None:
    r = _run(workload="random").report
    assert r.requests_served == 120
    assert r.external_hit_rate == 0 and r.device_hit_rate == 0
    assert r.loads_committed == 0 and r.offloads_published == 120


@pytest.mark.parametrize("workload", ["few_shot", "agentic"])
def test_other_workloads_reuse_prefixes(workload: str) -> None:
    r = _run(workload=workload).report
    assert r.requests_served == 120 and r.device_hit_rate > 0.3


def test_swa_and_chunked_prefill() -> None:
    r = _run(swa_window=48, chunk_size=64, workload="agentic").report
    assert r.requests_served == 120 and r.loads_mismatched == 0
    sim = _run(swa_window=100)
    assert sim.report.loads_committed > 0
    assert sim.report.loads_verified == sim.report.loads_committed


@pytest.mark.parametrize("kind", list(FaultKind))
def test_every_fault_kind_ends_with_all_requests_served(kind: FaultKind) -> None:
    prob = "every:3" if kind is FaultKind.DELAY_COMPLETION else "0.5"
    sim = _run(faults=f"{kind.value}={prob},seed=4", requests=80, pool_tokens=1536)
    r = sim.report
    assert r.requests_served == 80
    assert r.faults_injected.get(kind.value, 0) > 0, r.faults_injected
    assert r.loads_mismatched == 0
    assert not sim.linker.loads and not sim.linker.offloads
    assert all(n.lock_ref == 0 for n in sim.tree.nodes())


def test_reference_and_compiled_executors_serve_identically() -> None:
    a = _run(requests=60).report
    b = _run(requests=60, executor=ExecutorKind.REFERENCE).report
    for field in ("device_hit_tokens", "loaded_tokens", "loads_committed", "transitions"):
        assert getattr(a, field) == getattr(b, field), field


def test_workloads_are_seedable() -> None:
    one = make_workload("agentic", requests=30, seed=3)
    assert one == make_workload("agentic", requests=30, seed=3)
    assert one != make_workload("agentic", requests=30, seed=4)


@pytest.mark.parametrize("every", [7, 10**6])
def test_audits_run_at_the_cadence_set_and_once_at_the_end(every: int) -> None:
    r = _run(requests=60, audit_every=every).report
    assert r.steps > 7
    assert r.audits_passed == r.steps // every + 1
    assert r.config["audit_every"] == every
    assert f"every {every} steps" in r.format()


def test_an_audit_runs_the_kits_invariants_and_names_the_broken_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def forgets(self: RadixTree, node: object, receipt: object = None) -> None:
        return None  # planted bug: a released lock stays counted on the path

    monkeypatch.setattr(RadixTree, "dec_lock_ref", forgets)
    with pytest.raises(InvariantViolation, match="lock balance"):
        _run(requests=20)


def test_the_default_audit_cadence_is_not_every_step() -> None:
    assert SimConfig().audit_every > 1


def test_bad_config_is_typed() -> None:
    with pytest.raises(SimConfigError, match="power of two"):
        Simulation(SimConfig(page_size=12))
    with pytest.raises(SimConfigError, match="too small"):
        Simulation(SimConfig(pool_tokens=128))
    with pytest.raises(SimConfigError, match="--audit-every must be at least 1 step, got 0"):
        Simulation(SimConfig(audit_every=0))


def test_cli_json_and_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.jsonl"
    argv = ["simulate", "--requests", "40", "--json", "--trace", str(trace), "--audit-every", "3"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["requests_served"] == 40
    assert report["config"]["audit_every"] == 3
    assert report["audits_passed"] == report["steps"] // 3 + 1
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    moves = [rec for rec in lines if rec["trigger"] != "<init>"]
    assert len(moves) == sum(report["transitions"].values())
    assert {rec["machine"] for rec in lines} >= {"node_residency", "offload"}
    assert [rec["seq"] for rec in lines] == list(range(1, len(lines) + 1))


@pytest.mark.parametrize(
    ("args", "culprit"),
    [
        (["--workload", "nope"], "unknown workload 'nope'"),
        (["--page-size", "12"], "power of two"),
        (["--pool-tokens", "64"], "too small"),
        (["--faults", "explode=1"], "explode"),
        (["--executor", "fast"], "fast"),
        (["--audit-every", "0"], "--audit-every"),
    ],
)
def test_cli_bad_arguments_exit_2_with_one_line(args: list[str], culprit: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "unicache_fsm", "simulate", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("unicache-fsm: error:"), done.stderr
    assert culprit in lines[0] and "Traceback" not in done.stderr
