"""`check_page_keys` on batches it has not seen answers what checking each key answers:
the same tuple for good keys, the same `InvalidPageKeyError` (same culprit) otherwise,
whatever the batch mixes in (wrong lengths that add up, uppercase, non-ASCII digits,
str subclasses, non-strings)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from unicache_fsm.pools import transfer
from unicache_fsm.pools.transfer import InvalidPageKeyError, check_page_key, check_page_keys


class _Key(str):
    """A str subclass (never memoised; checked on its own)."""


_HEX = "0123456789abcdef"
fresh = st.text(alphabet=_HEX, min_size=64, max_size=64)
spoilt = st.one_of(
    st.text(alphabet=_HEX, min_size=63, max_size=63),
    st.text(alphabet=_HEX, min_size=65, max_size=65),
    fresh.map(str.upper).filter(lambda k: k != k.lower()),
    fresh.map(lambda k: k[:10] + "\u0663" + k[11:]),  # an Arabic-Indic digit
    fresh.map(lambda k: k[:63] + "\n"),
    fresh.map(_Key),
    st.sampled_from([None, 7, b"0" * 64]),
)


def _outcome(call: object) -> tuple[str, object]:
    assert callable(call)
    try:
        return "ok", call()
    except InvalidPageKeyError as exc:
        return "error", repr(exc.key)


@settings(max_examples=300, deadline=None)
@given(keys=st.lists(st.one_of(fresh, fresh, fresh, spoilt), max_size=8), as_list=st.booleans())
def test_an_unseen_batch_is_judged_as_each_key_is(keys: list[object], as_list: bool) -> None:
    transfer._CHECKED.clear()  # every key unseen
    given_keys = list(keys) if as_list else tuple(keys)
    batch = _outcome(lambda: check_page_keys(given_keys))
    remembered = set(transfer._CHECKED)
    transfer._CHECKED.clear()
    each = _outcome(lambda: tuple(check_page_key(k) for k in keys))
    assert batch == each
    if batch[0] == "ok":  # good plain keys are remembered: the next check is a set lookup
        assert {k for k in keys if type(k) is str} <= remembered


def test_a_batch_larger_than_the_memo_is_checked_but_not_remembered() -> None:
    keys = tuple(f"{i:064x}" for i in range(transfer._CHECKED_MAX + 1))
    transfer._CHECKED.clear()
    assert check_page_keys(keys) == keys
    assert len(transfer._CHECKED) <= transfer._CHECKED_MAX
