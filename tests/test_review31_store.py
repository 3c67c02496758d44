"""Review of issue 31, the stores: every wait a store makes is bounded, and a wait
that is not (nan, inf, past what a float or the platform's time_t holds) is refused at
open with `StoreConfigError` naming it, whether it comes as an argument or inside a
Redis URL."""

from __future__ import annotations

import random
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from unicache_fsm.pools.transfer import PoolName
from unicache_fsm.store import FileStore, StoreConfigError, StoreUnavailableError
from unicache_fsm.store.base import MAX_WAIT_SECONDS
from unicache_fsm.store.checksum import page_checksum
from unicache_fsm.store.pageformat import encode_header

redis_store = pytest.importorskip("unicache_fsm.store.redis")

BAD_WAITS = [10**400, 1e300, float("inf"), float("nan"), -1.0, 0, True, "5", None]


def _refused_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("wait", BAD_WAITS, ids=lambda w: repr(w)[:12])
def test_file_store_refuses_an_unbounded_lock_timeout(tmp_path: Path, wait: object) -> None:
    with pytest.raises(StoreConfigError, match="lock_timeout") as info:
        FileStore(tmp_path / "s", lock_timeout=wait)  # type: ignore[arg-type]
    assert info.value.argument == "lock_timeout"
    assert not (tmp_path / "s").exists()  # refused before anything was made


def test_file_store_takes_the_longest_bounded_lock_timeout(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "s", lock_timeout=MAX_WAIT_SECONDS)
    try:
        assert store.lock_timeout == MAX_WAIT_SECONDS
    finally:
        store.close()


@pytest.mark.parametrize("wait", BAD_WAITS, ids=lambda w: repr(w)[:12])
def test_redis_store_refuses_an_unbounded_timeout(wait: object) -> None:
    url = f"redis://127.0.0.1:{_refused_port()}/0"
    with pytest.raises(StoreConfigError, match="timeout") as info:
        redis_store.RedisStore(url, timeout=wait)  # type: ignore[arg-type]
    assert info.value.argument == "timeout"


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port that accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield int(s.getsockname()[1])


@pytest.mark.parametrize(
    "query",
    [
        "socket_timeout=inf",
        "socket_timeout=nan",
        "socket_timeout=1e300",
        "socket_connect_timeout=inf",
        "socket_connect_timeout=1e300",
        "socket_timeout=-1",
    ],
)
def test_redis_store_refuses_an_unbounded_timeout_in_its_url(silent_port: int, query: str) -> None:
    """The URL's own timeouts replace `timeout` (redis-py's rule): they are a setting,
    refused as one, before the server (which would never answer) is asked anything."""
    url = f"redis://127.0.0.1:{silent_port}/0?{query}"
    with pytest.raises(StoreConfigError, match=query.split("=")[0]) as info:
        redis_store.RedisStore(url, timeout=0.5)
    assert not isinstance(info.value, StoreUnavailableError)
    assert info.value.argument == "url"
    assert info.value.value == url


VERIFY_HUGE = r"""
import os, resource, sys
from unicache_fsm.pools.transfer import PoolName
from unicache_fsm.store.file import FileStore
from unicache_fsm.store.pageformat import HEADER_SIZE, encode_header

folder, nbytes = sys.argv[1], int(sys.argv[2])
FileStore(folder).close()
key = "ab" * 32
with open(os.path.join(folder, "default", PoolName.KV.value, key), "wb") as f:
    f.write(encode_header(key, None, PoolName.KV, nbytes, 0))
    f.truncate(HEADER_SIZE + nbytes)  # sparse: a huge page that costs no disk
with open("/proc/self/status") as status:
    vm = next(int(line.split()[1]) for line in status if line.startswith("VmSize:")) << 10
limit = vm + nbytes // 2  # less memory than the page claims
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
store = FileStore(folder, verify_on_open=True)
print(store.num_pages, ",".join(store.recovered.discarded))
"""


def test_verify_on_open_checks_a_huge_page_in_bounded_memory(tmp_path: Path) -> None:
    """A page file claiming more bytes than the process may allocate (a sparse file under
    a page name) is checksummed a piece at a time: its bad checksum discards it, and
    opening neither raises MemoryError nor allocates the page."""
    nbytes = 1 << 28
    done = subprocess.run(
        [sys.executable, "-c", VERIFY_HUGE, str(tmp_path / "s"), str(nbytes)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["0", f"{PoolName.KV.value}/{'ab' * 32}"]


def test_verify_on_open_keeps_a_whole_page_of_several_pieces(tmp_path: Path) -> None:
    """A good page longer than one read piece keeps its page; one flipped byte past the
    first piece discards it."""
    FileStore(tmp_path).close()
    payload = bytearray(random.Random(0).randbytes((5 << 20) + 3))
    folder = tmp_path / "default" / PoolName.KV.value
    good, bad = "cd" * 32, "ef" * 32
    for key in (good, bad):
        header = encode_header(key, None, PoolName.KV, len(payload), page_checksum(payload))
        body = bytearray(payload)
        if key == bad:
            body[-1] ^= 1
        (folder / key).write_bytes(header + body)
    store = FileStore(tmp_path, verify_on_open=True)
    try:
        assert store.num_pages == 1
        assert store.recovered.discarded == (f"{PoolName.KV.value}/{bad}",)
    finally:
        store.close()
