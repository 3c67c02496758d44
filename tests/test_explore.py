"""`unicache-fsm explore`: exhaustive breadth-first exploration of the real system.

Checked here: a small scope is explored to exhaustion (through the CLI, as CI runs it),
the canonical form renames slots and mirrors requests of one key but tells different
states apart, a snapshot continues like a replay, a violation comes back as the
shortest path, printed as a pytest module that reproduces it, the scope options and the
wild faults (one chosen call, one chosen answer) add operations only when switched on,
and eleven planted bugs of the mutation check (tests/test_testing_mutations.py) are found
with a counterexample no longer than the one Hypothesis shrinks to for the same bug (both
lengths printed), each through the operations it needs: two requests for the failed
load left queued, an ill-typed verdict (`garbage_answer`) for the truthy verdict, a
corrupted page (`corrupt`) for the corrupt page kept, a capacity store (`store_pages`)
and two-page keys for the chain offloaded without its link, an unpinned match, a host
tier and an unrelated key (`unrelated`) for the load-back on a stale prefix (marked
slow: 15 operations deep). The twelfth, the rank intersection, is found by the
multi-rank search (`testing.rank_explore`) against the same alphabet under Hypothesis
(`RankWorldMachine`); see docs/design.md.
"""

from __future__ import annotations

import collections
import copy
import json
import multiprocessing
import re
import time
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from planted_bugs import BUGS as PLANTED_BUGS
from planted_bugs import Bug
from unicache_fsm.cli import main
from unicache_fsm.linker import matching as matching_mod
from unicache_fsm.linker import ranks as ranks_mod
from unicache_fsm.pools.transfer import ComponentType, PoolName
from unicache_fsm.serving.invariants import InvariantViolation
from unicache_fsm.store.faults import FaultKind
from unicache_fsm.store.memory import MemoryStore
from unicache_fsm.testing.explore import (
    Op,
    Refused,
    Scope,
    apply,
    enabled_ops,
    explore,
    fingerprint,
    inject,
    replay,
    snapshot,
)
from unicache_fsm.testing.machines import SystemMachine
from unicache_fsm.testing.rank_explore import (
    RankOp,
    RankScope,
    RankWorldMachine,
    apply_rank_op,
    copy_world,
    explore_ranks,
    rank_fingerprint,
    replay_ranks,
)

CI_SCOPE = ["--pages", "2", "--requests", "1", "--key-pages", "1", "--swa-window", "0"]


def _op(ns: dict[str, Any], scope: Scope, label: str) -> Op:
    return next(op for op in enabled_ops(ns, scope) if op.label == label)


def _walk(scope: Scope, labels: list[str]) -> tuple[dict[str, Any], list[Op]]:
    ns = replay(scope, [])
    path = []
    for label in labels:
        op = _op(ns, scope, label)
        apply(op, ns)
        path.append(op)
    return ns, path


