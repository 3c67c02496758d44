"""`FileStore` on a real directory: the whole store contract, then what only a directory
has — recovery on open (torn files, dead writers' temporaries), durability order,
write-once across processes, the page format, and bad input."""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
import xxhash
from hypothesis import settings
from hypothesis.stateful import invariant, rule

from test_store_memory import (
    KV,
    SWA,
    LargeRig,
    Rig,
    StoreContract,
    StoreFactory,
    drain,
    kv_lookup,
    load_now,
)
from unicache_fsm.pools.transfer import InvalidPageKeyError, PoolName, PoolTransfer
from unicache_fsm.store import ExternalStore, LoadBatchResult, StoreConfigError
from unicache_fsm.store.checksum import page_checksum, page_checksums
from unicache_fsm.store.file import MARKER, FileStore
from unicache_fsm.store.pageformat import (
    HEADER_SIZE,
    VERSION,
    decode_header,
    encode_header,
)
from unicache_fsm.testing.store_machine import StoreMachine


def flip_payload(path: Path) -> None:
    """Flip the first payload byte of a page file in place."""
    with open(path, "r+b") as f:
        f.seek(HEADER_SIZE)
        byte = f.read(1)
        f.seek(HEADER_SIZE)
        f.write(bytes([byte[0] ^ 0xFF]))


class TestFileStore(StoreContract):
    @pytest.fixture(params=["sync", "background"])
    def store_factory(
        self, request: pytest.FixtureRequest, tmp_path: Path
    ) -> Iterator[StoreFactory]:
        background = request.param == "background"
        made: list[FileStore] = []

        def make(capacity_pages: int | None = None) -> ExternalStore:
            store = FileStore(
                tmp_path / f"store{len(made)}",
                capacity_pages=capacity_pages,
                background=background,
            )
            made.append(store)
            return store

        yield make
        for store in made:
            if not store._closed:
                store.check_invariants()
            assert store.last_error is None, store.last_error

    def corrupt(self, store: ExternalStore, pool: PoolName, key: str) -> None:
        assert isinstance(store, FileStore)
        flip_payload(store.path_of(pool, key))


class TestFileStoreLargePages(TestFileStore):
    """The contract again with 128 KiB pages: these are read straight into their
    reserved slots and checked there, not through the staging buffer."""

    failed_load_leaves_slots = False

    @pytest.fixture
    def rig(self) -> Rig:
        return LargeRig()


# -- helpers ----------------------------------------------------------------------------------


def _open(path: Path, rig: Rig, **options: object) -> FileStore:
    store = FileStore(path, **options)  # type: ignore[arg-type]
    store.attach(rig.pools)
    return store


def _offload(store: FileStore, rig: Rig, n: int) -> tuple[list[str], torch.Tensor]:
    keys, src = rig.chain(n), rig.fill(KV, n)
    assert store.offload([PoolTransfer(KV, src, keys)])
    store.progress()
    assert drain(store)[1] == [True]
    return keys, src


# -- persistence and recovery -----------------------------------------------------------------


def test_pages_survive_reopening_byte_exact(tmp_path: Path) -> None:
    rig = Rig()
    store = _open(tmp_path / "s", rig)
    keys, src = _offload(store, rig, 4)
    store.close()
    again = _open(tmp_path / "s", rig)
    assert again.recovered.pages == 4 and again.recovered.discarded == ()
    assert again.lookup("r", kv_lookup(keys)) == [1, 2, 3, 4]
    dst = rig.alloc(KV, 4)
    assert load_now(again, "r", [PoolTransfer(KV, dst, keys)])
    assert torch.equal(rig.read(KV, dst), rig.read(KV, src))
    again.check_invariants()
    again.close()


