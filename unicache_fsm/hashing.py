"""Page-hash chain and tenant namespace seed, byte-compatible with SGLang's store keys.

A page's key is what an external KV store files the page under. Two requests share a
stored page only if they share every token before it (the chain) and the tenant
namespace (the seed), so the keys are a chain of SHA-256 digests:

- `namespace_seed(extra_key, cache_salt)` -> hex seed, or None when neither is given.
  SHA-256 over ``b"sglang-cache-namespace-v1"`` then, for `extra_key` and `cache_salt`
  in that order, ``b"\\x00"`` when absent, else ``b"\\x01"`` + the UTF-8 length as
  8 bytes little-endian + the UTF-8 bytes. An empty string is *present*.
- `page_hash(page_tokens, prior)` -> hex key of one page: SHA-256 over the raw
  32-byte digest of `prior` (nothing when `prior` is None) then each token as an
  unsigned 32-bit little-endian integer.
- `page_hashes(tokens, page_size, prior)` -> one hex key per *full* page of `tokens`
  (any int sequence: list, tuple, range, 1-D tensor or array),
  chained: page i hashes on page i-1's digest, page 0 on `prior`. A trailing partial
  page is not hashed. `prior` is the namespace seed for a sequence head, or the key of
  the last page already hashed when a chain resumes.
- `pack_tokens(tokens)` -> the tokens as u32 little-endian bytes (what a page hash
  covers); `page_digests(packed, page_size, prior_digest)` -> the raw 32-byte digest of
  each full page of packed tokens, chained from `prior_digest` (b"" at a chain head),
  in one call: the tree packs a key once and keeps raw digests, hex only on demand;
  `page_digest_bytes(...)` -> the same digests end to end in one bytes object (what a
  tree node keeps: one object per node, not one per page).
  The chain runs in native code (`unicache_fsm._pagechain`, built with the package
  where a C compiler is found; SHA-NI where the CPU has it) when `NATIVE_CHAIN` is
  true, else page by page in Python (``native=False`` forces it): the same digests
  either way. The Python path remembers the chains it hashed lately (up to
  `DIGEST_MEMO_SIZE` pages and about `DIGEST_MEMO_BYTES` of pages in all): a LOOKUP
  of a tail and the insert of the same pages (or of a prefix or an extension of
  them) then hash each page once.
  `prior_digest(prior)` -> the raw digest of a hex key or seed (b"" for None).

Bad input raises a typed error, all under `HashError`: `InvalidTokenError` (a token
outside ``0 <= t < 2**32`` or not an integer), `InvalidPriorHashError` (a `prior` that
is not 64 hex digits), `PageSizeError` (below 1), `NamespaceFieldError` (a non-str
field). Nothing is returned for a chain that failed part-way.

Vectors produced by SGLang 0.5.23 itself live in ``tests/data/vectors/page_hashes.json``
and are reproduced by ``tests/test_hashing.py``. This module imports nothing of ours
but the error root.
"""

from __future__ import annotations

import functools
import hashlib
import struct
import sys
from array import array
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from unicache_fsm.fsm.errors import UnicacheFsmError

__all__ = [
    "CHAIN_IMPLEMENTATION",
    "DIGEST_MEMO_BYTES",
    "DIGEST_MEMO_SIZE",
    "NAMESPACE_TAG",
    "NATIVE_CHAIN",
    "HashError",
    "InvalidPriorHashError",
    "InvalidTokenError",
    "NamespaceFieldError",
    "PageSizeError",
    "check_prior",
    "check_tokens",
    "namespace_seed",
    "pack_tokens",
    "page_digest_bytes",
    "page_digests",
    "page_hash",
    "page_hashes",
    "prior_digest",
]

NAMESPACE_TAG = b"sglang-cache-namespace-v1"
"""The domain-separation prefix of the namespace seed (fixed by SGLang's key format)."""

_U32_LIMIT = 1 << 32
_DIGEST_HEX_LEN = 64
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")

# array('I') is the C `unsigned int`; every platform torch supports makes it 4 bytes.
# The byte order is the host's, so a big-endian host swaps before hashing.
assert array("I").itemsize == 4, "array('I') must be 32-bit for the page-hash packing"
_BIG_ENDIAN = sys.byteorder == "big"
#: keys at least this long pack through `struct` (a faster C loop than array's for a
#: tuple or list; below it, building the packer costs more than it saves)
_STRUCT_PACK_MIN = 64


