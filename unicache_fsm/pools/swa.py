"""The SWA hybrid allocator: a FULL pool, a smaller SWA pool, and the full->SWA mapping.

A sliding-window model keeps every token's KV in FULL but only the last window's in
SWA; kernels find a token's SWA slot through `full_to_swa_mapping[full_slot]` (0 =
no SWA data). Mappings are made and dropped page by page: FULL page a maps to SWA page
b slot for slot (``a*P + i -> b*P + i``), or not at all.

Lifecycle primitives, in the order a caller uses them:

- `SWAAllocator(full_size, swa_size, page_size, device=...)`: both pools empty of
  allocations, every mapping entry 0. Page 0 of each pool is never handed out.
- `alloc(num_tokens)` / `alloc_swa(num_tokens)` -> whole FULL / SWA pages as int64
  slots, or None (nothing changed) when short. Fresh pages are unmapped.
- `set_full_to_swa_mapping(full_slots, swa_slots)`: map allocated FULL pages to
  allocated SWA pages, element by element (equal lengths, whole pages, each page once).
  A FULL page's previous SWA page, and an SWA page's previous FULL page, are unmapped
  (they stay allocated), so the mapping stays one-to-one.
- `translate(full_slots)` -> the mapped SWA slot of each FULL slot (0 where unmapped);
  any slot of the FULL pool, page 0 included, any order.
- `free(full_slots)`: the combined free. Frees the FULL pages, frees the SWA pages
  they map to, and zeroes their mapping.
- `free_full_only(full_slots)`: frees the FULL pages and zeroes their mapping; the SWA
  pages they mapped to stay allocated (now unmapped, owned by the caller).
- `free_mapped_swa(full_slots)`: the SWA tombstone: frees the SWA pages mapped from
  these (still allocated) FULL pages and zeroes their mapping; FULL stays allocated.
- `free_swa(swa_slots)`: frees SWA pages directly; FULL pages that mapped to them
  become unmapped.
- `available_size()` / `available_swa_size()` in tokens; `free_page_ids()`,
  `swa_free_page_ids()`, `allocated_page_ids()`, `swa_allocated_page_ids()` snapshots.

Invariants after every call: a free FULL slot maps to 0; every non-zero mapping points
at an allocated SWA slot and no two FULL slots share one. Every call validates its whole
input first (typed errors from `pools.errors`) and changes nothing when it raises;
all work is vectorised over the pages of the call.
"""

from __future__ import annotations

from array import array

import torch

from unicache_fsm.pools.errors import LengthMismatchError
from unicache_fsm.pools.paged import PagedAllocator
from unicache_fsm.pools.slots import SlotCodec

__all__ = ["SWAAllocator"]


