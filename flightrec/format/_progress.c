/* The reporter's reading of every rank's progress record (progress.py) in C: the protobuf wire
 * format of ``Progress`` and ``progress._problem``'s checks, straight into ``ProgressRecord``s.
 *
 * Why C: at 131,072 ranks the reporter reads 131,072 records of about 90 bytes before it can
 * name anyone. protobuf's parser takes 0.16 s for them, but reading the parsed messages' fields
 * back from Python (the checks, then the first pass) took 1.2 s more; this file does both in
 * one pass over the bytes (benchmarks/bench_progress.py has the figures). progress.py defines
 * what it returns (``_read_py``: protobuf's parser, ``_problem``, ``record_of``); this file
 * returns exactly the same records and the same refusal texts, and
 * tests/unit/test_progress_decode.py compares the two on real and hostile bytes. Where this
 * extension is not built, progress.py runs the Python path: same results, slower.
 *
 * Faithful to protobuf's (upb's) parser: varints of up to ten bytes (bits beyond 64 dropped),
 * tags of up to five bytes and 32 bits, field number 0 and wire types 6 and 7 refused, unknown
 * fields and known fields of another wire type skipped (groups to a depth of 100), packed and
 * unpacked repeated numbers, the last value of a scalar kept, uint32 and sint32 cut to their
 * low 32 bits, and proto3 strings refused unless valid UTF-8.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define CAP 4096  /* records longer than MAX_BYTES (at most CAP) are refused before parsing */
#define MAX_DEPTH 100 /* groups nested in unknown fields, as protobuf's parser allows */

typedef struct {
    const unsigned char *p;
    Py_ssize_t n;
} Text;

/* A record as parsed (before the checks). Every repeated value takes at least one byte of a
 * record of at most CAP bytes, so no list can outgrow its array. */
typedef struct {
    uint64_t round, wait_seq;
    uint32_t rank, world_size, flags, wait_group, wait_flags, waited_ms;
    int32_t wait_peer;
    Text wait_op;
    int ngroup, nissued, npending, nsize;
    Text group[CAP];
    uint64_t issued[CAP], pending[CAP];
    uint32_t size[CAP];
} Parsed;

/* Limits, as progress.py defines them (``use``). */
static PyObject *record_type;
static Py_ssize_t max_bytes;
static long long max_groups, max_name, max_text, max_world;

static int
varint(const unsigned char *b, Py_ssize_t end, Py_ssize_t *i, uint64_t *out)
{
    uint64_t v = 0;
    for (int k = 0; k < 10; k++) {
        if (*i >= end)
            return -1;
        unsigned char c = b[(*i)++];
        v |= (uint64_t)(c & 0x7F) << (7 * k); /* (bits beyond 64 are dropped, as upb does) */
        if (!(c & 0x80)) {
            *out = v;
            return 0;
        }
    }
    return -1;
}

/* A tag: at most five bytes and 32 bits, field number not 0, wire type not 6 or 7. */
static int
tag(const unsigned char *b, Py_ssize_t end, Py_ssize_t *i, uint32_t *number, int *wire)
{
    Py_ssize_t at = *i;
    uint64_t v;
    if (varint(b, end, i, &v) < 0 || *i - at > 5 || v > UINT32_MAX)
        return -1;
    *number = (uint32_t)(v >> 3);
    *wire = (int)(v & 7);
    return (*number == 0 || *wire > 5) ? -1 : 0;
}

/* The length of a length-delimited field, checked against what is left. */
static int
length(const unsigned char *b, Py_ssize_t end, Py_ssize_t *i, Py_ssize_t *n)
{
    uint64_t v;
    if (varint(b, end, i, &v) < 0 || v >= INT32_MAX || (Py_ssize_t)v > end - *i)
        return -1;
    *n = (Py_ssize_t)v;
    return 0;
}

/* The value of one field of wire type ``wire`` after its tag: a varint, 8 or 4 bytes, or a
 * length and that many bytes. */
static int
value(const unsigned char *b, Py_ssize_t end, Py_ssize_t *i, int wire)
{
    uint64_t v;
    Py_ssize_t n = wire == 1 ? 8 : 4;
    if (wire == 0)
        return varint(b, end, i, &v);
    if (wire == 2 && length(b, end, i, &n) < 0)
        return -1;
    if (end - *i < n)
        return -1;
    *i += n;
    return 0;
}