def _pick_sha256() -> Callable[[bytes], hashlib._Hash]:
    """The cheapest SHA-256 constructor here that agrees with `hashlib.sha256`.

    A page chain makes one SHA-256 call per page, so the per-call setup dominates at
    small pages: CPython's built-in SHA-256 module (``_sha256`` in 3.11, ``_sha2``
    from 3.12) sets up a call faster than OpenSSL's here, while OpenSSL compresses a
    block several times faster (`page_digests` uses it from two blocks a page on).
    Used only when it gives the same digests; otherwise, or when the build lacks it,
    `hashlib.sha256`.
    """
    import importlib

    probe = bytes(range(100))
    for module in ("_sha256", "_sha2"):
        try:
            builtin = importlib.import_module(module).sha256
        except (ImportError, AttributeError):  # pragma: no cover - depends on the build
            continue
        if all(
            builtin(data).digest() == hashlib.sha256(data).digest()
            for data in (b"", probe[:36], probe)
        ):
            return builtin  # type: ignore[no-any-return]
    return hashlib.sha256  # pragma: no cover - depends on the build


_sha256 = _pick_sha256()
_openssl_sha256 = hashlib.sha256

_native_chain: Callable[..., Any] | None  # `_pagechain.chain_digests` (two result types)
_native_pack: Callable[[object], bytes | None] | None  # `_pagechain.pack_u32`
try:
    from unicache_fsm._pagechain import HARDWARE_SHA as _HARDWARE_SHA
    from unicache_fsm._pagechain import chain_digests as _native_chain
except ImportError:  # pragma: no cover - built without a C compiler
    _native_chain, _HARDWARE_SHA = None, False
try:
    from unicache_fsm._pagechain import pack_u32 as _native_pack
except ImportError:  # pragma: no cover - built without a C compiler (or an older build)
    _native_pack = None

NATIVE_PACK: bool = _native_pack is not None
"""Whether `pack_tokens` packs a tuple or list of plain ints in one native loop
(``_pagechain.pack_u32``; anything it does not take goes the `struct` / `array` way,
which packs it or names the bad token). Read at each call: a test may turn it off."""

NATIVE_CHAIN: bool = _native_chain is not None
"""Whether `page_digests` hashes a chain in native code (``unicache_fsm._pagechain``:
one call per chain instead of one SHA-256 call per page; optional, see setup.py)."""

CHAIN_IMPLEMENTATION: str = (
    ("native, SHA-NI" if _HARDWARE_SHA else "native, portable C") if NATIVE_CHAIN else "Python"
)
"""What hashes page chains here, in words (benchmarks print it beside their figures)."""

#: the longest SHA-256 input that fits one compressed block (64 bytes, less the padding)
_ONE_BLOCK = 55


@functools.lru_cache(maxsize=512)
def _u32_packer(n: int) -> Callable[..., bytes]:
    """`struct` packer of `n` unsigned 32-bit little-endian integers."""
    return struct.Struct(f"<{n}I").pack


#: pages cut per `struct` call (bounds the splitters kept: one per count and page size)
_SPLIT_PAGES = 128


@functools.lru_cache(maxsize=512)
def _page_splitter(pages: int, stride: int) -> Callable[[bytes, int], tuple[bytes, ...]]:
    """Cuts `pages` pages of `stride` bytes each out of a buffer from an offset, in one
    call (``struct``'s ``s`` fields: a bytes object per page)."""
    return struct.Struct(f"{stride}s" * pages).unpack_from


class HashError(UnicacheFsmError):
    """Root of the errors raised by the page-hash functions."""


class InvalidTokenError(HashError, ValueError):
    """A token cannot be packed as an unsigned 32-bit integer.

    `index` is the token's position in the sequence passed in, `token` its value.
    """

    def __init__(self, message: str, *, index: int, token: object) -> None:
        super().__init__(message)
        self.index = index
        self.token = token


class InvalidPriorHashError(HashError, ValueError):
    """A `prior` to chain from is not a 64-digit hex SHA-256 digest. `prior` holds it."""

    def __init__(self, message: str, *, prior: object) -> None:
        super().__init__(message)
        self.prior = prior


