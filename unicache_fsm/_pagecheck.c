/*
 * unicache_fsm._pagecheck: the live-page check of unicache_fsm.pools.paged, in one call.
 *
 * live_page_ids(slots, page_size, num_pages, free_flags, packed=False)
 *     -> list[int] | bytes | None
 *
 *   `slots` is a C-contiguous buffer of int64 slot ids (a NumPy view of a CPU slot
 *   tensor); `free_flags` the allocator's writable flag bytes (flags[k] is 1 while
 *   page k is free, 0 while it is handed out; num_pages + 1 of them). Returns the page
 *   id of each page of `slots`, in order, when every check holds (with packed=True as
 *   one bytes object of native int64 ids, 8 bytes an id: no int object per page):
 *
 *     - the slots are whole pages: a multiple of `page_size` long, each group of
 *       `page_size` is k*P, k*P+1, ..., k*P+P-1;
 *     - every page id k is inside 1 .. num_pages;
 *     - no page is free (flags[k] == 0);
 *     - no page is named twice.
 *
 *   Otherwise None, and nothing changed: the caller's Python path then finds the
 *   culprits and raises its typed error. A buffer that is not C-contiguous int64 also
 *   gives None; an object that is no buffer raises TypeError, read-only flags
 *   BufferError. Duplicates are found by marking each page's flag byte (2) and clearing
 *   the marks before returning; the GIL is held throughout, so no other code sees them.
 *
 * The same checks, in the same order of precedence for the answer (any failure: None),
 * as PagedAllocator's list path; tests/test_pagecheck.py holds the two side by side.
 *
 * live_page_ids_at(address, count, page_size, num_pages, free_flags, packed=False)
 *
 *   The same over `count` int64 slots at a raw address: a C-contiguous CPU tensor's
 *   data_ptr(), without the NumPy view (`Tensor.numpy()` costs more than the check
 *   itself at an insert's few pages). The caller guarantees that `count` int64 values
 *   are readable there and stay alive through the call (it holds the tensor); the
 *   address must be non-null and 8-byte aligned, else ValueError.
 *
 * any_flagged(flags, ids) -> bool; set_flags(flags, ids, value) -> None
 *
 *   Per-page flag bytes read and written by a list of page ids, or a C-contiguous
 *   buffer of native int64 ids (an array('q')), in one call
 *   (`unicache_fsm.pools.pageflags.PageFlags`); every id is converted and checked
 *   first: one outside the bytes raises IndexError, one that is no integer TypeError
 *   (any_flagged also past a flagged id), and set_flags then changes nothing. Any
 *   other object is a TypeError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define SEEN 2

/* page_size and num_pages in range, and the flag buffer (writable, num_pages + 1 bytes
 * or more) opened into `flags`; else -1 with an error set and nothing held. */
static int open_flags(Py_ssize_t page_size, Py_ssize_t num_pages, PyObject *flags_obj,
                      Py_buffer *flags) {
    if (page_size < 1 || num_pages < 0) {
        PyErr_Format(PyExc_ValueError, "page_size must be >= 1 and num_pages >= 0, got %zd, %zd",
                     page_size, num_pages);
        return -1;
    }
    if (PyObject_GetBuffer(flags_obj, flags, PyBUF_WRITABLE) < 0) return -1;
    if (num_pages >= flags->len) { /* fewer than num_pages + 1 bytes (which could overflow) */
        PyBuffer_Release(flags);
        PyErr_Format(PyExc_ValueError, "free_flags holds %zd bytes, fewer than num_pages + 1",
                     flags->len);
        return -1;
    }
    return 0;
}

static PyObject *check_pages(const int64_t *s, Py_ssize_t n, Py_ssize_t page_size,
                             Py_ssize_t num_pages, uint8_t *f, int packed);

