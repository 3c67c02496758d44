/*
 * unicache_fsm._pagecopy: page copies fused with their XXH3-64 checksum, in one call.
 *
 * xxh3_64(data, hardware=True) -> int
 *
 *   XXH3-64 (seed 0, the default secret) of the bytes of `data`, a C-contiguous buffer
 *   of more than SHORT_MAX (240) bytes, as an unsigned 64-bit int: the value of
 *   xxhash.xxh3_64_intdigest(data). Shorter inputs take other paths of XXH3 that are
 *   not written here (ValueError: unicache_fsm.store.checksum hashes them with the
 *   xxhash package; pages are large).
 *
 * copy_rows(dst, dst_rows, src, src_rows, row_bytes, hardware=True) -> list[int]
 *
 *   For each i: the `row_bytes` bytes of row src_rows[i] of `src` (the bytes at
 *   src_rows[i] * row_bytes) copied to row dst_rows[i] of `dst`, and their XXH3-64, in
 *   one pass: each 64-byte stripe is read once, folded into the hash state and stored
 *   to the destination. `dst` is a writable C-contiguous buffer, `src` a C-contiguous
 *   buffer, both whole multiples of row_bytes (> 240). Errors (the buffers untouched):
 *   TypeError for a buffer of the wrong kind or a row that is not an int; ValueError for
 *   row lists of different lengths, a row outside its buffer, a destination row that
 *   overlaps its source row in memory, or a bad row_bytes. Destination rows named twice
 *   are not detected (the caller's check). The copies run with the GIL released: other
 *   threads may call at the same time on other rows.
 *
 *   Destinations aligned to 32 bytes of pages of STREAM_MIN_BYTES or more are written
 *   with non-temporal (streaming) stores on the AVX2 path: a page that large is not read
 *   again soon, and a streaming store skips reading the destination's line first.
 *
 * gather_pages(dst, sources, row_bytes, pages, page_size, checksum=True, hardware=True,
 *              threads=1) -> list[int] | None
 *
 *   Pages assembled from several page-major sources (a KV cache's per-layer K and V
 *   buffers) into one page format: source s is a C-contiguous buffer of pages of
 *   page_size * row_bytes[s] bytes (token t of page k: the row_bytes[s] bytes at
 *   (k * page_size + t) * row_bytes[s]); page i of `dst` (page_nbytes = page_size *
 *   sum(row_bytes) bytes, at i * page_nbytes) holds, token by token, that token's row
 *   of every source in order. `dst` is a writable C-contiguous buffer of exactly
 *   len(pages) * page_nbytes bytes. With checksum=True, also each destination page's
 *   XXH3-64 (page_nbytes must then exceed 240); else None. A page is filled source by
 *   source (each source's page_size rows read as one run, written at the token stride):
 *   measured on 8 MiB of 16 x 2 KiB sources, 0.75 ms against 2.1 ms token by token (16
 *   interleaved source streams defeat the hardware prefetcher), a plain memcpy's time.
 *   With checksums, each page is filled in a scratch page that stays in cache, then
 *   moved to its place and hashed in one pass (as copy_rows: streaming stores for
 *   large aligned pages, which skip reading the destination's old lines): measured in
 *   a memory store at capacity (destination rows not in cache), 1.0 ms per 8 MiB
 *   against 1.9 ms filling the destination and hashing it there. A page over
 *   RUN_BYTES (512 KiB) whose token bytes are a multiple of XXH3's 1 KiB block goes
 *   so by runs of whole tokens of at most RUN_BYTES (one token at least), the hash
 *   state carried from run to run (the same value: runs end at block edges): a 2 MiB
 *   page in one scratch spills a core's L2 (measured at RUN_BYTES).
 *   Errors (nothing written):
 *   TypeError for a buffer of the wrong kind or an id or size that is not an int;
 *   ValueError for a source count other than len(row_bytes), a row size < 1, a page
 *   id outside a source, a destination of another size, a source that overlaps the
 *   destination, or sizes whose products (a page, all pages) are larger than memory
 *   (checked before they are computed: a product that wrapped would pass the bounds
 *   checks). The copies run with the GIL released.
 *
 * scatter_pages(src, dests, row_bytes, pages, page_size, checksum=True, hardware=True,
 *               threads=1) -> list[int] | None
 *
 *   The inverse move: page i of `src` (page format, len(pages) * page_nbytes bytes,
 *   C-contiguous) into page pages[i] of every page-major buffer of `dests` (writable,
 *   C-contiguous), with each page's XXH3-64 taken first (which brings the page into
 *   cache for its copies; by runs of tokens as above for large pages); the same checks
 *   and errors as gather_pages. A page named twice is written twice (the caller's
 *   check; split over threads, the two writes may interleave).
 *
 *   threads > 1 (TypeError for a non-int, ValueError below 1) splits a move of at
 *   least 2 * SHARE_MIN_BYTES (512 KiB) page-format bytes over up to that many threads:
 *   at most MAX_THREADS (64; any larger count, however large, is 64), one per
 *   SHARE_MIN_BYTES and one per page. Each takes the next page not yet moved until none
 *   is left (a thread slowed by a busy core moves fewer). The threads are the team of
 *   the OpenMP runtime named by set_team() where it was set in this process, else
 *   threads the call starts and joins itself (one that fails to start leaves its pages
 *   to the others). The same bytes and sums whatever the threads.
 *
 * set_team(address) -> None
 *
 *   The address of GOMP_parallel (libgomp's entry point for a parallel region, part of
 *   its ABI since GCC 4.9) of the OpenMP runtime the process already runs, or 0 for
 *   none. torch's CPU build runs its parallel work on a libgomp team whose threads spin
 *   on their cores for milliseconds after each region: threads of a move's own, started
 *   right after a torch op, find those cores taken (measured: a 2-thread gather of
 *   8 MiB at 0.5x the speed of 1 thread), where the team's threads take the shares at
 *   once. unicache_fsm.store.team finds the runtime and sets it.
 *
 * hardware=False forces the portable path even where the CPU has AVX2 (the tests run
 * both). HARDWARE_AVX2: whether this build and CPU have the AVX2 path (CPUID, at import).
 *
 * XXH3 is written here from its published specification (Yann Collet's xxHash, doc/
 * xxhash_spec.md, "XXH3 Algorithm Overview", inputs of more than 240 bytes): stripes of
 * 64 bytes accumulated into eight 64-bit lanes, a scramble after each block of 16
 * stripes, the last stripe at the input's end, the lanes merged and avalanched. The
 * tests compare every value with the xxhash package.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <pthread.h>
#include <unistd.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_X86_AVX2 1
#include <immintrin.h>
#else
#define HAVE_X86_AVX2 0
#endif

#define SHORT_MAX 240
#define STRIPE 64
#define SECRET_SIZE 192
#define STRIPES_PER_BLOCK ((SECRET_SIZE - STRIPE) / 8) /* 16 */
#define BLOCK (STRIPE * STRIPES_PER_BLOCK)               /* 1024 bytes */
#define LASTACC_START 7
#define MERGEACCS_START 11
/* pages written with streaming stores from this size on (smaller ones may be read soon) */
#define STREAM_MIN_BYTES (64 << 10)