class NamespaceFieldError(HashError, TypeError):
    """`extra_key` or `cache_salt` is neither a str nor None. `field` names it, `value` holds it."""

    def __init__(self, message: str, *, field: str, value: object) -> None:
        super().__init__(message)
        self.field = field
        self.value = value


class PageSizeError(HashError, ValueError):
    """The page size is not an integer >= 1. `page_size` holds it."""

    def __init__(self, message: str, *, page_size: object) -> None:
        super().__init__(message)
        self.page_size = page_size


def _encode_field(value: str | None) -> bytes:
    if value is None:
        return b"\x00"
    raw = value.encode("utf-8")
    return b"\x01" + len(raw).to_bytes(8, "little") + raw


def namespace_seed(extra_key: str | None = None, cache_salt: str | None = None) -> str | None:
    """The hex namespace seed of a request, or None when it has neither field.

    An empty string counts as given: ``namespace_seed("", "")`` is a seed, distinct
    from ``namespace_seed()`` (which is None: the chain then starts from nothing).
    """
    if extra_key is None and cache_salt is None:
        return None
    fields: tuple[tuple[str, object], ...] = (("extra_key", extra_key), ("cache_salt", cache_salt))
    for name, value in fields:
        if value is not None and not isinstance(value, str):
            msg = (
                f"{name} must be a str or None, got {type(value).__name__} {value!r}; "
                "decode bytes to str first (the seed hashes its UTF-8 encoding)"
            )
            raise NamespaceFieldError(msg, field=name, value=value)
    h = hashlib.sha256(NAMESPACE_TAG)
    h.update(_encode_field(extra_key))
    h.update(_encode_field(cache_salt))
    return h.hexdigest()


def prior_digest(prior: str | None) -> bytes:
    """The raw 32-byte digest of a hex page key or seed; b"" for None (a chain head)."""
    if prior is None:
        return b""
    if (
        not isinstance(prior, str)
        or len(prior) != _DIGEST_HEX_LEN
        or not _HEX_DIGITS.issuperset(prior)
    ):
        msg = (
            f"prior {prior!r} is not a page hash: pass the 64-hex-digit key of the page "
            "before (or a namespace seed), or None to start a chain at a sequence head"
        )
        raise InvalidPriorHashError(msg, prior=prior)
    return bytes.fromhex(prior)


def pack_tokens(tokens: Iterable[int]) -> bytes:
    """Tokens as unsigned 32-bit little-endian bytes, or a typed error naming the culprit."""
    seq: Sequence[object]
    if isinstance(tokens, (list, tuple)):
        if NATIVE_PACK and _native_pack is not None:
            native = _native_pack(tokens)  # little-endian whatever the host
            if native is not None:
                return native
        seq = tokens
    elif hasattr(tokens, "tolist"):  # a torch tensor or array: one C-level conversion
        seq = tokens.tolist()
    else:
        seq = list(tokens)
    try:
        if len(seq) >= _STRUCT_PACK_MIN:
            return _u32_packer(len(seq))(*seq)  # little-endian whatever the host
        packed = array("I", seq)
    except (OverflowError, TypeError, struct.error) as exc:
        index, token = _first_bad_token(seq)
        msg = (
            f"token {token!r} at index {index} is not an unsigned 32-bit integer "
            f"(0 <= token < 2**32); page hashes pack every token in 4 bytes"
        )
        raise InvalidTokenError(msg, index=index, token=token) from exc
    if _BIG_ENDIAN:  # pragma: no cover - no big-endian CI host
        packed.byteswap()
    return packed.tobytes()


def _first_bad_token(seq: Sequence[object]) -> tuple[int, object]:
    # Only runs after packing failed, to name the culprit; never on the fast path.
    for index, token in enumerate(seq):
        if not hasattr(token, "__index__"):
            return index, token
        value = token.__index__()
        if not 0 <= value < _U32_LIMIT:
            return index, token
    raise AssertionError("array('I') rejected a sequence whose every token is valid")


def _check_page_size(page_size: object) -> None:
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        msg = f"page_size must be an int >= 1, got {page_size!r}"
        raise PageSizeError(msg, page_size=page_size)


