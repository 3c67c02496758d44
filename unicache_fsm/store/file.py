"""A crash-safe store of pages in a directory: `FileStore(directory)`.

`FileStore(directory, *, namespace="default", capacity_pages=None, background=False,
history=256, staging_bytes=64 MiB, verify_on_open=False, io_threads=4,
lock_timeout=30.0)` implements every
primitive of `unicache_fsm.store.protocol`; queues, completions, the worker and capacity
eviction from chain ends are `unicache_fsm.store.base.BaseStore`'s, and checking pages,
learning and forgetting pages other processes wrote or removed are
`unicache_fsm.store.shared.SharedStore`'s. What the directory adds:

- Opening: a directory the store cannot use is refused at once with
  `StoreUnavailableError` naming it (one line): it cannot be created, listed or locked,
  it is not empty and holds no marker, its marker is anything but this format's (read
  at most 4 KiB, never through a symlink; nested or foreign JSON is not parsed past
  that), or a namespace or pool folder is not a real directory (a symlink would lead
  writes out of it). Several processes may open one new directory at once: each writes
  the marker under a name of its own and renames it into place, and a directory that
  holds only markers in the making counts as empty.
- Layout: ``DIR/unicache-store.json`` marks the directory as a store; each page is one
  file ``DIR/<namespace>/<pool>/<page key>`` holding the `pageformat` header (key, parent,
  pool, length, checksum) and the page's bytes. Keys are validated 64-hex page hashes
  and the namespace ``[A-Za-z0-9][A-Za-z0-9_.-]{0,63}``, so no name escapes the
  directory. Use one namespace per model and KV layout.
- Write-once and atomic: a page is written to a temporary name beside its final name
  (``.<key>.<pid>.<n>.tmp``), header and payload in one ``writev`` (one write lets the
  page cache hold the file in a few large folios, which later reads copy out faster
  than many small ones), fsynced, then renamed into place; a page file that already
  exists is skipped (a name that is no regular file is removed and written). After the
  renames of an offload, each directory it wrote into is fsynced; only then is the
  offload completed True. So a page is visible to LOOKUP only once its bytes are
  durable, and a page of an offload reported published survives a crash of the
  process (and, as far as fsync promises, of the machine).
  The pages of one transfer are written (and read) by `io_threads` threads at once,
  each a stride of the pages, the calling thread one of them: concurrent fsyncs share
  the file system's journal commits. A read fetches header, payload and one byte more
  in one ``preadv`` (the payload straight into its slot for large CPU pages) and
  checksums the payload right after, while it is in cache.
- Only regular files are pages. A directory, FIFO, socket, device or symlink under a
  page's name is never offered by LOOKUP and never opened (so never waited on, nor read
  through to a file outside the directory); a load that meets one (swapped in after
  LOOKUP) or a page file this process may not read fails its batch in bounded time, and
  the name is dropped with the chain after it, like a torn page. Reads are bounded by
  the page's length, whatever the file's size.
- Recovery on open: temporary files of dead writers (their pid names no live process on
  this host, or no process at all) are deleted; a name under a page key that is not a
  readable regular file, or a page file whose header is invalid, names another key or
  pool, or whose length disagrees with its header (a torn or partial file) is deleted,
  never served (`recovered.discarded` lists them); ``verify_on_open=True``
  also reads every page (a piece at a time: memory stays bounded whatever length a
  header claims) and deletes those whose checksum fails. The books are rebuilt
  from the headers (parents included), least recently modified first.
- Several processes may share one directory (on one host): two writers of one page
  write identical bytes and the renames make that safe; a reader never sees a partial
  file (renamed files are never written again; a page file unlinked under a reader
  that already opened it still reads whole, one unlinked before is missing: the load
  fails and the page is forgotten).
- Capacity holds for the namespace in the directory, across processes: offloads take
  an exclusive lock on ``DIR/<namespace>/.lock`` (`fcntl.flock`; released by the kernel
  if the process dies; a peer that holds it past `lock_timeout` seconds (above 0, at
  most a day: `StoreConfigError` otherwise), stopped or
  hung, fails the offload, and opening with a capacity raises `StoreUnavailableError`,
  instead of waiting forever) around choosing, evicting and writing, and a store with
  `capacity_pages` first reconciles its books with the files in the namespace (learning
  pages other processes wrote, parents from their headers; forgetting pages they
  removed), then evicts from chain ends so that the namespace holds at most
  `capacity_pages` pages when the offload completes. Opening evicts down to the limit
  (oldest files first), and a LOOKUP that learns pages beyond it reconciles and evicts
  too. So when every store writing a namespace passes the same `capacity_pages`, the
  namespace never holds more (a store without a limit writes under the same lock but
  never evicts). Recency is each process's own: pages another process wrote rank as
  least recently used until this process looks them up.
- Inspection: `directory`, `namespace`, `path_of(pool, key)`, `recovered` (what
  opening discarded), `num_pages`, `stored_keys`, `check_invariants()`, `last_error`.
"""