def test_recovery_discards_torn_pages_and_dead_writers_temporaries(tmp_path: Path) -> None:
    rig = Rig()
    store = _open(tmp_path / "s", rig)
    keys, _ = _offload(store, rig, 5)
    paths = [store.path_of(KV, k) for k in keys]
    store.close()
    # a truncated page, a page with a bad header, a page that names another key
    with open(paths[1], "r+b") as f:
        f.truncate(HEADER_SIZE + 3)
    with open(paths[2], "r+b") as f:
        f.write(b"garbage!")
    os.replace(paths[4], paths[4].with_name(keys[0][::-1]))  # a valid page under a wrong name
    wrong_name = paths[4].with_name(keys[0][::-1])
    # a dead writer's temporary (pid 2**22 + 1 is above the kernel's pid_max default)
    dead = paths[3].with_name(f".{keys[3]}.{2**22 + 1}.1.tmp")
    dead.write_bytes(b"partial")
    live = paths[3].with_name(f".{keys[3]}.{os.getppid()}.1.tmp")  # a live process's
    live.write_bytes(b"in flight")
    again = _open(tmp_path / "s", rig)
    rec = again.recovered
    assert sorted(rec.discarded) == sorted(
        f"kv/{name}" for name in (keys[1], keys[2], wrong_name.name)
    )
    assert rec.temporaries == 1 and not dead.exists() and live.exists()
    assert again.lookup("r", kv_lookup(keys)) == [1]
    assert again.contains(KV, keys[0]) and again.contains(KV, keys[3])
    assert not again.contains(KV, keys[4])
    again.close()


def test_verify_on_open_discards_a_page_whose_checksum_fails(tmp_path: Path) -> None:
    rig = Rig()
    store = _open(tmp_path / "s", rig)
    keys, _ = _offload(store, rig, 3)
    store.close()
    flip_payload(FileStore(tmp_path / "s").path_of(KV, keys[1]))
    quick = _open(tmp_path / "s", rig)
    assert quick.recovered.discarded == ()  # header and length are fine
    quick.close()
    full = _open(tmp_path / "s", rig, verify_on_open=True)
    assert full.recovered.discarded == (f"kv/{keys[1]}",)
    assert full.lookup("r", kv_lookup(keys)) == [1]
    full.close()


def test_a_corrupt_page_fails_its_load_and_is_never_offered_again(tmp_path: Path) -> None:
    rig = Rig()
    store = _open(tmp_path / "s", rig)
    keys, _ = _offload(store, rig, 3)
    flip_payload(store.path_of(KV, keys[2]))
    assert store.lookup("r", kv_lookup(keys)) == [1, 2, 3]
    assert not load_now(store, "r", [PoolTransfer(KV, rig.alloc(KV, 3), keys)])
    assert store.lookup("r", kv_lookup(keys)) == [1, 2]
    assert not store.path_of(KV, keys[2]).exists()
    store.close()


def test_books_are_rebuilt_with_parents_so_capacity_still_evicts_chain_ends(
    tmp_path: Path,
) -> None:
    rig = Rig()
    store = _open(tmp_path / "s", rig)
    x, _ = _offload(store, rig, 4)
    store.close()
    bounded = _open(tmp_path / "s", rig, capacity_pages=5)
    y, _ = _offload(bounded, rig, 3)  # two pages must go: x's end, then its new end
    assert bounded.lookup("x", kv_lookup(x)) == [1, 2]
    assert bounded.lookup("y", kv_lookup(y)) == [1, 2, 3]
    bounded.check_invariants()
    bounded.close()


def test_a_page_seen_while_its_offload_writes_it_keeps_its_parent(tmp_path: Path) -> None:
    """A `contains` (or LOOKUP, or load) that sees a page between the offload's write and
    its bookkeeping learns it without its parent; the offload's own entry must link it
    again, or capacity eviction takes the chain's start and leaves its end stored."""

    class Peeking(FileStore):
        def medium_write(self, pool: PoolName, pages: Any) -> None:
            super().medium_write(pool, pages)
            for key, _, _ in pages:  # another thread asks right after the write
                assert self.contains(pool, key)

    rig = Rig()
    store = Peeking(tmp_path / "s", capacity_pages=2)
    store.attach(rig.pools)
    x, _ = _offload(store, rig, 2)  # type: ignore[arg-type]
    store.check_invariants()
    _offload(store, rig, 1)  # one page must go: the chain's end, x[1]
    assert store.contains(KV, x[0]) and not store.contains(KV, x[1])
    assert store.lookup("x", kv_lookup(x)) == [1]
    store.check_invariants()
    store.close()