static const uint64_t PRIME32_1 = 0x9E3779B1U;
static const uint64_t PRIME32_2 = 0x85EBCA77U;
static const uint64_t PRIME32_3 = 0xC2B2AE3DU;
static const uint64_t PRIME64_1 = 0x9E3779B185EBCA87ULL;
static const uint64_t PRIME64_2 = 0xC2B2AE3D27D4EB4FULL;
static const uint64_t PRIME64_3 = 0x165667B19E3779F9ULL;
static const uint64_t PRIME64_4 = 0x85EBCA77C2B2AE63ULL;
static const uint64_t PRIME64_5 = 0x27D4EB2F165667C5ULL;

/* the default secret of the specification */
static const uint8_t SECRET[SECRET_SIZE] = {
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};

/* the little-endian 64-bit value at p, on any CPU */
static inline uint64_t read64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static inline uint64_t mul128_fold64(uint64_t a, uint64_t b) {
    __uint128_t product = (__uint128_t)a * b;
    return (uint64_t)product ^ (uint64_t)(product >> 64);
}

static inline uint64_t avalanche(uint64_t h) {
    h ^= h >> 37;
    h *= 0x165667919E3779F9ULL;
    return h ^ (h >> 32);
}

static void init_acc(uint64_t acc[8]) {
    acc[0] = PRIME32_3;
    acc[1] = PRIME64_1;
    acc[2] = PRIME64_2;
    acc[3] = PRIME64_3;
    acc[4] = PRIME64_4;
    acc[5] = PRIME32_2;
    acc[6] = PRIME64_5;
    acc[7] = PRIME32_1;
}

static uint64_t merge(const uint64_t acc[8], size_t n) {
    const uint8_t *key = SECRET + MERGEACCS_START;
    uint64_t result = (uint64_t)n * PRIME64_1;
    for (int i = 0; i < 4; i++)
        result += mul128_fold64(acc[2 * i] ^ read64(key + 16 * i), acc[2 * i + 1] ^ read64(key + 16 * i + 8));
    return avalanche(result);
}

/* One pass over a part of n bytes of an input of `total` (> SHORT_MAX) bytes, at src:
 * folded into the XXH3 lanes `acc` (init_acc() before the first part) and, where dst is
 * not NULL, stored to dst (not overlapping src). A part that is not the last (last = 0)
 * is whole blocks (n a multiple of BLOCK) and answers 0; the last part (at least one
 * stripe) answers the XXH3-64 of the whole input. Parts cut at block edges fold the
 * same lanes as one pass over the input: block k's stripes take the same secret
 * offsets, and the last stripe (the input's last 64 bytes) lies in the last part. */
typedef uint64_t (*part_fn)(uint64_t acc[8], uint8_t *dst, const uint8_t *src, size_t n,
                            size_t total, int last);

/* -- portable ------------------------------------------------------------------------- */

static inline void accumulate_portable(uint64_t acc[8], const uint8_t *in, const uint8_t *key) {
    for (int i = 0; i < 8; i++) {
        uint64_t data = read64(in + 8 * i);
        uint64_t mixed = data ^ read64(key + 8 * i);
        acc[i ^ 1] += data;
        acc[i] += (mixed & 0xFFFFFFFFULL) * (mixed >> 32);
    }
}

