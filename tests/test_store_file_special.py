"""`FileStore` with names under page keys that are not page files: directories, FIFOs,
symlinks (to a real page outside the store, or to nothing) and files this process may
not read. None is ever read through or waited on: LOOKUP never offers a special file;
a load that meets one (the name swapped after it was queued) or a page it may not read
fails in bounded time, writes nothing outside its own slots, and drops the page with the
chain after it, like a torn page; an offload then stores the page again. End to end, a
prefix with such a page recomputes once and is loaded again afterwards."""

from __future__ import annotations

import contextlib
import fcntl
import multiprocessing
import os
import shutil
import stat
import tempfile
import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch

from test_store_memory import KV, Rig, drain, kv_lookup, load_now
from unicache_fsm.hashing import page_hashes
from unicache_fsm.pools.transfer import PoolTransfer
from unicache_fsm.serving.request import Outcome
from unicache_fsm.store import ExternalStore, LoadBatchResult, StoreUnavailableError
from unicache_fsm.store.file import FileStore
from unicache_fsm.testing.system import System

T = TypeVar("T")
NOBODY = 65534
BOUND = 60.0  # seconds: far beyond any honest answer on a loaded machine


def _unblock_fifos(root: Path) -> None:
    """Give every FIFO under `root` a writer that closes at once: a reader blocked in
    open(2) then reads end of file (so a hung test leaves no thread behind)."""
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            with contextlib.suppress(OSError):
                if stat.S_ISFIFO(os.lstat(path).st_mode):
                    os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