# -- sharing one directory ---------------------------------------------------------------------


def test_two_stores_on_one_directory_see_each_others_pages(tmp_path: Path) -> None:
    rig = Rig()
    a = _open(tmp_path / "s", rig)
    b = _open(tmp_path / "s", rig)
    keys, src = _offload(a, rig, 3)
    assert b.num_pages == 0  # opened before a wrote
    assert b.lookup("r", kv_lookup(keys)) == [1, 2, 3]  # found on disk, and learnt
    assert b.num_pages == 3
    dst = rig.alloc(KV, 3)
    assert load_now(b, "r", [PoolTransfer(KV, dst, keys)])
    assert torch.equal(rig.read(KV, dst), rig.read(KV, src))
    # b writes the same pages again (write-once: skipped), then a evicts one: b forgets it
    assert b.offload([PoolTransfer(KV, src, keys)])
    b.progress()
    assert drain(b)[1] == [True]
    assert a.evict([keys[1]]) == 1
    assert b.lookup("r", kv_lookup(keys)) == [1]
    assert b.num_pages == 2
    b.check_invariants()
    a.close()
    b.close()


def _page_files(store: FileStore) -> set[str]:
    return {n for n in os.listdir(store.path_of(KV, "0" * 64).parent) if not n.startswith(".")}


def test_capacity_holds_for_the_namespace_not_per_store(tmp_path: Path) -> None:
    """Two stores on one directory, each capped at 6 pages: each offload counts the
    other's pages too and evicts from chain ends, so the namespace stays within 6."""
    rig = Rig()
    a = _open(tmp_path / "s", rig, capacity_pages=6)
    b = _open(tmp_path / "s", rig, capacity_pages=6)
    x, _ = _offload(a, rig, 4)
    y, _ = _offload(b, rig, 4)  # learns x (least recently used here), evicts x's end
    assert len(_page_files(a)) == 6
    assert a.lookup("x", kv_lookup(x)) == [1, 2]  # x lost its last two pages, in order
    assert b.lookup("y", kv_lookup(y)) == [1, 2, 3, 4]
    z, _ = _offload(a, rig, 3)  # a forgets what b evicted, learns y, makes room for z
    assert len(_page_files(a)) == 6
    assert a.lookup("z", kv_lookup(z)) == [1, 2, 3]
    for store in (a, b):  # every page still there is whole, whoever reads it
        for chain in (x, y, z):
            found = store.lookup("r", kv_lookup(chain))
            if found:
                dst = rig.alloc(KV, found[-1])
                assert load_now(store, "r", [PoolTransfer(KV, dst, chain[: found[-1]])])
        store.check_invariants()
        assert store.num_pages <= 6
    a.close()
    b.close()
    # reopening with a lower limit evicts down to it, oldest files first
    c = _open(tmp_path / "s", rig, capacity_pages=2)
    assert len(_page_files(c)) == 2 and c.num_pages == 2
    c.check_invariants()
    c.close()


def test_one_capacity_eviction_erases_its_pages_in_one_call(tmp_path: Path) -> None:
    """Room for a 4-page chain in a store of 6 holding a 5-page one: its last 3 pages go
    in one `medium_erase` (one call per eviction, not per page), chain end first, and
    their files are gone from the directory."""
    erased: list[tuple[object, list[str]]] = []

    class Counting(FileStore):
        def medium_erase(self, pool: object, keys: Sequence[str]) -> int:
            erased.append((pool, list(keys)))
            return super().medium_erase(pool, keys)  # type: ignore[arg-type]

    rig = Rig()
    store = Counting(tmp_path / "s", capacity_pages=6)
    store.attach(rig.pools)
    x, _ = _offload(store, rig, 5)
    erased.clear()
    y, _ = _offload(store, rig, 4)
    assert erased == [(KV, [x[4], x[3], x[2]])]
    assert _page_files(store) == {store.path_of(KV, k).name for k in [*x[:2], *y]}
    assert store.lookup("x", kv_lookup(x)) == [1, 2]
    store.check_invariants()
    store.close()


