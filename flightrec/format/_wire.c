/* The loops of the columnar dump reader (wire.py) in C: walking a message's top-level fields,
 * parting a dump's top-level fields (split), and decoding packed varint columns into typed
 * arrays (column, columns).
 *
 * Why C: at scale ``flightrec analyze`` reads one dump tail per rank, and in Python these two
 * loops were a third of a rank's reading time (a tail's read takes 0.19 ms of CPU with this
 * file against 0.40 ms without, 16,384-rank job of benchmarks/bench_scale.py). wire.py defines
 * what they return (``_walk_fields_py`` and the Python column path); this file returns exactly
 * the same, and the reader's tests run with both and compare them on arbitrary bytes
 * (tests/unit/test_columns_fastread.py). ``column`` handles the usual values and answers
 * None for anything else (a value its field type would truncate, a negative enum), which the
 * Python path then decodes as protobuf does. Where this extension is not built, wire.py runs
 * its Python loops: same results, slower.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* Column kinds, as wire.py's _KIND names them. */
enum { K_UINT32 = 0, K_UINT64 = 1, K_SINT32 = 2, K_INT64 = 3, K_ENUM = 4 };

static PyObject *array_type; /* array.array */

/* A varint at buf[*i] (below end), into *out. 0 on success; -1 when it runs past end or past
 * ten bytes, or when its value does not fit 64 bits (as wire.py's _varint). */
static int
read_varint(const unsigned char *buf, Py_ssize_t end, Py_ssize_t *i, uint64_t *out)
{
    uint64_t value = 0;
    int shift = 0;
    while (1) {
        if (*i >= end)
            return -1;
        unsigned char b = buf[(*i)++];
        if (shift == 63 && (b & 0x7F) > 1)
            return -1;
        value |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80) {
            *out = value;
            return 0;
        }
        shift += 7;
        if (shift > 63)
            return -1;
    }
}

static PyObject *
odd(void)
{
    PyErr_SetString(PyExc_ValueError, "not a plainly laid out message");
    return NULL;
}

/* walk(buf, start, end) -> [(number, wire, start, end, tag start)] */
static PyObject *
walk(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t start, end;
    if (!PyArg_ParseTuple(args, "y*nn", &view, &start, &end))
        return NULL;
    PyObject *out = PyList_New(0);
    if (out == NULL)
        goto fail;
    if (start < 0 || end > view.len || start > end) {
        odd();
        goto fail;
    }
    const unsigned char *buf = view.buf;
    Py_ssize_t i = start;
    while (i < end) {
        Py_ssize_t at = i;
        uint64_t tag, value;
        if (read_varint(buf, end, &i, &tag) < 0) {
            odd();
            goto fail;
        }
        unsigned wire = (unsigned)(tag & 7);
        Py_ssize_t a = i, b;
        if (wire == 2) {
            if (read_varint(buf, end, &i, &value) < 0 || value > (uint64_t)(end - i)) {
                odd();
                goto fail;
            }
            a = i;
            b = i + (Py_ssize_t)value;
        } else if (wire == 0) {
            if (read_varint(buf, end, &i, &value) < 0) {
                odd();
                goto fail;
            }
            b = i;
        } else if (wire == 1 || wire == 5) {
            b = i + (wire == 1 ? 8 : 4);
            if (b > end) {
                odd();
                goto fail;
            }
        } else {
            odd();
            goto fail;
        }
        PyObject *item = Py_BuildValue("(KInnn)", (unsigned long long)(tag >> 3), wire, a, b, at);
        if (item == NULL || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            goto fail;
        }
        Py_DECREF(item);
        i = b;
    }
    PyBuffer_Release(&view);
    return out;
fail:
    Py_XDECREF(out);
    PyBuffer_Release(&view);
    return NULL;
}

/* Decode the packed varint column in buf[start:end] as wire.py's Python path types it: every
 * value one byte -> "B" ("b" for zigzag); else int64 -> "q"; else the narrowest of H/I/Q
 * (h/i/q for zigzag) that holds them all. Sets *array and *highest (the largest value, for
 * index bounds) and returns 0; returns 1 (nothing set) for a value the Python path must decode
 * (one its field type truncates, a negative enum); -1 with an exception set on error. */