def returns(fn: Callable[[], T], root: Path) -> T:
    """`fn()`, which must return within `BOUND` seconds (a store call on a FIFO would
    block forever)."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append((True, fn()))
        except BaseException as exc:  # re-raised in the test's thread
            out.append((False, exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(BOUND)
    if thread.is_alive():
        _unblock_fifos(root)
        thread.join(BOUND)
        pytest.fail(f"the store call did not return within {BOUND:.0f} s")
    ok, value = out[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


# -- what goes under a page's name --------------------------------------------------------------


def _outside_page(path: Path, tmp: Path) -> None:
    """A symlink to a whole, valid page of the same key in another directory."""
    outside = tmp / "outside-page"
    shutil.copyfile(path, outside)
    path.unlink()
    path.symlink_to(outside)


def _directory(path: Path, tmp: Path) -> None:
    path.unlink()
    path.mkdir()
    (path / "inside").write_text("x")


def _fifo(path: Path, tmp: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _dangling(path: Path, tmp: Path) -> None:
    path.unlink()
    path.symlink_to(tmp / "nowhere")


SPECIAL = {
    "symlink-to-a-page": _outside_page,
    "dangling-symlink": _dangling,
    "directory": _directory,
    "fifo": _fifo,
}


@pytest.fixture
def rig() -> Rig:
    return Rig()


@pytest.fixture
def store(tmp_path: Path, rig: Rig) -> Iterator[FileStore]:
    s = FileStore(tmp_path / "s", background=True)
    s.attach(rig.pools)
    yield s
    _unblock_fifos(tmp_path)
    s.close()


def _stored(store: FileStore, rig: Rig, n: int) -> tuple[list[str], torch.Tensor]:
    keys, src = rig.chain(n), rig.fill(KV, n)
    assert store.offload([PoolTransfer(KV, src, keys)])
    store.progress()
    assert drain(store)[1] == [True]
    return keys, src


@pytest.mark.parametrize("kind", SPECIAL)
def test_lookup_never_offers_a_special_file(
    store: FileStore, rig: Rig, tmp_path: Path, kind: str
) -> None:
    keys, _ = _stored(store, rig, 3)
    SPECIAL[kind](store.path_of(KV, keys[1]), tmp_path)
    assert not returns(lambda: store.contains(KV, keys[1]), tmp_path)
    assert returns(lambda: store.lookup("r", kv_lookup(keys)), tmp_path) == [1]
    dst = rig.alloc(KV, 3)
    assert not returns(lambda: store.load("r", [PoolTransfer(KV, dst, keys)]), tmp_path)
    store.check_invariants()


@pytest.mark.parametrize("kind", SPECIAL)
def test_a_load_that_meets_a_special_file_fails_and_drops_the_chain(
    store: FileStore, rig: Rig, tmp_path: Path, kind: str
) -> None:
    """The name is swapped after the load was queued: the load fails in bounded time
    with its slots untouched, `reset` returns, the page and the chain after it are
    dropped; an offload stores them again and they load byte-exact."""
    keys, src = _stored(store, rig, 4)
    dst = rig.alloc(KV, 4)
    before = rig.read(KV, dst).clone()
    assert store.load("r", [PoolTransfer(KV, dst, keys)])
    SPECIAL[kind](store.path_of(KV, keys[1]), tmp_path)
    batch = store.start_loading()
    returns(store.progress, tmp_path)
    returns(store.reset, tmp_path)
    loads, _ = drain(store)
    assert loads == [LoadBatchResult(batch, ("r",), False)]
    assert torch.equal(rig.read(KV, dst), before)
    assert [store.contains(KV, k) for k in keys] == [True, False, False, False]
    assert not store.path_of(KV, keys[1]).is_symlink()
    assert (tmp_path / "outside-page").exists() == (kind == "symlink-to-a-page")
    assert store.offload([PoolTransfer(KV, src, keys)])
    store.progress()
    assert drain(store)[1] == [True]
    assert load_now(store, "again", [PoolTransfer(KV, dst, keys)])
    assert torch.equal(rig.read(KV, dst), rig.read(KV, src))
    store.check_invariants()


@pytest.mark.parametrize("kind", SPECIAL)
def test_an_offload_replaces_a_special_file_under_a_page_name(
    store: FileStore, rig: Rig, tmp_path: Path, kind: str
) -> None:
    """Write-once skipped any existing name, so the page was never written and every
    load of it failed (or read a file outside the store)."""
    keys, src = _stored(store, rig, 2)
    SPECIAL[kind](store.path_of(KV, keys[1]), tmp_path)
    assert returns(lambda: store.offload([PoolTransfer(KV, src, keys)]), tmp_path)
    returns(store.progress, tmp_path)
    assert drain(store)[1] == [True]
    path = store.path_of(KV, keys[1])
    assert path.is_file() and not path.is_symlink()
    dst = rig.alloc(KV, 2)
    assert load_now(store, "r", [PoolTransfer(KV, dst, keys)])
    assert torch.equal(rig.read(KV, dst), rig.read(KV, src))
    if kind == "symlink-to-a-page":
        assert (tmp_path / "outside-page").is_file()  # the target is left alone
    store.check_invariants()


# -- a page this process may not read ------------------------------------------------------------


def _in_an_unprivileged_child(scenario: Callable[[Path], None]) -> None:
    """Run `scenario(directory)` in a forked child that cannot read a file its owner made
    unreadable (as root, the child first becomes `nobody`): a real permission denial."""
    base = Path(tempfile.mkdtemp(prefix="unicache-perm-"))
    try:
        if os.geteuid() == 0:
            os.chmod(base, 0o755)
            os.chown(base, NOBODY, NOBODY)
        ctx = multiprocessing.get_context("fork")
        reader, writer = ctx.Pipe(duplex=False)

        def child() -> None:
            try:
                torch.set_num_threads(1)  # no OpenMP pool carried over the fork
                if os.geteuid() == 0:
                    os.setgroups([])
                    os.setgid(NOBODY)
                    os.setuid(NOBODY)
                scenario(base)
                writer.send("")
            except BaseException:
                writer.send(traceback.format_exc())

        proc = ctx.Process(target=child)
        proc.start()
        proc.join(BOUND)
        if proc.is_alive():
            proc.kill()
            proc.join()
            pytest.fail(f"the scenario did not end within {BOUND:.0f} s")
        assert reader.poll(), f"the child died (exit code {proc.exitcode})"
        failure = reader.recv()
        assert not failure, failure
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _made_unreadable(path: Path) -> None:
    path.chmod(0)
    try:
        open(path, "rb").close()
    except PermissionError:
        return
    raise AssertionError("this process reads a mode-000 file: no real denial here")


def _unreadable_page_at_open(base: Path) -> None:
    rig = Rig()
    store = FileStore(base / "s")
    store.attach(rig.pools)
    keys, _ = _stored(store, rig, 3)
    store.close()
    _made_unreadable(store.path_of(KV, keys[2]))
    reopened = FileStore(base / "s")
    assert reopened.recovered.discarded == (f"{KV.value}/{keys[2]}",)
    assert not reopened.path_of(KV, keys[2]).exists()
    reopened.close()


def test_a_page_that_may_not_be_read_is_dropped_when_the_store_opens() -> None:
    """Regression: one unreadable page file made `FileStore()` raise a raw
    `PermissionError`."""
    _in_an_unprivileged_child(_unreadable_page_at_open)


def _unreadable_page_at_load(base: Path) -> None:
    rig = Rig()
    store = FileStore(base / "s")
    store.attach(rig.pools)
    keys, src = _stored(store, rig, 3)
    _made_unreadable(store.path_of(KV, keys[1]))
    dst = rig.alloc(KV, 3)
    assert store.lookup("r", kv_lookup(keys)) == [1, 2, 3]  # it exists: offered once
    assert not load_now(store, "r", [PoolTransfer(KV, dst, keys)])
    assert store.lookup("r", kv_lookup(keys)) == [1]  # dropped with the chain after it
    assert store.offload([PoolTransfer(KV, src, keys)])
    store.progress()
    assert drain(store)[1] == [True]
    assert load_now(store, "again", [PoolTransfer(KV, dst, keys)])
    assert torch.equal(rig.read(KV, dst), rig.read(KV, src))
    store.check_invariants()
    store.close()


def test_a_page_that_may_not_be_read_is_dropped_with_its_chain_when_loaded() -> None:
    """Regression: its load failed and it was offered again, forever (write-once kept
    the unreadable file)."""
    _in_an_unprivileged_child(_unreadable_page_at_load)


# -- end to end: the prefix recomputes once, then loads again ------------------------------------

P = 4
KEY = tuple(range(100, 100 + 6 * P))  # six pages
THIRD = page_hashes(KEY, P)[2]


def prefix_recomputes_once(
    make: Callable[[], ExternalStore], poison: Callable[[ExternalStore], None], root: Path
) -> None:
    """A served prefix whose third page is then poisoned: another system (as another
    process would be) recomputes it once and stores it again; from then on it and every
    new system load all of it. (Shared with the Redis store's tests.)"""
    first = System.build(P, store_factory=make)
    assert first.compute("a", KEY).outcome is Outcome.COMPUTED
    assert THIRD in first.backend.stored_keys(KV)  # type: ignore[attr-defined]
    second = System.build(P, store_factory=make)  # open before the page goes bad
    poison(first.backend)
    once = returns(lambda: second.serve("b", KEY), root)
    assert once.outcome is not Outcome.COMMITTED or len(once.load.key) < len(KEY)  # type: ignore[union-attr]
    second.evict_all()
    third = System.build(P, store_factory=make)
    for system, rid in [(second, "c"), (third, "d")]:
        again = returns(lambda: system.serve(rid, KEY), root)  # noqa: B023 (called at once)
        assert again.outcome is Outcome.COMMITTED, rid
        assert again.load is not None and len(again.load.key) == len(KEY), rid
        system.audit()
    for system in (first, second, third):
        system.store.close()


@pytest.mark.parametrize("kind", SPECIAL)
def test_a_prefix_with_a_special_file_recomputes_once_then_loads(tmp_path: Path, kind: str) -> None:
    directory = tmp_path / "common"

    def poison(store: ExternalStore) -> None:
        assert isinstance(store, FileStore)
        SPECIAL[kind](store.path_of(KV, THIRD), tmp_path)

    prefix_recomputes_once(lambda: FileStore(directory), poison, tmp_path)


def _unreadable_prefix(base: Path) -> None:
    def poison(store: ExternalStore) -> None:
        assert isinstance(store, FileStore)
        _made_unreadable(store.path_of(KV, THIRD))

    prefix_recomputes_once(lambda: FileStore(base / "common"), poison, base)


def test_a_prefix_with_a_page_that_may_not_be_read_recomputes_once_then_loads() -> None:
    _in_an_unprivileged_child(_unreadable_prefix)


# -- a peer that holds the namespace lock and never lets go ------------------------------------


def _hold_lock(path: str, held: Any, release: Any) -> None:
    fd = os.open(path, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    held.set()
    release.wait(BOUND)


def test_an_offload_fails_when_a_peer_holds_the_namespace_lock_too_long(
    tmp_path: Path, rig: Rig
) -> None:
    """Regression: a process stopped (or hung) while holding the lock blocked every other
    process's offloads, and their `reset` and `close`, forever."""
    store = FileStore(tmp_path / "s", background=True, lock_timeout=0.2)
    store.attach(rig.pools)
    ctx = multiprocessing.get_context("fork")
    held, release = ctx.Event(), ctx.Event()
    peer = ctx.Process(target=_hold_lock, args=(str(tmp_path / "s/default/.lock"), held, release))
    peer.start()
    try:
        assert held.wait(BOUND)
        keys, src = rig.chain(2), rig.fill(KV, 2)
        assert store.offload([PoolTransfer(KV, src, keys)])
        returns(store.progress, tmp_path)
        assert drain(store)[1] == [False]
        assert "stayed held by another process" in str(store.last_error)
        assert not store.contains(KV, keys[0])
        with pytest.raises(StoreUnavailableError, match="stayed held"):
            FileStore(tmp_path / "s", capacity_pages=8, lock_timeout=0.2)
    finally:
        release.set()
        peer.join(BOUND)
    assert store.offload([PoolTransfer(KV, src, keys)])
    store.progress()
    assert drain(store)[1] == [True]
    store.check_invariants()
    returns(store.close, tmp_path)
