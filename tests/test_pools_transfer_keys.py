"""`check_page_key`: exactly 64 lowercase hex digits, whether or not the key was seen."""

from __future__ import annotations

import hashlib

import pytest

from unicache_fsm.pools import transfer
from unicache_fsm.pools.transfer import InvalidPageKeyError, PoolName, PoolTransfer, check_page_key

GOOD = hashlib.sha256(b"page").hexdigest()

BAD: list[object] = [
    GOOD + "\n",  # a trailing newline: `$` would have let it through
    "\n" + GOOD,
    GOOD.upper(),
    GOOD[:-1],
    GOOD + "0",
    "../" + GOOD[3:],
    "",
    None,
    42,
    GOOD.encode(),
]


@pytest.mark.parametrize("bad", BAD, ids=repr)
def test_bad_keys_are_refused_before_and_after_a_good_one(bad: object) -> None:
    for _ in range(2):  # the second time GOOD is in the memo of checked keys
        assert check_page_key(GOOD) == GOOD
        with pytest.raises(InvalidPageKeyError):
            check_page_key(bad)
        with pytest.raises(InvalidPageKeyError):
            PoolTransfer(PoolName.KV, keys=[GOOD, bad])  # type: ignore[list-item]


def test_a_str_subclass_is_checked_by_value_every_time() -> None:
    class Sneaky(str):
        pass

    assert check_page_key(Sneaky(GOOD)) == GOOD
    with pytest.raises(InvalidPageKeyError):
        check_page_key(Sneaky(GOOD + "\n"))


def test_the_memo_stays_bounded() -> None:
    keys = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(transfer._CHECKED_MAX + 10)]
    for k in keys:
        assert check_page_key(k) == k
    assert len(transfer._CHECKED) <= transfer._CHECKED_MAX
    assert all(check_page_key(k) == k for k in keys[:100])  # still valid after a clear