static int
decode_column(const unsigned char *buf, Py_ssize_t start, Py_ssize_t end, int kind,
              PyObject **array_out, PyObject **highest_out)
{
    int status = -1;
    uint64_t *raw = NULL;
    char *packed = NULL;
    Py_ssize_t len = end - start, n = 0;
    unsigned char any = 0, top = 0;
    for (Py_ssize_t i = start; i < end; i++) {
        any |= buf[i];
        if (buf[i] > top)
            top = buf[i];
    }
    if (!(any & 0x80) && kind != K_SINT32) {
        /* Every value one byte (the usual index column): the packed bytes are the values. */
        PyObject *array = PyObject_CallFunction(array_type, "Cy#", 'B', (const char *)buf + start, len);
        if (array == NULL)
            return -1;
        PyObject *highest = PyLong_FromLong(top);
        if (highest == NULL) {
            Py_DECREF(array);
            return -1;
        }
        *array_out = array;
        *highest_out = highest;
        return 0;
    }
    raw = PyMem_Malloc((size_t)(len ? len : 1) * sizeof(uint64_t));
    if (raw == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int one_byte = 1;
    for (Py_ssize_t i = start; i < end;) {
        if (buf[i] < 0x80) { /* (most values of most columns) */
            raw[n++] = buf[i++];
            continue;
        }
        if (read_varint(buf, end, &i, &raw[n]) < 0) {
            odd();
            goto done;
        }
        one_byte = 0;
        n++;
    }
    char code;
    int64_t lo = 0, hi = 0; /* signed kinds */
    uint64_t uhi = 0;        /* unsigned kinds */
    if (kind == K_SINT32) {
        for (Py_ssize_t k = 0; k < n; k++) {
            if (raw[k] > 0xFFFFFFFFull) { /* protobuf would truncate: the Python path decides */
                status = 1;
                goto done;
            }
            int64_t v = (int64_t)(raw[k] >> 1) ^ -(int64_t)(raw[k] & 1);
            raw[k] = (uint64_t)v;
            if (k == 0 || v < lo)
                lo = v;
            if (k == 0 || v > hi)
                hi = v;
        }
        code = one_byte ? 'b' : (lo >= -32768 && hi <= 32767) ? 'h' : 'i';
    } else {
        for (Py_ssize_t k = 0; k < n; k++) {
            if ((kind == K_UINT32 || kind == K_ENUM) && raw[k] > (kind == K_ENUM ? 0x7FFFFFFFull : 0xFFFFFFFFull)) {
                status = 1;
                goto done;
            }
            if (kind == K_INT64) {
                if (k == 0 || (int64_t)raw[k] > hi)
                    hi = (int64_t)raw[k];
            } else if (raw[k] > uhi)
                uhi = raw[k];
        }
        if (one_byte)
            code = 'B';
        else if (kind == K_INT64)
            code = 'q';
        else
            code = uhi <= 0xFFFF ? 'H' : uhi <= 0xFFFFFFFFull ? 'I' : 'Q';
    }
    size_t width = code == 'B' || code == 'b' ? 1 : code == 'H' || code == 'h' ? 2
                 : code == 'I' || code == 'i' ? 4 : 8;
    if (width == 1 && code == 'B') {
        /* One byte per value, all below 128: the packed bytes are the values. */
        packed = NULL;
    } else {
        packed = PyMem_Malloc((size_t)(n ? n : 1) * width);
        if (packed == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        for (Py_ssize_t k = 0; k < n; k++) {
            uint64_t v = raw[k];
            switch (width) {
            case 1: { uint8_t x = (uint8_t)v; memcpy(packed + k, &x, 1); break; }
            case 2: { uint16_t x = (uint16_t)v; memcpy(packed + 2 * k, &x, 2); break; }
            case 4: { uint32_t x = (uint32_t)v; memcpy(packed + 4 * k, &x, 4); break; }
            default: memcpy(packed + 8 * k, &v, 8);
            }
        }
    }
    const char *bytes = packed != NULL ? packed : (const char *)buf + start;
    PyObject *array = PyObject_CallFunction(array_type, "Cy#", (int)code, bytes, (Py_ssize_t)(n * (Py_ssize_t)width));
    if (array == NULL)
        goto done;
    PyObject *highest = kind == K_SINT32 || kind == K_INT64 ? PyLong_FromLongLong(hi)
                                                           : PyLong_FromUnsignedLongLong(uhi);
    if (highest == NULL) {
        Py_DECREF(array);
        goto done;
    }
    *array_out = array;
    *highest_out = highest;
    status = 0;
done:
    PyMem_Free(raw);
    PyMem_Free(packed);
    return status;
}

/* column(buf, start, end, kind) -> (array, highest) | None
 *
 * One packed varint column (see decode_column); None: a value the Python path must decode. */
static PyObject *
column(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t start, end;
    int kind;
    if (!PyArg_ParseTuple(args, "y*nni", &view, &start, &end, &kind))
        return NULL;
    PyObject *result = NULL, *array = NULL, *highest = NULL;
    if (start < 0 || end > view.len || start > end || kind < K_UINT32 || kind > K_ENUM) {
        odd();
        goto done;
    }
    int status = decode_column(view.buf, start, end, kind, &array, &highest);
    if (status == 1)
        result = Py_NewRef(Py_None);
    else if (status == 0) {
        result = PyTuple_Pack(2, array, highest);
        Py_DECREF(array);
        Py_DECREF(highest);
    }
done:
    PyBuffer_Release(&view);
    return result;
}

/* A growing byte buffer. */
typedef struct {
    char *data;
    Py_ssize_t len, cap;
} Buf;

static int
buf_put(Buf *b, const unsigned char *src, Py_ssize_t n)
{
    if (b->len + n > b->cap) {
        Py_ssize_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n)
            cap *= 2;
        char *grown = PyMem_Realloc(b->data, (size_t)cap);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        b->data = grown;
        b->cap = cap;
    }
    memcpy(b->data + b->len, src, (size_t)n);
    b->len += n;
    return 0;
}

/* One field of a message at buf[*i] (below end): its number, wire type, value bounds [*a, *b)
 * and, through *i, where the next field starts. 0, or -1 for bytes that are not a plain field
 * (as walk refuses them). */
static int
next_field(const unsigned char *buf, Py_ssize_t end, Py_ssize_t *i, uint64_t *number,
           unsigned *wire, Py_ssize_t *a, Py_ssize_t *b)
{
    uint64_t tag, value;
    if (read_varint(buf, end, i, &tag) < 0)
        return -1;
    *wire = (unsigned)(tag & 7);
    *number = tag >> 3;
    *a = *i;
    if (*wire == 2) {
        if (read_varint(buf, end, i, &value) < 0 || value > (uint64_t)(end - *i))
            return -1;
        *a = *i;
        *b = *i + (Py_ssize_t)value;
    } else if (*wire == 0) {
        if (read_varint(buf, end, i, &value) < 0)
            return -1;
        *b = *i;
    } else if (*wire == 1 || *wire == 5) {
        *b = *i + (*wire == 1 ? 8 : 4);
        if (*b > end)
            return -1;
    } else
        return -1;
    *i = *b;
    return 0;
}

#define MAX_TABLES 16

/* split(buf, entries, groups, tables) -> (entries, groups, rest, table_bytes)
 *
 * A dump's top-level fields, parted as wire.py's read_compact parts them: the value bounds
 * (start, end) of each ``entries`` and each ``groups`` field (both length-delimited, else
 * ValueError), every other field's encoding joined in order (``rest``), and the encodings of
 * the fields numbered in ``tables`` joined in order. ValueError for bytes walk refuses. */
static PyObject *
split(PyObject *self, PyObject *args)
{
    Py_buffer view;
    unsigned long long entries_no, groups_no;
    PyObject *tables_arg;
    if (!PyArg_ParseTuple(args, "y*KKO!", &view, &entries_no, &groups_no, &PyTuple_Type, &tables_arg))
        return NULL;
    PyObject *result = NULL, *entries = NULL, *groups = NULL;
    Buf rest = {0}, tables = {0};
    uint64_t table_no[MAX_TABLES];
    Py_ssize_t ntables = PyTuple_GET_SIZE(tables_arg);
    if (ntables > MAX_TABLES) {
        PyErr_SetString(PyExc_OverflowError, "too many table fields");
        goto done;
    }
    for (Py_ssize_t k = 0; k < ntables; k++) {
        table_no[k] = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(tables_arg, k));
        if (PyErr_Occurred())
            goto done;
    }
    entries = PyList_New(0);
    groups = PyList_New(0);
    if (entries == NULL || groups == NULL)
        goto done;
    const unsigned char *buf = view.buf;
    Py_ssize_t i = 0, end = view.len;
    while (i < end) {
        Py_ssize_t at = i, a, b;
        uint64_t number;
        unsigned wire;
        if (next_field(buf, end, &i, &number, &wire, &a, &b) < 0) {
            odd();
            goto done;
        }
        if (number == entries_no || number == groups_no) {
            if (wire != 2) {
                odd();
                goto done;
            }
            PyObject *span = Py_BuildValue("(nn)", a, b);
            if (span == NULL || PyList_Append(number == entries_no ? entries : groups, span) < 0) {
                Py_XDECREF(span);
                goto done;
            }
            Py_DECREF(span);
            continue;
        }
        if (buf_put(&rest, buf + at, b - at) < 0)
            goto done;
        for (Py_ssize_t k = 0; k < ntables; k++) {
            if (table_no[k] == number) {
                if (buf_put(&tables, buf + at, b - at) < 0)
                    goto done;
                break;
            }
        }
    }
    result = Py_BuildValue("(OOy#y#)", entries, groups, rest.data ? rest.data : "", rest.len,
                           tables.data ? tables.data : "", tables.len);
done:
    Py_XDECREF(entries);
    Py_XDECREF(groups);
    PyMem_Free(rest.data);
    PyMem_Free(tables.data);
    PyBuffer_Release(&view);
    return result;
}