def test_cli_explores_a_small_scope_to_exhaustion(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cov = tmp_path / "cov.json"
    argv = ["explore", *CI_SCOPE, "--faults", "refuse_load,fail_batch_midway"]
    assert main([*argv, "--workers", "2", "--coverage", str(cov)]) == 0
    out = capsys.readouterr().out
    print(out)
    assert "exhausted: every reachable state checked" in out
    states = int(re.search(r"states\s+(\d+) distinct", out).group(1))  # type: ignore[union-attr]
    assert states > 100
    reached = re.search(r"coverage\s+(\d+)/(\d+) declared", out)
    assert reached is not None and 0 < int(reached.group(1)) < int(reached.group(2))
    machines = json.loads(cov.read_text())["machines"]
    assert {"load_transaction", "node_residency", "offload"} <= set(machines)
    # the load machine's abort after a failed batch was reached (the injected fault)
    rows = {(s, t, d) for s, t, d, _ in machines["load_transaction"]}
    assert any(t == "abort" for _, t, _ in rows), rows


def test_one_worker_and_two_workers_find_the_same_space() -> None:
    scope = Scope(pages=2, requests=1, swa=False, key_pages=1, faults=())
    one = explore(scope, workers=1, max_depth=6)
    two = explore(scope, workers=2, max_depth=6)
    assert (one.states, one.transitions, one.depth) == (two.states, two.transitions, two.depth)


def test_cli_rejects_bad_scopes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explore", "--faults", "refuse_load,melt"]) == 2
    assert "unknown fault kind 'melt'" in capsys.readouterr().err
    assert main(["explore", "--pages", "0"]) == 2
    assert "--pages" in capsys.readouterr().err
    assert main(["explore", "--depth", "0"]) == 2
    assert main(["explore", "--store-pages", "-1"]) == 2
    assert "--store-pages" in capsys.readouterr().err


def test_scope_options_add_operations_and_wild_faults_pick_call_and_answer() -> None:
    plain = Scope(pages=2, requests=1, swa=False, key_pages=1, faults=())
    ns, _ = _walk(plain, ["compute 0", "progress", "poll"])
    labels = {op.label for op in enabled_ops(ns, plain)}
    assert not any("unpinned" in x or x.startswith("corrupt") for x in labels)
    assert "compute u" not in labels
    more = attrs.evolve(plain, unpinned=True, corrupt=True, store_pages=3, unrelated=True)
    assert "store_pages" not in plain.source() and "store_pages=3" in more.source()
    assert "unrelated" not in plain.source() and "unrelated=True" in more.source()
    ns, _ = _walk(more, ["compute 0", "progress", "poll"])
    labels = {op.label for op in enabled_ops(ns, more)}
    assert {"begin 0 unpinned", "corrupt [100]", "compute u"} <= labels
    apply(_op(ns, more, "compute u"), ns)  # its own first page: a new branch at the root
    assert ns["s"].tree.match_prefix(more.unrelated_key).prefix_len == 1
    s = ns["s"]
    assert s.check_chains and not s.check_stored and s.memory.capacity_pages == 3
    # the corruption is part of the state
    before = fingerprint(ns, more)
    apply(_op(ns, more, "corrupt [100]"), ns)
    assert fingerprint(ns, more) != before
    # a wild fault hits the chosen call with the chosen answer, and refuses an answer
    # the call does not have; its variants come from counting the plain op's calls
    wild = attrs.evolve(plain, faults=(K.GARBAGE_ANSWER,))
    ns, path = _walk(wild, ["compute 0"])
    poll = _op(ns, wild, "poll")
    with inject(ns["s"], K.GARBAGE_ANSWER, call=1, answer=1):  # the count answers -1
        ns["s"].linker.poll_offloads()
    assert ns["s"].linker.stats.store_faults == {"num_completed_offloads": 1}
    code = poll.code.replace("\n", "\n    ")
    far = Op(
        "poll[far]", f"with inject(s, FaultKind.GARBAGE_ANSWER, call=1, answer=5):\n    {code}"
    )
    with pytest.raises(Refused, match="options"):
        apply(far, replay(wild, path))


def test_fingerprints_rename_slots_but_tell_states_apart() -> None:
    scope = Scope(pages=4, requests=2, swa=True, faults=())
    ns_a, _ = _walk(scope, ["compute 0", "progress"])
    # the same operations on a system whose allocator hands out different slots
    ns_b = replay(scope, [])
    s = ns_b["s"]
    held = s.allocator.alloc(2)
    held_swa = s.allocator.alloc_swa(1)
    for label in ["compute 0", "progress"]:
        apply(_op(ns_b, scope, label), ns_b, audit=False)  # `held` is outside the tree
    s.allocator.free(held)
    s.allocator.free_swa(held_swa)
    s.audit()
    slots_a = ns_a["s"].stored_nodes() or list(ns_a["s"].tree.nodes())
    slots_b = ns_b["s"].stored_nodes() or list(ns_b["s"].tree.nodes())
    assert [n.data for n in slots_a][-1][ComponentType.FULL].tolist() != [n.data for n in slots_b][
        -1
    ][ComponentType.FULL].tolist()
    assert fingerprint(ns_a, scope) == fingerprint(ns_b, scope)
    # one more step (the offload's completion polled) is a different state
    ns_c, _ = _walk(scope, ["compute 0", "progress", "poll"])
    assert fingerprint(ns_c, scope) != fingerprint(ns_a, scope)
    # the device prefix a load matched is part of its state: the same load on an anchor
    # that moved into other slots since is another state (the stale prefix)
    u = Scope(pages=2, requests=2, swa=False, key_pages=1, faults=(), unpinned=True)
    steps = ["begin 0", "complete 0", "progress", "poll", "compute 1", "evict", "begin 1 unpinned"]
    ns_u, _ = _walk(u, steps)
    moved = snapshot(ns_u)
    moved["r1"].load.device_prefix = moved["r1"].load.device_prefix + 1
    assert fingerprint(moved, u) != fingerprint(ns_u, u)
    # and replaying a path reaches the same fingerprint every time
    _, path = _walk(scope, ["compute 0", "progress", "poll", "evict", "begin 0", "load_back 0"])
    assert fingerprint(replay(scope, path), scope) == fingerprint(replay(scope, path), scope)


def test_mirror_states_share_a_fingerprint_when_requests_share_a_key() -> None:
    scope = Scope(pages=4, requests=2, swa=True, key_pages=1, faults=())
    assert scope.symmetric
    ns_0, _ = _walk(scope, ["compute 0", "progress", "poll", "evict", "begin 0"])
    ns_1, _ = _walk(scope, ["compute 0", "progress", "poll", "evict", "begin 1"])
    assert ns_0["s"].linker.loads.keys() == {"r0"} and ns_1["s"].linker.loads.keys() == {"r1"}
    assert fingerprint(ns_0, scope) == fingerprint(ns_1, scope)
    both, _ = _walk(scope, ["compute 0", "progress", "poll", "evict", "begin 0", "begin 1"])
    assert fingerprint(both, scope) != fingerprint(ns_0, scope)
    # with two keys the requests are not interchangeable
    two = Scope(pages=4, requests=2, swa=True, key_pages=2, faults=())
    assert not two.symmetric


def test_a_snapshot_continues_like_a_replay_and_leaves_the_original_alone() -> None:
    scope = Scope(pages=4, requests=2, swa=True, key_pages=1)
    labels = ["compute 0", "progress", "poll", "evict", "begin 0", "load_back 0", "start"]
    ns, path = _walk(scope, labels)
    before = fingerprint(ns, scope)
    for op in enabled_ops(ns, scope):
        copied = snapshot(ns)
        assert copied["s"] is not ns["s"] and copied["r0"].load is copied["s"].linker.loads["r0"]
        fresh = replay(scope, path)
        outcomes = []
        for state in (copied, fresh):
            try:
                apply(op, state)
                outcomes.append(fingerprint(state, scope))
            except Exception as exc:  # a refusal must be the same on both
                outcomes.append(repr(exc))
        assert outcomes[0] == outcomes[1], op.label
        assert fingerprint(ns, scope) == before, op.label


def test_a_snapshot_keeps_views_on_their_copied_storage_and_shares_no_memory() -> None:
    base = torch.arange(12, dtype=torch.float16).reshape(3, 4)
    view = base.view(12)[4:8]
    other = torch.arange(6)
    ns = {
        # a deque goes through copy.deepcopy (Tensor.__deepcopy__), the rest through
        # snapshot's own paths: views of one storage still share one copied storage
        "s": {"q": collections.deque([other]), "base": base, "view": view, "again": (base,)},
        "r0": [view, other[2:]],
        "helper": base,
    }
    out = snapshot(ns)
    cb, cv = out["s"]["base"], out["s"]["view"]
    assert out["helper"] is base and out["s"]["again"][0] is cb and out["r0"][0] is cv
    assert torch.equal(cb, base) and torch.equal(cv, view)
    assert cv.stride() == view.stride() and cv.storage_offset() == view.storage_offset() == 4
    cv.fill_(-1)
    assert cb[1].tolist() == [-1.0] * 4 and base[1].tolist() == [4.0, 5.0, 6.0, 7.0]
    assert cb.untyped_storage().data_ptr() != base.untyped_storage().data_ptr()
    out["s"]["q"][0][3] = 99
    assert out["r0"][1].tolist() == [2, 99, 4, 5] and other.tolist() == list(range(6))


# -- planted bugs (the mutation check's) -------------------------------------------------

PLANTED = {bug.name: bug for bug in PLANTED_BUGS}
K = FaultKind


def _case(name: str, scope: Scope, **marks: Any) -> Any:
    """One planted bug (its plant, its Hypothesis hunt and what its failure names: the
    mutation check's) with the explore scope that finds it."""
    return pytest.param(PLANTED[name], scope, id=name, **marks)


BUGS = [
    _case(
        "swa_leak", Scope(pages=2, requests=1, swa=True, key_pages=1, faults=(K.FAIL_BATCH_MIDWAY,))
    ),
    _case("greedy_commit", Scope(pages=4, requests=1, swa=False, key_pages=2, faults=())),
    _case("forgetful_split", Scope(pages=4, requests=2, swa=False, key_pages=2, faults=())),
    _case("careless_eviction", Scope(pages=2, requests=1, swa=False, key_pages=1, faults=())),
    _case(
        "optimist",
        Scope(pages=2, requests=1, swa=False, key_pages=1, faults=(K.FAIL_BATCH_BEFORE_START,)),
    ),
    _case(
        "stuck_offload",
        Scope(pages=2, requests=1, swa=False, key_pages=1, faults=(K.REFUSE_OFFLOAD,)),
    ),
    # needs two requests: the refused load rides in the other's batch
    _case(
        "failed_load_queued",
        Scope(pages=2, requests=2, swa=False, key_pages=1, faults=(K.REFUSE_LOAD,)),
    ),
    # needs an ill-typed verdict on a failed batch's completion
    _case(
        "truthy_verdict",
        Scope(
            pages=2,
            requests=1,
            swa=False,
            key_pages=1,
            faults=(K.FAIL_BATCH_BEFORE_START, K.GARBAGE_ANSWER),
        ),
    ),
    # needs a page corrupted in the store
    _case(
        "corrupt_page_kept",
        Scope(pages=2, requests=1, swa=False, key_pages=1, faults=(), corrupt=True),
    ),
    # needs SWA checkpoints and a key longer than the window: a checkpoint window below it
    _case(
        "checkpoint_freed",
        Scope(pages=3, requests=1, swa=True, key_pages=2, faults=(), swa_checkpoint=1),
    ),
    # needs a capacity store and two requests: one key's chain stored below the other's
    _case(
        "chain_without_link",
        Scope(pages=4, requests=2, swa=False, key_pages=2, faults=(), store_pages=3),
    ),
    # needs the matched anchor moved into other slots while it stays the same node: an
    # unpinned match, a host tier that keeps the evicted anchor in the tree, and an
    # unrelated prefix that takes its freed slot (`unrelated`)
    _case(
        "stale_prefix",
        Scope(
            pages=2,
            requests=2,
            swa=False,
            key_pages=1,
            host_pages=1,
            faults=(),
            unpinned=True,
            unrelated=True,
        ),
        marks=pytest.mark.slow,  # 15 operations deep: minutes, not seconds
    ),
]


# how many operations of the explorer's alphabet one SystemMachine rule performs
OPS_PER_RULE = {
    "compute": lambda args: 3 if "settle=True" in args else 1,  # + progress + poll
    "begin": lambda args: 2 if "prepare=True" in args else 1,  # + load_back
    "revisit": lambda args: 6,  # compute, progress, poll, evict, begin, load_back
    "step": lambda args: 4,  # start, progress, finish, poll
    "poll_only": lambda args: 2,  # finish, poll
    # the unpinned match -> load gap: compute the head and the key (each settled: compute,
    # progress, poll), evict the tail, an unpinned begin, the meddling, then load_back
    "gap": lambda args: 3 + 3 + 1 + 1 + 1 + _MEDDLE_OPS[args.split("meddle='")[1].split("'")[0]],
}
# what the gap's meddling costs: a reload backs the anchor up, evicts everything (at
# least one eviction), computes an unrelated prefix and loads the anchor back from the
# host (each of the four an operation of the explorer's alphabet: `backup`, `evict`,
# `compute`, `host_load`); the others are one compute or one eviction
_MEDDLE_OPS = {"reload": 4, "refill": 1, "evict_swa": 1, "evict": 1, "nothing": 0}


def _program(exc: BaseException) -> list[str]:
    """The rule calls of the falsifying program Hypothesis noted on `exc` (the invariant
    checks between them are not steps)."""
    notes = "\n".join(getattr(exc, "__notes__", []))
    return [
        line
        for line in notes.splitlines()
        if line.startswith("state.")
        and not line.startswith(("state.setup", "state.teardown", "state.audited"))
    ]


# the Hypothesis side of the comparison: the mutation check's hunt with shrinking on. The
# hunt stops at its first failure (only that one is shrunk); nothing is read from or
# written to an example database, so every run starts from the same derandomized search
SHRINK_HUNT = settings(
    max_examples=6000,  # as the mutation check's hunts (it stops at the first failure)
    # shorter programs than the mutation check's 40 steps: each of these bugs is found
    # within 15, and shrinking a shorter program costs a fraction of the time
    stateful_step_count=15,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.generate, Phase.shrink],
    report_multiple_bugs=False,
)
# when the 15-step hunt misses (the fault pattern comes from a seeded generator Hypothesis
# cannot steer, and iteration orders follow the process's hash seed, so a derandomized
# hunt still finds a bug in some processes and not in others), the mutation check's own
# 40-step programs, with shrinking on: the comparison is with what Hypothesis finds at all
LONG_HUNT = settings(SHRINK_HUNT, stateful_step_count=40, max_examples=20_000)  # as theirs