/* Skip a field protobuf keeps as unknown: its value, or a group to its end (groups nested to
 * MAX_DEPTH, each closed by its own number). */
static int
skip(const unsigned char *b, Py_ssize_t end, Py_ssize_t *i, uint32_t number, int wire)
{
    uint32_t open[MAX_DEPTH];
    int depth = 0;
    while (1) {
        if (wire == 4) {
            if (depth == 0 || number != open[--depth])
                return -1; /* an end of group where none, or another one, is open */
        } else if (wire == 3) {
            if (depth == MAX_DEPTH)
                return -1;
            open[depth++] = number;
        } else if (value(b, end, i, wire) < 0)
            return -1;
        if (depth == 0)
            return 0;
        if (tag(b, end, i, &number, &wire) < 0)
            return -1;
    }
}

/* Characters of valid UTF-8 (no overlong forms, no surrogates, nothing beyond U+10FFFF); -1
 * for anything else (what a proto3 string field refuses). */
static Py_ssize_t
utf8_chars(const unsigned char *p, Py_ssize_t n)
{
    Py_ssize_t chars = 0, i = 0;
    while (i < n) {
        unsigned char c = p[i];
        chars++;
        if (c < 0x80) {
            i++;
            continue;
        }
        int more;
        unsigned char lo = 0x80, hi = 0xBF;
        if (c < 0xC2)
            return -1;
        if (c < 0xE0)
            more = 1;
        else if (c < 0xF0) {
            more = 2;
            if (c == 0xE0)
                lo = 0xA0;
            else if (c == 0xED)
                hi = 0x9F;
        } else if (c < 0xF5) {
            more = 3;
            if (c == 0xF0)
                lo = 0x90;
            else if (c == 0xF4)
                hi = 0x8F;
        } else
            return -1;
        if (n - i <= more || p[i + 1] < lo || p[i + 1] > hi)
            return -1;
        for (int k = 2; k <= more; k++)
            if ((p[i + k] & 0xC0) != 0x80)
                return -1;
        i += more + 1;
    }
    return chars;
}

static int
text(const unsigned char *b, Py_ssize_t end, Py_ssize_t *i, Text *out)
{
    Py_ssize_t n;
    if (length(b, end, i, &n) < 0 || utf8_chars(b + *i, n) < 0)
        return -1;
    out->p = b + *i;
    out->n = n;
    *i += n;
    return 0;
}

static int
append(uint64_t v, uint64_t *to, int *count, uint32_t *to32)
{
    if (*count >= CAP)
        return -1;
    if (to32 != NULL)
        to32[(*count)++] = (uint32_t)v; /* (a uint32 keeps the low 32 bits, as protobuf does) */
    else
        to[(*count)++] = v;
    return 0;
}

/* Append a packed (wire type 2) or single (0) value to a repeated number (``to``, or ``to32``
 * for a uint32 one). A packed varint must end within its field. */
static int
numbers(const unsigned char *b, Py_ssize_t end, Py_ssize_t *i, int wire, uint64_t *to, int *count,
        uint32_t *to32)
{
    uint64_t v;
    Py_ssize_t n;
    if (wire == 0)
        return (varint(b, end, i, &v) < 0) ? -1 : append(v, to, count, to32);
    if (length(b, end, i, &n) < 0)
        return -1;
    Py_ssize_t stop = *i + n;
    while (*i < stop)
        if (varint(b, stop, i, &v) < 0 || append(v, to, count, to32) < 0)
            return -1;
    return 0;
}

