"""A batch holding only loads being given up is never waited on forever.

A load the store refused (or whose `load` failed) is given up; when the store's answer
to its cancel is lost, the linker cannot know whether the store holds it, so a later
`start_loading` puts it in the batch the store answers. If that answer is an id the
store never started, and the store never held the load, no completion will ever end
the batch: the linker's nudge (asking the store to start loads again) is answered -1,
and the batch must end then, its slots quarantined, instead of holding the load
forever (found by `unicache-fsm fuzz`). A batch holding a load the store accepted is
not given up: an honest store that is merely slow still commits it.

Each test runs the real `MemoryStore` inside the kit's `FaultyStore`, switching one
fault on for exactly the calls that show it, and checks the system's audit.
"""

from __future__ import annotations

import pytest

from unicache_fsm.linker.load import AbortReason
from unicache_fsm.serving.request import Outcome
from unicache_fsm.serving.system import System
from unicache_fsm.store.faults import FaultKind, FaultPolicy, FaultRule
from unicache_fsm.testing.machines import SystemMachine
from unicache_fsm.testing.walk import Replayed

K = FaultKind
P = 4
ALWAYS = FaultRule(every=1)
ROUNDS = 16  # bounded: a load that never ends fails here
SEED = 0  # FaultyStore draws whether a failing cancel reaches the store: here not


def key_of(pages: int, base: int) -> list[int]:
    return list(range(base, base + pages * P))


def faulty(*, swa: bool = False, delay_steps: int = 2, seed: int = 0) -> tuple[System, FaultPolicy]:
    policy = FaultPolicy(seed=seed, delay_steps=delay_steps)
    return System.build(P, swa=swa, faults=policy), policy


def stored(s: System, rid: str, pages: int, base: int) -> list[int]:
    """A prefix the store holds and the device does not."""
    key = key_of(pages, base)
    s.compute(rid, key)
    s.evict_all()
    return key


def rounds(s: System, until: object) -> int:
    """Step the scheduler (start, progress, finish) until `until()` or ROUNDS; the count."""
    for n in range(ROUNDS):
        if until():  # type: ignore[operator]
            return n
        s.linker.start_loading()
        s.store.progress()
        s.finish_loads()
        s.audit()
    assert until(), f"not done after {ROUNDS} rounds: batches {s.linker.batches}"  # type: ignore[operator]
    return ROUNDS


@pytest.mark.parametrize("swa", [False, True])
def test_a_refused_load_in_a_batch_never_started_ends(swa: bool) -> None:
    """The store refuses the load, the cancel's answer is lost, and `start_loading`
    answers an id it never started: the batch ends at the nudge, the load aborts
    (its request recomputes) and its slots stay held until a reset."""
    s, policy = faulty(swa=swa)
    a = stored(s, "A", 3, 100)
    req = s.begin("a", a, load=False)
    assert req.load is not None
    policy.rules[K.REFUSE_LOAD] = ALWAYS
    policy.rules[K.RAISE_ERROR] = ALWAYS  # the cancel of the refused load raises
    assert not s.linker.load_back(req.load)
    del policy.rules[K.REFUSE_LOAD], policy.rules[K.RAISE_ERROR]
    assert req.load.abort_pending is AbortReason.STORE_REFUSED  # the store may hold it
    policy.rules[K.UNKNOWN_BATCH] = ALWAYS
    batch = s.linker.start_loading()
    del policy.rules[K.UNKNOWN_BATCH]
    assert batch >= 0 and req.load.batch == batch  # the linker cannot tell it is empty
    rounds(s, lambda: not s.in_flight())
    assert req.load.state == "aborted"
    assert s.linker.quarantine.num_slots() > 0  # no completion proved the store done
    s.complete(req)
    assert req.outcome is Outcome.ABORTED
    s.audit()
    s.linker.reset()
    s.assert_quiet()
    assert s.linker.quarantine.num_slots() == 0
    s.audit()


def test_a_released_load_whose_cancel_was_lost_is_freed_by_its_own_completion() -> None:
    """The request goes away, the cancel's answer is lost (the store kept the load), and
    the honest store runs its batch slowly: the nudge ends the batch (its only load
    may have been given back), and the store's completion, when it comes, releases
    the slots it held: no reset is needed, nothing is freed early."""
    s, policy = faulty(delay_steps=12, seed=SEED)
    a = stored(s, "A", 2, 100)
    req = s.begin("a", a)
    assert req.prepared and req.load is not None
    load = req.load
    policy.rules[K.RAISE_ERROR] = ALWAYS
    s.release(req)
    del policy.rules[K.RAISE_ERROR]
    assert s.faulty.pending()[0] == ("a",)  # the cancel did not reach the store
    policy.rules[K.DELAY_COMPLETION] = ALWAYS
    batch = s.linker.start_loading()
    s.store.progress()  # the batch runs; its completion is held back 12 calls
    del policy.rules[K.DELAY_COMPLETION]
    assert batch >= 0 and load.batch == batch and load.state == "prepared.loading"
    rounds(s, lambda: not s.in_flight())
    assert load.state == "aborted"
    assert s.linker.quarantine.num_slots() > 0  # the store may still write them
    rounds(s, lambda: s.linker.quarantine.num_slots() == 0)  # its own completion came
    s.audit()
    s.assert_quiet()


def test_a_load_the_store_accepted_waits_for_a_slow_batch() -> None:
    """Not given up: the same slow batch, its request still waiting, commits when the
    store's completion comes, however many nudges the store answers -1 meanwhile."""
    s, policy = faulty(delay_steps=12)
    a = stored(s, "A", 2, 100)
    req = s.begin("a", a)
    assert req.prepared and req.load is not None
    policy.rules[K.DELAY_COMPLETION] = ALWAYS
    s.linker.start_loading()
    s.store.progress()
    del policy.rules[K.DELAY_COMPLETION]
    waited = rounds(s, lambda: req.load is not None and req.load.state == "committed")
    assert waited > 8  # two nudges at least came and went
    s.complete(req)
    assert req.outcome is Outcome.COMMITTED
    s.audit()
    s.linker.reset()
    s.assert_quiet()


def test_the_fuzzed_walk_that_left_a_batch_in_flight_ends() -> None:
    """Regression (found by `unicache-fsm fuzz`, shrunk; page size 1, SWA, fault rate
    0.25, fault seed 14710): a refused load whose cancel raised was put in a batch the
    store never started (an unknown batch id); the teardown's drive saw it in flight
    after 20 rounds."""
    state = SystemMachine()
    state.setup(data=Replayed(1, True, 0.25, 14710, 24, 0))
    state.audited()
    state.revisit(doc=0, pages=3)
    state.audited()
    state.revisit(doc=1, pages=3)
    state.audited()
    state.revisit(doc=0, pages=3)
    state.audited()
    state.start_only()
    state.audited()
    state.teardown()