#define MAX_COLUMNS 64

/* columns(buf, ranges, numbers, kinds, bounds) -> [array | None]
 *
 * The entry columns of the ``entries`` fields at ``ranges`` ((start, end) value bounds; one,
 * or two in the 1.3 tail layout, whose packed columns concatenate, oldest first), as
 * wire.py's _columns reads them: ``numbers`` are the columns' field numbers in the order
 * wanted, ``kinds`` their kinds, ``bounds`` the size of the table an index column points into
 * (-1: none). Each range must hold every column once, length-delimited; every index must be
 * below its bound; every column must have as many values: else ValueError. A column with a
 * value the Python path must decode is None (see decode_column); its length is not checked. */
static PyObject *
columns(PyObject *self, PyObject *args)
{
    Py_buffer view;
    PyObject *ranges, *numbers, *kinds, *bounds;
    if (!PyArg_ParseTuple(args, "y*O!O!O!O!", &view, &PyList_Type, &ranges, &PyTuple_Type, &numbers,
                          &PyTuple_Type, &kinds, &PyTuple_Type, &bounds))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t (*spans)[2] = NULL;
    unsigned char *joined = NULL;
    Py_ssize_t ncols = PyTuple_GET_SIZE(numbers), nranges = PyList_GET_SIZE(ranges);
    uint64_t number_of[MAX_COLUMNS];
    int kind_of[MAX_COLUMNS];
    long long bound_of[MAX_COLUMNS];
    if (ncols > MAX_COLUMNS || PyTuple_GET_SIZE(kinds) != ncols || PyTuple_GET_SIZE(bounds) != ncols
        || nranges < 1) {
        odd();
        goto done;
    }
    for (Py_ssize_t k = 0; k < ncols; k++) {
        number_of[k] = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(numbers, k));
        kind_of[k] = (int)PyLong_AsLong(PyTuple_GET_ITEM(kinds, k));
        bound_of[k] = PyLong_AsLongLong(PyTuple_GET_ITEM(bounds, k));
        if (PyErr_Occurred())
            goto done;
        if (kind_of[k] < K_UINT32 || kind_of[k] > K_ENUM) {
            odd();
            goto done;
        }
    }
    spans = PyMem_Calloc((size_t)(nranges * ncols), sizeof *spans);
    if (spans == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const unsigned char *buf = view.buf;
    for (Py_ssize_t r = 0; r < nranges; r++) {
        Py_ssize_t start, end;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(ranges, r), "nn", &start, &end))
            goto done;
        if (start < 0 || end > view.len || start > end) {
            odd();
            goto done;
        }
        Py_ssize_t seen = 0, i = start;
        Py_ssize_t (*row)[2] = spans + r * ncols;
        for (Py_ssize_t k = 0; k < ncols; k++)
            row[k][0] = row[k][1] = -1;
        while (i < end) {
            Py_ssize_t a, b;
            uint64_t number;
            unsigned wire;
            if (next_field(buf, end, &i, &number, &wire, &a, &b) < 0) {
                odd();
                goto done;
            }
            Py_ssize_t k = 0;
            while (k < ncols && number_of[k] != number)
                k++;
            if (k == ncols || wire != 2 || row[k][0] >= 0) {
                odd(); /* an unknown, unpacked or split column */
                goto done;
            }
            row[k][0] = a;
            row[k][1] = b;
            seen++;
        }
        if (seen != ncols) {
            odd(); /* an empty column (no entries, or damage): the ordinary reader decides */
            goto done;
        }
    }
    result = PyList_New(ncols);
    if (result == NULL)
        goto done;
    Py_ssize_t length = -1;
    for (Py_ssize_t k = 0; k < ncols; k++) {
        const unsigned char *src = buf;
        Py_ssize_t a = spans[k][0], b = spans[k][1];
        if (nranges > 1) { /* the column's parts joined, oldest first */
            Py_ssize_t total = 0;
            for (Py_ssize_t r = 0; r < nranges; r++)
                total += spans[r * ncols + k][1] - spans[r * ncols + k][0];
            PyMem_Free(joined);
            joined = PyMem_Malloc((size_t)(total ? total : 1));
            if (joined == NULL) {
                PyErr_NoMemory();
                goto fail;
            }
            Py_ssize_t at = 0;
            for (Py_ssize_t r = 0; r < nranges; r++) {
                Py_ssize_t pa = spans[r * ncols + k][0], pb = spans[r * ncols + k][1];
                memcpy(joined + at, buf + pa, (size_t)(pb - pa));
                at += pb - pa;
            }
            src = joined;
            a = 0;
            b = total;
        }
        PyObject *array = NULL, *highest = NULL;
        int status = decode_column(src, a, b, kind_of[k], &array, &highest);
        if (status < 0)
            goto fail;
        if (status == 1) {
            PyList_SET_ITEM(result, k, Py_NewRef(Py_None));
            continue;
        }
        int beyond = 0;
        if (bound_of[k] >= 0) {
            long long top = PyLong_AsLongLong(highest);
            if (top == -1 && PyErr_Occurred()) {
                PyErr_Clear();
                beyond = 1; /* beyond 63 bits: beyond any table */
            } else
                beyond = top >= bound_of[k];
        }
        Py_DECREF(highest);
        Py_ssize_t n = PyObject_Length(array);
        if (beyond || n < 0 || (length >= 0 && n != length)) {
            Py_DECREF(array);
            if (n >= 0)
                odd(); /* an index beyond its table, or columns of different lengths */
            goto fail;
        }
        length = n;
        PyList_SET_ITEM(result, k, array);
    }
    goto done;