/* Parse ``b[0:end]`` into ``r`` as protobuf parses a ``Progress``; -1 where it refuses it. */
static int
parse(const unsigned char *b, Py_ssize_t end, Parsed *r)
{
    Py_ssize_t i = 0;
    memset(r, 0, offsetof(Parsed, group));
    while (i < end) {
        uint32_t number;
        int wire;
        uint64_t v;
        if (tag(b, end, &i, &number, &wire) < 0)
            return -1;
        int ok = 0;
        if (wire == 0 && number != 5 && number != 9 && number <= 14) {
            if (number == 6)
                ok = numbers(b, end, &i, 0, r->issued, &r->nissued, NULL);
            else if (number == 7)
                ok = numbers(b, end, &i, 0, r->pending, &r->npending, NULL);
            else if (number == 14)
                ok = numbers(b, end, &i, 0, NULL, &r->nsize, r->size);
            else {
                if (varint(b, end, &i, &v) < 0)
                    return -1;
                uint32_t low = (uint32_t)v;
                switch (number) {
                case 1: r->round = v; break;
                case 2: r->rank = low; break;
                case 3: r->world_size = low; break;
                case 4: r->flags = low; break;
                case 8: r->wait_group = low; break;
                case 10: r->wait_seq = v; break;
                case 11: r->wait_peer = (int32_t)((low >> 1) ^ (0u - (low & 1))); break;
                case 12: r->wait_flags = low; break;
                case 13: r->waited_ms = low; break;
                }
            }
        } else if (wire == 2 && number == 5) {
            if (r->ngroup >= CAP)
                return -1;
            ok = text(b, end, &i, &r->group[r->ngroup++]);
        } else if (wire == 2 && number == 9)
            ok = text(b, end, &i, &r->wait_op);
        else if (wire == 2 && number == 6)
            ok = numbers(b, end, &i, 2, r->issued, &r->nissued, NULL);
        else if (wire == 2 && number == 7)
            ok = numbers(b, end, &i, 2, r->pending, &r->npending, NULL);
        else if (wire == 2 && number == 14)
            ok = numbers(b, end, &i, 2, NULL, &r->nsize, r->size);
        else
            ok = skip(b, end, &i, number, wire); /* unknown, or a known field's other wire type */
        if (ok < 0)
            return -1;
    }
    return 0;
}

/* ``progress._problem``: why the record is refused, or NULL with no error set where it is
 * not (NULL with an error set: out of memory). */
static PyObject *
problem(const Parsed *r, long long rank, long long world)
{
    int n = r->ngroup;
    if ((long long)r->rank != rank)
        return PyUnicode_FromFormat("says it is rank %u", (unsigned)r->rank);
    if ((long long)r->world_size != world || world > max_world)
        return PyUnicode_FromFormat("says the world has %u ranks, not %lld",
                                    (unsigned)r->world_size, world);
    if (n > max_groups || r->nissued != n || r->npending != n || r->nsize != n)
        return PyUnicode_FromString("its group columns disagree");
    if ((long long)r->wait_group > n)
        return PyUnicode_FromString("waits in a group it does not list");
    if (!(-1 <= (long long)r->wait_peer && (long long)r->wait_peer < world))
        return PyUnicode_FromString("waits on a peer outside the world");
    for (int k = 0; k < n; k++)
        if ((long long)r->size[k] > world)
            return PyUnicode_FromString("a group larger than the world");
    int long_text = utf8_chars(r->wait_op.p, r->wait_op.n) > max_text;
    for (int k = 0; k < n && !long_text; k++)
        long_text = utf8_chars(r->group[k].p, r->group[k].n) > max_name;
    if (long_text)
        return PyUnicode_FromString("a text longer than a progress record keeps");
    return NULL;
}

static PyObject *
u64_tuple(const uint64_t *v, int n)
{
    PyObject *t = PyTuple_New(n);
    for (int k = 0; t != NULL && k < n; k++) {
        PyObject *x = PyLong_FromUnsignedLongLong(v[k]);
        if (x == NULL)
            Py_CLEAR(t);
        else
            PyTuple_SET_ITEM(t, k, x);
    }
    return t;
}

