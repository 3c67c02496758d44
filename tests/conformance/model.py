"""What the differential suite runs: configurations, operations and observables.

A *program* is a tuple of operations, run on both caches by `harness.run_program`.
Operations name keys by page ids (a small alphabet, so keys share prefixes), never by
slots: each side allocates its own slots, and the harness maps one side's slots onto
the other's (see `harness`).

Pages: page id ``v`` in 0..2 is the P tokens ``v*P + 1 .. v*P + P``; page id 3 is
page 0 with its last token changed (a key that diverges *inside* a page).
"""

from __future__ import annotations

import enum

import attrs

__all__ = [
    "CONFIGS",
    "Complete",
    "Config",
    "Evict",
    "Insert",
    "Lock",
    "Match",
    "Op",
    "Program",
    "SetAccept",
    "Unlock",
    "config_named",
    "describe_tokens",
    "key_tokens",
    "program_source",
]

SWA_WINDOW = 8
DIVERGENT_PAGE = 3
DIVERGENT_TOKEN = 999


class Pool(str, enum.Enum):
    """The device pools whose free counts are compared."""

    FULL = "full"
    SWA = "swa"


# page size -> (FULL pool pages, SWA pool pages, longest key in pages): keys reach
# 24-64 tokens (several SWA windows), pools hold a few keys (eviction pressure).
SIZING = {1: (64, 48, 24), 4: (24, 16, 8), 16: (12, 8, 4)}


@attrs.frozen
class Config:
    """One configuration: page size, SWA window (None: Full only), offload cycles.

    Pools and key lengths scale with the page size (`SIZING`); page 0 of each pool is
    reserved, as on both sides.
    """

    page_size: int
    swa_window: int | None
    offload: bool

    @property
    def full_pages(self) -> int:
        return SIZING[self.page_size][0]

    @property
    def swa_pages(self) -> int:
        return SIZING[self.page_size][1]

    @property
    def max_key_pages(self) -> int:
        return SIZING[self.page_size][2]

    @property
    def name(self) -> str:
        kind = "full" if self.swa_window is None else f"swa{self.swa_window}"
        return f"{kind}-p{self.page_size}" + ("-offload" if self.offload else "")

    @property
    def full_tokens(self) -> int:
        return self.full_pages * self.page_size

    @property
    def swa_tokens(self) -> int:
        return self.swa_pages * self.page_size

    def __str__(self) -> str:
        return self.name


CONFIGS: tuple[Config, ...] = tuple(
    Config(page_size=p, swa_window=w, offload=o)
    for w in (None, SWA_WINDOW)
    for p in (1, 4, 16)
    for o in (False, True)
)


def config_named(name: str) -> Config:
    for config in CONFIGS:
        if config.name == name:
            return config
    names = ", ".join(c.name for c in CONFIGS)
    msg = f"no conformance configuration named {name!r}; choose one of {names}"
    raise KeyError(msg)


def key_tokens(pages: tuple[int, ...], page_size: int, extra: int = 0) -> list[int]:
    """The tokens of a key made of `pages`, plus `extra` tokens of a partial page."""
    tokens: list[int] = []
    for v in pages:
        base = 0 if v == DIVERGENT_PAGE else v
        page = [base * page_size + j + 1 for j in range(page_size)]
        if v == DIVERGENT_PAGE:
            page[-1] = DIVERGENT_TOKEN
        tokens.extend(page)
    tokens.extend(7_000 + j for j in range(extra))
    return tokens


def describe_tokens(tokens: list[int], page_size: int) -> str:
    """Tokens written as the page ids they spell, e.g. ``pages(0,1,3)`` (a trailing
    partial page, or a page no id spells, is written as its raw tokens)."""
    pages: list[str] = []
    spelled = {tuple(key_tokens((v,), page_size)): v for v in range(DIVERGENT_PAGE + 1)}
    for i in range(0, len(tokens), page_size):
        chunk = tuple(tokens[i : i + page_size])
        v = spelled.get(chunk)
        pages.append(str(v) if v is not None else str(list(chunk)))
    return "pages(" + ",".join(pages) + ")"


# -- operations --------------------------------------------------------------------------
@attrs.frozen
class Insert:
    """A request inserts the key `pages` (whole pages).

    With `match_first`, the request first matches the key, then reuses the tree's slots
    for the first ``prev = min(prev_pages * P, matched)`` tokens (`prev_prefix_len`);
    without it, ``prev = 0``. The other tokens get fresh slots (FULL, and SWA peers
    when SWA is on). With SWA, the request has already released the SWA peers of its
    own tokens below ``swa_evicted_pages * P`` (`swa_evicted_seqlen`).
    """

    pages: tuple[int, ...]
    match_first: bool = False
    prev_pages: int = 0
    swa_evicted_pages: int = 0


@attrs.frozen
class Match:
    """Match the key `pages` plus `extra` tokens of a partial page (no request)."""

    pages: tuple[int, ...]
    extra: int = 0


@attrs.frozen
class Lock:
    """Match `pages` and lock the last matched node (nothing when the match is empty)."""

    pages: tuple[int, ...]


@attrs.frozen
class Unlock:
    """Release the held lock number ``which % len(held)`` (nothing when none is held)."""

    which: int = 0


@attrs.frozen
class Evict:
    """Evict at least `full` Full tokens and `swa` SWA tokens."""

    full: int = 0
    swa: int = 0


@attrs.frozen
class SetAccept:
    """The scripted store accepts (or refuses) the offloads submitted from now on."""

    accept: bool


@attrs.frozen
class Complete:
    """The store completes its oldest accepted offloads, one verdict each (True: the
    pages landed), as far as it has any; then the cache polls its completions."""

    verdicts: tuple[bool, ...]


Op = Insert | Match | Lock | Unlock | Evict | SetAccept | Complete
Program = tuple[Op, ...]


def program_source(config: Config, program: Program) -> str:
    """The program as Python source a person can paste into `replay` (see README)."""
    lines = [f"config = config_named({config.name!r})", "program = ("]
    lines += [f"    {op!r}," for op in program]
    lines.append(")")
    return "\n".join(lines)
