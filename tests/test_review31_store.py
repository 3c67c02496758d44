"""Review of issue 31, the stores: every wait a store makes is bounded, and a wait
that is not (nan, inf, past what a float or the platform's time_t holds) is refused at
open with `StoreConfigError` naming it, whether it comes as an argument or inside a
Redis URL."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from unicache_fsm.store import FileStore, StoreConfigError, StoreUnavailableError
from unicache_fsm.store.base import MAX_WAIT_SECONDS

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
