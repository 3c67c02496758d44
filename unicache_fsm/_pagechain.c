/*
 * unicache_fsm._pagechain: the SHA-256 page chain of unicache_fsm.hashing, in one call.
 *
 * chain_digests(data, stride, prior, start, end, hardware=True) -> list[bytes]
 *
 *   The raw 32-byte SHA-256 digest of each `stride`-byte page of data[start:end],
 *   chained: page i is hashed as SHA-256(digest of page i-1 || page i), page 0 as
 *   SHA-256(prior || page 0), where `prior` is b"" (a chain head) or a 32-byte digest.
 *   `data` is any C-contiguous buffer; (end - start) must be a multiple of `stride`.
 *   Exactly what unicache_fsm.hashing.page_digests computes page by page in Python
 *   (the same digests: the tests compare both with hashlib and SGLang's own vectors).
 *
 *   hardware=False forces the portable compression even where the CPU has the SHA
 *   extensions (the tests run both paths). Chains of many pages are hashed with the
 *   GIL released.
 *
 * HARDWARE_SHA: whether this build and CPU compress with the x86 SHA extensions.
 *
 * pack_u32(tokens) -> bytes | None
 *
 *   The tokens of a tuple or list of exact ints as u32 little-endian bytes, the hash
 *   input unicache_fsm.hashing.pack_tokens builds, in one C loop; None for anything it
 *   does not take (pack_tokens then packs it by struct, or names the bad token).
 *
 * SHA-256 is written here from FIPS 180-4: a portable compression function and, on
 * x86-64 CPUs that have them (checked once, by CPUID), one built on the SHA-NI
 * instructions. Both are checked against hashlib by tests/test_hashing.py.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_X86_SHA 1
#include <cpuid.h>
#include <immintrin.h>
#else
#define HAVE_X86_SHA 0
#endif

/* pages hashed with the GIL held below this many (releasing it costs more) */
#define RELEASE_GIL_PAGES 64

static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static const uint32_t IV256[8] = {
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
};

typedef void (*compress_fn)(uint32_t state[8], const uint8_t *blocks, size_t count);

static inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static inline uint32_t load_be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline void store_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* FIPS 180-4, section 6.2.2, one 64-byte block after another */
static void compress_portable(uint32_t state[8], const uint8_t *blocks, size_t count) {
    uint32_t w[64];
    for (; count; count--, blocks += 64) {
        for (int t = 0; t < 16; t++) w[t] = load_be32(blocks + 4 * t);
        for (int t = 16; t < 64; t++) {
            uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
            uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
            w[t] = w[t - 16] + s0 + w[t - 7] + s1;
        }
        uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
        uint32_t e = state[4], f = state[5], g = state[6], h = state[7];
        for (int t = 0; t < 64; t++) {
            uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) +
                          K256[t] + w[t];
            uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
            h = g;
            g = f;
            f = e;
            e = d + t1;
            d = c;
            c = b;
            b = a;
            a = t1 + t2;
        }
        state[0] += a;
        state[1] += b;
        state[2] += c;
        state[3] += d;
        state[4] += e;
        state[5] += f;
        state[6] += g;
        state[7] += h;
    }
}

#if HAVE_X86_SHA
/*
 * The same compression on the SHA-NI instructions. SHA256RNDS2 does two rounds on the
 * working variables kept as two lanes-of-four: (A, B, E, F) and (C, D, G, H);
 * SHA256MSG1/MSG2 extend the message schedule four words at a time.
 */
