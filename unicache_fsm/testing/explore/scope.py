"""The tiny configuration a search explores (`Scope`), and how it builds its system.

- `Scope(...)` — pools, requests, keys, host tier, the store faults the search may inject
  and the options that add operations; a bad field is a `ValueError` naming it.
- `Scope.key(i)` / `Scope.unrelated_key` — the tokens request ``i`` (or ``compute u``)
  asks for; every request shares the first page.
- `Scope.build()` — a fresh `System` of this scope, its store inside an inactive fault
  wrapper, its audit told what the scope's faults make unknowable.
- `Scope.source()` / `Scope.describe()` — the scope as a Python expression (what a
  printed counterexample builds) and as the report's one line.
- `EXTRA_TOKEN` — the token past a request's key (its partial last page).

Two options change the system rather than the alphabet: ``store_pages``, a store of that
many pages that evicts for room from chain ends (the audit then checks that the store's
chains stay whole, until an operation removes a page from a chain's middle on purpose);
``swa_checkpoint`` (K pages, 0 off), which changes what every compute keeps: the SWA
window ending at every K-page checkpoint too (`tree.swa_checkpoints`).
"""

from __future__ import annotations

import attrs

from unicache_fsm.serving.system import System
from unicache_fsm.store.faults import FaultKind, FaultPolicy
from unicache_fsm.testing.explore.faults import UNTRUSTED, WILD_FAULTS

EXTRA_TOKEN = 7  # a request asks for its key plus one token past it (a partial page)


@attrs.frozen
class Scope:
    """The tiny configuration explored: pools, requests, keys, host tier, faults.

    Request ``i`` asks for ``key_pages`` pages: the first page is shared by every request
    (so paths split), the rest are its own. `faults` lists the store faults the search
    may inject (each on one call of its choosing).
    """

    pages: int = 4
    requests: int = 2
    page_size: int = 1
    swa: bool = True
    swa_pages: int = 4
    window_pages: int = 1
    key_pages: int = 2
    host_pages: int = 0
    faults: tuple[FaultKind, ...] = tuple(FaultKind)
    unpinned: bool = False
    corrupt: bool = False
    store_pages: int = 0
    unrelated: bool = False
    swa_checkpoint: int = 0

    def __attrs_post_init__(self) -> None:
        for name in ("pages", "requests", "page_size", "key_pages", "swa_pages", "window_pages"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                msg = f"Scope.{name} must be an int >= 1, got {value!r}"
                raise ValueError(msg)
        for name in ("host_pages", "store_pages", "swa_checkpoint"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                msg = f"Scope.{name} must be an int >= 0, got {value!r}"
                raise ValueError(msg)
        for name in ("unpinned", "corrupt", "unrelated"):
            if not isinstance(getattr(self, name), bool):
                msg = f"Scope.{name} must be a bool, got {getattr(self, name)!r}"
                raise ValueError(msg)
        if self.requests > 9:
            msg = f"Scope.requests must be at most 9 (a small scope), got {self.requests}"
            raise ValueError(msg)

    @property
    def symmetric(self) -> bool:
        """Whether every request asks for the same key (so requests are interchangeable)."""
        return self.key_pages == 1 and self.requests <= 3

    def key(self, i: int) -> tuple[int, ...]:
        p = self.page_size
        tokens = [100 + t for t in range(p)]
        for j in range(1, self.key_pages):
            tokens += [1000 * (i + 1) + 10 * j + t for t in range(p)]
        return tuple(tokens)

    @property
    def unrelated_key(self) -> tuple[int, ...]:
        """The one-page key `compute u` computes (with `unrelated`): a first page no
        request's key shares."""
        return tuple(200 + t for t in range(self.page_size))

    def build(self) -> System:
        """A fresh system of this scope, with an (inactive) fault wrapper.

        With a store of `store_pages` pages (which drops pages for room on its own, and
        nothing LOOKUPs before an audit), or with faults that raise or answer garbage (a
        LOOKUP that should demote what the store lost may fail), the audit checks the
        pages the store acknowledged, not those it still holds (`System.check_stored`);
        with a capacity store, also that its chains stay whole (`System.check_chains`,
        until an operation removes a page from a chain's middle on purpose)."""
        s = System.build(
            self.page_size,
            swa=self.swa,
            full_pages=self.pages,
            swa_pages=self.swa_pages,
            window_pages=self.window_pages,
            faults=FaultPolicy(),
            host_pages=self.host_pages,
            capacity_pages=self.store_pages or None,
            swa_checkpoint=self.swa_checkpoint,
        )
        if self.store_pages or any(kind in self.faults for kind in UNTRUSTED):
            s.check_stored = False
        if self.store_pages:
            s.check_chains = True
        return s

    @property
    def wild(self) -> bool:
        """Whether a fault of the scope hits one call of the search's choosing (it may
        raise or answer garbage on any call, or lie about its work)."""
        return any(kind in self.faults for kind in WILD_FAULTS)

    def source(self) -> str:
        """This scope as a Python expression."""
        kinds = ", ".join(f"FaultKind.{k.name}" for k in self.faults)
        faults = f"({kinds},)" if len(self.faults) == 1 else f"({kinds})"
        return (
            f"Scope(pages={self.pages}, requests={self.requests}, "
            f"page_size={self.page_size}, swa={self.swa}, swa_pages={self.swa_pages}, "
            f"window_pages={self.window_pages}, key_pages={self.key_pages}, "
            f"host_pages={self.host_pages}, faults={faults}{self._options()})"
        )

    def _options(self) -> str:
        """The options that add operations, as keyword arguments (those switched on)."""
        parts = [f", {name}=True" for name in ("unpinned", "corrupt") if getattr(self, name)]
        if self.store_pages:
            parts.append(f", store_pages={self.store_pages}")
        if self.unrelated:
            parts.append(", unrelated=True")
        if self.swa_checkpoint:
            parts.append(f", swa_checkpoint={self.swa_checkpoint}")
        return "".join(parts)

    def describe(self) -> str:
        faults = ",".join(k.value for k in self.faults) or "none"
        kind = f"FULL+SWA (window {self.window_pages} pages)" if self.swa else "FULL only"
        if self.swa and self.swa_checkpoint:
            kind += f", SWA checkpoints every {self.swa_checkpoint} pages"
        extra = "".join(
            [
                ", unpinned matches" if self.unpinned else "",
                ", corrupt pages" if self.corrupt else "",
                f", store of {self.store_pages} pages" if self.store_pages else "",
                ", an unrelated key" if self.unrelated else "",
            ]
        )
        return (
            f"{self.pages} pages (P={self.page_size}), {self.requests} requests of "
            f"{self.key_pages} pages, {kind}, "
            f"host {self.host_pages} pages, faults {faults}{extra}"
        )