/* The ProgressRecord of a checked record (progress.py's NamedTuple, filled as a tuple). */
static PyObject *
record(const Parsed *r)
{
    PyObject *out = ((PyTypeObject *)record_type)->tp_alloc((PyTypeObject *)record_type, 14);
    if (out == NULL)
        return NULL;
    PyObject *group = PyTuple_New(r->ngroup);
    for (int k = 0; group != NULL && k < r->ngroup; k++) {
        PyObject *name = PyUnicode_DecodeUTF8((const char *)r->group[k].p, r->group[k].n, NULL);
        if (name == NULL)
            Py_CLEAR(group);
        else
            PyTuple_SET_ITEM(group, k, name);
    }
    PyObject *size = PyTuple_New(r->nsize);
    for (int k = 0; size != NULL && k < r->nsize; k++) {
        PyObject *x = PyLong_FromUnsignedLong(r->size[k]);
        if (x == NULL)
            Py_CLEAR(size);
        else
            PyTuple_SET_ITEM(size, k, x);
    }
    PyObject *items[14] = {
        PyLong_FromUnsignedLongLong(r->round),
        PyLong_FromUnsignedLong(r->rank),
        PyLong_FromUnsignedLong(r->world_size),
        PyLong_FromUnsignedLong(r->flags),
        group,
        u64_tuple(r->issued, r->nissued),
        u64_tuple(r->pending, r->npending),
        PyLong_FromUnsignedLong(r->wait_group),
        PyUnicode_DecodeUTF8((const char *)r->wait_op.p, r->wait_op.n, NULL),
        PyLong_FromUnsignedLongLong(r->wait_seq),
        PyLong_FromLong(r->wait_peer),
        PyLong_FromUnsignedLong(r->wait_flags),
        PyLong_FromUnsignedLong(r->waited_ms),
        size,
    };
    int failed = 0;
    for (int k = 0; k < 14; k++) {
        failed |= items[k] == NULL;
        PyTuple_SET_ITEM(out, k, items[k]); /* (NULL where one failed: the tuple frees the rest) */
    }
    if (failed) {
        Py_CLEAR(out);
        return NULL;
    }
    /* Numbers and strings only: no cycle can pass through a record, so the collector need not
     * walk 131,072 of them at every pass (as it stops walking such tuples once it has seen them). */
    PyObject_GC_UnTrack(group); /* (an empty tuple is untracked already) */
    PyObject_GC_UnTrack(items[5]);
    PyObject_GC_UnTrack(items[6]);
    PyObject_GC_UnTrack(size);
    PyObject_GC_UnTrack(out);
    return out;
}

/* The record in ``data``, or why it is refused (a str). */
static PyObject *
read_one(PyObject *data, long long rank, long long world, Parsed *r)
{
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *out;
    if (view.len > max_bytes)
        out = PyUnicode_FromFormat("%zd bytes, more than the %zd a progress record may have",
                                   view.len, max_bytes);
    else if (parse(view.buf, view.len, r) < 0)
        out = PyUnicode_FromString("not a flightrec progress record (unparseable)");
    else {
        out = problem(r, rank, world);
        if (out == NULL && !PyErr_Occurred())
            out = record(r);
    }
    PyBuffer_Release(&view);
    return out;
}

static Parsed *
scratch(void)
{
    Parsed *r = PyMem_Malloc(sizeof(Parsed));
    if (r == NULL)
        PyErr_NoMemory();
    return r;
}

/* use(record_type, max_bytes, max_groups, max_name, max_text, max_world) */
static PyObject *
use(PyObject *self, PyObject *args)
{
    PyObject *type;
    Py_ssize_t bytes;
    long long groups, name, text_, world;
    if (!PyArg_ParseTuple(args, "O!nLLLL", &PyType_Type, &type, &bytes, &groups, &name, &text_,
                          &world))
        return NULL;
    PyTypeObject *t = (PyTypeObject *)type;
    if (!PyType_IsSubtype(t, &PyTuple_Type) || t->tp_basicsize != PyTuple_Type.tp_basicsize ||
        t->tp_itemsize != PyTuple_Type.tp_itemsize) {
        PyErr_SetString(PyExc_TypeError, "the record type must be a plain tuple subclass");
        return NULL;
    }
    if (bytes < 0 || bytes > CAP) {
        PyErr_SetString(PyExc_ValueError, "records longer than this extension reads");
        return NULL;
    }
    Py_INCREF(type);
    Py_XSETREF(record_type, type);
    max_bytes = bytes;
    max_groups = groups;
    max_name = name;
    max_text = text_;
    max_world = world;
    Py_RETURN_NONE;
}

static int
ready(void)
{
    if (record_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_progress.use() was not called");
        return -1;
    }
    return 0;
}

/* decode(data, rank, world_size) -> ProgressRecord | str */
static PyObject *
decode(PyObject *self, PyObject *args)
{
    PyObject *data;
    long long rank, world;
    if (!PyArg_ParseTuple(args, "OLL", &data, &rank, &world) || ready() < 0)
        return NULL;
    Parsed *r = scratch();
    if (r == NULL)
        return NULL;
    PyObject *out = read_one(data, rank, world, r);
    PyMem_Free(r);
    return out;
}

