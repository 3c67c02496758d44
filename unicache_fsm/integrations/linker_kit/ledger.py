"""What the kit knows to be true about the pages of one check run (no SGLang here).

A linker's answers are judged against this record, shared by every instance of a run
(restarts, a second instance, a second model on the same backing store):

- `page_tokens` — each page hash SGLang may ask about -> the tokens up to the end of
  that page (so the KV model gives its right bytes).
- `submitted[model]` — page hashes an accepted offload of that model carried.
- `damaged` — page hashes a backend fault lost, corrupted or truncated since their
  last successful offload; `unreachable` — the backend is cut off.
- `write_fault_armed` — a "fail the next write" fault not yet consumed.
- `intact(keys)` — whether a load of those pages must land: each stored by a
  completed, successful offload, none damaged since, the backend reachable, no write
  fault armed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

__all__ = ["Ledger"]


@attrs.define
class Ledger:
    """The truth of one run (module docstring)."""

    page_tokens: dict[str, tuple[int, ...]] = attrs.Factory(dict)
    submitted: dict[str, set[str]] = attrs.Factory(dict)
    stored: dict[str, set[str]] = attrs.Factory(dict)
    damaged: set[str] = attrs.Factory(set)
    unreachable: bool = False
    write_fault_armed: bool = False

    def learn_pages(self, keys: Sequence[str], tokens: Sequence[int], page: int) -> None:
        """Page `i` of `keys` covers ``tokens[:page * (i + 1)]``."""
        for i, key in enumerate(keys):
            self.page_tokens.setdefault(key, tuple(tokens[: page * (i + 1)]))

    def submit(self, model: str, keys: Iterable[str]) -> None:
        self.submitted.setdefault(model, set()).update(keys)

    def store(self, model: str, keys: Iterable[str]) -> None:
        keys = list(keys)
        self.stored.setdefault(model, set()).update(keys)
        self.damaged.difference_update(keys)

    def damage(self, keys: Iterable[str]) -> None:
        self.damaged.update(keys)

    def owners(self, key: str) -> list[str]:
        """The models whose accepted offloads carried `key`."""
        return sorted(m for m, keys in self.submitted.items() if key in keys)

    def clean(self) -> bool:
        """No backend fault is active (writes and reads should succeed)."""
        return not (self.unreachable or self.write_fault_armed)

    def intact(self, model: str, keys: Iterable[str]) -> bool:
        stored = self.stored.get(model, set())
        return self.clean() and all(k in stored and k not in self.damaged for k in keys)
