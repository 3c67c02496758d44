"""A Hypothesis state machine that fuzzes any `ExternalStore` beside a simple model.

Subclass `StoreMachine`, implement `make_store()` (a fresh, unattached store), and let
pytest collect its `TestCase`::

    from unicache_fsm.store.protocol import ExternalStore
    from unicache_fsm.testing.profiles import load_profile
    from unicache_fsm.testing.store_machine import StoreMachine

    load_profile()  # dev / ci / fuzz from UNICACHE_FSM_PROFILE (default ci); a conftest.py
                    # usually does this, before any `TestCase` is read

    class MyStoreMachine(StoreMachine):
        lossless = True  # my store never drops, refuses or fails anything on its own

        def make_store(self) -> ExternalStore:
            return MyStore()

    TestMyStore = MyStoreMachine.TestCase  # its settings come from the loaded profile

In a script, ``hypothesis.stateful.run_state_machine_as_test(MyStoreMachine,
settings=...)`` runs it. A failure raises `AssertionError` naming the page, the call
and the rule broken, and Hypothesis prints the shortest program it found, one protocol
call per line (``state.offload(...)``, ``state.lookup(...)``): a pasteable reproduction.

The rules are the protocol's calls (`unicache_fsm.store.protocol`), driven on real CPU
`KVPool` pools (one per name in `pool_names`, page size drawn by `open_store`):

- `offload` — a chain of pages (the first pages of a parent chain, then new ones) is
  written into fresh device slots with its *truth* bytes (a fixed function of pool and
  key) and offloaded: KV for every page, SWA / MAMBA for a trailing window;
- `progress`; `poll_offloads` — pop every recorded offload flag, oldest first;
- `lookup` — a chain's tail, with a TRAILING_PAGES window for each extra pool;
- `load` (any run of a chain's KV pages) and `load_restorable` (a lookup, then a load
  of one boundary it reported, with its windows, as the linker does) — the destination
  slots hold `POISON` first;
- `start_loading`, `poll_loads`, `cancel_queued_load` (of a ticket that may by then be
  queued, started, finished or refused);
- `loaded_layers` — the per-layer progress of a started batch (also asked of every
  batch as it starts, and again when its result is popped, before its slots are freed);
- `evict` (pages of a chain; one pool or all), `reset`;
- `corrupt_page` — only when the subclass overrides `corrupt(store, pool, key)`;
- `break_device` — only with ``device_faults = True``: the next store write into a
  pool (after `after` more) raises `DeviceFault` (a GPU copy that failed); loads pending
  until it is disarmed, by the next `progress()` or `reset()`, may then fail, and must
  report only layers that landed.

`offload`, `load`, `load_restorable` and `start_loading` take a `settle` flag: then
they also run `progress()` and poll (loads: poll, progress, poll), as a serving loop
would, so that most programs reach completions (the plain interleavings stay reachable
with ``settle=False``).

The model, per page ``(pool, key)``: *may* — could be in the store (an accepted offload
named it and the test has not evicted it since, or evicted it while an accepted offload
of it had not yet run: no `progress()` or `reset()` since); *stored* — a successful
offload stored it and the test has not evicted it since (the store may still have
dropped it on its own, unless `lossless`); *tainted* — `corrupt` flipped its bytes (at
any time), or it follows such a page in a chain (a load that reads a corrupt page drops
it and the chain after it).

What is checked, in the rules and after every step (invariants):

- completions: one flag per accepted offload, FIFO; one result per started batch, FIFO,
  listing exactly its loads; `reset()` completes every pending job (queued loads fail);
  never more completions recorded than jobs pending; with `progress_completes` (the
  protocol's rule), after `progress()` every queued offload and started batch has its
  completion — a lost completion is caught there;
- bytes: a batch reported successful wrote exactly the truth bytes into every slot of
  every load in it (a page the store lost or skipped still shows the poison); offload
  source slots are never written;
- LOOKUP: boundaries ascending, distinct, within ``1..n``, and each one restorable by the
  rules of `unicache_fsm.store.lookup` applied to *may* (a boundary over a page the test
  evicted, or never offloaded, is a lie); `contains` is False off *may*; `evict`
  removes no more pages than *may* holds; `cancel_queued_load` is True exactly for a
  queued load;
- `lossless = True` (the store never drops, refuses or fails on its own) adds: every
  offload is accepted and succeeds; lookups report at least the rules applied to
  *stored*; `contains` is True on *stored*; `evict` removes every *stored* page named;
  a load of *stored* pages (or of a boundary a lookup just reported) is accepted, and
  its batch lands unless the test evicted, corrupted or reset under it;
- per-layer progress (`loaded_layers`): a dict of attached pools to ints in
  ``0..num_layers``; never below an earlier answer for the batch; every layer it
  reports holds the page's truth bytes in every slot of every load of the batch for
  that pool, whenever asked (a store that reports a layer before writing it shows the
  poison there), a failed batch included; a successful batch reports every layer of
  each of its pools (asked right after its result is popped: a store answers for at
  least the last batch popped); a batch id never started (-1) is a `LookupError`;
- the store's own ``check_invariants()``, when it has one;
- slots given back: every slot the machine freed (a load's or an offload's once its
  completion was popped or it was cancelled, a refused job's at once) holds `FREED`
  until the machine allocates it again — a store whose completion (or count of
  completions) runs ahead of its writes, so that a caller frees slots it still writes
  into, shows there; a count the store cannot back with a pop, and a completion of the
  wrong shape (rids that are not a tuple of str, a batch id that is not an int), are
  named as such.

A store may raise `StoreFaultError` from `lookup`, `load` or `offload` (a failing
backend): the machine treats it as the linker does — a miss, a refusal. A store with a
worker thread answers differently from run to run; the machine draws nothing from the
store's answers (a refused load still yields a ticket, and the guards count calls, not
results), so Hypothesis can fuzz it too. Keep ``pool_pages`` above
``stateful_step_count * max_chain_pages`` so that the room guard never closes.

To draw more per program (a fault policy, a capacity), override the initializer under
the same name and call the base one::

    @initialize(page_size=st.sampled_from((1, 4)), policy=fault_policies())
    def open_store(self, page_size: int, policy: FaultPolicy) -> None:
        self.policy = policy  # make_store wraps its store in FaultyStore(store, policy)
        super().open_store(page_size)

`MemoryStoreMachine` is the reference subclass (the embedded `MemoryStore`, with a
capacity small enough that it evicts on its own).

The package, one concept per module (dependencies pointing down the list):

- `devices` — the pools (`BreakablePool`), truth / `POISON` / `FREED` bytes, the checks
  of what lands in the slots; `DeviceFault`.
- `model` — the bundle values (`Chain`, `LoadTicket`) and the page model (*may*,
  *stored*, *tainted*), with the checks of LOOKUP, `contains` and `evict` answers.
- `completions` — the jobs the store owes a completion for, and the checks of every
  completion, count and per-layer progress it reports.
- `faults` — the faults the machine injects itself: `break_device`, `corrupt_page`
  (rules of `FaultRules`, a base of `StoreMachine`).
- `machine` — `StoreMachine`: the protocol's rules and the invariants.
- `memory` — `MemoryStoreMachine`, the reference subclass.
"""

from __future__ import annotations

from unicache_fsm.testing.store_machine.devices import FREED as FREED
from unicache_fsm.testing.store_machine.devices import POISON, DeviceFault
from unicache_fsm.testing.store_machine.machine import StoreMachine
from unicache_fsm.testing.store_machine.memory import MemoryStoreMachine
from unicache_fsm.testing.store_machine.model import Chain, LoadTicket

__all__ = ["POISON", "Chain", "DeviceFault", "LoadTicket", "MemoryStoreMachine", "StoreMachine"]

# An exception prints with its module (a traceback names ``module.Class``) and the errors
# hierarchy in `unicache_fsm.fsm.errors` names it there: it keeps the public path it had
# before this package was split, not the file that defines it.
DeviceFault.__module__ = __name__