def test_a_lookup_that_learns_pages_beyond_the_limit_evicts(tmp_path: Path) -> None:
    """A store without a limit filled the namespace; a capped store that learns those
    pages evicts down to its limit, keeping what it just looked up."""
    rig = Rig()
    free = _open(tmp_path / "s", rig)
    capped = _open(tmp_path / "s", rig, capacity_pages=3)
    x, _ = _offload(free, rig, 5)
    assert capped.lookup("x", kv_lookup(x[:3])) == [1, 2, 3]
    y, _ = _offload(free, rig, 2)
    assert capped.lookup("y", kv_lookup(y)) == [1, 2]  # learns 2 more: 5 > 3
    assert capped.num_pages <= 3
    assert len(_page_files(capped)) <= 3
    assert capped.contains(KV, y[0]) and capped.contains(KV, y[1])
    capped.check_invariants()
    free.close()
    capped.close()


def test_a_load_queued_before_another_process_evicts_fails_cleanly(tmp_path: Path) -> None:
    rig = Rig()
    a = _open(tmp_path / "s", rig)
    b = _open(tmp_path / "s", rig)
    keys, _ = _offload(a, rig, 2)
    dst = rig.alloc(KV, 2)
    before = rig.read(KV, dst).clone()
    assert b.load("r", [PoolTransfer(KV, dst, keys)])
    assert a.evict(keys) == 2
    batch = b.start_loading()
    b.progress()
    assert drain(b)[0] == [LoadBatchResult(batch, ("r",), False)]
    assert torch.equal(rig.read(KV, dst), before)
    b.check_invariants()
    a.close()
    b.close()


# -- durability order --------------------------------------------------------------------------