/* decode_into(raw: dict[int, bytes], world_size, into: dict) -> None:
 * into[rank] = (data, decode(data, rank, world_size)) */
static PyObject *
decode_into(PyObject *self, PyObject *args)
{
    PyObject *raw, *into;
    long long world;
    if (!PyArg_ParseTuple(args, "O!LO!", &PyDict_Type, &raw, &world, &PyDict_Type, &into) ||
        ready() < 0)
        return NULL;
    Parsed *r = scratch();
    if (r == NULL)
        return NULL;
    Py_ssize_t pos = 0;
    PyObject *key, *data;
    int failed = 0;
    while (!failed && PyDict_Next(raw, &pos, &key, &data)) {
        long long rank = PyLong_AsLongLong(key);
        PyObject *got = (rank == -1 && PyErr_Occurred()) ? NULL : read_one(data, rank, world, r);
        PyObject *pair = got == NULL ? NULL : PyTuple_Pack(2, data, got);
        Py_XDECREF(got);
        if (pair != NULL)
            PyObject_GC_UnTrack(pair); /* (bytes and a record or a str: no cycle) */
        failed = pair == NULL || PyDict_SetItem(into, key, pair) < 0;
        Py_XDECREF(pair);
    }
    PyMem_Free(r);
    if (failed)
        return NULL;
    Py_RETURN_NONE;
}

/* by_group(records: dict[int, ProgressRecord]) -> {name: ([rank], [issued])}: progress.py's
 * ``_by_group_py``, the records' group columns turned group-major. */
static PyObject *
by_group(PyObject *self, PyObject *args)
{
    PyObject *records;
    if (!PyArg_ParseTuple(args, "O!", &PyDict_Type, &records))
        return NULL;
    PyObject *out = PyDict_New();
    Py_ssize_t pos = 0;
    PyObject *rank, *rec;
    while (out != NULL && PyDict_Next(records, &pos, &rank, &rec)) {
        if (!PyTuple_Check(rec) || PyTuple_GET_SIZE(rec) != 14 ||
            !PyTuple_Check(PyTuple_GET_ITEM(rec, 4)) || !PyTuple_Check(PyTuple_GET_ITEM(rec, 5)) ||
            PyTuple_GET_SIZE(PyTuple_GET_ITEM(rec, 4)) != PyTuple_GET_SIZE(PyTuple_GET_ITEM(rec, 5))) {
            PyErr_SetString(PyExc_TypeError, "by_group takes ProgressRecords");
            Py_CLEAR(out);
            break;
        }
        PyObject *names = PyTuple_GET_ITEM(rec, 4), *issued = PyTuple_GET_ITEM(rec, 5);
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(names); k++) {
            PyObject *name = PyTuple_GET_ITEM(names, k);
            PyObject *col = PyDict_GetItemWithError(out, name);
            if (col == NULL) {
                col = PyErr_Occurred() ? NULL : Py_BuildValue("([][])");
                if (col == NULL || PyDict_SetItem(out, name, col) < 0) {
                    Py_XDECREF(col);
                    Py_CLEAR(out);
                    break;
                }
                Py_DECREF(col); /* (the dict holds it) */
            }
            if (PyList_Append(PyTuple_GET_ITEM(col, 0), rank) < 0 ||
                PyList_Append(PyTuple_GET_ITEM(col, 1), PyTuple_GET_ITEM(issued, k)) < 0) {
                Py_CLEAR(out);
                break;
            }
        }
    }
    return out;
}

static PyMethodDef methods[] = {
    {"use", use, METH_VARARGS,
     "use(record_type, max_bytes, max_groups, max_name, max_text, max_world): the record type "
     "and the limits of progress.py."},
    {"decode", decode, METH_VARARGS,
     "decode(data, rank, world_size): the record, or why it is refused."},
    {"decode_into", decode_into, METH_VARARGS,
     "decode_into(raw, world_size, into): into[rank] = (data, decode(data, rank, world_size))."},
    {"by_group", by_group, METH_VARARGS,
     "by_group(records): per group name, the ranks listing it and what each issued."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef progressmodule = {
    PyModuleDef_HEAD_INIT, "_progress", "The reporter's progress-record reader in C (optional).",
    -1, methods,
};

PyMODINIT_FUNC
PyInit__progress(void)
{
    return PyModule_Create(&progressmodule);
}