static inline void scramble_portable(uint64_t acc[8]) {
    const uint8_t *key = SECRET + SECRET_SIZE - STRIPE;
    for (int i = 0; i < 8; i++) {
        uint64_t a = acc[i];
        a ^= a >> 47;
        a ^= read64(key + 8 * i);
        acc[i] = a * PRIME32_1;
    }
}

static uint64_t part_portable(uint64_t acc[8], uint8_t *dst, const uint8_t *src, size_t n,
                              size_t total, int last) {
    size_t blocks = last ? (n - 1) / BLOCK : n / BLOCK, at = 0;
    for (size_t b = 0; b < blocks; b++) {
        for (int s = 0; s < STRIPES_PER_BLOCK; s++, at += STRIPE) {
            accumulate_portable(acc, src + at, SECRET + 8 * s);
            if (dst) memcpy(dst + at, src + at, STRIPE);
        }
        scramble_portable(acc);
    }
    if (!last) return 0;
    size_t stripes = ((n - 1) - at) / STRIPE;
    for (size_t s = 0; s < stripes; s++, at += STRIPE) {
        accumulate_portable(acc, src + at, SECRET + 8 * s);
        if (dst) memcpy(dst + at, src + at, STRIPE);
    }
    if (dst) memcpy(dst + at, src + at, n - at); /* the tail: 1 .. 64 bytes */
    accumulate_portable(acc, src + n - STRIPE, SECRET + SECRET_SIZE - STRIPE - LASTACC_START);
    return merge(acc, total);
}

/* -- AVX2 ----------------------------------------------------------------------------- */

#if HAVE_X86_AVX2

#define AVX2 __attribute__((target("avx2")))

AVX2 static inline __m256i accumulate_avx2(__m256i acc, __m256i data, const uint8_t *key) {
    __m256i mixed = _mm256_xor_si256(data, _mm256_loadu_si256((const __m256i *)key));
    /* lane i: (low 32 bits of mixed) * (high 32 bits), plus the data of lane i ^ 1 */
    __m256i product = _mm256_mul_epu32(mixed, _mm256_srli_epi64(mixed, 32));
    __m256i swapped = _mm256_shuffle_epi32(data, _MM_SHUFFLE(1, 0, 3, 2));
    return _mm256_add_epi64(acc, _mm256_add_epi64(product, swapped));
}

AVX2 static inline __m256i scramble_avx2(__m256i acc, const uint8_t *key) {
    const __m256i prime = _mm256_set1_epi64x((long long)PRIME32_1);
    acc = _mm256_xor_si256(acc, _mm256_srli_epi64(acc, 47));
    acc = _mm256_xor_si256(acc, _mm256_loadu_si256((const __m256i *)key));
    __m256i low = _mm256_mul_epu32(acc, prime);
    __m256i high = _mm256_mul_epu32(_mm256_srli_epi64(acc, 32), prime);
    return _mm256_add_epi64(low, _mm256_slli_epi64(high, 32));
}

/* STORE: 0 no destination, 1 regular stores, 2 streaming stores (dst aligned to 32) */
#define STRIPE_AVX2(STORE, at, key)                                                       \
    do {                                                                                  \
        __m256i d0 = _mm256_loadu_si256((const __m256i *)(src + (at)));                   \
        __m256i d1 = _mm256_loadu_si256((const __m256i *)(src + (at) + 32));              \
        a0 = accumulate_avx2(a0, d0, (key));                                              \
        a1 = accumulate_avx2(a1, d1, (key) + 32);                                         \
        if ((STORE) == 1) {                                                               \
            _mm256_storeu_si256((__m256i *)(dst + (at)), d0);                             \
            _mm256_storeu_si256((__m256i *)(dst + (at) + 32), d1);                        \
        } else if ((STORE) == 2) {                                                        \
            _mm256_stream_si256((__m256i *)(dst + (at)), d0);                             \
            _mm256_stream_si256((__m256i *)(dst + (at) + 32), d1);                        \
        }                                                                                 \
    } while (0)

#define PASS_AVX2(NAME, STORE)                                                            \
    AVX2 static uint64_t NAME(uint64_t acc[8], uint8_t *dst, const uint8_t *src, size_t n, \
                              size_t total, int last) {                                   \
        __m256i a0 = _mm256_loadu_si256((const __m256i *)acc);                            \
        __m256i a1 = _mm256_loadu_si256((const __m256i *)(acc + 4));                      \
        size_t blocks = last ? (n - 1) / BLOCK : n / BLOCK, at = 0;                       \
        for (size_t b = 0; b < blocks; b++) {                                             \
            for (int s = 0; s < STRIPES_PER_BLOCK; s++, at += STRIPE)                     \
                STRIPE_AVX2(STORE, at, SECRET + 8 * s);                                   \
            a0 = scramble_avx2(a0, SECRET + SECRET_SIZE - STRIPE);                        \
            a1 = scramble_avx2(a1, SECRET + SECRET_SIZE - STRIPE + 32);                   \
        }                                                                                 \
        if (!last) {                                                                      \
            if ((STORE) == 2) _mm_sfence();                                               \
            _mm256_storeu_si256((__m256i *)acc, a0);                                      \
            _mm256_storeu_si256((__m256i *)(acc + 4), a1);                                \
            return 0;                                                                     \
        }                                                                                 \
        size_t stripes = ((n - 1) - at) / STRIPE;                                         \
        for (size_t s = 0; s < stripes; s++, at += STRIPE)                                \
            STRIPE_AVX2(STORE, at, SECRET + 8 * s);                                       \
        if ((STORE) == 2) _mm_sfence();                                                   \
        if ((STORE) != 0) memcpy(dst + at, src + at, n - at);                             \
        STRIPE_AVX2(0, n - STRIPE, SECRET + SECRET_SIZE - STRIPE - LASTACC_START);        \
        _mm256_storeu_si256((__m256i *)acc, a0);                                          \
        _mm256_storeu_si256((__m256i *)(acc + 4), a1);                                    \
        return merge(acc, total);                                                         \
    }

