"""Page-hash chain and namespace seed: SGLang's golden vectors, chaining laws, bad input."""

from __future__ import annotations

import hashlib
import json
import random
import struct
from array import array
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from unicache_fsm.fsm.errors import UnicacheFsmError
from unicache_fsm.hashing import (
    NAMESPACE_TAG,
    HashError,
    InvalidPriorHashError,
    InvalidTokenError,
    NamespaceFieldError,
    PageSizeError,
    namespace_seed,
    page_hash,
    page_hashes,
)

# Golden vectors computed by SGLang 0.5.23's own hashing code (facts, kept as data).
VECTORS_PATH = Path(__file__).parent / "data" / "vectors" / "page_hashes.json"

tokens_u32 = st.lists(st.integers(0, 2**32 - 1), max_size=80)
page_sizes = st.sampled_from([1, 2, 4, 16])


def load_vectors() -> dict[str, Any]:
    # No skip when missing: the golden vectors are the point of byte compatibility.
    assert VECTORS_PATH.is_file(), f"golden vectors missing at {VECTORS_PATH}"
    data: dict[str, Any] = json.loads(VECTORS_PATH.read_text(encoding="utf-8"))["vectors"]
    return data


def reference_chain(tokens: list[int], page_size: int, prior: str | None) -> list[str]:
    """The spec, written the slow obvious way (struct, one token at a time)."""
    prev = bytes.fromhex(prior) if prior is not None else b""
    out = []
    for i in range(len(tokens) // page_size):
        h = hashlib.sha256(prev)
        for t in tokens[i * page_size : (i + 1) * page_size]:
            h.update(struct.pack("<I", t))
        prev = h.digest()
        out.append(h.hexdigest())
    return out


class TestGoldenVectors:
    def test_vector_file_has_every_case_we_check(self) -> None:
        assert set(load_vectors()) == {
            "tokens_1_to_8_page4",
            "tokens_0_to_7_page4",
            "tokens_0_to_15_page16",
            "namespace_seed_cache_salt_tenant-a",
            "tokens_1_to_8_page4_salted_tenant-a",
            "namespace_seed_extra_key_empty_cache_salt_empty",
            "resume_from_prior",
        }

    def test_unsalted_chains(self) -> None:
        v = load_vectors()
        assert page_hashes(list(range(1, 9)), 4) == v["tokens_1_to_8_page4"]
        assert page_hashes(list(range(0, 8)), 4) == v["tokens_0_to_7_page4"]
        assert page_hashes(list(range(0, 16)), 16) == v["tokens_0_to_15_page16"]

    def test_namespace_seeds(self) -> None:
        v = load_vectors()
        assert namespace_seed(cache_salt="tenant-a") == v["namespace_seed_cache_salt_tenant-a"]
        assert namespace_seed(None, "tenant-a") == v["namespace_seed_cache_salt_tenant-a"]
        assert namespace_seed("", "") == v["namespace_seed_extra_key_empty_cache_salt_empty"]

    def test_salted_chain_starts_from_the_seed(self) -> None:
        v = load_vectors()
        seed = namespace_seed(cache_salt="tenant-a")
        got = page_hashes(list(range(1, 9)), 4, seed)
        assert got == v["tokens_1_to_8_page4_salted_tenant-a"]

    def test_resume_from_prior(self) -> None:
        case = load_vectors()["resume_from_prior"]
        assert page_hashes(case["tokens"], 4, case["prior"]) == case["hash"]
        assert [page_hash(case["tokens"], case["prior"])] == case["hash"]


class TestNamespaceSeed:
    def test_absent_fields_give_no_seed(self) -> None:
        assert namespace_seed() is None
        assert namespace_seed(None, None) is None

    def test_encoding_matches_the_spec(self) -> None:
        extra, salt = "k\u00e9y", "s"
        raw_extra, raw_salt = extra.encode(), salt.encode()
        expected = hashlib.sha256(
            NAMESPACE_TAG
            + b"\x01"
            + len(raw_extra).to_bytes(8, "little")
            + raw_extra
            + b"\x01"
            + len(raw_salt).to_bytes(8, "little")
            + raw_salt
        ).hexdigest()
        assert namespace_seed(extra, salt) == expected
        only_extra = hashlib.sha256(
            NAMESPACE_TAG + b"\x01" + len(raw_extra).to_bytes(8, "little") + raw_extra + b"\x00"
        ).hexdigest()
        assert namespace_seed(extra_key=extra) == only_extra

    def test_fields_are_not_interchangeable(self) -> None:
        assert namespace_seed("a", None) != namespace_seed(None, "a")
        assert namespace_seed("", None) != namespace_seed(None, None)

    def test_non_str_field_is_a_typed_error(self) -> None:
        with pytest.raises(NamespaceFieldError) as info:
            namespace_seed(cache_salt=b"tenant")  # type: ignore[arg-type]
        assert info.value.field == "cache_salt"
        assert info.value.value == b"tenant"
        assert isinstance(info.value, TypeError)
        assert isinstance(info.value, UnicacheFsmError)


class TestChainLaws:
    @settings(max_examples=60, deadline=None)
    @given(tokens=tokens_u32, page_size=page_sizes, salted=st.booleans())
    def test_matches_the_slow_reference(
        self, tokens: list[int], page_size: int, salted: bool
    ) -> None:
        prior = namespace_seed(cache_salt="t") if salted else None
        assert page_hashes(tokens, page_size, prior) == reference_chain(tokens, page_size, prior)

    @settings(max_examples=60, deadline=None)
    @given(tokens=tokens_u32, page_size=page_sizes, data=st.data())
    def test_resuming_at_any_page_boundary_continues_the_chain(
        self, tokens: list[int], page_size: int, data: st.DataObject
    ) -> None:
        full = page_hashes(tokens, page_size)
        cut = data.draw(st.integers(0, len(full)), label="cut page")
        prior = full[cut - 1] if cut else None
        assert page_hashes(tokens[cut * page_size :], page_size, prior) == full[cut:]

    @pytest.mark.parametrize("page_size", [1, 3, 6, 16])
    @pytest.mark.parametrize("pages", [127, 128, 129, 257])
    def test_long_chains_and_their_extensions_match_the_reference(
        self, page_size: int, pages: int
    ) -> None:
        """Chains longer than one cut of pages, hashed whole and as an extension of a
        chain hashed before (which resumes from the remembered pages)."""
        rng = random.Random(pages * 100 + page_size)
        tokens = [rng.randrange(2**32) for _ in range(pages * page_size + 1)]
        head = tokens[: pages // 3 * page_size]
        seed = namespace_seed(extra_key=f"long-{pages}-{page_size}")
        for prior in (None, seed):
            assert page_hashes(head, page_size, prior) == reference_chain(head, page_size, prior)
            want = reference_chain(tokens, page_size, prior)
            assert page_hashes(tokens, page_size, prior) == want
            short = tokens[: (pages - 1) * page_size]  # a prefix of a remembered chain
            assert page_hashes(short, page_size, prior) == want[: pages - 1]

    def test_only_full_pages_are_hashed(self) -> None:
        assert page_hashes([1, 2, 3], 4) == []
        assert page_hashes(list(range(7)), 4) == page_hashes(list(range(4)), 4)
        assert page_hashes([], 1) == []

    def test_accepts_any_int_sequence(self) -> None:
        expected = page_hashes(list(range(8)), 4)
        assert page_hashes(tuple(range(8)), 4) == expected
        assert page_hashes(range(8), 4) == expected
        assert page_hashes(array("q", range(8)), 4) == expected
        assert page_hashes(torch.arange(8), 4) == expected
        assert page_hashes(torch.arange(8, dtype=torch.int32), 4) == expected

    @pytest.mark.parametrize("n", [1, 63, 64, 65, 300])
    def test_short_and_long_sequences_pack_alike(self, n: int) -> None:
        # short sequences pack through array, long ones through struct: same bytes
        tokens = [(i * 2_654_435_761) % 2**32 for i in range(n)]
        assert page_hashes(tokens, 1) == reference_chain(tokens, 1, None)
        assert page_hashes(tuple(tokens), 1) == page_hashes(torch.tensor(tokens), 1)

    def test_tensor_tokens_outside_u32(self) -> None:
        with pytest.raises(InvalidTokenError) as info:
            page_hashes(torch.tensor([1, -5, 2, 3]), 4)
        assert (info.value.index, info.value.token) == (1, -5)

    def test_boundary_token_values_pack(self) -> None:
        assert page_hashes([0, 2**32 - 1], 2) == reference_chain([0, 2**32 - 1], 2, None)

    def test_uppercase_prior_is_the_same_digest(self) -> None:
        prior = page_hash([1, 2])
        assert page_hashes([3, 4], 2, prior.upper()) == page_hashes([3, 4], 2, prior)


class TestBadInput:
    @pytest.mark.parametrize(("token", "index"), [(-1, 2), (2**32, 0), (2**40, 3)])
    def test_token_outside_u32(self, token: int, index: int) -> None:
        tokens = [5, 6, 7, 8]
        tokens[index] = token
        with pytest.raises(InvalidTokenError) as info:
            page_hashes(tokens, 2)
        assert info.value.index == index
        assert info.value.token == token
        assert str(token) in str(info.value)
        assert isinstance(info.value, ValueError)
        assert isinstance(info.value, HashError)

    @pytest.mark.parametrize("bad", [-1, 2**32, 2.0, "7", None])
    @pytest.mark.parametrize("n", [8, 200])
    def test_bad_token_is_named_in_short_and_long_sequences(self, bad: object, n: int) -> None:
        tokens: list[object] = list(range(n))
        tokens[n - 3] = bad
        with pytest.raises(InvalidTokenError) as info:
            page_hashes(tokens, 1)  # type: ignore[arg-type]
        assert (info.value.index, info.value.token) == (n - 3, bad)

    def test_non_integer_token(self) -> None:
        with pytest.raises(InvalidTokenError) as info:
            page_hash([1, 2.5, 3])  # type: ignore[list-item]
        assert info.value.index == 1
        assert info.value.token == 2.5

    def test_bad_token_in_an_unhashed_tail_is_ignored(self) -> None:
        # Only full pages are hashed, so a partial tail page is never packed.
        assert page_hashes([1, 2, -1], 2) == page_hashes([1, 2], 2)

    @pytest.mark.parametrize("prior", ["", "ab", "z" * 64, "0" * 63, "0" * 65, b"0" * 64, 7])
    def test_bad_prior(self, prior: object) -> None:
        with pytest.raises(InvalidPriorHashError) as info:
            page_hashes([1, 2], 2, prior)  # type: ignore[arg-type]
        assert info.value.prior == prior
        assert isinstance(info.value, ValueError)

    @pytest.mark.parametrize("page_size", [0, -4, 1.5, True, "4"])
    def test_bad_page_size(self, page_size: object) -> None:
        with pytest.raises(PageSizeError) as info:
            page_hashes([1, 2, 3, 4], page_size)  # type: ignore[arg-type]
        assert info.value.page_size == page_size