def test_a_page_is_renamed_into_place_only_after_its_bytes_are_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig = Rig()
    store = _open(tmp_path / "s", rig)
    calls: list[tuple[str, str]] = []
    fsync, replace, open_ = os.fsync, os.replace, os.open
    names: dict[int, str] = {}

    def spy_open(path: object, flags: int, mode: int = 0o777) -> int:
        fd = open_(path, flags, mode)  # type: ignore[arg-type]
        names[fd] = Path(str(path)).name
        return fd

    def spy_fsync(fd: int) -> None:
        calls.append(("fsync", names.get(fd, "?")))
        fsync(fd)

    def spy_replace(src: object, dst: object) -> None:
        calls.append(("rename", Path(str(dst)).name))
        replace(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", spy_open)
    monkeypatch.setattr(os, "fsync", spy_fsync)
    monkeypatch.setattr(os, "replace", spy_replace)
    keys, _ = _offload(store, rig, 2)
    monkeypatch.undo()
    for key in keys:  # each page: its temporary is fsynced before it is renamed in
        synced = next(i for i, (kind, name) in enumerate(calls) if kind == "fsync" and key in name)
        assert calls[synced][1].startswith(f".{key}.") and calls[synced][1].endswith(".tmp")
        assert synced < calls.index(("rename", key))
    # then the directory, once, after every rename, before the offload is reported
    assert calls[-1] == ("fsync", "kv") and [c for c in calls if c[1] == "kv"] == [calls[-1]]
    assert len(calls) == 5
    store.close()


def test_a_page_file_is_one_write_and_whole_even_when_the_kernel_writes_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Header and payload go to the kernel in one ``writev`` per page (one write lets the
    page cache hold the file in large folios); a kernel that takes only part of a write
    (any cut, across the header/payload boundary too) still leaves whole pages that
    reopen, verify and load byte-exact."""
    rig = LargeRig()
    store = _open(tmp_path / "s", rig)
    writev = os.writev
    calls: list[int] = []

    def counted(fd: int, buffers: Any) -> int:
        calls.append(len(buffers))
        return writev(fd, buffers)

    monkeypatch.setattr(os, "writev", counted)
    _offload(store, rig, 3)
    assert calls == [2, 2, 2]  # header and payload of each page, one call each
    cuts = iter([1, HEADER_SIZE - 1, 5, HEADER_SIZE + 7, 4096, 1 << 30])

    def short(fd: int, buffers: Any) -> int:  # writes at most the next cut's bytes
        want = next(cuts, 1 << 30)
        joined = b"".join(bytes(b) for b in buffers)[:want]
        return writev(fd, [joined])

    monkeypatch.setattr(os, "writev", short)
    keys, src = _offload(store, rig, 2)
    monkeypatch.undo()
    store.close()
    again = _open(tmp_path / "s", rig, verify_on_open=True)
    assert again.recovered.discarded == ()
    for key in keys:
        path = again.path_of(KV, key)
        assert path.stat().st_size == HEADER_SIZE + rig.pools[KV].page_nbytes
    dst = rig.alloc(KV, 2)
    assert load_now(again, "r", [PoolTransfer(KV, dst, keys)])
    assert torch.equal(rig.read(KV, dst), rig.read(KV, src))
    again.close()


# -- the page format ---------------------------------------------------------------------------


def test_checksum_is_xxh3_64_and_pinned() -> None:
    """The page checksum is XXH3-64 (seed 0) of the page bytes: the published value for
    empty input, a golden value that must never drift, the same whether the bytes are
    read in place or copied out, and sensitive to every bit."""
    assert page_checksum(torch.empty(0, dtype=torch.uint8)) == 0x2D06800538D394C2
    page = torch.arange(64, dtype=torch.uint8)
    golden = page_checksum(page)
    assert golden == 0x6187EB9089B0ED55  # the format's checksum must never drift
    rows = torch.randint(
        0, 256, (3, 4096), dtype=torch.uint8, generator=torch.Generator().manual_seed(5)
    )
    sums = page_checksums(rows)
    assert sums == [page_checksum(r) for r in rows]
    assert sums == [xxhash.xxh3_64_intdigest(bytes(r.tolist())) for r in rows]
    assert len(set(sums)) == 3
    # a strided view hashes its own bytes, not the memory underneath it
    assert page_checksums(rows.t()[:2]) == [
        xxhash.xxh3_64_intdigest(bytes(c.tolist())) for c in rows.t()[:2]
    ]
    assert page_checksums(torch.empty(0, 8, dtype=torch.uint8)) == []
    for i in range(64):
        for bit in (0x01, 0x80):
            flipped = page.clone()
            flipped[i] ^= bit
            assert page_checksum(flipped) != golden, f"a flipped bit at byte {i} went unnoticed"
    odd = torch.arange(13, dtype=torch.uint8)
    assert page_checksum(odd) != page_checksum(odd.flip(0))


def as_version(value: bytes, version: int) -> bytes:
    """`value` (a stored page) as a writer of format `version` would have labelled it: the
    version field changed and the header's CRC made valid again, nothing else."""
    raw = bytearray(value)
    struct.pack_into("<H", raw, 8, version)
    struct.pack_into("<I", raw, 12, 0)
    struct.pack_into("<I", raw, 12, zlib.crc32(raw[:HEADER_SIZE]))
    return bytes(raw)


def test_a_header_of_another_format_version_is_refused() -> None:
    raw = encode_header("ab" * 32, None, KV, 4096, 7)
    assert decode_header(as_version(raw, VERSION)) is not None  # the helper alone is harmless
    assert VERSION == 2
    for version in (0, 1, 3, 0xFFFF):
        assert decode_header(as_version(raw, version)) is None, version


def test_pages_of_the_old_format_version_are_never_served(tmp_path: Path) -> None:
    """Pages written as format version 1 (whose checksum was another function): a load
    refuses them with nothing written and deletes them; opening the directory discards
    them as torn."""
    rig = Rig()
    store = _open(tmp_path / "s", rig)
    keys, _ = _offload(store, rig, 4)
    paths = [store.path_of(KV, k) for k in keys]
    paths[3].write_bytes(as_version(paths[3].read_bytes(), 1))
    dst = rig.alloc(KV, 1)
    before = rig.read(KV, dst).clone()
    assert store.contains(KV, keys[3])
    assert not load_now(store, "r", [PoolTransfer(KV, dst, keys[3:])])
    assert torch.equal(rig.read(KV, dst), before)
    assert not paths[3].exists() and not store.contains(KV, keys[3])
    store.close()
    paths[2].write_bytes(as_version(paths[2].read_bytes(), 1))
    again = _open(tmp_path / "s", rig)
    assert again.recovered.discarded == (f"kv/{keys[2]}",)
    assert again.lookup("r", kv_lookup(keys)) == [1, 2]
    again.check_invariants()
    again.close()


def test_headers_round_trip_and_reject_any_damage() -> None:
    key, parent = "ab" * 32, "cd" * 32
    raw = encode_header(key, parent, SWA, 4096, 2**64 - 1)
    assert len(raw) == HEADER_SIZE
    record = decode_header(raw)
    assert record is not None
    assert (record.key, record.parent, record.pool, record.nbytes, record.checksum) == (
        key,
        parent,
        SWA,
        4096,
        2**64 - 1,
    )
    orphan = encode_header(key, None, KV, 1, 0)
    assert decode_header(orphan).parent is None  # type: ignore[union-attr]
    for header in (raw, orphan):  # with and without a parent (the two flags values)
        for i in range(HEADER_SIZE):
            for bit in range(8):
                damaged = bytearray(header)
                damaged[i] ^= 1 << bit
                assert decode_header(damaged) is None, f"flipped bit {bit} of byte {i} passed"
        assert decode_header(header[:-1]) is None


# -- bad input ---------------------------------------------------------------------------------


def test_bad_arguments_are_typed_errors(tmp_path: Path) -> None:
    for bad in ("", "../x", "a/b", ".hidden", "x" * 65, 3):
        with pytest.raises(StoreConfigError) as info:
            FileStore(tmp_path / "s", namespace=bad)  # type: ignore[arg-type]
        assert info.value.argument == "namespace"
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(StoreConfigError, match="not a store directory"):
        FileStore(foreign)
    (foreign / MARKER).write_text("{}")
    with pytest.raises(StoreConfigError, match="format"):
        FileStore(foreign)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StoreConfigError, match="cannot open"):
        FileStore(blocker / "sub")
    with pytest.raises(StoreConfigError):
        FileStore(tmp_path / "t", capacity_pages=0)