PASS_AVX2(hash_avx2, 0)
PASS_AVX2(copy_avx2, 1)
PASS_AVX2(stream_avx2, 2)

/* streaming stores where the whole input is large and dst aligned (every part of a
 * large page then streams: parts start at block edges) */
AVX2 static uint64_t part_avx2(uint64_t acc[8], uint8_t *dst, const uint8_t *src, size_t n,
                               size_t total, int last) {
    if (!dst) return hash_avx2(acc, dst, src, n, total, last);
    if (total >= STREAM_MIN_BYTES && ((uintptr_t)dst & 31) == 0)
        return stream_avx2(acc, dst, src, n, total, last);
    return copy_avx2(acc, dst, src, n, total, last);
}

#endif /* HAVE_X86_AVX2 */

static part_fn hardware_part = NULL; /* set at import where the CPU has AVX2 */

static part_fn pick(int hardware) { return hardware && hardware_part ? hardware_part : part_portable; }

/* one pass over the whole input of n (> SHORT_MAX) bytes: its XXH3-64 (and its copy) */
static inline uint64_t pass(part_fn part, uint8_t *dst, const uint8_t *src, size_t n) {
    uint64_t acc[8];
    init_acc(acc);
    return part(acc, dst, src, n, n, 1);
}

/* the n checksums as a new list of ints (NULL and an exception on failure) */
static PyObject *sums_list(const uint64_t *sums, Py_ssize_t n) {
    PyObject *result = PyList_New(n);
    if (!result) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(sums[i]);
        if (!v) {
            Py_DECREF(result);
            return NULL;
        }
        PyList_SET_ITEM(result, i, v);
    }
    return result;
}

/* -- Python ---------------------------------------------------------------------------- */

static PyObject *py_xxh3_64(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"data", "hardware", NULL};
    Py_buffer data;
    int hardware = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*|p:xxh3_64", keywords, &data, &hardware))
        return NULL;
    if (data.len <= SHORT_MAX) {
        PyErr_Format(PyExc_ValueError, "xxh3_64: %zd bytes; this path hashes more than %d",
                     data.len, SHORT_MAX);
        PyBuffer_Release(&data);
        return NULL;
    }
    part_fn part = pick(hardware);
    uint64_t h;
    Py_BEGIN_ALLOW_THREADS
    h = pass(part, NULL, (const uint8_t *)data.buf, (size_t)data.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLongLong(h);
}

/* the rows of `seq` as byte offsets into a buffer of `count` rows of `row_bytes`
 * (NULL and an exception when one is not an int or outside) */
static Py_ssize_t *row_offsets(PyObject *seq, Py_ssize_t n, Py_ssize_t count, Py_ssize_t row_bytes,
                               const char *side) {
    Py_ssize_t *out = PyMem_Malloc(n ? (size_t)n * sizeof(Py_ssize_t) : 1);
    if (!out) return (Py_ssize_t *)PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyLong_Check(item) || PyBool_Check(item)) {
            PyErr_Format(PyExc_TypeError, "copy_rows: %s row %zd is a %.80s, not an int", side, i,
                         Py_TYPE(item)->tp_name);
            PyMem_Free(out);
            return NULL;
        }
        Py_ssize_t row = PyLong_AsSsize_t(item);
        if (row == -1 && PyErr_Occurred()) PyErr_Clear();
        if (row < 0 || row >= count) {
            PyErr_Format(PyExc_ValueError, "copy_rows: %s row %R outside 0 .. %zd", side, item,
                         count - 1);
            PyMem_Free(out);
            return NULL;
        }
        out[i] = row * row_bytes;
    }
    return out;
}