def _hypothesis_length(
    machine_attrs: dict[str, Any], hunt: settings = SHRINK_HUNT
) -> tuple[int, int] | str:
    """Run the mutation check's hunt with shrinking on: the shrunk program's rules, and
    the operations of the explorer's alphabet they perform (the same unit as explore's);
    a string saying what went wrong when there is no program to measure.

    Hypothesis shrinks the first failure it meets (``report_multiple_bugs=False``); a
    planted bug often breaks several invariants, each of them is that bug. This runs in
    a forked pool worker, so it returns its verdict instead of failing: pytest's
    failure exceptions derive from BaseException and would kill the worker, leaving the
    parent waiting for an answer that never comes."""
    machine = type("Shrink", (SystemMachine,), machine_attrs)
    found: Exception | None = None
    for attempt in (hunt, LONG_HUNT) if hunt is SHRINK_HUNT else (hunt,):
        try:
            run_state_machine_as_test(machine, settings=attempt)
        except Exception as exc:
            found = exc
            break
    if found is None:
        return f"Hypothesis found no failure in {hunt.max_examples} programs"
    failures = [e for e in getattr(found, "exceptions", [found]) if _program(e)]
    if not failures:
        return f"Hypothesis printed no falsifying program: {found!r}"
    failure = min(failures, key=lambda e: len(_program(e)))
    steps = _program(failure)
    ops = 0
    for line in steps:
        name, _, args = line.removeprefix("state.").partition("(")
        ops += OPS_PER_RULE.get(name, lambda args: 1)(args)
    if _in_teardown(failure):
        # the machine's teardown drives what is in flight (start, progress, finish, ...)
        # before it fails: counted as its first three operations, a lower bound
        ops += 3
    return len(steps), ops