def test_keys_cannot_escape_the_directory(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "s")
    with pytest.raises(InvalidPageKeyError):
        store.contains(KV, "../../" + "a" * 58)
    with pytest.raises(InvalidPageKeyError):
        store.path_of(KV, "../x")
    store.close()


def test_attach_refuses_a_layout_that_contradicts_the_pages_on_disk(tmp_path: Path) -> None:
    rig = Rig()
    store = _open(tmp_path / "s", rig)
    _offload(store, rig, 1)
    store.close()
    from unicache_fsm.pools import KVPool

    again = FileStore(tmp_path / "s")
    with pytest.raises(StoreConfigError, match="another namespace"):
        again.attach({KV: KVPool(64, Rig.P, 3, Rig.WIDTH)})
    other = FileStore(tmp_path / "s", namespace="other-layout")
    other.attach({KV: KVPool(64, Rig.P, 3, Rig.WIDTH)})
    again.close()
    other.close()


# -- the public store machine, on a directory -------------------------------------------------
# Hypothesis runs hundreds of programs, so these use a directory on tmpfs when the machine
# has one (the same files, renames and fsync calls; fsync is then cheap); the contract
# tests above run on the disk's temporary directory.

FAST_DIR = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


class FileStoreMachine(StoreMachine):
    """A bounded FileStore (it evicts on its own); corruption flips a file's byte."""

    capacity_pages: ClassVar[int | None] = 24
    background: ClassVar[bool] = False

    def make_store(self) -> ExternalStore:
        self.directory = Path(tempfile.mkdtemp(prefix="unicache-fsm-", dir=FAST_DIR))
        return self._open()

    def _open(self) -> FileStore:
        return FileStore(
            self.directory, capacity_pages=self.capacity_pages, background=self.background
        )

    def corrupt(self, store: ExternalStore, pool: PoolName, key: str) -> None:
        assert isinstance(store, FileStore)
        flip_payload(store.path_of(pool, key))

    @invariant()
    def no_swallowed_error(self) -> None:
        store = self.store
        assert isinstance(store, FileStore)
        assert store.last_error is None, f"the store swallowed {store.last_error!r}"

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            if hasattr(self, "directory"):
                shutil.rmtree(self.directory, ignore_errors=True)


