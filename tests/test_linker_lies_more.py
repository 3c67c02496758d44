"""Three lies of a store the quarantine must contain too (issue 31's last cases).

Each test runs the real `MemoryStore` inside the kit's `FaultyStore`, switching one lie
on for exactly the call that tells it (`FaultPolicy.rules`), and checks the system's
audit (KV bytes of every resident node, slot conservation with the quarantine, lock
balance): a lost `offload` reply whose offload the store still runs, a completion
count that hides one while `reset` drains, and an unknown batch id followed by a
malformed completion. No load may wait forever, and nothing is published or freed on
the strength of an answer the store did not back.
"""

from __future__ import annotations

from unicache_fsm.serving.request import Outcome
from unicache_fsm.serving.system import System
from unicache_fsm.store.faults import FaultKind, FaultPolicy, FaultRule

K = FaultKind
P = 4
ALWAYS = FaultRule(every=1)


def key_of(pages: int, base: int) -> list[int]:
    return list(range(base, base + pages * P))


def lying() -> tuple[System, FaultPolicy]:
    policy = FaultPolicy()
    return System.build(P, faults=policy), policy


def test_a_lost_offload_reply_keeps_the_nodes_until_the_store_is_done() -> None:
    """The store queues the offload, then its reply is lost: the nodes stay locked (the
    store reads their slots later) and are never published on that unknown answer."""
    s, policy = lying()
    a, b = key_of(2, 100), key_of(2, 500)
    policy.rules[K.LOST_REPLY] = ALWAYS
    s.compute("A", a, settle=False)
    del policy.rules[K.LOST_REPLY]
    assert s.linker.last_store_fault is not None
    s.evict_all()  # a's slots must not go: the store has not read them yet
    assert s.tree.match_prefix(a).prefix_len == len(a)
    s.compute("B", b, offload=False)  # takes free slots (a's, were they freed)
    s.store.progress()  # the store reads a's slots now
    s.linker.poll_offloads()
    req = s.begin("a", a)
    s.drive()
    s.complete(req)
    s.audit()
    s.linker.reset()
    s.assert_quiet()
    s.audit()


def test_an_undercount_while_reset_drains_never_lends_a_stale_verdict() -> None:
    """`reset` drains what the store reports; it hides a's completion. That completion,
    popped later, must not be taken for b's offload (b would be published unstored)."""
    s, policy = lying()
    a, b = key_of(2, 100), key_of(2, 500)
    s.compute("A", a, settle=False)
    s.store.progress()  # a's offload done: its (True) completion waits
    policy.rules[K.UNDERCOUNT_COMPLETIONS] = ALWAYS
    s.linker.reset()
    del policy.rules[K.UNDERCOUNT_COMPLETIONS]
    s.compute("B", b, settle=False)  # b's offload queued, not run yet
    s.linker.poll_offloads()  # a's stale completion is the only one there
    s.audit()  # b published here would claim pages the store never got
    s.store.progress()
    s.linker.poll_offloads()
    s.audit()
    s.linker.reset()
    s.assert_quiet()
    s.audit()


def test_a_malformed_completion_after_a_phantom_batch_ends_the_real_load() -> None:
    """`start_loading` answers an id with nothing queued (a batch never run), then the
    real batch's completion comes malformed: the real load ends at once (its request
    recomputes), its slots held until a reset, instead of waiting forever."""
    s, policy = lying()
    a = key_of(2, 100)
    s.compute("A", a)
    s.evict_all()
    policy.rules[K.UNKNOWN_BATCH] = ALWAYS
    assert s.linker.start_loading() >= 0  # nothing of ours queued: a phantom batch
    del policy.rules[K.UNKNOWN_BATCH]
    req = s.begin("a", a)
    assert req.prepared
    s.linker.start_loading()
    s.store.progress()
    policy.rules[K.MALFORMED_COMPLETION] = ALWAYS
    s.finish_loads()
    del policy.rules[K.MALFORMED_COMPLETION]
    assert req.load is not None and req.load.state == "aborted", req.load
    assert s.linker.quarantine.num_slots() > 0  # the store may still write them
    s.complete(req)
    assert req.outcome is Outcome.ABORTED
    s.audit()
    s.linker.reset()
    s.assert_quiet()
    s.audit()


def test_loads_under_a_batch_id_never_started_still_end() -> None:
    """`start_loading` answers an id it never started while our loads stay queued, and
    the scheduler (as SGLang's) calls it again only for newly queued loads: the linker
    asks the store again itself, and the completion of the batch that really holds the
    loads settles them."""
    s, policy = lying()
    a = key_of(2, 100)
    s.compute("A", a)
    s.evict_all()
    req = s.begin("a", a)
    assert req.prepared
    policy.rules[K.UNKNOWN_BATCH] = ALWAYS
    s.linker.start_loading()
    del policy.rules[K.UNKNOWN_BATCH]
    for _ in range(12):  # bounded: a load that never ends fails here
        s.store.progress()
        s.finish_loads()
        if req.load is None or req.load.state in ("committed", "aborted"):
            break
    assert req.load is not None and req.load.state == "committed", req.load
    s.complete(req)
    s.audit()
    s.linker.reset()
    s.assert_quiet()
