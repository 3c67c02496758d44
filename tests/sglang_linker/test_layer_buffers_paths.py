"""`LayerBuffers` on SGLang 0.5.23's own `MHATokenToKVPool` (CPU). Reads, and writes of
every layer from contiguous bytes, move whole runs of K or V rows natively
(`checksum.gather_pages` / `scatter_pages`); writes of a slice of layers copy page by
page when a page's K and V bytes per layer reach `PAGE_BY_PAGE_BYTES`, with one fancy
index per layer below. Every path, forced in turn on the same pool, reads and writes the
same bytes as a torch gather/scatter of SGLang's buffers: K and V rows of one size and
of two sizes, pages of 1 and 16 tokens, every layer and a slice of layers (a strided
`data`). The one-pass moves (`read_checksummed` / `write_checksummed`) move the same
bytes with each page's XXH3-64, and pass the gate like the others."""

from __future__ import annotations

import logging

import pytest
import torch

HEADS, HEAD_DIM, LAYERS, PAGES = 8, 128, 3, 6
PICK = [5, 2, 3]  # pages moved, out of order


def _pool(page: int, v_head_dim: int) -> tuple[object, object]:
    logging.disable(logging.WARNING)
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    from unicache_fsm.integrations.sglang.buffers import LayerBuffers
    from unicache_fsm.pools.transfer import PoolName

    set_global_server_args_for_scheduler(ServerArgs(model_path="dummy", page_size=page))
    kv = MHATokenToKVPool(
        size=PAGES * page,
        page_size=page,
        dtype=torch.bfloat16,
        head_num=HEADS,
        head_dim=HEAD_DIM,
        layer_num=LAYERS,
        device="cpu",
        enable_memory_saver=False,
        v_head_dim=v_head_dim,
    )
    gen = torch.Generator().manual_seed(page * 1000 + v_head_dim)
    for buf in [*kv.k_buffer, *kv.v_buffer]:
        buf.copy_(torch.randn(buf.shape, generator=gen).to(torch.bfloat16))
    return kv, LayerBuffers(PoolName.KV, kv)


def _gathered(kv: object, page: int, pages: list[int]) -> torch.Tensor:
    """The pages in the store's format, by torch: [rows, layers, K bytes then V bytes]."""
    slots = (torch.tensor(pages)[:, None] * page + torch.arange(page)).reshape(-1)
    per_layer = [
        torch.cat([k[slots].flatten(1), v[slots].flatten(1)], dim=1)
        for k, v in zip(kv.k_buffer, kv.v_buffer, strict=True)  # type: ignore[attr-defined]
    ]
    return torch.stack(per_layer, dim=1)


