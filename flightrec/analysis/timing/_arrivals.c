/* The straggler pass's per-group work in C: each member's newest completed collectives (a
 * lane), their arrivals on the group anchor's clock, and who arrived last at each.
 *
 * Why C: the pass looks at every member of every group, 64 collectives each: 262,144 lanes
 * of a 131,072-rank job (tp=8, pp=8). In Python that is about 60 us per lane, 17 s of the
 * analysis (benchmarks/bench_scale.py), one integer object per time and a sort per
 * collective; here it is a few hundred nanoseconds.
 *
 * What it computes is defined in Python, which stays the reference and the fallback where
 * this extension is not built (flightrec/analysis/timing/lastarrivals.py: ``tally_py``, composed of
 * ``clocks.lane``, ``clocks.align_lanes`` and ``lastarrivals.last_arrivals``). Every integer
 * step is done in integers and every floating-point step in the same IEEE operations, in the
 * same order, so the two return the same values, which
 * tests/unit/test_lastarrivals.py checks on arbitrary groups. Times (with their host's
 * anchor added) must lie in [0, 2**61); outside that, ``tally`` answers None and the Python
 * path runs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAD_SIGMA 1.4826
#define STABLE_NS 1000000.0
#define MIN_LINK_SAMPLES 3
#define TIME_LIMIT ((int64_t)1 << 61)

/* One integer column (array.array or any buffer of one integer type), read as int64. */
typedef struct {
    Py_buffer view;
    char code;
    int held;
} Col;