static PyObject *py_copy_rows(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"dst", "dst_rows", "src", "src_rows", "row_bytes", "hardware", NULL};
    Py_buffer dst = {0}, src = {0};
    PyObject *dst_rows, *src_rows, *dst_seq = NULL, *src_seq = NULL, *result = NULL;
    Py_ssize_t row_bytes, *dst_at = NULL, *src_at = NULL;
    uint64_t *sums = NULL;
    int hardware = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "w*Oy*On|p:copy_rows", keywords, &dst, &dst_rows,
                                     &src, &src_rows, &row_bytes, &hardware))
        return NULL;
    if (row_bytes <= SHORT_MAX || dst.len % row_bytes || src.len % row_bytes) {
        PyErr_Format(PyExc_ValueError,
                     "copy_rows: row_bytes %zd must exceed %d and divide both buffers (%zd and %zd "
                     "bytes)",
                     row_bytes, SHORT_MAX, dst.len, src.len);
        goto done;
    }
    dst_seq = PySequence_Fast(dst_rows, "copy_rows: dst_rows must be a sequence of ints");
    if (!dst_seq) goto done;
    src_seq = PySequence_Fast(src_rows, "copy_rows: src_rows must be a sequence of ints");
    if (!src_seq) goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(src_seq);
    if (PySequence_Fast_GET_SIZE(dst_seq) != n) {
        PyErr_Format(PyExc_ValueError, "copy_rows: %zd source row(s) for %zd destination row(s)", n,
                     PySequence_Fast_GET_SIZE(dst_seq));
        goto done;
    }
    dst_at = row_offsets(dst_seq, n, dst.len / row_bytes, row_bytes, "destination");
    if (!dst_at) goto done;
    src_at = row_offsets(src_seq, n, src.len / row_bytes, row_bytes, "source");
    if (!src_at) goto done;
    uint8_t *d = (uint8_t *)dst.buf;
    const uint8_t *s = (const uint8_t *)src.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (d + dst_at[i] < s + src_at[i] + row_bytes && s + src_at[i] < d + dst_at[i] + row_bytes) {
            PyErr_Format(PyExc_ValueError,
                         "copy_rows: destination row %zd overlaps source row %zd in memory",
                         dst_at[i] / row_bytes, src_at[i] / row_bytes);
            goto done;
        }
    }
    sums = PyMem_Malloc(n ? (size_t)n * sizeof(uint64_t) : 1);
    if (!sums) {
        PyErr_NoMemory();
        goto done;
    }
    part_fn part = pick(hardware);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++)
        sums[i] = pass(part, d + dst_at[i], s + src_at[i], (size_t)row_bytes);
    Py_END_ALLOW_THREADS
    result = sums_list(sums, n);
done:
    PyMem_Free(sums);
    PyMem_Free(dst_at);
    PyMem_Free(src_at);
    Py_XDECREF(dst_seq);
    Py_XDECREF(src_seq);
    if (dst.obj) PyBuffer_Release(&dst);
    if (src.obj) PyBuffer_Release(&src);
    return result;
}

/* `obj` as a Py_ssize_t >= lo, else -1 with TypeError / ValueError naming `what` and `i` */
static Py_ssize_t index_at_least(const char *call, PyObject *obj, Py_ssize_t lo, const char *what,
                                 Py_ssize_t i) {
    if (!PyLong_Check(obj) || PyBool_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s: %s %zd is a %.80s, not an int", call, what, i,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    Py_ssize_t v = PyLong_AsSsize_t(obj);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s: %s %zd is %R, outside a Py_ssize_t", call, what, i, obj);
        return -1;
    }
    if (v < lo) {
        PyErr_Format(PyExc_ValueError, "%s: %s %zd is %R, below %zd", call, what, i, obj, lo);
        return -1;
    }
    return v;
}

/* A page move run by one or more threads: each takes the next page not yet taken
 * (`next`, shared) until none is left, so a thread slowed by a competitor for its
 * core (torch's OpenMP workers spin on theirs for milliseconds after each parallel
 * region) moves fewer pages instead of holding the others up. */
typedef struct {
    int scatter, checksum;
    part_fn part;
    uint8_t *side;
    const Py_buffer *bufs;
    const Py_ssize_t *rows, *ids;
    Py_ssize_t n, nbuf, page_size, token_bytes, page_nbytes;
    Py_ssize_t run; /* tokens moved and hashed at a time (page_size: the whole page) */
    Py_ssize_t next; /* the next page to take (atomic) */
    uint64_t *sums;
} move_t;

typedef struct {
    move_t *move;
    uint8_t *scratch; /* `run` tokens of this thread's own (a gather with checksums) */
} share_t;

/* tokens t0 .. t1-1 of page `id` between the page-major buffers and `at` (page format,
 * token t0 first): each buffer's rows read (written) as one run, at the token stride */
static void move_tokens(const move_t *j, Py_ssize_t id, Py_ssize_t t0, Py_ssize_t t1, uint8_t *at) {
    Py_ssize_t offset = 0; /* of buffer s's row inside a token's bytes */
    for (Py_ssize_t s = 0; s < j->nbuf; s++) {
        Py_ssize_t row = j->rows[s];
        uint8_t *run = (uint8_t *)j->bufs[s].buf + (id * j->page_size + t0) * row;
        uint8_t *to = at + offset;
        for (Py_ssize_t t = t0; t < t1; t++, run += row, to += j->token_bytes) {
            if (j->scatter) memcpy(run, to, (size_t)row);
            else memcpy(to, run, (size_t)row);
        }
        offset += row;
    }
}

static void move_share(const share_t *share) {
    move_t *j = share->move;
    uint8_t *scratch = share->scratch;
    Py_ssize_t tb = j->token_bytes, total = j->page_nbytes;
    for (;;) {
        Py_ssize_t i = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
        if (i >= j->n) return;
        uint8_t *place = j->side + i * total;
        if (!j->checksum) {
            move_tokens(j, j->ids[i], 0, j->page_size, place);
            continue;
        }
        /* `run` tokens at a time: a gather fills them in the scratch (in cache), then
         * stores them to their place and hashes them in one pass; a scatter hashes them,
         * which leaves them in cache for their rows' copies */
        uint64_t acc[8];
        init_acc(acc);
        for (Py_ssize_t t0 = 0; t0 < j->page_size; t0 += j->run) {
            Py_ssize_t t1 = t0 + j->run < j->page_size ? t0 + j->run : j->page_size;
            int last = t1 == j->page_size;
            uint8_t *at = place + t0 * tb;
            size_t len = (size_t)((t1 - t0) * tb);
            if (j->scatter) {
                uint64_t h = j->part(acc, NULL, at, len, (size_t)total, last);
                move_tokens(j, j->ids[i], t0, t1, at);
                if (last) j->sums[i] = h;
            } else {
                move_tokens(j, j->ids[i], t0, t1, scratch);
                uint64_t h = j->part(acc, at, scratch, len, (size_t)total, last);
                if (last) j->sums[i] = h;
            }
        }
    }
}

