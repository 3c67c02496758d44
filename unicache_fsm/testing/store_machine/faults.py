"""The faults the store machine injects itself, as rules (`FaultRules`, a base of
`StoreMachine`): the store's surroundings go wrong, and the store must cope.

- `break_device` — only with ``device_faults = True``: the store's write into a pool,
  after `after` more, raises `DeviceFault` (a GPU copy that failed); loads pending
  until the device is mended (by the next `progress()` or `reset()`) may then fail,
  and must report only layers that landed. No pending load is clean any more.
- `corrupt_page` — only when the subclass overrides `corrupt(store, pool, key)`: flip
  the bytes of a page the store holds; the page, and every page after it in a chain,
  is *tainted* from then on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from unicache_fsm.pools.transfer import PoolName
from unicache_fsm.store.protocol import ExternalStore
from unicache_fsm.testing.store_machine.model import ANY_POOL, CHAINS, Chain

if TYPE_CHECKING:
    from unicache_fsm.testing.store_machine.completions import Completions
    from unicache_fsm.testing.store_machine.devices import Devices
    from unicache_fsm.testing.store_machine.model import PageModel


class FaultRules:
    """The fault-injecting rules of `StoreMachine` (see the module docstring), and the
    `corrupt` hook a subclass overrides to enable `corrupt_page`."""

    if TYPE_CHECKING:  # what the machine provides
        device_faults: ClassVar[bool]
        devices: Devices
        model: PageModel
        completions: Completions

        @property
        def store(self) -> ExternalStore: ...

    def corrupt(self, store: ExternalStore, pool: PoolName, key: str) -> None:
        """Flip bytes of a stored page. Override it to enable the `corrupt_page` rule."""
        msg = f"{type(self).__name__} does not override corrupt(store, pool, key)"
        raise NotImplementedError(msg)

    @precondition(lambda self: self.device_faults and not self.devices.armed)
    @rule(pool=ANY_POOL, after=st.integers(0, 3))
    def break_device(self, pool: PoolName, after: int) -> None:
        """The store's write into `pool` after `after` more fails (`DeviceFault`)."""
        self.devices.arm(pool, after)  # (until mended: whether the store used it is its timing's)
        for load in self.completions.pending_loads():
            load.clean = False

    @precondition(lambda self: type(self).corrupt is not FaultRules.corrupt)
    @rule(chain=CHAINS, index=st.integers(0, 7), pool=ANY_POOL)
    def corrupt_page(self, chain: Chain, index: int, pool: PoolName) -> None:
        """Flip the bytes of a stored page (only when the subclass overrides `corrupt`)."""
        key = chain.keys[index % len(chain.keys)]
        if pool not in self.devices.pools or not self.store.contains(pool, key):
            return
        self.corrupt(self.store, pool, key)
        self.model.corrupted.add((pool, key))
        self.completions.disturb(self.model.tainted)