__attribute__((target("sha,sse4.1,ssse3"))) static void
compress_shani(uint32_t state[8], const uint8_t *blocks, size_t count) {
    const __m128i byteswap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
    __m128i dcba = _mm_loadu_si128((const __m128i *)&state[0]);
    __m128i hgfe = _mm_loadu_si128((const __m128i *)&state[4]);
    __m128i cdab = _mm_shuffle_epi32(dcba, 0xB1);
    __m128i efgh = _mm_shuffle_epi32(hgfe, 0x1B);
    __m128i abef = _mm_alignr_epi8(cdab, efgh, 8);
    __m128i cdgh = _mm_blend_epi16(efgh, cdab, 0xF0);
    for (; count; count--, blocks += 64) {
        const __m128i abef_in = abef, cdgh_in = cdgh;
        __m128i m[4];
        for (int i = 0; i < 4; i++)
            m[i] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(blocks + 16 * i)), byteswap);
        for (int r = 0; r < 16; r++) {
            if (r >= 4) {
                /* W[t..t+3] from W[t-16..t-13], W[t-12..], W[t-8..] and W[t-4..t-1] */
                __m128i x = _mm_sha256msg1_epu32(m[r & 3], m[(r + 1) & 3]);
                x = _mm_add_epi32(x, _mm_alignr_epi8(m[(r + 3) & 3], m[(r + 2) & 3], 4));
                m[r & 3] = _mm_sha256msg2_epu32(x, m[(r + 3) & 3]);
            }
            __m128i wk = _mm_add_epi32(m[r & 3], _mm_loadu_si128((const __m128i *)&K256[4 * r]));
            cdgh = _mm_sha256rnds2_epu32(cdgh, abef, wk);
            abef = _mm_sha256rnds2_epu32(abef, cdgh, _mm_shuffle_epi32(wk, 0x0E));
        }
        abef = _mm_add_epi32(abef, abef_in);
        cdgh = _mm_add_epi32(cdgh, cdgh_in);
    }
    __m128i feba = _mm_shuffle_epi32(abef, 0x1B);
    __m128i dchg = _mm_shuffle_epi32(cdgh, 0xB1);
    _mm_storeu_si128((__m128i *)&state[0], _mm_blend_epi16(feba, dchg, 0xF0));
    _mm_storeu_si128((__m128i *)&state[4], _mm_alignr_epi8(dchg, feba, 8));
}

static int cpu_has_sha(void) {
    unsigned int a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    int ssse3 = (c >> 9) & 1, sse41 = (c >> 19) & 1;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    return ssse3 && sse41 && ((b >> 29) & 1);
}
#endif

static compress_fn hardware_compress = NULL; /* set at import where the CPU has SHA-NI */

/* SHA-256(prior[0:prior_len] || page[0:page_len]) -> out (32 bytes); prior_len <= 32 */
static void hash_page(compress_fn compress, const uint8_t *prior, size_t prior_len,
                      const uint8_t *page, size_t page_len, uint8_t out[32]) {
    const uint64_t bits = 8 * ((uint64_t)prior_len + (uint64_t)page_len);
    uint32_t state[8];
    uint8_t block[64];
    size_t used = prior_len;
    memcpy(state, IV256, sizeof state);
    memcpy(block, prior, prior_len);
    if (used) { /* top the first block up from the page */
        size_t take = page_len < 64 - used ? page_len : 64 - used;
        memcpy(block + used, page, take);
        used += take;
        page += take;
        page_len -= take;
        if (used == 64) {
            compress(state, block, 1);
            used = 0;
        }
    }
    if (page_len >= 64) { /* whole blocks straight from the page (used is 0 here) */
        size_t whole = page_len / 64;
        compress(state, page, whole);
        page += 64 * whole;
        page_len -= 64 * whole;
    }
    memcpy(block + used, page, page_len); /* the tail, then the padding */
    used += page_len;
    block[used++] = 0x80;
    if (used > 56) {
        memset(block + used, 0, 64 - used);
        compress(state, block, 1);
        used = 0;
    }
    memset(block + used, 0, 56 - used);
    store_be32(block + 56, (uint32_t)(bits >> 32));
    store_be32(block + 60, (uint32_t)bits);
    compress(state, block, 1);
    for (int i = 0; i < 8; i++) store_be32(out + 4 * i, state[i]);
}

static void hash_chain(compress_fn compress, const uint8_t *data, size_t stride, size_t pages,
                       const uint8_t *prior, size_t prior_len, uint8_t *out) {
    for (size_t i = 0; i < pages; i++) {
        hash_page(compress, prior, prior_len, data + i * stride, stride, out + 32 * i);
        prior = out + 32 * i;
        prior_len = 32;
    }
}