static void *move_share_thread(void *arg) {
    move_share((const share_t *)arg);
    return NULL;
}

/* The OpenMP runtime's GOMP_parallel(fn, data, threads, flags) that runs fn on a team
 * of `threads` threads (the calling one among them) and returns once all are done: set
 * by set_team() to that of the runtime the process already runs (torch's), in the
 * process that set it (team_pid: a forked child has none of its threads); NULL, or in
 * another process, the move starts threads of its own. */
typedef void (*gomp_parallel_fn)(void (*fn)(void *), void *data, unsigned threads, unsigned flags);
static gomp_parallel_fn gomp_parallel = NULL;
static pid_t team_pid = 0;

typedef struct {
    share_t *shares;
    Py_ssize_t count; /* shares (the runtime may run fewer threads, never more) */
    Py_ssize_t taken; /* shares handed out (atomic) */
} team_t;

static void move_team(void *arg) {
    team_t *team = (team_t *)arg;
    Py_ssize_t w = __atomic_fetch_add(&team->taken, 1, __ATOMIC_RELAXED);
    if (w < team->count) move_share(&team->shares[w]); /* (the others take every page) */
}

/* a page move splits over at most MAX_THREADS threads, each moving SHARE_MIN_BYTES or
 * more (a thread costs tens of microseconds to start and join: smaller moves stay whole) */
#define MAX_THREADS 64
#define SHARE_MIN_BYTES (512 << 10)
/* a checksummed page larger than this moves by runs of tokens of at most this size.
 * Measured (1 thread, 16 pages, rows of 2 KiB; GiB/s, gather + hash + streaming store):
 * 64 sources (pages of 2 MiB): runs of 64 KiB 4.8-5.0, 256 KiB 5.4-6.2, 512 KiB
 * 5.2-6.7, 1 MiB 5.4-5.6, the whole page 4.6-5.5; 16 sources (pages of 512 KiB): 256
 * KiB 8.2-8.6, the whole page 8.6-9.1 (a core's L2 here: 2 MiB) */
#define RUN_BYTES (512 << 10)

/* gather_pages (scatter = 0) and scatter_pages (1): `page` is the page-format side
 * (written by a gather, read by a scatter), `buffers` the page-major side */
