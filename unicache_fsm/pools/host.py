"""The host pool: a CPU copy of KV pages for the optional host backup tier.

- `HostKVPool(size, page_size, num_layers, width, dtype=..., pin_memory=False)`: a
  `KVPool` on the CPU (same `read_pages` / `write_pages`). Pinned (page-locked) memory
  makes device<->host copies faster and needs CUDA; asking for it without CUDA raises
  `DeviceUnavailableError`.
- `HostKVPool.for_device_pool(device_pool, size)`: a host pool with the device pool's
  P, layers, width and dtype; pinned exactly when the device pool is on CUDA.
- `backup_from(device_pool, device_slots, host_slots)`: copy whole device pages into
  host pages (device -> host), element by element in the order given.
- `restore_to(device_pool, host_slots, device_slots)`: copy host pages back into device
  pages (host -> device).

Host slots come from a CPU `PagedAllocator` of the same size and P. Both copies check
both sides (slots, page counts, layout) before moving a byte; each moves the batch as
one gather, one blocking device<->host transfer through a reusable staging buffer
(pinned when the pool is, grown to the largest batch seen), and one scatter; when both
pools are on the CPU and pages are at least 16 KiB, each page is instead copied straight
from its source page to its destination page (one copy, not a gather and a scatter).
"""

from __future__ import annotations

import torch

from unicache_fsm.pools.errors import (
    DeviceUnavailableError,
    LengthMismatchError,
    TensorShapeError,
    TensorTypeError,
)
from unicache_fsm.pools.kv import PAGE_BY_PAGE_BYTES, KVPool
from unicache_fsm.pools.slots import SlotCodec

__all__ = ["HostKVPool"]