class UnboundedFileStoreMachine(FileStoreMachine):
    """No capacity and no corruption: the store must lose nothing, across reopenings."""

    capacity_pages = None
    lossless = True
    corrupt = StoreMachine.corrupt  # a corrupt page is deleted: not lossless

    @rule()
    def reopen(self) -> None:
        """Reset, settle every completion, close, and open the directory again (a
        restart): every page a successful offload stored is still there."""
        self.reset()
        self.poll_offloads()
        self.poll_loads()
        self.store.close()
        self._store = self._open()
        self._store.attach(self.kv_pools)
        assert isinstance(self._store, FileStore)
        assert self._store.recovered.discarded == ()


class BackgroundFileStoreMachine(UnboundedFileStoreMachine):
    background = True


TestFileStoreMachine = FileStoreMachine.TestCase
TestUnboundedFileStoreMachine = UnboundedFileStoreMachine.TestCase
TestBackgroundFileStoreMachine = BackgroundFileStoreMachine.TestCase
# a variant of the machine above: a third of the profile's programs
TestBackgroundFileStoreMachine.settings = settings(
    settings.default, max_examples=max(10, settings.default.max_examples // 3)
)


# -- choosing a store by spec (the CLI's --store) -----------------------------------------------


def test_open_store_by_spec(tmp_path: Path) -> None:
    from unicache_fsm.store import MemoryStore, open_store
    from unicache_fsm.store.spec import store_loses_pages

    memory = open_store("memory")
    assert isinstance(memory, MemoryStore) and not store_loses_pages(memory)
    files = open_store(f"file:{tmp_path / 'd'}", namespace="m1", capacity_pages=8)
    assert isinstance(files, FileStore) and files.namespace == "m1"
    assert files.capacity_pages == 8 and store_loses_pages(files)
    assert not store_loses_pages(open_store(f"file:{tmp_path / 'd'}"))
    for bad in ("", "mem", "file:", "http://x", "redis:/x"):
        with pytest.raises(StoreConfigError) as info:
            open_store(bad)
        assert info.value.argument == "store"


def test_simulate_rejects_a_bad_store_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from unicache_fsm.cli import main

    assert main(["simulate", "--store", "tape:/dev/st0", "--requests", "2"]) == 2
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "x").write_text("x")
    assert main(["simulate", "--store", f"file:{foreign}", "--requests", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("unicache-fsm: error:") for line in err)
    assert "not a store" in err[0] and "not a store directory" in err[1]


def test_simulate_on_a_file_store_survives_a_restart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two simulate runs on one directory: the second loads what the first computed."""
    import json

    from unicache_fsm.cli import main

    store = f"file:{tmp_path / 'shared'}"
    args = ["simulate", "--store", store, "--requests", "40", "--json"]
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out)
    assert main(args) == 0
    second = json.loads(capsys.readouterr().out)
    assert first["external_hit_rate"] == 0 < second["external_hit_rate"]
    assert second["loads_verified"] == second["loads_committed"] > 0
    assert second["loads_mismatched"] == 0


def test_foreign_files_under_page_names_are_never_served(tmp_path: Path) -> None:
    """A page copied under another key's name and a truncated page: the load fails with
    nothing written and the name is removed. (Symlinks and other special files under
    page names: tests/test_store_file_special.py.)"""
    rig = Rig()
    store = _open(tmp_path / "s", rig)
    keys, _ = _offload(store, rig, 3)
    paths = [store.path_of(KV, k) for k in keys]
    paths[1].write_bytes(paths[0].read_bytes())
    paths[2].write_bytes(paths[0].read_bytes()[:-1])
    for i in (2, 1):  # chain end first: a bad page also drops the chain after it
        dst = rig.alloc(KV, 1)
        before = rig.read(KV, dst).clone()
        assert store.contains(KV, keys[i])
        assert not load_now(store, f"r{i}", [PoolTransfer(KV, dst, keys[i : i + 1])])
        assert torch.equal(rig.read(KV, dst), before)
        assert not store.contains(KV, keys[i])
    assert store.lookup("r", kv_lookup(keys)) == [1]
    store.check_invariants()
    store.close()


# -- the machine catches a broken file store ----------------------------------------------------


def _never_renamed(monkeypatch: pytest.MonkeyPatch) -> None:
    def write_file(self: FileStore, folder: Path, key: str, final: Path, chunks: object) -> None:
        (folder / f".{key}.lost.tmp").write_bytes(b"")  # written, fsynced, never renamed

    monkeypatch.setattr(FileStore, "_write_file", write_file)


def _pages_read_into_the_wrong_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    read = FileStore.medium_read

    def shifted(self: FileStore, pool: PoolName, keys: Any, rows: list[memoryview]) -> Any:
        return read(self, pool, keys, [*rows[1:], *rows[:1]])  # page i lands in row i - 1

    monkeypatch.setattr(FileStore, "medium_read", shifted)


@pytest.mark.parametrize(
    ("plant", "match"),
    [
        (_never_renamed, r"is False, but a successful offload stored it"),
        # each page checks out as read, but lands in its neighbour's slots
        (_pages_read_into_the_wrong_rows, r"reported success, but .* holds the bytes of page"),
    ],
)
def test_planted_file_store_bugs_are_caught(
    plant: Any, match: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from test_testing_store import _caught

    plant(monkeypatch)
    _caught(UnboundedFileStoreMachine, match)


def test_a_page_evicted_while_its_offload_runs_is_written_again_next_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (found by the background Redis machine): an evict between an offload's
    write and its bookkeeping left the books claiming a page the medium lacked, and the
    next offload of that page skipped it yet completed True."""
    rig = Rig()
    store = _open(tmp_path / "s", rig)
    keys, src = rig.chain(2), rig.fill(KV, 2)
    write = FileStore.medium_write

    def write_then_evict(self: FileStore, pool: PoolName, pages: Any) -> None:
        write(self, pool, pages)
        self.evict([key for key, _, _ in pages])  # another thread, in the window

    monkeypatch.setattr(FileStore, "medium_write", write_then_evict)
    assert store.offload([PoolTransfer(KV, src, keys)])
    store.progress()
    assert drain(store)[1] == [True]
    monkeypatch.undo()
    assert not store.contains(KV, keys[0])
    assert store.offload([PoolTransfer(KV, src, keys)])
    store.progress()
    assert drain(store)[1] == [True]
    assert store.contains(KV, keys[0]) and store.contains(KV, keys[1])
    store.check_invariants()
    store.close()
