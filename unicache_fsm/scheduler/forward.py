"""A cheap deterministic "forward": KV bytes that depend on the whole token prefix.

Real attention KV at position i depends on tokens 0..i. This stand-in keeps that
property (two prefixes that differ anywhere before i give different KV at i) while
costing a few vectorised torch ops: a running sum of tokens times per-position
weights, then sines over a (layer, width) grid. Loaded KV can thus be compared with
what recomputing would have produced, byte for byte.

- `synth_kv(tokens, start, end, num_layers, width, dtype, salt)` — KV rows for
  positions ``[start, end)``; `salt` separates the FULL and SWA pools and namespaces.
- `namespace_salt(namespace)` — a small integer salt from a namespace seed.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["namespace_salt", "synth_kv"]

_MOD = 1_000_003


def namespace_salt(namespace: str | None) -> int:
    return 0 if namespace is None else int(namespace[:8], 16) % 9973


def synth_kv(
    tokens: Sequence[int],
    start: int,
    end: int,
    num_layers: int,
    width: int,
    dtype: torch.dtype,
    salt: int = 0,
) -> torch.Tensor:
    """KV rows ``[end - start, num_layers, width]`` for positions ``[start, end)``."""
    t = torch.tensor(tokens[:end], dtype=torch.int64)
    pos = torch.arange(end, dtype=torch.int64)
    weights = (pos * 2_654_435_761 + 97 + salt) % 2_147_483_647 + 1
    running = torch.cumsum((t + 1 + salt) * weights % _MOD, 0) % _MOD
    phase = running[start:end].to(torch.float32) / _MOD
    grid = torch.arange(num_layers * width, dtype=torch.float32).reshape(num_layers, width)
    grid = grid * 0.37 + 1.0 + salt % 7
    return torch.sin(phase[:, None, None] * grid * 6.283).to(dtype)