static int
col_open(PyObject *obj, Col *c)
{
    c->held = 0;
    if (PyObject_GetBuffer(obj, &c->view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    c->held = 1;
    const char *f = c->view.format ? c->view.format : "B";
    if (*f == '@' || *f == '=')
        f++;
    c->code = f[0];
    int ok = f[1] == '\0';
    switch (c->code) {
    case 'b': case 'B': ok = ok && c->view.itemsize == 1; break;
    case 'h': case 'H': ok = ok && c->view.itemsize == 2; break;
    case 'i': case 'I': ok = ok && c->view.itemsize == (Py_ssize_t)sizeof(int); break;
    case 'l': case 'L': ok = ok && c->view.itemsize == (Py_ssize_t)sizeof(long); break;
    case 'q': case 'Q': ok = ok && c->view.itemsize == 8; break;
    default: ok = 0;
    }
    if (!ok) {
        PyErr_SetString(PyExc_TypeError, "expected a buffer of one integer type");
        return -1;
    }
    return 0;
}

static void
col_close(Col *c)
{
    if (c->held)
        PyBuffer_Release(&c->view);
    c->held = 0;
}

static inline Py_ssize_t
col_len(const Col *c)
{
    return c->view.len / c->view.itemsize;
}

/* Element k as int64; *big set where an unsigned value does not fit. */
static inline int64_t
col_at(const Col *c, Py_ssize_t k, int *big)
{
    const char *p = (const char *)c->view.buf;
    switch (c->code) {
    case 'b': return ((const signed char *)p)[k];
    case 'B': return ((const unsigned char *)p)[k];
    case 'h': return ((const short *)p)[k];
    case 'H': return ((const unsigned short *)p)[k];
    case 'i': return ((const int *)p)[k];
    case 'I': return ((const unsigned int *)p)[k];
    case 'l': return ((const long *)p)[k];
    case 'L': {
        unsigned long v = ((const unsigned long *)p)[k];
        if (v > (unsigned long)INT64_MAX)
            *big = 1;
        return (int64_t)v;
    }
    case 'q': return ((const long long *)p)[k];
    default: {
        unsigned long long v = ((const unsigned long long *)p)[k];
        if (v > (unsigned long long)INT64_MAX)
            *big = 1;
        return (int64_t)v;
    }
    }
}

/* One member's lane: its usable entries of the window, newest per seq, increasing seqs. */
typedef struct {
    Py_ssize_t n;
    int64_t *seq, *pos, *enq, *comp;
} Lane;

/* Python's median of sorted values, as _median_sorted returns it for integers: the middle
 * value, or the true quotient of the two middle ones. *integral says which. */
static double
median_i64(const int64_t *v, Py_ssize_t n, int64_t *as_int, int *integral)
{
    if (n % 2) {
        *integral = 1;
        *as_int = v[n / 2];
        return (double)v[n / 2];
    }
    *integral = 0;
    /* (a + b) fits: every value lies within (-2**62, 2**62) here. */
    return (double)(v[n / 2 - 1] + v[n / 2]) / 2.0;
}

static int
cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int
cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static int
cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* clocks._sigma of n integers: 1.4826 x the median absolute deviation from their median.
 * scratch holds 2n int64 (or n doubles) of room. */
static double
sigma_i64(const int64_t *values, Py_ssize_t n, int64_t *scratch)
{
    if (n < 2)
        return 0.0;
    int64_t *sorted = scratch;
    memcpy(sorted, values, (size_t)n * sizeof(int64_t));
    qsort(sorted, (size_t)n, sizeof(int64_t), cmp_i64);
    int64_t mid_i;
    int integral;
    double mid = median_i64(sorted, n, &mid_i, &integral);
    if (integral) {
        /* |v - mid| in integers, as Python's int arithmetic. */
        uint64_t *dev = (uint64_t *)(scratch + n);
        for (Py_ssize_t k = 0; k < n; k++) {
            int64_t d = values[k] - mid_i;
            dev[k] = d < 0 ? (uint64_t)0 - (uint64_t)d : (uint64_t)d;
        }
        qsort(dev, (size_t)n, sizeof(uint64_t), cmp_u64);
        double med = n % 2 ? (double)dev[n / 2] : (double)(dev[n / 2 - 1] + dev[n / 2]) / 2.0;
        return MAD_SIGMA * med;
    }
    /* A fractional median: int - float is float(int) - float in Python. */
    double *dev = (double *)(scratch + n);
    for (Py_ssize_t k = 0; k < n; k++)
        dev[k] = fabs((double)values[k] - mid);
    qsort(dev, (size_t)n, sizeof(double), cmp_dbl);
    double med = n % 2 ? dev[n / 2] : (dev[n / 2 - 1] + dev[n / 2]) / 2;
    return MAD_SIGMA * med;
}

/* clocks.jitter_ns of one member's completion differences. */
static double
jitter(const int64_t *diffs, Py_ssize_t n, int64_t *scratch)
{
    if (n - 1 < 2)
        return 0.0;
    int64_t *steps = scratch;
    for (Py_ssize_t k = 0; k + 1 < n; k++)
        steps[k] = diffs[k + 1] - diffs[k];
    return sigma_i64(steps, n - 1, scratch + n) / sqrt(2.0);
}

/* Python's round(float) to an integer: half to even, as nearbyint in the default mode. */
static inline int64_t
round_even(double x)
{
    return (int64_t)nearbyint(x);
}

typedef struct {
    int64_t seq;
    Py_ssize_t at;
} SeqAt;

static int
cmp_seq_at(const void *a, const void *b)
{
    const SeqAt *x = a, *y = b;
    if (x->seq != y->seq)
        return (x->seq > y->seq) - (x->seq < y->seq);
    return (x->at > y->at) - (x->at < y->at);
}

/* The lane of one member (clocks.lane): returns 0, 1 when a time lies outside the range this
 * file computes in (the Python path then runs), -1 with an exception set. */
static int
build_lane(PyObject *spec, int64_t completed, Lane *lane, int64_t *store, SeqAt *order)
{
    PyObject *objs[6];
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 6) {
        PyErr_SetString(PyExc_TypeError, "a member is (enqueue, complete, state, positions, seqs, base)");
        return -1;
    }
    for (int k = 0; k < 6; k++)
        objs[k] = PyTuple_GET_ITEM(spec, k);
    long long base = PyLong_AsLongLong(objs[5]);
    if (base == -1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return -1;
        PyErr_Clear();
        return 1;
    }
    Col enq, comp, state, pos, seqs;
    Col *cols[5] = {&enq, &comp, &state, &pos, &seqs};
    int status = -1;
    for (int k = 0; k < 5; k++)
        cols[k]->held = 0;
    for (int k = 0; k < 5; k++)
        if (col_open(objs[k], cols[k]) < 0)
            goto done;
    Py_ssize_t w = col_len(&pos), entries = col_len(&state);
    if (col_len(&seqs) != w) {
        PyErr_SetString(PyExc_ValueError, "a window's positions and seqs differ in length");
        goto done;
    }
    if (col_len(&enq) != entries || col_len(&comp) != entries) {
        PyErr_SetString(PyExc_ValueError, "a dump's entry columns differ in length");
        goto done;
    }
    int big = 0;
    Py_ssize_t n = 0;
    int increasing = 1;
    lane->seq = store;
    lane->pos = store + w;
    lane->enq = store + 2 * w;
    lane->comp = store + 3 * w;
    for (Py_ssize_t k = 0; k < w; k++) {
        int64_t p = col_at(&pos, k, &big);
        if (p < 0 || p >= entries) {
            PyErr_SetString(PyExc_IndexError, "a window position lies beyond its ring");
            goto done;
        }
        int64_t e = col_at(&enq, p, &big), c = col_at(&comp, p, &big);
        if (col_at(&state, p, &big) != completed || e == 0 || c == 0)
            continue;
        /* base + time must lie in [0, 2**61) (each within 2**62, so the sum cannot overflow):
         * beyond, the Python path computes. */
        if (big || e <= -2 * TIME_LIMIT || e >= 2 * TIME_LIMIT || c <= -2 * TIME_LIMIT ||
            c >= 2 * TIME_LIMIT || base <= -2 * TIME_LIMIT || base >= 2 * TIME_LIMIT || base + e < 0 ||
            base + c < 0 || base + e >= TIME_LIMIT || base + c >= TIME_LIMIT) {
            status = 1;
            goto done;
        }
        int64_t s = col_at(&seqs, k, &big);
        if (big) {
            status = 1;
            goto done;
        }
        if (n && s <= lane->seq[n - 1])
            increasing = 0;
        lane->seq[n] = s;
        lane->pos[n] = p;
        lane->enq[n] = base + e;
        lane->comp[n] = base + c;
        n++;
    }
    if (!increasing) {
        /* The newest entry of each seq, in increasing seq order. */
        for (Py_ssize_t k = 0; k < n; k++) {
            order[k].seq = lane->seq[k];
            order[k].at = k;
        }
        qsort(order, (size_t)n, sizeof(SeqAt), cmp_seq_at);
        int64_t *tmp = store + 4 * w; /* room for 4 x n */
        Py_ssize_t m = 0;
        for (Py_ssize_t k = 0; k < n; k++) {
            if (k + 1 < n && order[k + 1].seq == order[k].seq)
                continue; /* an older entry of the same seq */
            Py_ssize_t a = order[k].at;
            tmp[m] = lane->seq[a];
            tmp[n + m] = lane->pos[a];
            tmp[2 * n + m] = lane->enq[a];
            tmp[3 * n + m] = lane->comp[a];
            m++;
        }
        memcpy(lane->seq, tmp, (size_t)m * sizeof(int64_t));
        memcpy(lane->pos, tmp + n, (size_t)m * sizeof(int64_t));
        memcpy(lane->enq, tmp + 2 * n, (size_t)m * sizeof(int64_t));
        memcpy(lane->comp, tmp + 3 * n, (size_t)m * sizeof(int64_t));
        n = m;
    }
    lane->n = n;
    status = 0;
done:
    for (int k = 0; k < 5; k++)
        col_close(cols[k]);
    return status;
}

static PyObject *
bytes_of(const int64_t *v, Py_ssize_t n)
{
    return PyBytes_FromStringAndSize((const char *)v, n * (Py_ssize_t)sizeof(int64_t));
}

/* tally(members, completed, floor_ns) -> None | False | (kept, seqs, arrivals, positions,
 *     diffs, lasts, late, spreads); see lastarrivals.tally_py. spreads: per member its
 *     jitter where the tally needed it, else None. */
static PyObject *
tally(PyObject *self, PyObject *args)
{
    PyObject *members;
    long long completed;
    double floor_ns;
    if (!PyArg_ParseTuple(args, "O!Ld", &PyList_Type, &members, &completed, &floor_ns))
        return NULL;
    Py_ssize_t count = PyList_GET_SIZE(members);
    PyObject *result = NULL;
    Lane *lanes = NULL;
    int64_t *store = NULL, *common = NULL, *scratch = NULL, *rows = NULL;
    Py_ssize_t *kept = NULL, *last_count = NULL;
    SeqAt *order = NULL;
    double *spread = NULL;
    unsigned char *spread_done = NULL;

    /* Room: per member its window (4 columns, and 4 more while deduplicating). */
    Py_ssize_t room = 0, widest = 0;
    for (Py_ssize_t j = 0; j < count; j++) {
        PyObject *spec = PyList_GET_ITEM(members, j);
        if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 6) {
            PyErr_SetString(PyExc_TypeError, "a member is (enqueue, complete, state, positions, seqs, base)");
            return NULL;
        }
        Py_ssize_t w = PyObject_Length(PyTuple_GET_ITEM(spec, 3));
        if (w < 0)
            return NULL;
        room += 4 * w;
        if (w > widest)
            widest = w;
    }
    lanes = PyMem_Calloc((size_t)(count ? count : 1), sizeof(Lane));
    store = PyMem_Malloc((size_t)(room + 4 * widest + 1) * sizeof(int64_t));
    order = PyMem_Malloc((size_t)(widest + 1) * sizeof(SeqAt));
    kept = PyMem_Malloc((size_t)(count + 1) * sizeof(Py_ssize_t));
    if (!lanes || !store || !order || !kept) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t k_count = 0, used = 0;
    for (Py_ssize_t j = 0; j < count; j++) {
        PyObject *spec = PyList_GET_ITEM(members, j);
        Py_ssize_t w = PyObject_Length(PyTuple_GET_ITEM(spec, 3));
        /* (the dedup's scratch lies past this member's columns: the next member's room, or
         * the spare 4 x widest at the end) */
        int got = build_lane(spec, completed, &lanes[k_count], store + used, order);
        if (got < 0)
            goto done;
        if (got > 0) {
            result = Py_NewRef(Py_False);
            goto done;
        }
        used += 4 * w;
        if (lanes[k_count].n) {
            kept[k_count] = j;
            k_count++;
        }
    }
    if (k_count < 2) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    /* Seqs every lane holds (each lane's seqs increase). */
    common = PyMem_Malloc((size_t)lanes[0].n * sizeof(int64_t));
    if (!common) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t S = lanes[0].n;
    memcpy(common, lanes[0].seq, (size_t)S * sizeof(int64_t));
    for (Py_ssize_t j = 1; j < k_count && S; j++) {
        const Lane *l = &lanes[j];
        Py_ssize_t a = 0, b = 0, m = 0;
        while (a < S && b < l->n) {
            if (common[a] < l->seq[b])
                a++;
            else if (common[a] > l->seq[b])
                b++;
            else {
                common[m++] = common[a];
                a++;
                b++;
            }
        }
        S = m;
    }
    if (S < MIN_LINK_SAMPLES) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    Py_ssize_t K = k_count;
    /* rows: arrivals, positions, diffs, completions, K x S each. */
    rows = PyMem_Malloc((size_t)(4 * K * S) * sizeof(int64_t));
    scratch = PyMem_Malloc((size_t)(4 * S + 4) * sizeof(int64_t));
    spread = PyMem_Malloc((size_t)K * sizeof(double));
    spread_done = PyMem_Calloc((size_t)K, 1);
    last_count = PyMem_Calloc((size_t)K, sizeof(Py_ssize_t));
    if (!rows || !scratch || !spread || !spread_done || !last_count) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t *arr = rows, *posr = rows + K * S, *diff = rows + 2 * K * S, *compr = rows + 3 * K * S;
    for (Py_ssize_t j = 0; j < K; j++) {
        const Lane *l = &lanes[j];
        Py_ssize_t b = 0;
        for (Py_ssize_t a = 0; a < S; a++) {
            while (l->seq[b] != common[a])
                b++;
            posr[j * S + a] = l->pos[b];
            arr[j * S + a] = l->enq[b]; /* shifted below */
            compr[j * S + a] = l->comp[b];
        }
    }
    const int64_t *ref = compr; /* the anchor: the lowest rank */
    for (Py_ssize_t j = 0; j < K; j++) {
        int64_t *d = diff + j * S, *a = arr + j * S;
        const int64_t *c = compr + j * S;
        int64_t lo = 0, hi = 0;
        for (Py_ssize_t i = 0; i < S; i++) {
            d[i] = c[i] - ref[i];
            if (i == 0 || d[i] < lo)
                lo = d[i];
            if (i == 0 || d[i] > hi)
                hi = d[i];
        }
        int stable = MAD_SIGMA * (double)(hi - lo) < STABLE_NS || sigma_i64(d, S, scratch) < STABLE_NS;
        if (stable) {
            memcpy(scratch, d, (size_t)S * sizeof(int64_t));
            qsort(scratch, (size_t)S, sizeof(int64_t), cmp_i64);
            int64_t off_i;
            int integral;
            double off = median_i64(scratch, S, &off_i, &integral);
            if (off == floor(off)) {
                off_i = (int64_t)off; /* (exact: |off| < 2**62) */
                for (Py_ssize_t i = 0; i < S; i++)
                    a[i] -= off_i;
            } else {
                for (Py_ssize_t i = 0; i < S; i++)
                    a[i] = round_even((double)a[i] - off);
            }
        } else {
            /* Drifting clocks: each collective aligned on its own completion. */
            for (Py_ssize_t i = 0; i < S; i++)
                a[i] = round_even((double)a[i] - (double)d[i]);
        }
    }
    /* Who arrived last at each collective; ties go to the highest rank. */
    PyObject *late = PyList_New(0);
    if (!late)
        goto done;
    for (Py_ssize_t i = 0; i < S; i++) {
        Py_ssize_t jl = K - 1;
        int64_t a_last = arr[jl * S + i];
        for (Py_ssize_t j = K - 2; j >= 0; j--)
            if (arr[j * S + i] > a_last) {
                a_last = arr[j * S + i];
                jl = j;
            }
        Py_ssize_t js = -1;
        int64_t a_second = 0;
        for (Py_ssize_t j = K - 1; j >= 0; j--) {
            if (j == jl)
                continue;
            if (js < 0 || arr[j * S + i] > a_second) {
                a_second = arr[j * S + i];
                js = j;
            }
        }
        last_count[jl]++;
        int64_t margin = a_last - a_second;
        if ((long double)margin < (long double)floor_ns)
            continue;
        for (int t = 0; t < 2; t++) {
            Py_ssize_t j = t ? js : jl;
            if (!spread_done[j]) {
                spread[j] = jitter(diff + j * S, S, scratch);
                spread_done[j] = 1;
            }
        }
        double bound = 3.0 * pow(pow(spread[jl], 2.0) + pow(spread[js], 2.0), 0.5);
        if ((long double)margin < (long double)bound)
            continue;
        PyObject *item = Py_BuildValue("(nnL)", i, jl, (long long)margin);
        if (!item || PyList_Append(late, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(late);
            goto done;
        }
        Py_DECREF(item);
    }
    PyObject *kept_t = PyTuple_New(K), *seqs_t = PyTuple_New(S), *lasts = PyList_New(K);
    PyObject *spreads = PyList_New(K);
    PyObject *arr_b = bytes_of(arr, K * S), *pos_b = bytes_of(posr, K * S), *diff_b = bytes_of(diff, K * S);
    if (!kept_t || !seqs_t || !lasts || !spreads || !arr_b || !pos_b || !diff_b)
        goto built;
    for (Py_ssize_t j = 0; j < K; j++) {
        PyObject *v = PyLong_FromSsize_t(kept[j]), *c = PyLong_FromSsize_t(last_count[j]);
        PyObject *sp = spread_done[j] ? PyFloat_FromDouble(spread[j]) : Py_NewRef(Py_None);
        if (!v || !c || !sp) {
            Py_XDECREF(v);
            Py_XDECREF(c);
            Py_XDECREF(sp);
            goto built;
        }
        PyTuple_SET_ITEM(kept_t, j, v);
        PyList_SET_ITEM(lasts, j, c);
        PyList_SET_ITEM(spreads, j, sp);
    }
    for (Py_ssize_t i = 0; i < S; i++) {
        PyObject *v = PyLong_FromLongLong(common[i]);
        if (!v)
            goto built;
        PyTuple_SET_ITEM(seqs_t, i, v);
    }
    result = PyTuple_Pack(8, kept_t, seqs_t, arr_b, pos_b, diff_b, lasts, late, spreads);
built:
    Py_XDECREF(spreads);
    Py_XDECREF(kept_t);
    Py_XDECREF(seqs_t);
    Py_XDECREF(lasts);
    Py_XDECREF(arr_b);
    Py_XDECREF(pos_b);
    Py_XDECREF(diff_b);
    Py_DECREF(late);
done:
    PyMem_Free(lanes);
    PyMem_Free(store);
    PyMem_Free(order);
    PyMem_Free(kept);
    PyMem_Free(common);
    PyMem_Free(rows);
    PyMem_Free(scratch);
    PyMem_Free(spread);
    PyMem_Free(spread_done);
    PyMem_Free(last_count);
    return result;
}

static PyMethodDef methods[] = {
    {"tally", tally, METH_VARARGS,
     "tally(members, completed, floor_ns): one group's lanes aligned, and who arrived last."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef arrivalsmodule = {
    PyModuleDef_HEAD_INIT, "_arrivals", "The straggler pass's per-group loops in C (optional).", -1, methods,
};

PyMODINIT_FUNC
PyInit__arrivals(void)
{
    if (sizeof(long long) != 8) {
        PyErr_SetString(PyExc_ImportError, "long long is not 8 bytes here");
        return NULL;
    }
    return PyModule_Create(&arrivalsmodule);
}
