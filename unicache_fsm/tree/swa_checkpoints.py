"""SWA checkpoints: the opt-in retention policy that keeps SWA prefixes reusable.

SGLang 0.5.23 keeps a request's SWA KV for its last window only, so once it is
inserted every node before that window is an SWA tombstone, and a later prompt that
shares only a prefix ending inside those tokens finds no live window at its end — on
the device or in the store. With checkpoints every `interval` tokens (``K`` pages,
``interval = K * P``), a request also keeps the window that *ends at each checkpoint*
of its tokens: ``[c - window, c)`` for every ``c = m * interval``. The tree then holds
those windows as live nodes of their own (an insert splits at their edges, so a node's
SWA stays whole or a tombstone), a match may end at a checkpoint, an offload exports the
window with the node, and LOOKUP's TRAILING_PAGES rule finds the checkpoint restorable.

- `check_interval(pages)` — the policy's setting: None or 0 (off, 0.5.23's behaviour)
  or a positive number of pages; `TreeConfigError` names anything else.
- `checkpoint_windows(start, end, limit, window, interval)` — the token ranges a request
  computing ``[start, end)`` keeps below `limit` (its trailing window's start): every
  checkpoint ``c`` with ``start < c <= end`` gives ``[c - window, c)``, clipped to
  ``[start, limit)``; overlapping or touching windows merge, so a page two windows share
  is kept (and later stored) once. Sorted, disjoint, page-aligned when the inputs are.
"""

from __future__ import annotations

from unicache_fsm.tree.errors import TreeConfigError

__all__ = ["check_interval", "checkpoint_windows"]


def check_interval(pages: object) -> int:
    """The checkpoint interval in pages (0: off); raise `TreeConfigError` otherwise."""
    if pages is None:
        return 0
    if type(pages) is not int or pages < 0:
        msg = (
            f"swa_checkpoint = {pages!r} is not a number of pages: pass a positive int "
            "(keep the window ending at every that-many pages) or 0/None (off)"
        )
        raise TreeConfigError(msg, what="swa_checkpoint", value=pages)
    return pages


def checkpoint_windows(
    start: int, end: int, limit: int, window: int, interval: int
) -> tuple[tuple[int, int], ...]:
    """The checkpoint windows of ``[start, end)`` below `limit`; see the module docstring.

    `interval` 0 (off) or `window` 0 gives none.
    """
    top = min(end, limit)
    if interval <= 0 or window <= 0 or top <= start:
        return ()
    out: list[tuple[int, int]] = []
    first = (start // interval + 1) * interval  # the first checkpoint past `start`
    # only checkpoints whose window reaches below `top` matter
    last = min(end, top + window - 1) // interval * interval
    for c in range(first, last + 1, interval):
        a, b = max(start, c - window), min(c, top)
        if a >= b:
            continue
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return tuple(out)