from __future__ import annotations

import concurrent.futures
import errno
import fcntl
import json
import os
import re
import secrets
import shutil
import stat
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import attrs
import xxhash

from unicache_fsm.pools.transfer import PoolName, check_page_key
from unicache_fsm.store.base import Ident, check_seconds
from unicache_fsm.store.checksum import page_checksum
from unicache_fsm.store.errors import StoreConfigError, StoreFaultError, StoreUnavailableError
from unicache_fsm.store.jobs import StoreOffload
from unicache_fsm.store.pageformat import HEADER_SIZE, decode_header
from unicache_fsm.store.shared import KnownPage, PageRead, PageWrite, SharedStore, TornPage
from unicache_fsm.store.staging import DEFAULT_STAGING_BYTES

__all__ = ["MARKER", "FileStore", "Recovery"]

MARKER = "unicache-store.json"
_FORMAT = {"format": "unicache-fsm file store", "version": 1}
_MARKER_BYTES = 4096  # a marker of this format is ~60 bytes; more is not ours
_NAMESPACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_KEY = re.compile(r"[0-9a-f]{64}")
_TMP = re.compile(r"\.([0-9a-f]{64})\.(\d+)\.(\d+)\.tmp")
# a marker being written by an opening store (older versions wrote it without the token)
_MARKER_TMP = re.compile(rf"\.{re.escape(MARKER)}\.(\d+)(?:\.[0-9a-f]+)?\.tmp")
_VERIFY_PIECE = 4 << 20  # verify_on_open reads a page this much at a time
_PID_MAX = (1 << 22) - 1  # Linux's largest pid_max: a greater pid names no process
# Opening a page never follows a symlink nor waits on a FIFO (the name is checked to be a
# regular file first; these flags cover a name swapped in between).
_READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
# Errors of one name, not of the process or the file system: the page is unreadable.
_UNREADABLE = frozenset(
    {
        errno.EACCES,
        errno.EPERM,
        errno.ELOOP,
        errno.EISDIR,
        errno.ENOTDIR,
        errno.ENXIO,
        errno.ENODEV,
        errno.ESPIPE,
        errno.EINVAL,
        errno.EIO,
        errno.EAGAIN,
    }
)
T = TypeVar("T")
R = TypeVar("R")


class _Unreadable(Exception):
    """A name that is not a regular file this process can read (a directory, FIFO,
    socket, device or symlink, or permission denied)."""


def _open_regular(path: str) -> int:
    """A read-only descriptor of the regular file `path`; `FileNotFoundError` when there
    is none, `_Unreadable` when the name is anything else or cannot be read. Special
    files are refused before they are opened (opening a device or a FIFO has effects,
    or waits); the flags make a name swapped in between harmless."""
    try:
        mode = os.lstat(path).st_mode
        if not stat.S_ISREG(mode):
            msg = f"{path} is not a regular file (mode {stat.filemode(mode)})"
            raise _Unreadable(msg)
        return os.open(path, _READ_FLAGS)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno in _UNREADABLE:
            raise _Unreadable(f"{path}: {exc.strerror}") from exc
        raise


def _read_at_most(path: str, limit: int) -> bytes:
    """The first `limit` + 1 bytes at most of the regular file `path` (see
    `_open_regular` for what else it raises)."""
    fd = _open_regular(path)
    try:
        return os.pread(fd, limit + 1, 0)
    except OSError as exc:
        if exc.errno in _UNREADABLE:
            raise _Unreadable(f"{path}: {exc.strerror}") from exc
        raise
    finally:
        os.close(fd)


