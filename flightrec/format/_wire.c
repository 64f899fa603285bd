/* The two loops of the columnar dump reader (wire.py) in C: walking a message's top-level
 * fields, and decoding one packed varint column into a typed array.
 *
 * Why C: at scale ``flightrec analyze`` reads one dump tail per rank, and in Python these two
 * loops were a third of a rank's reading time (a tail's read takes 0.25 ms of CPU with this
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

/* column(buf, start, end, kind) -> (array, highest) | None
 *
 * The packed varint column in buf[start:end], typed as wire.py's Python path types it: every
 * value one byte -> "B" ("b" for zigzag); else int64 -> "q"; else the narrowest of H/I/Q
 * (h/i/q for zigzag) that holds them all. ``highest``: the largest value (for index bounds).
 * None: a value the Python path must decode (one its field type truncates, a negative enum). */
static PyObject *
column(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t start, end;
    int kind;
    if (!PyArg_ParseTuple(args, "y*nni", &view, &start, &end, &kind))
        return NULL;
    PyObject *result = NULL;
    uint64_t *raw = NULL;
    char *packed = NULL;
    if (start < 0 || end > view.len || start > end || kind < K_UINT32 || kind > K_ENUM) {
        odd();
        goto done;
    }
    const unsigned char *buf = view.buf;
    Py_ssize_t len = end - start, n = 0;
    raw = PyMem_Malloc((size_t)(len ? len : 1) * sizeof(uint64_t));
    if (raw == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int one_byte = 1;
    for (Py_ssize_t i = start; i < end;) {
        Py_ssize_t at = i;
        if (read_varint(buf, end, &i, &raw[n]) < 0) {
            odd();
            goto done;
        }
        if (i - at > 1)
            one_byte = 0;
        n++;
    }
    char code;
    int64_t lo = 0, hi = 0; /* signed kinds */
    uint64_t uhi = 0;        /* unsigned kinds */
    if (kind == K_SINT32) {
        for (Py_ssize_t k = 0; k < n; k++) {
            if (raw[k] > 0xFFFFFFFFull) { /* protobuf would truncate: the Python path decides */
                result = Py_NewRef(Py_None);
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
                result = Py_NewRef(Py_None);
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
    PyObject *array = PyObject_CallFunction(array_type, "Cy#", (int)code, packed, (Py_ssize_t)(n * (Py_ssize_t)width));
    if (array == NULL)
        goto done;
    PyObject *highest = kind == K_SINT32 || kind == K_INT64 ? PyLong_FromLongLong(hi)
                                                           : PyLong_FromUnsignedLongLong(uhi);
    if (highest == NULL) {
        Py_DECREF(array);
        goto done;
    }
    result = PyTuple_Pack(2, array, highest);
    Py_DECREF(array);
    Py_DECREF(highest);
done:
    PyMem_Free(raw);
    PyMem_Free(packed);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS, "walk(buf, start, end): the fields of buf[start:end]."},
    {"column", column, METH_VARARGS, "column(buf, start, end, kind): one packed column as a typed array."},
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