static PyObject *live_page_ids(PyObject *self, PyObject *args) {
    PyObject *slots_obj, *flags_obj;
    Py_ssize_t page_size, num_pages;
    Py_buffer slots, flags;
    int packed = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "OnnO|p:live_page_ids", &slots_obj, &page_size, &num_pages,
                          &flags_obj, &packed))
        return NULL;
    if (open_flags(page_size, num_pages, flags_obj, &flags) < 0) return NULL;
    if (PyObject_GetBuffer(slots_obj, &slots, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&flags);
        if (!PyObject_CheckBuffer(slots_obj)) return NULL; /* not a buffer: TypeError */
        PyErr_Clear(); /* a buffer, not a contiguous one: the caller's own path decides */
        Py_RETURN_NONE;
    }
    const char *fmt = slots.format ? slots.format : "B";
    if (fmt[0] == '<' || fmt[0] == '=' || fmt[0] == '@') fmt++;
    int int64 = slots.itemsize == 8 && (fmt[0] == 'q' || fmt[0] == 'l') && fmt[1] == '\0';
    Py_ssize_t n = int64 ? slots.len / 8 : -1;
    if (n < 0 || n % page_size) {
        PyBuffer_Release(&slots);
        PyBuffer_Release(&flags);
        Py_RETURN_NONE;
    }
    PyObject *result =
        check_pages((const int64_t *)slots.buf, n, page_size, num_pages, flags.buf, packed);
    PyBuffer_Release(&slots);
    PyBuffer_Release(&flags);
    return result;
}

static PyObject *live_page_ids_at(PyObject *self, PyObject *args) {
    PyObject *address_obj, *flags_obj;
    Py_ssize_t count, page_size, num_pages;
    Py_buffer flags;
    int packed = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "OnnnO|p:live_page_ids_at", &address_obj, &count, &page_size,
                          &num_pages, &flags_obj, &packed))
        return NULL;
    if (!PyLong_Check(address_obj)) {
        PyErr_Format(PyExc_TypeError, "address must be an int, got %.100s",
                     Py_TYPE(address_obj)->tp_name);
        return NULL;
    }
    /* (checked: a negative or too large int is an OverflowError, not a wrapped address) */
    unsigned long long address = PyLong_AsUnsignedLongLong(address_obj);
    if (address == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    if (count < 0 || (count && (address == 0 || address % sizeof(int64_t)))) {
        PyErr_Format(PyExc_ValueError,
                     "live_page_ids_at needs a non-null, 8-byte aligned address and a count "
                     ">= 0, got %llu, %zd",
                     address, count);
        return NULL;
    }
    if (open_flags(page_size, num_pages, flags_obj, &flags) < 0) return NULL;
    PyObject *result;
    if (count % page_size) {
        result = Py_None;
        Py_INCREF(result);
    } else {
        result = check_pages((const int64_t *)(uintptr_t)address, count, page_size, num_pages,
                             flags.buf, packed);
    }
    PyBuffer_Release(&flags);
    return result;
}

/* The checks over n (a multiple of page_size) int64 slots at s, against flag bytes f
 * (num_pages + 1 of them, or more): the answer of live_page_ids. */
static PyObject *check_pages(const int64_t *s, Py_ssize_t n, Py_ssize_t page_size,
                             Py_ssize_t num_pages, uint8_t *f, int packed) {
    Py_ssize_t pages = n / page_size, marked = 0;
    int64_t stack_ids[256];
    int64_t *ids = pages <= 256 ? stack_ids : PyMem_Malloc(sizeof(int64_t) * (size_t)pages);
    PyObject *result = NULL;
    if (!ids) {
        PyErr_NoMemory();
        goto done;
    }
    int ok = 1;
    for (Py_ssize_t i = 0; i < pages && ok; i++) {
        const int64_t *page = s + i * page_size;
        int64_t first = page[0];
        if (first < page_size || first % page_size) {
            ok = 0;
            break;
        }
        int64_t k = first / page_size;
        /* (k > num_pages, and a page whose last slot would pass INT64_MAX: first + j must
         * not overflow below) */
        if (k > num_pages || first > INT64_MAX - (page_size - 1)) {
            ok = 0;
            break;
        }
        for (Py_ssize_t j = 1; j < page_size; j++) {
            if (page[j] != first + j) {
                ok = 0;
                break;
            }
        }
        if (!ok || f[k] != 0) { /* free (1) or named before in this call (SEEN) */
            ok = 0;
            break;
        }
        f[k] = SEEN;
        ids[marked++] = k;
    }
    for (Py_ssize_t i = 0; i < marked; i++) f[ids[i]] = 0; /* every mark cleared */
    if (!ok) {
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    if (packed) {
        result = PyBytes_FromStringAndSize((const char *)ids, (Py_ssize_t)sizeof(int64_t) * pages);
        goto done;
    }
    result = PyList_New(pages);
    if (!result) goto done;
    for (Py_ssize_t i = 0; i < pages; i++) {
        PyObject *k = PyLong_FromLongLong(ids[i]);
        if (!k) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, i, k);
    }
done:
    if (ids && ids != stack_ids) PyMem_Free(ids);
    return result;
}