fail:
    Py_CLEAR(result);
done:
    PyMem_Free(spans);
    PyMem_Free(joined);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS, "walk(buf, start, end): the fields of buf[start:end]."},
    {"column", column, METH_VARARGS, "column(buf, start, end, kind): one packed column as a typed array."},
    {"split", split, METH_VARARGS, "split(buf, entries, groups, tables): a dump's top-level fields, parted."},
    {"columns", columns, METH_VARARGS, "columns(buf, ranges, numbers, kinds, bounds): the entry columns."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef wiremodule = {
    PyModuleDef_HEAD_INIT, "_wire", "The columnar dump reader's loops in C (optional).", -1, methods,
};

PyMODINIT_FUNC
PyInit__wire(void)
{
    if (sizeof(unsigned short) != 2 || sizeof(unsigned int) != 4 || sizeof(long long) != 8) {
        PyErr_SetString(PyExc_ImportError, "array typecodes H/I/q are not 2/4/8 bytes here");
        return NULL;
    }
    PyObject *mod = PyImport_ImportModule("array");
    if (mod == NULL)
        return NULL;
    array_type = PyObject_GetAttrString(mod, "array");
    Py_DECREF(mod);
    if (array_type == NULL)
        return NULL;
    return PyModule_Create(&wiremodule);
}
