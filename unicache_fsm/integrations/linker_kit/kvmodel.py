"""The deterministic KV model the linker kit checks loads against.

`KvModel(model)` gives every token one right K and one right V per layer: a function
of the model's name, the pool, the layer and the token's whole prefix (a 63-bit chain
hash of the tokens up to and including it). So every page a linker loads has exactly
one right answer, two models never share one, and a page loaded at the wrong place,
from the wrong model, the wrong pool or the wrong layer is wrong somewhere.

- `prefix_hashes(tokens)` — the chain hash of each prefix ``tokens[:i + 1]``.
- `values(hashes, pool, layer, kind, width)` — the model's rows for those tokens:
  ``[len(hashes), width]`` small integers, exact in bfloat16 and every wider dtype.

Nothing here imports SGLang.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

__all__ = ["KvModel"]

_MASK = (1 << 63) - 1
#: two odd 63-bit multipliers of the mixing step (any odd constants would do)
_MUL_A = 0x2545F4914F6CDD1D
_MUL_B = 0x1B873593A1C0F0B5


class KvModel:
    """The right K/V of every token of model `model` (module docstring)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self._seed = int.from_bytes(hashlib.sha256(model.encode()).digest()[:8], "little") & _MASK

    def prefix_hashes(self, tokens: Sequence[int]) -> torch.Tensor:
        """int64 chain hashes: entry ``i`` names ``tokens[:i + 1]`` of this model."""
        out = []
        h = self._seed
        for token in tokens:
            h = ((h ^ (int(token) & _MASK)) * _MUL_A + 0x9E3779B97F4A7C15) & _MASK
            h ^= h >> 29
            out.append(h)
        return torch.tensor(out, dtype=torch.int64)

    def values(
        self, hashes: torch.Tensor, pool: str, layer: int, kind: str, width: int
    ) -> torch.Tensor:
        """The model's rows (``[tokens, width]``, float32) for `layer`'s K or V."""
        salt = int.from_bytes(
            hashlib.sha256(f"{pool}/{layer}/{kind}".encode()).digest()[:4], "little"
        )
        cols = torch.arange(width, dtype=torch.int64)
        mixed = (hashes.view(-1, 1) ^ salt) * _MUL_B + cols.view(1, -1) * _MUL_A
        mixed = mixed ^ (mixed >> 31)
        return (torch.remainder(mixed, 241) - 120).to(torch.float32)
