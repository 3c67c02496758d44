"""The reference scheduler loop and `unicache-fsm simulate`, end to end."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from unicache_fsm.cli import main
from unicache_fsm.scheduler import (
    SimConfig,
    SimConfigError,
    SimReport,
    Simulation,
    make_workload,
)
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
    assert r.requests_served == 120 and r.host_hit_tokens == 0
    assert r.external_hit_rate > 0 and r.loads_committed > 0
    assert r.loads_verified == r.loads_committed and r.loads_mismatched == 0
    assert r.audits_passed == r.steps + 1
    assert r.offloads_published > 0
    assert r.transitions["load_transaction"] >= 4 * r.loads_committed
    assert r.device_hit_tokens + r.loaded_tokens + r.computed_tokens == r.prompt_tokens


@pytest.mark.parametrize("workload", ["multi_turn", "few_shot", "agentic", "random"])
def test_every_workload_at_default_settings_reaches_the_external_tier(workload: str) -> None:
    r = Simulation(SimConfig(workload=workload)).run()
    assert r.requests_served == SimConfig().requests
    assert r.loaded_tokens > 0 and r.loads_committed > 0, r.format()
    assert r.loads_verified == r.loads_committed and r.loads_mismatched == 0
    assert r.leaked_slots and set(r.leaked_slots.values()) == {0}


@pytest.mark.parametrize("workload", ["few_shot", "agentic"])
def test_other_workloads_reuse_prefixes(workload: str) -> None:
    r = _run(workload=workload).report
    assert r.requests_served == 120 and r.device_hit_rate > 0.3


def test_random_reuses_only_its_retries() -> None:
    specs = make_workload("random", requests=200, seed=1)
    prompts = [s.prompt for s in specs]
    repeats = len(prompts) - len(set(prompts))
    assert 0 < repeats < len(prompts) // 5


def test_the_host_tier_backs_up_and_loads_back(tmp_path: Path) -> None:
    cov = tmp_path / "cov.json"
    rc = main(
        ["simulate", "--requests", "200", "--host-tokens", "8192", "--json", "--coverage", str(cov)]
    )
    assert rc == 0
    taken = {row[1] for row in json.loads(cov.read_text())["machines"]["node_residency"]}
    assert {"start_backup", "backup_succeeded", "load_back", "evict", "delete"} <= taken


def test_host_hits_are_counted_apart_from_device_hits() -> None:
    r = _run(requests=200, host_tokens=32768).report
    assert r.host_hit_tokens > 0
    assert r.device_hit_tokens + r.host_hit_tokens + r.loaded_tokens + r.computed_tokens == (
        r.prompt_tokens
    )
    assert set(r.leaked_slots) == {"FULL", "host"} and set(r.leaked_slots.values()) == {0}


def test_bad_host_tokens_is_typed() -> None:
    with pytest.raises(SimConfigError, match="--host-tokens"):
        Simulation(SimConfig(host_tokens=10))


def test_the_cli_and_simconfig_share_one_pool_default() -> None:
    from unicache_fsm.cli import DEFAULT_POOL_TOKENS

    assert SimConfig().pool_tokens == DEFAULT_POOL_TOKENS


def test_the_text_report_spells_out_aborts_transitions_and_leaks() -> None:
    r = _run(requests=60, faults="refuse_load=1.0,seed=1", pool_tokens=1536).report
    text = r.format()
    assert "(-)" not in text
    assert "the store refused the load (store_refused)" in text
    assert re.search(r"leaked slots\s+0 \(FULL 0\)", text)
    quiet = SimReport(transitions={"offload": 0, "load_transaction": 0})
    assert "none fired (offload 0, load_transaction 0)" in quiet.format()
    assert "none aborted" in quiet.format()


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
    if kind is FaultKind.OVERCOUNT_COMPLETIONS:
        # the reference scheduler drives a synchronous store: no job is in flight when it
        # reads a count, so an over-count has nothing to lie about here (the kit injects it
        # where a poll races the store: tests/test_testing_lying_store.py)
        assert r.faults_injected.get(kind.value, 0) == 0, r.faults_injected
    elif kind is FaultKind.OVERREPORT_LAYERS:
        # only a layer-wise loader asks loaded_layers (StoreLinker); this linker does not
        assert r.faults_injected.get(kind.value, 0) == 0, r.faults_injected
    else:
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


def test_setup_builds_the_steps_before_the_clock() -> None:
    sim = Simulation(SimConfig(**SMALL))  # type: ignore[arg-type]
    # every step a run can fire is built in setup (the compiled executors build them
    # lazily otherwise): nothing is left to build, before the run or after it
    assert all(ex.compile_all() == 0 for ex in sim.executors)
    report = sim.run()
    assert report.requests_served == len(sim.specs)
    assert all(ex.compile_all() == 0 for ex in sim.executors)
