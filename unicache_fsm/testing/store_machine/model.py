"""The store machine's truth model: the chains it offloads, the loads it asks for, and
what the store may, and must, hold, page by page.

- `Chain`, `LoadTicket` — the bundle values Hypothesis draws from (a chain of whole
  pages; the rid of a load asked for).
- `PageModel` — per page ``(pool, key)``: *may* (could be in the store), *stored* (a
  successful offload stored it and the test has not evicted it since), *corrupted* /
  `tainted` (flipped, or after a flipped page in a chain), why a page cannot be there
  (`absent_reason`); `check_boundaries` holds a LOOKUP's answer to them,
  `check_presence` every `contains`, `evicted` takes the test's evictions in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
from hypothesis import strategies as st
from hypothesis.stateful import Bundle

from unicache_fsm.hashing import page_hashes
from unicache_fsm.pools.transfer import PoolName, PoolTransfer
from unicache_fsm.store.lookup import restorable_prefix_pages
from unicache_fsm.store.protocol import ExternalStore
from unicache_fsm.testing.store_machine.devices import Ident

KV = PoolName.KV

CHAINS: Bundle[Chain] = Bundle("chains")
"""The chains the machine offloaded (drawn again by lookups, loads, evictions)."""
LOADS: Bundle[LoadTicket] = Bundle("loads")
"""The loads the machine asked for (drawn again by `cancel_queued_load`)."""

# Built, not sampled: Hypothesis prints a str-mixin enum member with its angle-bracket
# repr, but an object from `builds` as the call that made it: ``ComponentType('swa')``
# (`PoolName` is the same enum).
ANY_POOL = st.builds(PoolName, st.sampled_from([name.value for name in PoolName]))
"""Any pool name (a pool the machine does not attach included)."""


@attrs.frozen
class Chain:
    """A chain of whole pages (a bundle value): page i is `page_size` copies of token
    ``pages[i]``; `keys` are their page hashes, chained from no namespace."""

    page_size: int
    pages: tuple[int, ...]
    keys: tuple[str, ...] = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "keys", tuple(page_hashes(self.tokens, self.page_size)))

    @property
    def tokens(self) -> tuple[int, ...]:
        return tuple(v for v in self.pages for _ in range(self.page_size))


@attrs.frozen
class LoadTicket:
    """The rid of a load the machine asked for (a bundle value): by now it may be queued,
    started, finished, or refused (or never sent, when a lookup found nothing)."""

    rid: str


def short(ident: Ident) -> str:
    """A page, as messages name it: its pool and the start of its key."""
    return f"({ident[0].value}, {ident[1][:12]}...)"


class PageModel:
    """What the store may and must hold, per page (see the module docstring)."""

    def __init__(self) -> None:
        self.known: set[Ident] = set()  # every page the test named to the store
        self.may: set[Ident] = set()
        self.stored: set[Ident] = set()
        self.corrupted: set[Ident] = set()  # pages `corrupt` ever flipped
        self.chains_made: list[Chain] = []
        self.absent_because: dict[Ident, str] = {}

    @property
    def tainted(self) -> set[Ident]:
        """The corrupted pages and every page after one in any chain offloaded so far: a
        load that reads a corrupt page drops it and the chain stored after it."""
        out = set(self.corrupted)
        for pool, key in self.corrupted:
            for chain in self.chains_made:
                if key in chain.keys:
                    out |= {(pool, k) for k in chain.keys[chain.keys.index(key) :]}
        return out

    def absent_reason(self, ident: Ident) -> str:
        """Why `ident` cannot be in the store."""
        return self.absent_because.get(ident, "the test never offloaded it")

    def evicted(self, idents: set[Ident], number: int, pending: set[Ident]) -> None:
        """The test evicted `idents` (evict number `number`); those in `pending` (named by
        an accepted offload that has not run yet) may still land."""
        for ident in idents:
            self.stored.discard(ident)  # (a corrupted page stays in `corrupted`: a load
            # may already have dropped the chain after it, which this evict cannot undo)
            if ident not in pending:
                self.may.discard(ident)
                self.absent_because[ident] = (
                    f"the test evicted it (evict #{number}), after every offload of it the "
                    "store accepted had run"
                )

    def check_presence(self, store: ExternalStore, *, lossless: bool) -> None:
        """`contains` is False off *may*; with `lossless`, True on *stored* (untainted)."""
        tainted = self.tainted if lossless else set()
        for ident in sorted(self.known):
            if ident not in self.may:
                assert not store.contains(*ident), (
                    f"contains{short(ident)} is True, but that page cannot be in the "
                    f"store: {self.absent_reason(ident)}"
                )
            elif lossless and ident in self.stored and ident not in tainted:
                assert store.contains(*ident), (
                    f"contains{short(ident)} is False, but a successful offload stored it "
                    "and the test has not evicted it since; the store is lossless, so it "
                    "lost the page"
                )

    def check_boundaries(
        self,
        rid: str,
        tail: tuple[str, ...],
        windows: list[tuple[PoolName, int]],
        transfers: list[PoolTransfer],
        found: object,
        *,
        lossless: bool,
    ) -> None:
        """A LOOKUP's answer `found` for `tail` (and its `windows`): its form, and each
        boundary restorable by the rules applied to *may* (with `lossless`: at least
        every boundary the rules give on *stored*)."""
        n = len(tail)
        assert (
            isinstance(found, list)
            and all(isinstance(b, int) and not isinstance(b, bool) for b in found)
            and found == sorted(set(found))
            and all(1 <= b <= n for b in found)
        ), (
            f"lookup({rid!r}) of a {n}-page tail returned {found!r}; expected a list of "
            f"distinct ascending prefix lengths within 1..{n}"
        )
        may = restorable_prefix_pages(transfers, presence(self.may))
        for boundary in found:
            if boundary in may:
                continue
            needed = [(KV, key) for key in tail[:boundary]]
            needed += [
                (pool, key) for pool, w in windows for key in tail[max(0, boundary - w) : boundary]
            ]
            gone = next(ident for ident in needed if ident not in self.may)
            raise AssertionError(
                f"lookup({rid!r}) reported prefix {boundary} of a {n}-page tail as "
                f"restorable, but page {tail.index(gone[1])} of the tail {short(gone)} "
                f"cannot be in the store: {self.absent_reason(gone)}"
            )
        if lossless:
            surely = restorable_prefix_pages(transfers, presence(self.stored - self.tainted))
            missing = sorted(set(surely) - set(found))
            assert not missing, (
                f"lookup({rid!r}) returned {found}, missing restorable prefix(es) {missing}: "
                "every page up to them was stored by a successful offload and not evicted "
                "since, and the store is lossless"
            )


def presence(pages: set[Ident]) -> Callable[[PoolName, Sequence[str]], list[bool]]:
    """A presence function over `pages` (what `restorable_prefix_pages` asks)."""

    def present(pool: PoolName, keys: Sequence[str]) -> list[bool]:
        return [(pool, key) in pages for key in keys]

    return present