static PyObject *move_pages(PyObject *args, PyObject *kwargs, int scatter) {
    static char *gather_keywords[] = {"dst",      "sources",  "row_bytes", "pages", "page_size",
                                      "checksum", "hardware", "threads",   NULL};
    static char *scatter_keywords[] = {"src",      "dests",    "row_bytes", "pages", "page_size",
                                       "checksum", "hardware", "threads",   NULL};
    const char *call = scatter ? "scatter_pages" : "gather_pages";
    Py_buffer side = {0}, *bufs = NULL;
    PyObject *buffers, *row_obj, *pages_obj, *buf_seq = NULL, *row_seq = NULL, *page_seq = NULL;
    PyObject *result = NULL;
    Py_ssize_t page_size, nbuf = 0, opened = 0, *rows = NULL, *ids = NULL;
    uint64_t *sums = NULL;
    uint8_t *scratch = NULL;
    int checksum = 1, hardware = 1;
    PyObject *threads_obj = NULL;
    Py_ssize_t threads = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, scatter ? "y*OOOn|ppO:scatter_pages" : "w*OOOn|ppO:gather_pages",
                                     scatter ? scatter_keywords : gather_keywords, &side, &buffers,
                                     &row_obj, &pages_obj, &page_size, &checksum, &hardware,
                                     &threads_obj))
        return NULL;
    if (threads_obj) {
        if (!PyLong_Check(threads_obj) || PyBool_Check(threads_obj)) {
            PyErr_Format(PyExc_TypeError, "%s: threads is a %.80s, not an int", call,
                         Py_TYPE(threads_obj)->tp_name);
            goto done;
        }
        int overflow = 0;
        long long asked = PyLong_AsLongLongAndOverflow(threads_obj, &overflow);
        /* a count past any int64: as many threads as a move takes (MAX_THREADS) */
        if (overflow > 0 || asked > MAX_THREADS) threads = MAX_THREADS;
        else threads = overflow < 0 || asked < 1 ? 0 : (Py_ssize_t)asked;
        if (threads < 1) {
            PyErr_Format(PyExc_ValueError, "%s: threads %R must be an int >= 1", call, threads_obj);
            goto done;
        }
    }
    if (page_size < 1) {
        PyErr_Format(PyExc_ValueError, "%s: page_size %zd must be >= 1", call, page_size);
        goto done;
    }
    buf_seq = PySequence_Fast(buffers, "the page-major buffers must be a sequence of buffers");
    if (!buf_seq) goto done;
    row_seq = PySequence_Fast(row_obj, "row_bytes must be a sequence of ints");
    if (!row_seq) goto done;
    page_seq = PySequence_Fast(pages_obj, "pages must be a sequence of ints");
    if (!page_seq) goto done;
    nbuf = PySequence_Fast_GET_SIZE(buf_seq);
    if (nbuf < 1 || PySequence_Fast_GET_SIZE(row_seq) != nbuf) {
        PyErr_Format(PyExc_ValueError, "%s: %zd buffer(s) for %zd row size(s)", call, nbuf,
                     PySequence_Fast_GET_SIZE(row_seq));
        goto done;
    }
    rows = PyMem_Malloc((size_t)nbuf * sizeof(Py_ssize_t));
    bufs = PyMem_Calloc((size_t)nbuf, sizeof(Py_buffer));
    if (!rows || !bufs) {
        PyErr_NoMemory();
        goto done;
    }
    int flags = scatter ? PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE : PyBUF_C_CONTIGUOUS;
    Py_ssize_t token_bytes = 0, pages_in = PY_SSIZE_T_MAX;
    for (Py_ssize_t s = 0; s < nbuf; s++) {
        rows[s] = index_at_least(call, PySequence_Fast_GET_ITEM(row_seq, s), 1, "row size", s);
        if (rows[s] < 0) goto done;
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(buf_seq, s), &bufs[s], flags) < 0) goto done;
        opened++;
        /* a page of a source, and a token of every source, as sizes that fit memory:
         * a product that wraps would pass the bounds checks and move past the buffers */
        if (rows[s] > PY_SSIZE_T_MAX / page_size || rows[s] > PY_SSIZE_T_MAX - token_bytes) {
            PyErr_Format(PyExc_ValueError,
                         "%s: page_size %zd * row size %zd (buffer %zd) is larger than memory",
                         call, page_size, rows[s], s);
            goto done;
        }
        Py_ssize_t page_bytes = page_size * rows[s];
        if (bufs[s].len / page_bytes < pages_in) pages_in = bufs[s].len / page_bytes;
        token_bytes += rows[s];
    }
    if (token_bytes > PY_SSIZE_T_MAX / page_size) {
        PyErr_Format(PyExc_ValueError, "%s: pages of page_size %zd * %zd bytes are larger than memory",
                     call, page_size, token_bytes);
        goto done;
    }
    Py_ssize_t page_nbytes = page_size * token_bytes;
    if (checksum && page_nbytes <= SHORT_MAX) {
        PyErr_Format(PyExc_ValueError, "%s: pages of %zd bytes; checksums need more than %d", call,
                     page_nbytes, SHORT_MAX);
        goto done;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(page_seq);
    if ((n && page_nbytes > PY_SSIZE_T_MAX / n) || side.len != n * page_nbytes) {
        PyErr_Format(PyExc_ValueError, "%s: %zd page-format bytes for %zd page(s) of %zd", call,
                     side.len, n, page_nbytes);
        goto done;
    }
    ids = PyMem_Malloc(n ? (size_t)n * sizeof(Py_ssize_t) : 1);
    sums = PyMem_Malloc(n ? (size_t)n * sizeof(uint64_t) : 1);
    if (!ids || !sums) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        ids[i] = index_at_least(call, PySequence_Fast_GET_ITEM(page_seq, i), 0, "page", i);
        if (ids[i] < 0) goto done;
        if (ids[i] >= pages_in) {
            PyErr_Format(PyExc_ValueError, "%s: page %zd is %zd, outside the buffers' 0 .. %zd", call,
                         i, ids[i], pages_in - 1);
            goto done;
        }
    }
    const uint8_t *p0 = (const uint8_t *)side.buf, *p1 = p0 + side.len;
    for (Py_ssize_t s = 0; s < nbuf; s++) {
        const uint8_t *b0 = (const uint8_t *)bufs[s].buf;
        if (side.len && b0 < p1 && p0 < b0 + bufs[s].len) {
            PyErr_Format(PyExc_ValueError, "%s: buffer %zd overlaps the page-format bytes", call, s);
            goto done;
        }
    }
    /* A gather with checksums fills each page in a scratch page (in cache, reused),
     * then moves it to its place and hashes it in one pass (streaming stores for large
     * pages: no read of the destination's old lines first). A scatter with checksums
     * hashes each page first, which leaves it in cache for its rows' copies. A page of
     * more than RUN_BYTES whose tokens are whole XXH3 blocks goes so by runs of tokens
     * of at most RUN_BYTES (at least one token), the hash carried from run to run: a
     * whole page would not stay in a core's cache.
     * With threads > 1 the pages are shared among threads (each with a scratch of its
     * own); every check is done above, so no share fails. */
    Py_ssize_t run = page_size;
    if (page_nbytes > RUN_BYTES && token_bytes % BLOCK == 0)
        run = token_bytes >= RUN_BYTES ? 1 : RUN_BYTES / token_bytes;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    Py_ssize_t most = side.len / SHARE_MIN_BYTES; /* shares of SHARE_MIN_BYTES at least */
    if (threads > most) threads = most > 1 ? most : 1;
    if (threads > n) threads = n ? n : 1;
    Py_ssize_t scratch_bytes = run * token_bytes;
    if (checksum && !scatter && n) {
        scratch = PyMem_Malloc((size_t)threads * (size_t)scratch_bytes);
        if (!scratch) {
            PyErr_NoMemory();
            goto done;
        }
    }
    move_t move = {
        .scatter = scatter, .checksum = checksum, .part = pick(hardware),
        .side = (uint8_t *)side.buf, .bufs = bufs, .rows = rows, .ids = ids, .n = n,
        .nbuf = nbuf, .page_size = page_size, .token_bytes = token_bytes,
        .page_nbytes = page_nbytes, .run = run, .next = 0, .sums = sums,
    };
    share_t shares[MAX_THREADS];
    pthread_t workers[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    for (Py_ssize_t w = 0; w < threads; w++)
        shares[w] = (share_t){&move, scratch ? scratch + w * scratch_bytes : NULL};
    team_t team = {shares, threads, 0};
    Py_BEGIN_ALLOW_THREADS
    /* read once: set_team() may change it in another thread while this one runs */
    gomp_parallel_fn parallel = __atomic_load_n(&gomp_parallel, __ATOMIC_ACQUIRE);
    if (threads > 1 && parallel && getpid() == __atomic_load_n(&team_pid, __ATOMIC_RELAXED)) {
        parallel(move_team, &team, (unsigned)threads, 0);
    } else {
        for (Py_ssize_t w = 1; w < threads; w++) /* a thread that cannot start: the others */
            started[w] = pthread_create(&workers[w], NULL, move_share_thread, &shares[w]) == 0;
        move_share(&shares[0]);
        for (Py_ssize_t w = 1; w < threads; w++)
            if (started[w]) pthread_join(workers[w], NULL);
    }
    Py_END_ALLOW_THREADS
    if (!checksum) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    result = sums_list(sums, n);
done:
    for (Py_ssize_t s = 0; s < opened; s++) PyBuffer_Release(&bufs[s]);
    PyMem_Free(scratch);
    PyMem_Free(bufs);
    PyMem_Free(rows);
    PyMem_Free(ids);
    PyMem_Free(sums);
    Py_XDECREF(buf_seq);
    Py_XDECREF(row_seq);
    Py_XDECREF(page_seq);
    if (side.obj) PyBuffer_Release(&side);
    return result;
}