class HostKVPool(KVPool):
    """A CPU `KVPool` (pinned when serving a CUDA pool) with device<->host page copies."""

    __slots__ = ("_pinned", "_staging_buffer")

    def __init__(
        self,
        size: int,
        page_size: int,
        num_layers: int,
        width: int,
        *,
        dtype: torch.dtype = torch.float16,
        name: str = "host",
        pin_memory: bool = False,
    ) -> None:
        if pin_memory and not torch.cuda.is_available():
            msg = (
                f"pool {name!r}: pinned host memory needs CUDA, which is not available in this "
                "process; pass pin_memory=False (plain CPU memory)"
            )
            raise DeviceUnavailableError(msg, device="cuda")
        super().__init__(
            size,
            page_size,
            num_layers,
            width,
            dtype=dtype,
            device="cpu",
            name=name,
            pin_memory=pin_memory,
        )
        self._pinned = pin_memory
        # Reused between copies (grown to the largest batch seen) so a transfer does not
        # page-fault a fresh buffer every time; pinned when the pool is. Only the copy
        # methods touch it, and every copy through it is complete before they return.
        self._staging_buffer = torch.empty(0, dtype=dtype, pin_memory=pin_memory)

    @classmethod
    def for_device_pool(cls, device_pool: KVPool, size: int, *, name: str = "host") -> HostKVPool:
        """A host pool of `size` tokens laid out like `device_pool`; pinned iff it is CUDA."""
        return cls(
            size,
            device_pool.page_size,
            device_pool.num_layers,
            device_pool.width,
            dtype=device_pool.dtype,
            name=name,
            pin_memory=device_pool.device.type == "cuda",
        )

    @property
    def is_pinned(self) -> bool:
        return self._pinned

    def backup_from(
        self, device_pool: KVPool, device_slots: torch.Tensor, host_slots: torch.Tensor
    ) -> None:
        """Copy whole device pages `device_slots` into host pages `host_slots` (D -> H)."""
        self._check_pair(device_pool, device_slots, host_slots)
        if self._copy_in_place(device_pool, device_slots, self, host_slots):
            return
        staging = self._staging(device_slots.numel())
        if device_pool.device.type == "cpu":
            device_pool.read_pages(device_slots, out=staging)
        else:
            # Gather on the device, then one blocking download (DMA when pinned).
            staging.copy_(device_pool.read_pages(device_slots))
        self.write_pages(host_slots, staging)

    def restore_to(
        self, device_pool: KVPool, host_slots: torch.Tensor, device_slots: torch.Tensor
    ) -> None:
        """Copy whole host pages `host_slots` back into device pages `device_slots` (H -> D)."""
        self._check_pair(device_pool, device_slots, host_slots)
        if self._copy_in_place(self, host_slots, device_pool, device_slots):
            return
        staging = self.read_pages(host_slots, out=self._staging(host_slots.numel()))
        if device_pool.device.type != "cpu":
            # Blocking upload: the staging buffer is reused by the next copy.
            staging = staging.to(device_pool.device)
        device_pool.write_pages(device_slots, staging)

    @staticmethod
    def _copy_in_place(
        src: KVPool, src_slots: torch.Tensor, dst: KVPool, dst_slots: torch.Tensor
    ) -> bool:
        """Copy the pages page by page, each straight from its source page into its
        destination page (one copy instead of a gather and a scatter), when both pools
        are on the CPU and pages are large enough that a Python step per page costs
        little; False (nothing moved) otherwise, or when a destination page repeats
        (then the batched path raises its typed error before moving a byte)."""
        if (
            src.device.type != "cpu"
            or dst.device.type != "cpu"
            or src.page_nbytes < PAGE_BY_PAGE_BYTES
            or src.page_nbytes % 8
        ):
            return False
        dst_pages = dst.pages_of(dst_slots, "destination slots")
        if SlotCodec.has_duplicates(dst_pages):
            return False
        src_pages = src.pages_of(src_slots, "source slots").tolist()
        src_rows, dst_rows = src.page_bytes(), dst.page_bytes()
        for s, d in zip(src_pages, dst_pages.tolist(), strict=True):
            dst_rows[d] = src_rows[s]
        return True

    def _staging(self, num_slots: int) -> torch.Tensor:
        """A contiguous ``[num_slots, layers, width]`` view of the reusable buffer."""
        shape = (num_slots, self.num_layers, self.width)
        need = num_slots * self.num_layers * self.width
        if self._staging_buffer.numel() < need:
            self._staging_buffer = torch.empty(need, dtype=self.dtype, pin_memory=self._pinned)
        return self._staging_buffer[:need].view(shape)

    def _check_pair(
        self, device_pool: KVPool, device_slots: torch.Tensor, host_slots: torch.Tensor
    ) -> None:
        """Everything a copy needs, checked before any byte moves."""
        if device_pool.dtype != self.dtype:
            msg = (
                f"host pool {self.name!r} holds {self.dtype} but device pool "
                f"{device_pool.name!r} holds {device_pool.dtype}; build the host pool with "
                "HostKVPool.for_device_pool"
            )
            raise TensorTypeError(
                msg, what="device_pool", got=device_pool.dtype, expected=self.dtype
            )
        host_layout = (self.page_size, self.num_layers, self.width)
        dev_layout = (device_pool.page_size, device_pool.num_layers, device_pool.width)
        if dev_layout != host_layout:
            msg = (
                f"host pool {self.name!r} has (page_size, num_layers, width) = {host_layout} "
                f"but device pool {device_pool.name!r} has {dev_layout}; build the host pool "
                "with HostKVPool.for_device_pool"
            )
            raise TensorShapeError(msg, what="device_pool", got=dev_layout, expected=host_layout)
        device_pool.pages_of(device_slots, "device_slots")
        self.pages_of(host_slots, "host_slots")
        if device_slots.numel() != host_slots.numel():
            msg = (
                f"a page copy needs one host slot per device slot: got {device_slots.numel()} "
                f"device slots and {host_slots.numel()} host slots"
            )
            raise LengthMismatchError(
                msg,
                left="device_slots",
                right="host_slots",
                left_len=device_slots.numel(),
                right_len=host_slots.numel(),
            )