def check_tokens(tokens: Sequence[int]) -> None:
    """Raise `InvalidTokenError` unless every token is an unsigned 32-bit integer."""
    pack_tokens(tokens)


def check_prior(prior: str | None) -> None:
    """Raise `InvalidPriorHashError` unless `prior` is None or a 64-hex-digit hash/seed."""
    prior_digest(prior)


def page_hash(page_tokens: Sequence[int], prior: str | None = None) -> str:
    """The hex key of one page: SHA-256(digest of `prior`, tokens as u32 little-endian).

    `page_tokens` is hashed whole, whatever its length; `page_hashes` cuts pages.
    """
    return _sha256(prior_digest(prior) + pack_tokens(page_tokens)).hexdigest()


def page_hashes(tokens: Sequence[int], page_size: int, prior: str | None = None) -> list[str]:
    """One chained hex key per full page of `tokens` (a partial tail page is skipped).

    `prior` seeds the chain: the namespace seed at a sequence head (None when the
    request has none), or the key of the page just before `tokens` to resume a chain.
    """
    _check_page_size(page_size)
    prev = prior_digest(prior)
    num_pages = len(tokens) // page_size
    if num_pages == 0:
        return []
    packed = pack_tokens(tokens[: num_pages * page_size])
    return [d.hex() for d in page_digests(packed, page_size, prev)]


def _chain_args(packed: object, page_size: object, prior: object) -> tuple[bytes, bytes, int, int]:
    """`page_digests`' arguments checked: (packed, prior, page stride in bytes, bytes of
    whole pages); the typed errors its docstring names."""
    if type(page_size) is not int or page_size < 1:
        _check_page_size(page_size)
    assert isinstance(page_size, int)
    if type(prior) is not bytes:
        prior = _prior_bytes(prior)
    if type(packed) is not bytes:
        packed = _packed_bytes(packed)
    assert isinstance(prior, bytes) and isinstance(packed, bytes)
    if len(prior) not in (0, 32):
        msg = (
            f"prior digest of {len(prior)} bytes: pass b'' at a chain head or the raw "
            "32-byte digest of the page before (prior_digest(key) of a hex key)"
        )
        raise InvalidPriorHashError(msg, prior=prior)
    stride = 4 * page_size
    return packed, prior, stride, len(packed) // stride * stride


def page_digest_bytes(
    packed: bytes, page_size: int, prior: bytes = b"", *, native: bool = True
) -> bytes:
    """`page_digests` end to end in one bytes object (32 bytes a page, in page order):
    what a tree node keeps. One object, not one per page, and none that the garbage
    collector has to visit. Same arguments, same errors."""
    if (
        type(packed) is bytes
        and type(prior) is bytes
        and type(page_size) is int
        and page_size > 0
        and (not prior or len(prior) == 32)
    ):  # the tree's own call: already the checked types, nothing to convert
        stride = 4 * page_size
        end = len(packed) // stride * stride
    else:
        packed, prior, stride, end = _chain_args(packed, page_size, prior)
    if not end:
        return b""
    if native and _native_chain is not None:
        joined: bytes = _native_chain(packed, stride, prior, 0, end, joined=True)
        return joined
    return b"".join(page_digests(packed, page_size, prior, native=False))


