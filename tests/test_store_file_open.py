"""Opening a `FileStore`: a directory it cannot use is refused at once with a typed error
naming it; several processes may open one new directory together; what opening finds in
the directory (markers, temporaries, page names) never makes it raise anything else."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest

from test_store_memory import KV, Rig, kv_lookup
from unicache_fsm.store import StoreConfigError, StoreError, StoreUnavailableError, open_store
from unicache_fsm.store.file import MARKER, FileStore


def _refused(directory: Path, match: str) -> StoreUnavailableError:
    with pytest.raises(StoreUnavailableError, match=match) as info:
        FileStore(directory)
    error = info.value
    assert isinstance(error, StoreConfigError) and isinstance(error, StoreError)
    assert error.argument == "directory" and error.value == str(directory)
    assert len(str(error).splitlines()) == 1
    return error


# -- a directory the store cannot use is refused when it is opened -----------------------------


def test_a_directory_that_cannot_be_created_is_refused(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    error = _refused(blocker / "sub", "cannot open the store directory")
    assert str(blocker / "sub") in str(error)
    assert blocker.read_text() == "x"


def test_open_store_refuses_a_directory_it_cannot_use(tmp_path: Path) -> None:
    """The CLI's ``--store file:DIR`` gets the same typed, one-line refusal."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StoreUnavailableError) as info:
        open_store(f"file:{blocker / 'sub'}")
    assert info.value.argument == "directory" and len(str(info.value).splitlines()) == 1


def test_a_directory_that_is_not_a_store_is_refused(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    _refused(foreign, "not a store directory")
    assert sorted(os.listdir(foreign)) == ["notes.txt"]  # nothing written into it


@pytest.mark.parametrize(
    "marker",
    [
        "[" * 100_000 + "]" * 100_000,  # nested past any parser's recursion
        '{"format": "unicache-fsm file store", "version": 1, "pad": "' + "x" * 10_000 + '"}',
        "{}",
        '{"format": "unicache-fsm file store", "version": 2}',
        "\xff\xfe not json",
    ],
    ids=["deeply-nested", "huge", "empty-object", "other-version", "not-json"],
)
def test_a_marker_of_another_kind_is_a_typed_error_naming_it(tmp_path: Path, marker: str) -> None:
    """The marker is the store's identity: anything but this format's is refused (one
    line naming the file), never parsed past a bound, never a `RecursionError`."""
    directory = tmp_path / "s"
    directory.mkdir()
    (directory / MARKER).write_text(marker, encoding="utf-8", errors="surrogateescape")
    error = _refused(directory, "does not describe a store of this format")
    assert str(directory / MARKER) in str(error)


def test_a_special_file_as_the_marker_is_refused_without_waiting(tmp_path: Path) -> None:
    """A FIFO as the marker would block a plain read forever; a directory or a symlink
    to a real marker is not this store's marker either."""
    good = tmp_path / "good"
    FileStore(good).close()
    for name, make in [
        ("fifo", lambda p: os.mkfifo(p)),
        ("dir", lambda p: p.mkdir()),
        ("link", lambda p: p.symlink_to(good / MARKER)),
    ]:
        directory = tmp_path / name
        directory.mkdir()
        make(directory / MARKER)
        _refused(directory, "does not describe a store of this format")


def test_namespace_folders_and_lock_files_that_are_symlinks_are_refused(tmp_path: Path) -> None:
    """Nothing is ever written or created through a symlink out of the store's
    directory."""
    outside = tmp_path / "outside"
    outside.mkdir()
    directory = tmp_path / "s"
    FileStore(directory, namespace="other").close()
    (directory / "default").symlink_to(outside)
    _refused(directory, "not a directory of this store")
    assert os.listdir(outside) == []
    (directory / "default").unlink()
    FileStore(directory).close()
    (directory / "default" / ".lock").unlink()
    (directory / "default" / ".lock").symlink_to(outside / "lock")
    _refused(directory, "lock file")
    assert os.listdir(outside) == []


# -- several processes open one new directory at once ------------------------------------------


def _open_and_close(directory: str, start: multiprocessing.synchronize.Event) -> None:
    start.wait()
    FileStore(directory).close()


def test_processes_opening_one_new_directory_at_once_all_succeed(tmp_path: Path) -> None:
    """Regression: each opener saw the others' marker in the making and refused the
    directory as "not empty" (1-2 of 18 opens failed)."""
    ctx = multiprocessing.get_context("fork")
    for round_ in range(6):
        directory = str(tmp_path / f"new{round_}")
        start = ctx.Event()
        procs = [ctx.Process(target=_open_and_close, args=(directory, start)) for _ in range(3)]
        for p in procs:
            p.start()
        start.set()
        for p in procs:
            p.join(60)
        assert [p.exitcode for p in procs] == [0, 0, 0], f"round {round_}"
        assert json.loads((Path(directory) / MARKER).read_text())["version"] == 1
        assert not [n for n in os.listdir(directory) if n.endswith(".tmp")]


def test_a_marker_left_in_the_making_by_a_dead_process_does_not_block_opening(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "s"
    directory.mkdir()
    stale = directory / f".{MARKER}.{2**31 + 5}.tmp"  # an opener that died mid-write
    stale.write_text("{")
    FileStore(directory).close()
    assert not stale.exists()
    assert (directory / MARKER).exists()


# -- what opening finds never makes it raise anything but a typed error ------------------------


def test_temporaries_named_with_impossible_pids_are_deleted(tmp_path: Path) -> None:
    """Regression: a pid >= 2**31 in a temporary's name raised `OverflowError`."""
    rig = Rig()
    directory = tmp_path / "s"
    FileStore(directory).close()
    folder = directory / "default" / KV.value
    key = rig.chain(1)[0]
    names = [f".{key}.{pid}.1.tmp" for pid in (2**31, 2**63, 10**40, 0)]
    for name in names:
        (folder / name).write_bytes(b"partial")
    store = FileStore(directory)
    assert store.recovered.temporaries == len(names)
    assert not any((folder / n).exists() for n in names)
    store.close()


def test_a_directory_named_like_a_temporary_does_not_stop_opening(tmp_path: Path) -> None:
    rig = Rig()
    directory = tmp_path / "s"
    FileStore(directory).close()
    odd = directory / "default" / KV.value / f".{rig.chain(1)[0]}.{2**40}.1.tmp"
    odd.mkdir()
    (odd / "inside").write_text("x")
    store = FileStore(directory)
    assert store.recovered.temporaries == 1 and not odd.exists()
    store.close()


def test_opening_a_store_with_special_files_under_page_names_drops_them(
    tmp_path: Path,
) -> None:
    """A FIFO under a page name blocked opening (with a capacity, reconciling) forever; a
    directory or a symlink was kept; each is an unreadable page, discarded."""
    rig = Rig()
    directory = tmp_path / "s"
    FileStore(directory).close()
    folder = directory / "default" / KV.value
    keys = rig.chain(3)
    os.mkfifo(folder / keys[0])
    (folder / keys[1]).mkdir()
    (folder / keys[2]).symlink_to(tmp_path / "nowhere")
    store = FileStore(directory, capacity_pages=4)
    store.attach(rig.pools)
    assert sorted(store.recovered.discarded) == sorted(f"{KV.value}/{k}" for k in keys)
    assert store.lookup("r", kv_lookup(keys)) == []
    assert os.listdir(folder) == []
    store.check_invariants()
    store.close()