static PyObject *chain_digests(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"data",  "stride",   "prior",  "start",
                               "end",   "hardware", "joined", NULL};
    Py_buffer data, prior;
    Py_ssize_t stride, start, end;
    int hardware = 1, joined = 0;
    PyObject *result = NULL;
    uint8_t *digests = NULL;
    (void)self;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*ny*nn|pp:chain_digests", keywords, &data,
                                     &stride, &prior, &start, &end, &hardware, &joined))
        return NULL;
    if (stride < 1) {
        PyErr_Format(PyExc_ValueError, "stride must be >= 1, got %zd", stride);
        goto done;
    }
    if (prior.len != 0 && prior.len != 32) {
        PyErr_Format(PyExc_ValueError, "prior must be b\"\" or a 32-byte digest, got %zd bytes",
                     prior.len);
        goto done;
    }
    if (start < 0 || end < start || end > data.len || (end - start) % stride) {
        PyErr_Format(PyExc_ValueError,
                     "pages [%zd:%zd) of a %zd-byte buffer are not whole %zd-byte pages", start,
                     end, data.len, stride);
        goto done;
    }
    size_t pages = (size_t)((end - start) / stride);
    compress_fn compress = hardware && hardware_compress ? hardware_compress : compress_portable;
    uint8_t first_prior[32];
    memcpy(first_prior, prior.buf, (size_t)prior.len);
    if (joined) { /* one bytes object of 32 * pages bytes, hashed in place */
        result = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(32 * pages));
        if (!result) goto done;
        digests = (uint8_t *)PyBytes_AS_STRING(result);
    } else {
        digests = PyMem_RawMalloc(pages ? 32 * pages : 1);
        if (!digests) {
            PyErr_NoMemory();
            goto done;
        }
    }
    const uint8_t *from = (const uint8_t *)data.buf + start;
    if (pages >= RELEASE_GIL_PAGES) {
        Py_BEGIN_ALLOW_THREADS
        hash_chain(compress, from, (size_t)stride, pages, first_prior, (size_t)prior.len, digests);
        Py_END_ALLOW_THREADS
    } else {
        hash_chain(compress, from, (size_t)stride, pages, first_prior, (size_t)prior.len, digests);
    }
    if (joined) {
        digests = NULL; /* the result's own buffer: not freed below */
        goto done;
    }
    result = PyList_New((Py_ssize_t)pages);
    if (!result) goto done;
    for (size_t i = 0; i < pages; i++) {
        PyObject *digest = PyBytes_FromStringAndSize((const char *)digests + 32 * i, 32);
        if (!digest) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, (Py_ssize_t)i, digest);
    }
done:
    PyMem_RawFree(digests);
    PyBuffer_Release(&data);
    PyBuffer_Release(&prior);
    return result;
}

/* pack_u32(tokens) -> bytes | None: a tuple or list of exact ints, each in
 * 0 .. 2**32 - 1, as unsigned 32-bit little-endian bytes (what struct's "<NI" packs),
 * with no argument tuple of the tokens built first and one C loop; None for anything
 * else (another sequence type, an item that is not an exact int, or out of range): the
 * caller's general path then packs it or names the culprit. No Python code runs in the
 * loop, so a list cannot change under it. */
static PyObject *pack_u32(PyObject *self, PyObject *tokens) {
    (void)self;
    if (!PyTuple_Check(tokens) && !PyList_Check(tokens)) Py_RETURN_NONE;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(tokens);
    PyObject **items = PySequence_Fast_ITEMS(tokens);
    if (n > PY_SSIZE_T_MAX / 4) Py_RETURN_NONE;
    PyObject *out = PyBytes_FromStringAndSize(NULL, 4 * n);
    if (!out) return NULL;
    unsigned char *dst = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++, dst += 4) {
        PyObject *item = items[i];
        if (!PyLong_CheckExact(item)) goto refuse;
        unsigned long v = PyLong_AsUnsignedLong(item);
        if (v == (unsigned long)-1 && PyErr_Occurred()) {
            PyErr_Clear(); /* negative, or past an unsigned long */
            goto refuse;
        }
        if (v > 0xFFFFFFFFUL) goto refuse;
        dst[0] = (unsigned char)v;
        dst[1] = (unsigned char)(v >> 8);
        dst[2] = (unsigned char)(v >> 16);
        dst[3] = (unsigned char)(v >> 24);
    }
    return out;
refuse:
    Py_DECREF(out);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"pack_u32", pack_u32, METH_O,
     "pack_u32(tokens) -> bytes | None\n\n"
     "A tuple or list of exact ints in 0 .. 2**32 - 1 as u32 little-endian bytes; None\n"
     "for anything else (the caller's general path decides)."},
    {"chain_digests", (PyCFunction)(void (*)(void))chain_digests, METH_VARARGS | METH_KEYWORDS,
     "chain_digests(data, stride, prior, start, end, hardware=True, joined=False)\n"
     "    -> list[bytes] | bytes\n\n"
     "The chained SHA-256 digest of each stride-byte page of data[start:end]: a list of\n"
     "32-byte digests, or with joined=True one bytes object of them end to end."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_pagechain",
    "The SHA-256 page chain of unicache_fsm.hashing, in native code.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__pagechain(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
#if HAVE_X86_SHA
    if (cpu_has_sha()) hardware_compress = compress_shani;
#endif
    if (PyModule_AddObject(m, "HARDWARE_SHA", PyBool_FromLong(hardware_compress != NULL)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