def page_digests(
    packed: bytes, page_size: int, prior: bytes = b"", *, native: bool = True
) -> list[bytes]:
    """The raw digest of each full page of `packed` (`pack_tokens` output), chained:
    page i hashes on page i-1's digest, page 0 on `prior` (b"" at a chain head, else
    the raw digest of the page before). ``d.hex()`` is the page's key.

    Hashed in one native call when `NATIVE_CHAIN` (and `native`); otherwise page by
    page in Python, with the memo of chains hashed lately. `packed` and `prior` may be
    any bytes-like objects (read by their bytes). `PageSizeError` for a page size below
    1, `InvalidPriorHashError` for a prior that is not bytes-like or neither b"" nor 32
    bytes, TypeError for packed tokens that are not bytes-like.
    """
    packed, prior, stride, end = _chain_args(packed, page_size, prior)
    if not end:
        return []
    if native and _native_chain is not None:
        # natively a page costs about 0.1 us: the memo's bookkeeping would cost more
        # than the pages it saves, so every call hashes
        chain: list[bytes] = _native_chain(packed, stride, prior, 0, end)
        return chain
    # In Python a page costs about 0.3 us, and a chain is usually hashed twice (a
    # LOOKUP of a request's tail, then the insert of the same pages, or every rank of
    # a group): the chains hashed lately are kept by (prior, first page), so a chain
    # that repeats or extends one of them is recalled, not rehashed: one dict lookup
    # per call, not one per page. A pure function of its input: never stale.
    memo = _CHAINS
    head = prior + packed[:stride]
    seen = memo.get(head)
    done = 0
    out: list[bytes] = []
    if seen is not None:
        known, digests = seen
        if len(known) >= end:
            if known.startswith(packed if end == len(packed) else memoryview(packed)[:end]):
                return list(digests[: end // stride])
        elif packed.startswith(known):  # a longer chain: hash only its new pages
            done = len(known)
            out = list(digests)
            prior = digests[-1]
    _python_chain(packed, stride, prior, done, end, out)
    global _memo_pages, _memo_bytes
    size = len(head) + end + 32 * len(out)  # the key, the pages kept and their digests
    if _memo_pages + len(out) > DIGEST_MEMO_SIZE or _memo_bytes + size > DIGEST_MEMO_BYTES:
        memo.clear()
        _memo_pages = _memo_bytes = 0
    if len(out) <= DIGEST_MEMO_SIZE and size <= DIGEST_MEMO_BYTES:
        memo[head] = (packed[:end] if end < len(packed) else packed, tuple(out))
        _memo_pages += len(out)
        _memo_bytes += size
    return out


def _prior_bytes(prior: object) -> bytes:
    """A bytes-like `prior` as bytes (a bytearray or view would make the memo's key
    unhashable); anything else (``bytes(32)`` is 32 zero bytes) InvalidPriorHashError."""
    try:
        return bytes(memoryview(prior))  # type: ignore[arg-type]
    except TypeError:
        msg = (
            f"prior digest must be bytes-like (b'' at a chain head or a raw 32-byte "
            f"digest), got {type(prior).__name__}"
        )
        raise InvalidPriorHashError(msg, prior=prior) from None


def _packed_bytes(packed: object) -> bytes:
    """A bytes-like `packed` as its bytes (an array('I') or a cast view counts items in
    its len(), not bytes); anything else TypeError."""
    try:
        return bytes(memoryview(packed))  # type: ignore[arg-type]
    except TypeError:
        msg = f"packed tokens must be bytes-like (pack_tokens output), got {type(packed).__name__}"
        raise TypeError(msg) from None


def _python_chain(
    packed: bytes, stride: int, prior: bytes, start: int, end: int, out: list[bytes]
) -> None:
    """Append the chained digest of each page of ``packed[start:end]`` to `out`."""
    # one block a page (the prior digest and up to 5 tokens): the built-in module's
    # cheaper call wins; from two blocks on, OpenSSL's faster compression does
    sha256 = _sha256 if 32 + stride <= _ONE_BLOCK else _openssl_sha256
    append = out.append
    # one SHA-256 per page is inherent to a chain; the loop does nothing else: the
    # pages come cut by one `struct` call per `_SPLIT_PAGES`, and each page goes in
    # by `update` (no concatenated copy of the prior digest and the page)
    for at in range(start, end, _SPLIT_PAGES * stride):
        pages = min(_SPLIT_PAGES, (end - at) // stride)
        for page in _page_splitter(pages, stride)(packed, at):
            h = sha256(prior)
            h.update(page)
            prior = h.digest()
            append(prior)


#: the memo of `page_digests`' Python path: the SHA-256 input of a chain's first page
#: (the prior digest + the page) -> (the chain's packed pages, their digests); cleared
#: when the chains kept hold more than `DIGEST_MEMO_SIZE` pages or `DIGEST_MEMO_BYTES`
#: of pages and digests (a few MiB at most, whatever the page size).
_CHAINS: dict[bytes, tuple[bytes, tuple[bytes, ...]]] = {}
_memo_pages = 0
_memo_bytes = 0
DIGEST_MEMO_SIZE = 1 << 14
DIGEST_MEMO_BYTES = 8 << 20