def _in_teardown(exc: BaseException) -> bool:
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "teardown":
            return True
        tb = tb.tb_next
    return False


@pytest.mark.parametrize(("bug", "scope"), BUGS)
def test_explore_finds_each_planted_bug_no_longer_than_hypothesis(
    monkeypatch: pytest.MonkeyPatch, bug: Bug, scope: Scope, tmp_path: Path
) -> None:
    bug.plant(monkeypatch)
    names = bug.names
    began = time.perf_counter()
    # Hypothesis hunts and shrinks in a forked process (the bug planted there too) while
    # explore searches here: the two halves share the machine's cores
    with multiprocessing.get_context("fork").Pool(1) as pool:
        hunt = pool.apply_async(_hypothesis_length, (bug.attrs,))
        report = explore(scope, workers=1, minutes=20)
        explored = time.perf_counter() - began
        outcome = hunt.get(timeout=1500)  # a dead worker fails the test, never hangs it
    assert not isinstance(outcome, str), outcome
    rules, shrunk = outcome
    found = report.violation
    assert found is not None, report.summary()
    assert any(n in found.error for n in names), found.error
    print(
        f"\n{bug.name}: explore {len(found)} operations ({report.states} states, "
        f"{explored:.1f} s); Hypothesis shrank to {rules} rules = {shrunk} operations "
        f"(both done after {time.perf_counter() - began:.1f} s)"
    )
    assert len(found) <= shrunk
    # the printed test is a runnable pytest module that hits the same violation
    test = found.as_test()
    module: dict[str, Any] = {}
    exec(compile(test, str(tmp_path / "test_found.py"), "exec"), module)
    with pytest.raises(Exception, match="|".join(re.escape(n) for n in names)):
        module["test_explore_counterexample"]()
    assert "stateDiagram" in found.diagrams()