class SWAAllocator:
    """FULL + SWA paged allocators sharing P, with the full->SWA slot mapping."""

    __slots__ = ("_full", "_full_to_swa", "_swa", "_swa_to_full")

    def __init__(
        self,
        full_size: int,
        swa_size: int,
        page_size: int,
        *,
        device: str | torch.device = "cpu",
    ) -> None:
        self._full = PagedAllocator(full_size, page_size, device=device, name="full")
        self._swa = PagedAllocator(swa_size, page_size, device=device, name="swa")
        dev = self._full.device
        # Indexed by FULL slot: the SWA slot holding that token's window KV, or 0.
        # Entry 0 (the padding sink) always reads 0, so writes "through" 0 are harmless.
        self._full_to_swa = torch.zeros(self._full.num_slots, dtype=torch.int64, device=dev)
        # The inverse, indexed by SWA slot; kept so SWA-side frees and re-mappings can
        # clear the FULL side in O(pages) without scanning the whole mapping.
        self._swa_to_full = torch.zeros(self._swa.num_slots, dtype=torch.int64, device=dev)

    # -- read-only facts ---------------------------------------------------------------

    @property
    def page_size(self) -> int:
        return self._full.page_size

    @property
    def device(self) -> torch.device:
        return self._full.device

    @property
    def full_size(self) -> int:
        return self._full.size

    @property
    def swa_size(self) -> int:
        return self._swa.size

    @property
    def full_num_slots(self) -> int:
        return self._full.num_slots

    @property
    def swa_num_slots(self) -> int:
        return self._swa.num_slots

    @property
    def full_codec(self) -> SlotCodec:
        return self._full.codec

    @property
    def swa_codec(self) -> SlotCodec:
        return self._swa.codec

    @property
    def full_to_swa_mapping(self) -> torch.Tensor:
        """The live mapping tensor (indexed by FULL slot). Read it; never write it."""
        return self._full_to_swa

    def available_size(self) -> int:
        """Free FULL capacity in tokens."""
        return self._full.available_size()

    def available_swa_size(self) -> int:
        """Free SWA capacity in tokens."""
        return self._swa.available_size()

    def free_page_ids(self) -> torch.Tensor:
        return self._full.free_page_ids()

    def swa_free_page_ids(self) -> torch.Tensor:
        return self._swa.free_page_ids()

    def allocated_page_ids(self) -> torch.Tensor:
        return self._full.allocated_page_ids()

    def swa_allocated_page_ids(self) -> torch.Tensor:
        return self._swa.allocated_page_ids()

    def allocated_page_list(self) -> list[int]:
        """`allocated_page_ids` as Python ints (`PagedAllocator.allocated_page_list`)."""
        return self._full.allocated_page_list()

    def swa_allocated_page_list(self) -> list[int]:
        """`swa_allocated_page_ids` as Python ints."""
        return self._swa.allocated_page_list()

    def __repr__(self) -> str:
        return (
            f"SWAAllocator(full_size={self.full_size}, swa_size={self.swa_size}, "
            f"page_size={self.page_size}, device={str(self.device)!r})"
        )

    # -- allocation --------------------------------------------------------------------

    def alloc(self, num_tokens: int) -> torch.Tensor | None:
        """Whole FULL pages (unmapped), or None when short."""
        return self._full.alloc(num_tokens)

    def alloc_swa(self, num_tokens: int) -> torch.Tensor | None:
        """Whole SWA pages (unmapped), or None when short."""
        return self._swa.alloc(num_tokens)

    # -- mapping -----------------------------------------------------------------------

    def set_full_to_swa_mapping(self, full_slots: torch.Tensor, swa_slots: torch.Tensor) -> None:
        """Map each FULL slot to the SWA slot at the same position (whole pages both sides)."""
        full_codec, swa_codec = self._full.codec, self._swa.codec
        full_codec.check_index_tensor(full_slots, "full_slots")
        swa_codec.check_index_tensor(swa_slots, "swa_slots")
        if full_slots.numel() != swa_slots.numel():
            msg = (
                f"full->SWA mapping needs one SWA slot per FULL slot: got {full_slots.numel()} "
                f"FULL slots and {swa_slots.numel()} SWA slots; pass equally many whole pages"
            )
            raise LengthMismatchError(
                msg,
                left="full_slots",
                right="swa_slots",
                left_len=full_slots.numel(),
                right_len=swa_slots.numel(),
            )
        self._full.live_pages(full_slots, what="full_slots to map", freeing=False)
        self._swa.live_pages(swa_slots, what="swa_slots to map", freeing=False)
        if full_slots.numel() == 0:
            return
        fwd, rev = self._full_to_swa, self._swa_to_full
        # Entry 0 of either side reads 0 and is only ever filled with 0, so looking up an
        # unmapped partner (0) and clearing "it" is a harmless no-op: no masking needed.
        # Unmap the FULL slots' old SWA partners, then the SWA slots' old FULL partners
        # (read after the first step, so partners inside this call are not touched twice).
        rev.index_fill_(0, fwd.index_select(0, full_slots), 0)
        fwd.index_fill_(0, rev.index_select(0, swa_slots), 0)
        fwd.index_copy_(0, full_slots, swa_slots)
        rev.index_copy_(0, swa_slots, full_slots)

    def translate(self, full_slots: torch.Tensor) -> torch.Tensor:
        """The SWA slot mapped from each FULL slot (0 = none); any slot of the FULL pool."""
        codec = self._full.codec
        codec.check_index_tensor(full_slots, "full_slots to translate")
        if full_slots.numel():
            lo, hi = torch.aminmax(full_slots)
            if lo.item() < 0 or hi.item() >= self._full.num_slots:
                codec.raise_out_of_pool(full_slots, "full_slots to translate", allow_page0=True)
        return self._full_to_swa.index_select(0, full_slots)

    def check_live(self, full_slots: object, what: str = "full_slots") -> None:
        """Raise a typed error unless `full_slots` are whole, distinct, allocated FULL pages."""
        self._full.check_live(full_slots, what)

    def live_page_ids(
        self, full_slots: object, what: str = "full_slots", start: int = 0
    ) -> list[int]:
        """`check_live` of ``full_slots[start:]``, returning the FULL page id of each of
        its pages (`PagedAllocator.live_page_ids`)."""
        return self._full.live_page_ids(full_slots, what, start)

    def live_page_array(
        self, full_slots: object, what: str = "full_slots", start: int = 0
    ) -> array[int]:
        """`live_page_ids` as an ``array('q')`` (`PagedAllocator.live_page_array`)."""
        return self._full.live_page_array(full_slots, what, start)

    # -- frees -------------------------------------------------------------------------

    def free(self, full_slots: torch.Tensor) -> None:
        """Free FULL pages and the SWA pages they map to; zero their mapping."""
        pages = self._full.live_pages(full_slots, what="full_slots to free", freeing=True)
        if pages.numel() == 0:
            return
        swa_pages = self._mapped_swa_pages(full_slots)
        self._unmap_full(full_slots)
        self._swa.release_pages(swa_pages)
        self._full.release_pages(pages)

    def free_full_only(self, full_slots: torch.Tensor) -> None:
        """Free FULL pages and zero their mapping; their SWA pages stay allocated."""
        pages = self._full.live_pages(full_slots, what="full_slots to free", freeing=True)
        if pages.numel() == 0:
            return
        self._unmap_full(full_slots)
        self._full.release_pages(pages)

    def free_mapped_swa(self, full_slots: torch.Tensor) -> None:
        """Free the SWA pages mapped from allocated FULL pages; FULL stays allocated.

        Unmapped FULL pages in `full_slots` are skipped (they have no SWA data).
        """
        pages = self._full.live_pages(
            full_slots, what="full_slots whose SWA to free", freeing=False
        )
        if pages.numel() == 0:
            return
        swa_pages = self._mapped_swa_pages(full_slots)
        self._unmap_full(full_slots)
        self._swa.release_pages(swa_pages)

    def free_swa(self, swa_slots: torch.Tensor) -> None:
        """Free SWA pages; FULL pages that mapped to them become unmapped."""
        pages = self._swa.live_pages(swa_slots, what="swa_slots to free", freeing=True)
        if pages.numel() == 0:
            return
        fwd, rev = self._full_to_swa, self._swa_to_full
        fwd.index_fill_(0, rev.index_select(0, swa_slots), 0)
        rev.index_fill_(0, swa_slots, 0)
        self._swa.release_pages(pages)

    # -- internals ---------------------------------------------------------------------

    def _mapped_swa_pages(self, full_slots: torch.Tensor) -> torch.Tensor:
        """SWA page ids mapped from the (validated, whole) FULL pages; unmapped skipped."""
        p = self.page_size
        # Mappings are whole pages slot for slot, so a page's first slot speaks for it.
        firsts = self._full_to_swa.index_select(0, full_slots[::p])
        return firsts[firsts > 0].div(p, rounding_mode="floor")

    def _unmap_full(self, full_slots: torch.Tensor) -> None:
        fwd, rev = self._full_to_swa, self._swa_to_full
        rev.index_fill_(0, fwd.index_select(0, full_slots), 0)
        fwd.index_fill_(0, full_slots, 0)