def _remove(path: str) -> bool:
    """Remove the name `path`, whatever it is (a directory with what it holds: a name of
    the store's own is never anyone else's data); whether it was there. `OSError` when
    it cannot be removed."""
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def _is_page_file(path: str) -> bool:
    """Whether `path` names a regular file (not a symlink, directory or special file:
    those are never offered as pages)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _discard(path: str) -> bool:
    """`_remove`, for cleaning up: whether the name went; never raises."""
    try:
        return _remove(path)
    except OSError:
        return False


@attrs.frozen
class Recovery:
    """What opening the directory found: pages kept, torn pages and temporaries deleted."""

    pages: int
    discarded: tuple[str, ...]
    temporaries: int


def _payload_checksum(fd: int, nbytes: int) -> int | None:
    """`page_checksum` of the `nbytes` payload bytes of the page file `fd`, read a piece
    at a time (memory bounded, whatever length a header claims), or None when the file
    ends before them."""
    state = xxhash.xxh3_64()  # page_checksum's XXH3-64, seed 0, in its streaming form
    piece = bytearray(min(nbytes, _VERIFY_PIECE))
    at = 0
    while at < nbytes:
        view = memoryview(piece)[: min(len(piece), nbytes - at)]
        got = os.preadv(fd, [view], HEADER_SIZE + at)
        if got == 0:
            return None
        state.update(view[:got])
        at += got
    return state.intdigest()


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True  # another store of this process may be writing it right now
    if not 0 < pid <= _PID_MAX:
        return False  # no process has it (and 0 would signal our own process group)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, chunks: Sequence[bytes | memoryview]) -> None:
    """Write `chunks` one after another, in as few ``writev`` calls as the kernel allows
    (one for a page file: header and payload arrive in one write, so the page cache can
    hold the file in a few large folios instead of many small ones, and a later read
    copies it out faster)."""
    views = [v for v in (memoryview(c).cast("B") for c in chunks) if v.nbytes]
    while views:
        written = os.writev(fd, views)
        while views and written >= views[0].nbytes:
            written -= views[0].nbytes
            views.pop(0)
        if written:
            views[0] = views[0][written:]


class FileStore(SharedStore):
    """Pages in a directory, crash-safe; see the module docstring."""

    worker_name = "unicache-file-store"

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        namespace: str = "default",
        capacity_pages: int | None = None,
        background: bool = False,
        history: int = 256,
        staging_bytes: int = DEFAULT_STAGING_BYTES,
        verify_on_open: bool = False,
        io_threads: int = 4,
        lock_timeout: float = 30.0,
    ) -> None:
        super().__init__(
            capacity_pages=capacity_pages,
            background=background,
            history=history,
            staging_bytes=staging_bytes,
        )
        self.lock_timeout = check_seconds("lock_timeout", lock_timeout)
        if isinstance(io_threads, bool) or not isinstance(io_threads, int) or io_threads < 1:
            msg = f"io_threads must be an int >= 1, got {io_threads!r}"
            raise StoreConfigError(msg, argument="io_threads", value=io_threads)
        self.io_threads = io_threads
        flag: object = verify_on_open
        if not isinstance(flag, bool):
            msg = f"verify_on_open must be True or False, got {verify_on_open!r}"
            raise StoreConfigError(msg, argument="verify_on_open", value=verify_on_open)
        self._io: concurrent.futures.ThreadPoolExecutor | None = None
        if not isinstance(namespace, str) or not _NAMESPACE.fullmatch(namespace):
            msg = (
                f"namespace must match [A-Za-z0-9][A-Za-z0-9_.-]{{0,63}} (one directory "
                f"level), got {namespace!r}"
            )
            raise StoreConfigError(msg, argument="namespace", value=namespace)
        given: object = directory
        if not isinstance(given, (str, os.PathLike)) or not str(os.fspath(directory)):
            msg = f"directory must be a path, got {directory!r}"
            raise StoreConfigError(msg, argument="directory", value=directory)
        self.directory = Path(directory)
        self.namespace = namespace
        self._root = self.directory / namespace
        # the pool folders as strings: per-page paths are joined on hot paths
        self._folders = {pool: str(self._root / pool.value) for pool in PoolName}
        self._tmp_counter = 0
        self._tmp_lock = threading.Lock()
        self._open_directory()
        self._lock_fd = self._open_lock()
        try:
            try:
                self.recovered = self._recover(verify=verify_on_open)
            except OSError as exc:
                msg = f"cannot open the store directory {self.directory}: {exc}"
                raise StoreUnavailableError(
                    msg, argument="directory", value=str(self.directory)
                ) from exc
            if capacity_pages is not None:
                try:
                    self._lock_namespace()
                except StoreFaultError as exc:
                    raise StoreUnavailableError(
                        str(exc), argument="directory", value=str(self.directory)
                    ) from exc
                try:
                    with self._lock:
                        self._shrink(set())
                finally:
                    self._unlock_namespace()
        except BaseException:
            os.close(self._lock_fd)
            raise
        self.start_worker()

    def __repr__(self) -> str:
        return (
            f"FileStore({str(self.directory)!r}, namespace={self.namespace!r}, "
            f"capacity_pages={self.capacity_pages!r}, background={self.background!r})"
        )

    def path_of(self, pool: PoolName, key: str) -> Path:
        """The file of page (`pool`, `key`) (whether or not it exists)."""
        return self._root / pool.value / check_page_key(key)

    # -- opening and recovery ------------------------------------------------------------

    def _open_directory(self) -> None:
        """Make the directory a store (or check that it is one) and create the namespace's
        pool folders; `StoreUnavailableError` naming the path when it cannot be.

        Several processes may open one new directory at once: each writes the marker
        under a temporary name of its own and renames it into place (the contents are
        equal, so the last rename wins harmlessly), and a directory that holds nothing
        but markers in the making counts as empty."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            if not self._read_marker():
                foreign = self._foreign_entries()
                # another process may have made it a store between the two looks
                if foreign and not self._read_marker():
                    msg = (
                        f"{self.directory} is not empty and holds no {MARKER} (found "
                        f"{foreign[0]!r}): it is not a store directory; pass an empty or "
                        "new directory"
                    )
                    raise StoreUnavailableError(
                        msg, argument="directory", value=str(self.directory)
                    )
                if not foreign:
                    self._write_marker()
            for folder in (self._root, *(self._root / pool.value for pool in PoolName)):
                folder.mkdir(exist_ok=True)
                if not stat.S_ISDIR(os.lstat(folder).st_mode):  # never through a symlink
                    msg = f"{folder} is not a directory of this store (a symlink or a file)"
                    raise StoreUnavailableError(
                        msg, argument="directory", value=str(self.directory)
                    )
        except OSError as exc:
            msg = f"cannot open the store directory {self.directory}: {exc}"
            raise StoreUnavailableError(
                msg, argument="directory", value=str(self.directory)
            ) from exc

    def _read_marker(self) -> bool:
        """Whether there is a marker (one of this format); `StoreUnavailableError` naming
        it when it is anything else (another format, not JSON, nested past parsing,
        larger than any marker, not a regular file)."""
        marker = self.directory / MARKER
        try:
            raw = _read_at_most(str(marker), _MARKER_BYTES)
            found = json.loads(raw) if len(raw) <= _MARKER_BYTES else None
        except FileNotFoundError:
            return False
        except (_Unreadable, ValueError, RecursionError):
            found = None
        if found != _FORMAT:
            msg = (
                f"{marker} does not describe a store of this format ({_FORMAT}); point the "
                "store at another directory"
            )
            raise StoreUnavailableError(msg, argument="directory", value=str(self.directory))
        return True

    def _foreign_entries(self) -> list[str]:
        """What the directory holds besides markers other openers are writing (those of
        dead processes are deleted)."""
        foreign: list[str] = []
        for entry in os.scandir(self.directory):
            tmp = _MARKER_TMP.fullmatch(entry.name)
            if tmp is None:
                foreign.append(entry.name)
            elif not _pid_alive(int(tmp.group(1))):
                _discard(entry.path)
        return sorted(foreign)

    def _write_marker(self) -> None:
        tmp = self.directory / f".{MARKER}.{os.getpid()}.{secrets.token_hex(8)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            try:
                _write_all(fd, [json.dumps(_FORMAT).encode()])
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.directory / MARKER)
        except BaseException:
            _discard(str(tmp))
            raise
        _fsync_dir(self.directory)

    def _recover(self, *, verify: bool) -> Recovery:
        """Delete temporaries of dead writers and torn or unreadable pages; rebuild the
        books. A name the store cannot list is `StoreUnavailableError`."""
        discarded: list[str] = []
        temporaries = 0
        found: list[tuple[float, Ident, KnownPage]] = []
        for pool in PoolName:
            folder = self._folders[pool]
            try:
                entries = list(os.scandir(folder))
            except OSError as exc:
                msg = f"cannot list the store folder {folder}: {exc}"
                raise StoreUnavailableError(
                    msg, argument="directory", value=str(self.directory)
                ) from exc
            for entry in entries:
                name = entry.name
                tmp = _TMP.fullmatch(name)
                if tmp is not None:
                    if not _pid_alive(int(tmp.group(2))) and _discard(entry.path):
                        temporaries += 1
                    continue
                if not _KEY.fullmatch(name):
                    continue
                checked = self._check_file(entry.path, pool, name, verify=verify)
                if checked is None:
                    _discard(entry.path)
                    discarded.append(f"{pool.value}/{name}")
                    continue
                known, mtime = checked
                found.append((mtime, (pool, name), known))
        with self._lock:
            for _, ident, known in sorted(found, key=lambda f: f[0]):
                self._insert(ident, known)
        return Recovery(len(found), tuple(discarded), temporaries)

    def _check_file(
        self, path: str, pool: PoolName, key: str, *, verify: bool
    ) -> tuple[KnownPage, float] | None:
        """The books' entry for a page file and its modification time, or None when the
        name is not a whole, readable page (gone, torn, foreign, a special file)."""
        try:
            fd = _open_regular(path)
        except (FileNotFoundError, _Unreadable):
            return None
        try:
            st = os.fstat(fd)
            record = decode_header(os.pread(fd, HEADER_SIZE, 0))
            if record is None or record.key != key or record.pool is not pool:
                return None
            if st.st_size != HEADER_SIZE + record.nbytes:
                return None
            if verify and _payload_checksum(fd, record.nbytes) != record.checksum:
                return None
        except OSError:
            return None  # unreadable (EIO, ...): not a page this store can serve
        finally:
            os.close(fd)
        parent = (pool, record.parent) if record.parent is not None else None
        return KnownPage(parent, record.nbytes), st.st_mtime

    # -- the namespace lock and directory-wide capacity ----------------------------------

    def _open_lock(self) -> int:
        path = self._root / ".lock"
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
        try:
            fd = os.open(path, flags, 0o644)
        except OSError as exc:
            msg = f"cannot open the store's lock file {path}: {exc}"
            raise StoreUnavailableError(
                msg, argument="directory", value=str(self.directory)
            ) from exc
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            msg = f"the store's lock file {path} is not a regular file"
            raise StoreUnavailableError(msg, argument="directory", value=str(self.directory))
        return fd

    def _lock_namespace(self) -> None:
        """Take the namespace lock, exclusive across processes (and across stores of one
        process), waiting at most `lock_timeout` seconds: a peer that holds it longer
        (stopped, or hung in I/O) makes this a `StoreFaultError`, not a wait forever."""
        deadline = time.monotonic() + self.lock_timeout
        pause = 0.001
        while True:
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    msg = (
                        f"the store's lock {self._root / '.lock'} stayed held by another "
                        f"process for {self.lock_timeout:g} s"
                    )
                    raise StoreFaultError(msg, operation="lock") from None
                time.sleep(min(pause, left))
                pause = min(2 * pause, 0.05)

    def _unlock_namespace(self) -> None:
        fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _reconcile(self) -> None:
        """Make the books match the page files of the namespace (the lock is held):
        forget pages whose file is gone, learn the others (at the least recently used
        end, parents from their headers); files that are not whole pages are left to
        recovery."""
        for pool in PoolName:
            folder = self._folders[pool]
            try:
                on_disk = sorted(e.name for e in os.scandir(folder) if _KEY.fullmatch(e.name))
            except OSError as exc:
                msg = f"cannot list the store folder {folder}: {exc}"
                raise StoreFaultError(msg, operation="reconcile") from exc
            names = set(on_disk)
            for ident in [i for i in self._pages if i[0] is pool and i[1] not in names]:
                self._forget(ident)
            for key in on_disk:
                ident = (pool, key)
                if ident in self._pages:
                    continue
                checked = self._check_file(f"{folder}/{key}", pool, key, verify=False)
                if checked is not None:
                    self._insert(ident, checked[0])
                    if ident in self._leaves:
                        self._leaves.move_to_end(ident, last=False)

    def _shrink(self, protect: set[Ident]) -> None:
        try:
            self._reconcile()  # pages others removed no longer count
        except StoreFaultError as exc:  # shrink the books as they are
            self.last_error = exc
        super()._shrink(protect)

    def backend_offload(self, record: StoreOffload) -> None:
        try:
            self._lock_namespace()
        except StoreFaultError as exc:
            with self._lock:
                self._offload_failed(record, exc)
            return
        try:
            if self.capacity_pages is not None:
                with self._lock:
                    try:
                        self._reconcile()  # room is made for the namespace, not the books
                    except StoreFaultError as exc:  # room is made from the books alone
                        self.last_error = exc
            super().backend_offload(record)
        finally:
            self._unlock_namespace()

    # -- the medium --------------------------------------------------------------------

    def medium_exists(self, pool: PoolName, keys: Sequence[str]) -> list[bool]:
        folder = self._folders[pool]
        return [_is_page_file(f"{folder}/{key}") for key in keys]

    def _each(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """`fn` over `items` on the I/O threads (in order); the first failure is raised."""
        workers = min(self.io_threads, len(items))
        if workers < 2:
            return [fn(item) for item in items]
        if self._io is None:
            self._io = concurrent.futures.ThreadPoolExecutor(
                self.io_threads - 1, thread_name_prefix="unicache-file-io"
            )

        def run(part: Sequence[T]) -> list[R]:
            return [fn(item) for item in part]

        # one stride of the items per thread, the first on the calling thread (few
        # hand-offs: every submission wakes a thread that then competes for the GIL)
        futures = [self._io.submit(run, items[w::workers]) for w in range(1, workers)]
        try:
            mine = run(items[0::workers])
        finally:
            concurrent.futures.wait(futures)  # none left running, whatever happened
        parts = [f.result() for f in futures]
        out: list[R] = [None] * len(items)  # type: ignore[list-item]
        out[0::workers] = mine
        for w, part in enumerate(parts, start=1):
            out[w::workers] = part
        return out

    def medium_write(self, pool: PoolName, pages: Sequence[PageWrite]) -> None:
        folder = self._root / pool.value

        def write(page: PageWrite) -> None:
            key, header, payload = page
            final = folder / key
            # write-once (another process may have written it); a name that is no page
            # file (a directory, a special file, a symlink) is removed and written
            if not _is_page_file(str(final)):
                _remove(str(final))
                self._write_file(folder, key, final, [header, payload])

        self._each(write, pages)  # concurrent fsyncs share the file system's commits
        if pages:
            _fsync_dir(folder)  # the renames are durable before the offload completes

    def _write_file(
        self, folder: Path, key: str, final: Path, chunks: Sequence[bytes | memoryview]
    ) -> None:
        with self._tmp_lock:
            self._tmp_counter += 1
            tmp = folder / f".{key}.{os.getpid()}.{self._tmp_counter}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            try:
                _write_all(fd, chunks)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, final)
        except BaseException:
            _discard(str(tmp))
            raise

    def medium_read(
        self, pool: PoolName, keys: Sequence[str], rows: Sequence[memoryview]
    ) -> list[PageRead | None]:
        folder = self._folders[pool]

        def read(i: int) -> PageRead | None:
            key, row = keys[i], rows[i]
            header = bytearray(HEADER_SIZE)
            extra = bytearray(1)  # a longer file is torn too (and a huge one reads no more)
            try:
                fd = _open_regular(f"{folder}/{key}")
            except FileNotFoundError:
                return None
            except _Unreadable:
                raise TornPage(key) from None
            try:  # one call: header, payload straight into its row, and any excess
                got = os.preadv(fd, [header, row, extra], 0)
            except OSError as exc:
                if exc.errno in _UNREADABLE:
                    raise TornPage(key) from exc
                raise
            finally:
                os.close(fd)
            record = decode_header(header)
            if record is None or got != HEADER_SIZE + record.nbytes or record.nbytes != len(row):
                raise TornPage(key)
            return record, page_checksum(row)  # checked while the page is in cache

        return self._each(read, range(len(keys)))

    def medium_erase(self, pool: PoolName, keys: Sequence[str]) -> int:
        folder = self._folders[pool]
        return sum(_remove(f"{folder}/{key}") for key in keys)

    def backend_release(self) -> None:
        os.close(self._lock_fd)
        if self._io is not None:
            self._io.shutdown(wait=True)
            self._io = None