def test_a_hunt_that_finds_nothing_answers_its_parent() -> None:
    """No bug planted: the forked Hypothesis half says so instead of dying (which left
    the parent waiting forever)."""
    few = settings(SHRINK_HUNT, max_examples=2, stateful_step_count=3)
    with multiprocessing.get_context("fork").Pool(1) as pool:
        outcome = pool.apply_async(_hypothesis_length, ({}, few)).get(timeout=300)
    assert outcome == "Hypothesis found no failure in 2 programs"


def test_a_store_with_a_background_worker_is_not_copied() -> None:
    store = MemoryStore(background=True)
    try:
        with pytest.raises(TypeError, match="background worker"):
            copy.deepcopy(store)
    finally:
        store.close()
    quiet = MemoryStore()
    twin = copy.deepcopy(quiet)
    assert twin is not quiet and twin.stored_keys(PoolName.KV) == quiet.stored_keys(PoolName.KV)


# -- several ranks (testing.rank_explore) ----------------------------------------------


def _plant_min_of_maxima(monkeypatch: pytest.MonkeyPatch) -> None:
    # the intersection takes the MIN of each rank's largest boundary (wrong on sparse sets)
    def min_of_maxima(group: Any, restorable: Any, num_pages: int) -> int:
        best = max(restorable, default=0)
        return int(group.all_reduce_min([best])[0])

    monkeypatch.setattr(ranks_mod, "intersect_restorable", min_of_maxima)
    monkeypatch.setattr(matching_mod, "intersect_restorable", min_of_maxima)  # its own name