@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("v_head_dim", [HEAD_DIM, HEAD_DIM // 2], ids=["K=V", "K!=V"])
@pytest.mark.parametrize("per_page", [True, False], ids=["per-page", "fancy"])
def test_both_host_paths_move_the_bytes_of_a_torch_gather_and_scatter(
    monkeypatch: pytest.MonkeyPatch, page: int, v_head_dim: int, per_page: bool
) -> None:
    from unicache_fsm.integrations.sglang import buffers as module

    monkeypatch.setattr(module, "PAGE_BY_PAGE_BYTES", 0 if per_page else 1 << 40)
    kv, device = _pool(page, v_head_dim)
    pages = torch.tensor(PICK)
    device.allow("read", pages)  # type: ignore[attr-defined]
    device.allow("write", pages)  # type: ignore[attr-defined]
    read = device.read_page_ids(pages)  # type: ignore[attr-defined]
    assert torch.equal(read.view(torch.int16), _gathered(kv, page, PICK).view(torch.int16))

    # every layer written: the buffers then gather to exactly the written bytes
    gen = torch.Generator().manual_seed(7)
    new = torch.randn(read.shape, generator=gen).to(torch.bfloat16)
    device.write_page_ids(pages, new)  # type: ignore[attr-defined]
    assert torch.equal(_gathered(kv, page, PICK).view(torch.int16), new.view(torch.int16))

    # layers 1..2 only, from a strided view of a wider tensor: layer 0 keeps its bytes
    wider = torch.randn((read.shape[0], LAYERS + 1, read.shape[2]), generator=gen)
    part = wider.to(torch.bfloat16)[:, 1:3]
    device.write_page_ids(pages, part, layers=slice(1, 3))  # type: ignore[attr-defined]
    after = _gathered(kv, page, PICK)
    assert torch.equal(after[:, 0].view(torch.int16), new[:, 0].view(torch.int16))
    assert torch.equal(after[:, 1:].view(torch.int16), part.view(torch.int16))
    # the other pages untouched: page 1 still reads as SGLang's buffers hold it
    device.allow("read", torch.tensor([1]))  # type: ignore[attr-defined]
    one = device.read_page_ids(torch.tensor([1]))  # type: ignore[attr-defined]
    assert torch.equal(one.view(torch.int16), _gathered(kv, page, [1]).view(torch.int16))


@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("v_head_dim", [HEAD_DIM, HEAD_DIM // 2], ids=["K=V", "K!=V"])
def test_the_one_pass_moves_carry_each_pages_checksum(page: int, v_head_dim: int) -> None:
    import xxhash

    kv, device = _pool(page, v_head_dim)
    pages = torch.tensor(PICK)
    want = _gathered(kv, page, PICK)
    device.allow("read", pages)  # type: ignore[attr-defined]
    out = torch.empty_like(want)
    sums = device.read_checksummed(pages, out=out)  # type: ignore[attr-defined]
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))
    rows = out.view(torch.uint8).reshape(len(PICK), -1)
    assert sums == [xxhash.xxh3_64_intdigest(r.numpy().tobytes()) for r in rows]

    back = torch.tensor([4, 1, 6])
    device.allow("write", back)  # type: ignore[attr-defined]
    assert device.write_checksummed(back, out) == sums  # type: ignore[attr-defined]
    assert torch.equal(_gathered(kv, page, [4, 1, 6]).view(torch.int16), want.view(torch.int16))


def test_the_one_pass_moves_pass_the_gate() -> None:
    from unicache_fsm.integrations.sglang.buffers import SlotsRevokedError
    from unicache_fsm.pools.errors import TensorShapeError

    kv, device = _pool(16, HEAD_DIM)
    pages = torch.tensor(PICK)
    want = _gathered(kv, 16, PICK)
    out = torch.zeros_like(want)
    device.allow("read", pages[:2])  # type: ignore[attr-defined]
    with pytest.raises(SlotsRevokedError, match="read page"):
        device.read_checksummed(pages, out=out)  # type: ignore[attr-defined]
    assert not out.view(torch.int16).any()
    device.allow("write", pages[1:])  # type: ignore[attr-defined]
    with pytest.raises(SlotsRevokedError, match="write page"):
        device.write_checksummed(pages, torch.zeros_like(want))  # type: ignore[attr-defined]
    assert torch.equal(_gathered(kv, 16, PICK).view(torch.int16), want.view(torch.int16))
    with pytest.raises(TensorShapeError):
        device.read_checksummed(pages[:2], out=out)  # type: ignore[attr-defined]
    with pytest.raises(TensorShapeError):  # a strided view: the one-pass write wants rows
        device.write_checksummed(pages[1:], want[: 2 * 16 * 2 : 2])  # type: ignore[attr-defined]


@pytest.mark.parametrize("checksum", [True, False], ids=["read_checksummed", "read_page_ids"])
@pytest.mark.parametrize("bad", [PAGES + 1, 99, -1], ids=["past the end", "far", "negative"])
@pytest.mark.parametrize("native", [True, False], ids=["native-if-built", "python"])
def test_a_read_refuses_a_page_outside_the_buffers_before_moving_any(
    monkeypatch: pytest.MonkeyPatch, checksum: bool, bad: int, native: bool
) -> None:
    """A read of pages the gate was opened for, one of them outside the buffers, is a
    `ValueError` naming that page by its place in the whole read (the native path) or
    the whole read's pages (the Python path), and `out` is untouched: no page before it
    landed (a read split into chunks over threads once landed the chunks before it and
    named the page by its place in its chunk)."""
    import re

    from unicache_fsm.store import checksum as checksum_module

    native = native and checksum_module.NATIVE_COPY
    monkeypatch.setattr(checksum_module, "NATIVE_COPY", native)
    kv, device = _pool(16, HEAD_DIM // 2)
    pages = torch.tensor([5, 2, 3, bad, 1])
    device.allow("read", pages)  # type: ignore[attr-defined]
    out = torch.full_like(_gathered(kv, 16, [5, 2, 3, 1, 1]), 7.0)
    before = out.clone()
    named = f"page 3 is {bad}" if native else re.escape(f"pages [5, 2, 3, {bad}, 1]")
    with pytest.raises(ValueError, match=named):
        if checksum:
            device.read_checksummed(pages, out=out)  # type: ignore[attr-defined]
        else:
            device.read_page_ids(pages, out=out)  # type: ignore[attr-defined]
    assert torch.equal(out.view(torch.int16), before.view(torch.int16))