/* Page ids: a list of ints, or a buffer of native int64 (ids_open fills `view`, whose
 * buf is NULL for a list; ids_close releases it). */
static int ids_open(PyObject *ids, Py_buffer *view) {
    view->buf = NULL;
    view->obj = NULL;
    if (PyList_Check(ids)) return 0;
    if (!PyObject_CheckBuffer(ids)) {
        PyErr_Format(PyExc_TypeError, "page ids must be a list or an int64 buffer, got %.100s",
                     Py_TYPE(ids)->tp_name);
        return -1;
    }
    if (PyObject_GetBuffer(ids, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        /* a strided array (NumPy: ValueError, others BufferError): the wrong kind of ids */
        if (PyErr_ExceptionMatches(PyExc_ValueError) || PyErr_ExceptionMatches(PyExc_BufferError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError,
                         "page id buffer must be a C-contiguous int64 buffer, got a %.100s that "
                         "is not",
                         Py_TYPE(ids)->tp_name);
        }
        view->buf = NULL;
        view->obj = NULL;
        return -1;
    }
    const char *fmt = view->format ? view->format : "B";
    if (fmt[0] == '<' || fmt[0] == '=' || fmt[0] == '@') fmt++;
    if (view->itemsize != 8 || (fmt[0] != 'q' && fmt[0] != 'l') || fmt[1] != '\0') {
        PyErr_Format(PyExc_TypeError, "page id buffer must hold int64 ('q'), got format '%s'",
                     view->format ? view->format : "B");
        PyBuffer_Release(view);
        view->buf = NULL;
        view->obj = NULL;
        return -1;
    }
    return 0;
}

static void ids_close(Py_buffer *view) {
    if (view->obj) PyBuffer_Release(view);
}

static Py_ssize_t ids_count(PyObject *ids, const Py_buffer *view) {
    return view->obj ? view->len / 8 : PyList_GET_SIZE(ids);
}

/* ids[i] as a page index into `len` flag bytes, or -1 with an error set (a strong
 * reference is held across the conversion: an __index__ may change the list) */
static Py_ssize_t flag_index(PyObject *ids, const Py_buffer *view, Py_ssize_t i,
                             Py_ssize_t len) {
    Py_ssize_t k;
    if (view->obj) {
        int64_t v = ((const int64_t *)view->buf)[i];
        if (v < 0 || v >= (int64_t)len) {
            PyErr_Format(PyExc_IndexError, "page id %lld outside the %zd flag bytes",
                         (long long)v, len);
            return -1;
        }
        return (Py_ssize_t)v;
    }
    PyObject *id = PyList_GET_ITEM(ids, i);
    Py_INCREF(id);
    k = PyNumber_AsSsize_t(id, PyExc_IndexError);
    Py_DECREF(id);
    if (k == -1 && PyErr_Occurred()) return -1;
    if (k < 0 || k >= len) {
        PyErr_Format(PyExc_IndexError, "page id %zd outside the %zd flag bytes", k, len);
        return -1;
    }
    return k;
}

static PyObject *any_flagged(PyObject *self, PyObject *args) {
    PyObject *flags_obj, *ids;
    Py_buffer flags, view;
    (void)self;
    if (!PyArg_ParseTuple(args, "OO:any_flagged", &flags_obj, &ids)) return NULL;
    if (ids_open(ids, &view) < 0) return NULL;
    if (PyObject_GetBuffer(flags_obj, &flags, PyBUF_SIMPLE) < 0) {
        ids_close(&view);
        return NULL;
    }
    const uint8_t *f = (const uint8_t *)flags.buf;
    int found = 0;
    /* every id checked, also past the first flagged one: a bad id is refused wherever it
     * stands, as the Python form does (a list's length is read each time round: an
     * __index__ may shorten it) */
    for (Py_ssize_t i = 0; i < ids_count(ids, &view); i++) {
        Py_ssize_t k = flag_index(ids, &view, i, flags.len);
        if (k < 0) {
            PyBuffer_Release(&flags);
            ids_close(&view);
            return NULL;
        }
        found |= f[k] != 0;
    }
    PyBuffer_Release(&flags);
    ids_close(&view);
    return PyBool_FromLong(found);
}

static PyObject *set_flags(PyObject *self, PyObject *args) {
    PyObject *flags_obj, *ids;
    int value;
    Py_buffer flags;
    (void)self;
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "OOp:set_flags", &flags_obj, &ids, &value)) return NULL;
    if (ids_open(ids, &view) < 0) return NULL;
    if (PyObject_GetBuffer(flags_obj, &flags, PyBUF_WRITABLE) < 0) {
        ids_close(&view);
        return NULL;
    }
    Py_ssize_t stack_at[256], *at = stack_at, n = 0;
    PyObject *result = NULL;
    Py_ssize_t room = ids_count(ids, &view);
    if (room > 256) {
        at = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)room);
        if (!at) {
            PyErr_NoMemory();
            goto done;
        }
    }
    /* every id converted and checked before any flag changes (no more than `room`: an
     * __index__ may grow the list) */
    for (Py_ssize_t i = 0; i < ids_count(ids, &view) && n < room; i++) {
        Py_ssize_t k = flag_index(ids, &view, i, flags.len);
        if (k < 0) goto done;
        at[n++] = k;
    }
    uint8_t *f = (uint8_t *)flags.buf;
    for (Py_ssize_t i = 0; i < n; i++) f[at[i]] = (uint8_t)value;
    result = Py_None;
    Py_INCREF(result);