RANK_SCOPE = RankScope(ranks=2, pages=2, doc_pages=2, window_pages=1)


def _hypothesis_rank_length(scope: RankScope) -> int:
    """The rank world's Hypothesis machine with shrinking on (the comparison's hunt):
    its shrunk program's steps, each one operation of the explorer's alphabet."""
    machine = type("RankShrink", (RankWorldMachine,), {"scope": scope})
    with pytest.raises(Exception) as info:
        run_state_machine_as_test(machine, settings=SHRINK_HUNT)
    found = info.value
    failures = [e for e in getattr(found, "exceptions", [found]) if _program(e)]
    assert failures, f"Hypothesis printed no falsifying program: {found!r}"
    assert all("restorable intersection" in str(e) for e in failures), failures
    return min(len(_program(e)) for e in failures)


def test_explore_ranks_finds_the_rank_intersection_bug_no_longer_than_hypothesis(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _plant_min_of_maxima(monkeypatch)
    # one after the other in this process (a forked child of a process that ran thread
    # ranks can inherit a held lock)
    began = time.perf_counter()
    report = explore_ranks(RANK_SCOPE, minutes=10)
    explored = time.perf_counter() - began
    shrunk = _hypothesis_rank_length(RANK_SCOPE)
    found = report.violation
    assert found is not None, report.summary()
    assert "restorable intersection" in found.error, found.error
    print(
        f"\nmin_of_maxima: explore_ranks {len(found)} operations ({report.states} states, "
        f"{explored:.1f} s); Hypothesis (the same alphabet) shrank to {shrunk} operations "
        f"(both done after {time.perf_counter() - began:.1f} s)"
    )
    assert len(found) <= shrunk
    # the two ranks' stores lost different pages, and the ranks then looked up together
    kinds = [op.kind for op in found.path]
    assert kinds[-1] == "match" and {op.rank for op in found.path if op.rank >= 0} == {0, 1}
    with pytest.raises(InvariantViolation, match="restorable intersection"):
        found.replay()


def test_rank_world_without_a_bug_agrees_and_ranks_are_interchangeable() -> None:
    report = explore_ranks(RANK_SCOPE, max_depth=4)
    assert report.violation is None, report.summary()
    assert report.states > 20
    # rank 0 losing a page and rank 1 losing it are one state (ranks are interchangeable)
    base = [RankOp("compute 1", "compute", pages=1)]
    lose = [
        RankOp(f"store_evict {r} kv [100]", "store_evict", pages=1, rank=r, pool=PoolName.KV)
        for r in (0, 1)
    ]
    w0 = replay_ranks(RANK_SCOPE, [*base, lose[0]])
    w1 = replay_ranks(RANK_SCOPE, [*base, lose[1]])
    both = replay_ranks(RANK_SCOPE, [*base, *lose])
    assert rank_fingerprint(w0, RANK_SCOPE) == rank_fingerprint(w1, RANK_SCOPE)
    assert rank_fingerprint(w0, RANK_SCOPE) != rank_fingerprint(both, RANK_SCOPE)
    # a copied world runs on its own thread group and leaves the original alone
    copied = copy_world(w0)
    apply_rank_op(RankOp("match", "match"), copied, RANK_SCOPE)
    apply_rank_op(lose[1], copied, RANK_SCOPE)
    assert rank_fingerprint(w0, RANK_SCOPE) == rank_fingerprint(w1, RANK_SCOPE)
    assert copied[0].linker.group is not w0[0].linker.group
    with pytest.raises(ValueError, match="ranks"):
        RankScope(ranks=1)