static PyObject *py_gather_pages(PyObject *self, PyObject *args, PyObject *kwargs) {
    return move_pages(args, kwargs, 0);
}

static PyObject *py_scatter_pages(PyObject *self, PyObject *args, PyObject *kwargs) {
    return move_pages(args, kwargs, 1);
}

static PyObject *py_set_team(PyObject *self, PyObject *arg) {
    if (!PyLong_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "set_team: the address is a %.80s, not an int",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    void *address = PyLong_AsVoidPtr(arg);
    if (!address && PyErr_Occurred()) return NULL;
    __atomic_store_n(&team_pid, getpid(), __ATOMIC_RELAXED);
    __atomic_store_n(&gomp_parallel, (gomp_parallel_fn)address, __ATOMIC_RELEASE);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"set_team", (PyCFunction)py_set_team, METH_O,
     "set_team(address) -> None\n\n"
     "The address of GOMP_parallel of the OpenMP runtime loaded in this process, whose "
     "threads then run the shares of a page move split over threads (in this process); "
     "0: moves start threads of their own."},
    {"xxh3_64", (PyCFunction)(void (*)(void))py_xxh3_64, METH_VARARGS | METH_KEYWORDS,
     "xxh3_64(data, hardware=True) -> int\n\n"
     "XXH3-64 (seed 0) of a C-contiguous buffer of more than 240 bytes."},
    {"copy_rows", (PyCFunction)(void (*)(void))py_copy_rows, METH_VARARGS | METH_KEYWORDS,
     "copy_rows(dst, dst_rows, src, src_rows, row_bytes, hardware=True) -> list[int]\n\n"
     "Copy row src_rows[i] of src to row dst_rows[i] of dst, each with its XXH3-64, in one "
     "pass; the GIL is released while the bytes move."},
    {"gather_pages", (PyCFunction)(void (*)(void))py_gather_pages, METH_VARARGS | METH_KEYWORDS,
     "gather_pages(dst, sources, row_bytes, pages, page_size, checksum=True, hardware=True) "
     "-> list[int] | None\n\n"
     "Assemble pages from page-major sources (a row of each per token) into dst, each "
     "page's XXH3-64 taken as it lands; the GIL is released while the bytes move."},
    {"scatter_pages", (PyCFunction)(void (*)(void))py_scatter_pages, METH_VARARGS | METH_KEYWORDS,
     "scatter_pages(src, dests, row_bytes, pages, page_size, checksum=True, hardware=True) "
     "-> list[int] | None\n\n"
     "The inverse of gather_pages: each page of src (page format) into its rows of the "
     "page-major dests, with its XXH3-64; the GIL is released while the bytes move."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_pagecopy",
    "Page copies fused with their XXH3-64 checksum (see unicache_fsm.store.checksum).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__pagecopy(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
#if HAVE_X86_AVX2
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) hardware_part = part_avx2;
#endif
    if (PyModule_AddIntConstant(m, "SHORT_MAX", SHORT_MAX) < 0 ||
        PyModule_AddObject(m, "HARDWARE_AVX2", PyBool_FromLong(hardware_part != NULL)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