done:
    if (at != stack_at) PyMem_Free(at);
    PyBuffer_Release(&flags);
    ids_close(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"live_page_ids", live_page_ids, METH_VARARGS,
     "live_page_ids(slots, page_size, num_pages, free_flags, packed=False)\n"
     "    -> list[int] | bytes | None\n\n"
     "The page ids of whole, allocated, distinct pages of int64 slots (packed: as native\n"
     "int64 bytes); None otherwise."},
    {"live_page_ids_at", live_page_ids_at, METH_VARARGS,
     "live_page_ids_at(address, count, page_size, num_pages, free_flags, packed=False)\n"
     "    -> list[int] | bytes | None\n\n"
     "live_page_ids over `count` int64 slots at a raw address (a contiguous CPU tensor's\n"
     "data_ptr(), which the caller keeps alive)."},
    {"any_flagged", any_flagged, METH_VARARGS,
     "any_flagged(flags, ids: list[int] | int64 buffer) -> bool\n\n"
     "Is flags[k] non-zero for some k of ids?"},
    {"set_flags", set_flags, METH_VARARGS,
     "set_flags(flags, ids: list[int] | int64 buffer, value: bool) -> None\n\n"
     "flags[k] = value for every k of ids (every id checked first: IndexError, nothing set)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_pagecheck",
    "The live-page check of unicache_fsm.pools.paged, in native code.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__pagecheck(void) { return PyModule_Create(&module); }
