"""The page layout of one pool: how many token slots, in pages of P, and where they live.

- `PageLayout(size, page_size, name)`: a frozen value. `size` is the usable capacity in
  tokens (a multiple of P); the pool has ``num_slots = size + P`` slots because page 0
  (slots ``0 .. P-1``) is a padding sink that is never handed out. Usable page ids are
  ``1 .. num_pages``; page k holds slots ``k*P .. k*P + P - 1``.
- `resolve_device(device)` -> `torch.device`: "cpu" or "cuda[:i]"; CUDA asked for
  without a usable GPU raises `DeviceUnavailableError` naming the device.

Allocators and KV data pools built on the same layout agree slot for slot.
"""

from __future__ import annotations

import functools

import attrs
import torch

from unicache_fsm.pools.errors import DeviceUnavailableError, NotPageMultipleError, PoolConfigError

__all__ = ["PageLayout", "resolve_device"]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@attrs.frozen
class PageLayout:
    """Capacity `size` (tokens, a multiple of `page_size`) of the pool called `name`."""

    size: int
    page_size: int
    name: str = "kv"

    def __attrs_post_init__(self) -> None:
        if not _is_int(self.page_size) or self.page_size < 1:
            msg = f"pool {self.name!r}: page_size must be an int >= 1, got {self.page_size!r}"
            raise PoolConfigError(msg, argument="page_size", value=self.page_size)
        if not _is_int(self.size) or self.size < 0:
            msg = f"pool {self.name!r}: size must be an int >= 0 (tokens), got {self.size!r}"
            raise PoolConfigError(msg, argument="size", value=self.size)
        if self.size % self.page_size:
            lower = self.size - self.size % self.page_size
            msg = (
                f"pool {self.name!r}: size {self.size} is not a multiple of the page size "
                f"{self.page_size}; use {lower} or {lower + self.page_size}"
            )
            raise NotPageMultipleError(msg, what="size", value=self.size, page_size=self.page_size)
        # the derived values, stored once in their slots (a slot read, not a call, on
        # every pool call); not attrs fields, so `attrs.asdict` / `fields` / `evolve`
        # see the three constructor arguments alone, as before they were cached
        object.__setattr__(self, "num_pages", self.size // self.page_size)
        object.__setattr__(self, "num_slots", self.size + self.page_size)

    @functools.cached_property
    def num_pages(self) -> int:
        """Usable pages (ids 1 .. num_pages); page 0 is not counted."""
        return self.size // self.page_size

    @functools.cached_property
    def num_slots(self) -> int:
        """Rows a tensor indexed by slot needs: the usable slots plus page 0."""
        return self.size + self.page_size


def resolve_device(device: str | torch.device) -> torch.device:
    """`device` as a concrete `torch.device` ("cuda" becomes "cuda:<current>")."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        msg = f"unknown device {device!r}: pass 'cpu' or 'cuda[:index]'"
        raise PoolConfigError(msg, argument="device", value=device) from exc
    if dev.type == "cpu":
        return torch.device("cpu")
    if dev.type != "cuda":
        msg = f"device {device!r} is not supported by the pools: pass 'cpu' or 'cuda[:index]'"
        raise PoolConfigError(msg, argument="device", value=device)
    if not torch.cuda.is_available():
        msg = (
            f"device {str(device)!r} was asked for but CUDA is not available in this process "
            "(no GPU, or a CPU-only torch build); pass device='cpu'"
        )
        raise DeviceUnavailableError(msg, device=str(device))
    index = torch.cuda.current_device() if dev.index is None else dev.index
    if index >= torch.cuda.device_count():
        msg = (
            f"device {str(device)!r} was asked for but only {torch.cuda.device_count()} "
            "CUDA device(s) are visible; pick an index below that"
        )
        raise DeviceUnavailableError(msg, device=str(device))
    return torch.device("cuda", index)
