/* The recorder's hot path in C: one call before torch's function, one after.
 *
 * Why C: measured around a real gloo all_reduce, the generated Python hot path costs about
 * 14 µs more per call (benchmarks/bench_recorder.py), so the recording has to execute far
 * fewer instructions, not merely cheaper ones. ``enter`` and ``leave`` implement the contract
 * of the Python path (python.py: PyPath.enter/leave, where recording one call is defined,
 * over the HotState of state.py) for what repeats in training loops, collectives on single
 * tensors, on cache hits only: any miss, surprise or error returns -1 before anything is
 * consumed (no sequence number, no record id), and the generated wrapper takes the Python
 * path, which fills the caches. The Python path
 * stays the reference and the fallback when this extension is not built; one test suite runs
 * against both (tests/integration/test_recorder_fast.py, test_recorder_hooks.py).
 *
 * The slot is written last, in one go, with the GIL held and no Python code running in
 * between: like ``struct.pack_into``, a reader copying the buffer sees it before or after.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <structmember.h>
#include <string.h>
#include <time.h>

/* Hot and cold code. On a hit the C path runs a few hundred instructions, but spread over
 * more cache lines of code than it needs: torch's call around it (about 40K instructions)
 * evicts them from the instruction cache at every call, so each line the hit path touches is
 * a miss (callgrind's cache simulation counted some 60 to 80 per call in this file). Misses and
 * errors are therefore COLD functions or UNLIKELY branches, which the compiler lays out away
 * from the straight line of a hit. */
#if defined(__GNUC__)
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)
#define COLD __attribute__((cold, noinline))
#define COMPILER_BARRIER() __asm__ __volatile__("" ::: "memory")
#else
#define LIKELY(x) (x)
#define UNLIKELY(x) (x)
#define COLD
#define COMPILER_BARRIER() ((void)0)
#endif

/* The interpreter's own frames, read where their layout is known (CPython 3.11 to 3.14): the
 * Site's hot path tells its caller's code, instruction and parent frame apart without making
 * Python create a frame object for the caller (PyEval_GetFrame does, and frees it when the
 * caller returns: a fifth of the stack's cost). Elsewhere, and on any cache miss, the public
 * API (PyEval_GetFrame, PyFrame_GetBack) as before: a later Python (its frames are not known
 * yet) and free-threaded builds (frames read without the GIL's guarantees) decline here, by
 * version, at compile time; ``FRAME_WALK`` says which this build is. */
#if !defined(PYPY_VERSION) && !defined(Py_LIMITED_API) && !defined(Py_GIL_DISABLED) && \
    PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030F0000
#define FR_IFRAME 1
#define Py_BUILD_CORE 1
#if PY_VERSION_HEX >= 0x030E0000
/* 3.14 moved the frame's struct and accessors here; its code is a tagged reference
 * (_PyStackRef), which _PyFrame_GetCode unmasks. */
#include <internal/pycore_interpframe.h>
#else
#include <internal/pycore_frame.h>
#endif
#undef Py_BUILD_CORE
#else
#define FR_IFRAME 0
#endif

#if !PY_LITTLE_ENDIAN
#error "the ring's slots are little-endian; build without this extension on big-endian hosts"
#endif

/* Slot layout: ring.SLOT = struct.Struct("<QqqB3xQQIIIiIIIIIIQ") (92 bytes). */
#define SLOT_SIZE 92
#define OFF_RID 0
#define OFF_ENQ 8
#define OFF_COMPLETE 16
#define OFF_STATE 24
#define OFF_SEQ 28
#define OFF_P2P 36
#define OFF_GROUP 44
#define OFF_OP 48
#define OFF_RED 52
#define OFF_PEER 56
#define OFF_THREAD 60
#define OFF_STACK 64
#define OFF_IN 68
#define OFF_OUT 72
#define OFF_DEV 76
#define OFF_FLAGS 80
#define OFF_RID2 84
#define ENQUEUED 1
#define COMPLETED 3
#define FLAG_IS_P2P 8 /* EntryFlag IS_P2P: per-peer counters, the Python path's */
#define RED_CACHE 4

static PyObject *s_enabled, *s_specs, *s_shape, *s_dtype, *s_counter, *s_index,
    *s_gpu, *s_top, *s_top_lasti, *s_top_index, *s_ranks;

/* A thread's stack cache in C. The stack of a call is its caller's (code, offset) followed by
 * the stack of the caller's caller (``parent``); while ``parent`` is the same frame object,
 * paused at the same instruction, that rest is the same, so the stack index is known from the
 * caller's code and offset alone (the assumption StackTable's own cache makes at every level).
 * The caller itself is not held: in a training loop it is a new frame at every call (``step``
 * called from ``train``), and holding it would make CPython copy it out at every return.
 * ``parent`` is a strong reference, so its address cannot be reused while cached; the
 * watchdog's purge drops it once it has returned (``FastPath.purge``). */
#define TC_THREADS 4
#define SPEC_CACHE 4
#define RAW_DIMS 5   /* dimensions torch keeps inline in a TensorImpl (SizesAndStrides) */
#define RAW_KEYS 8   /* dispatch key sets checked against torch's getters */
#define RAW_DTYPES 256
#define RAW_SPAN 192 /* bytes of a TensorImpl the offsets may reach (layout.py: SPAN) */
#define TC_HEADS 8
typedef struct {
    PyCodeObject *code; /* kept alive by the StackTable, which interned it */
    int lasti;
    uint32_t index;
} TcHead;

typedef struct {
    PyObject *parent; /* strong reference (the thread's ident: FastPath.tc_ident) */
    int parent_lasti;
    int nheads, next_head;
    TcHead head[TC_HEADS]; /* code, offset and stack index side by side: one line per hit */
} TCache;

/* Where a plain torch.Tensor keeps its shape, dtype and dispatch keys, found by layout.py at
 * start-up by comparing torch's own answers on probe tensors with their memory (offsets from
 * the Python object to its at::Tensor, and from the TensorImpl to its dimension count and
 * inline sizes, its dtype's TypeMeta index and its DispatchKeySet). torch's ``shape`` and
 * ``dtype`` getters build a torch.Size and go through torch-function checks and an error
 * handler at every call: three quarters of the hot path's own instructions (callgrind).
 *
 * Reading the memory instead is used only where it must agree with the getters:
 *  - the tensor's type is exactly the calibrated one, whose ``shape`` and ``dtype`` getters
 *    are still torch's (checked again whenever the type's version tag moves);
 *  - its key set holds only allowed bits (a dense tensor on CPU or a GPU, autograd, autocast,
 *    conjugate or negative views: no sparse, nested, Python, functionalized or batched
 *    tensor, whose sizes may live elsewhere), and a tensor with that exact key set was read
 *    both ways and agreed (the first of each key set is checked against the getters; any
 *    disagreement turns this path off for good);
 *  - at most RAW_DIMS dimensions (the inline sizes), and a dtype index seen at calibration.
 * Anything else takes the getters, as before. */
typedef struct {
    /* What every read needs, together. */
    int on;
    int nseen;
    unsigned int version;              /* the type's version tag while its getters are torch's */
    int32_t off_impl, off_ndim, off_dtype, off_keys; /* set_layout checks their range */
    PyTypeObject *type;                /* strong reference */
    uint64_t seen[RAW_KEYS];           /* key sets read both ways and found to agree */
    /* For admitting a new key set, and re-arming after the type changed. */
    uint64_t allowed;
    getter shape_get, dtype_get;
    void *shape_closure, *dtype_closure;
    /* TypeMeta index -> torch.dtype, strong references: apart from the fields above, since a
     * read touches one entry of these 2 KB. */
    PyObject *dtypes[RAW_DTYPES];
} Layout;

/* -- Counter and Active: state the C and Python paths share, readable without objects ------
 *
 * ``Counter`` is itertools.count(1) that also exposes its last number (``value``): the group
 * sequence counters and the ring's record ids. Under the GIL ``next()`` is atomic, as with
 * itertools.count; the C path takes a number without creating an int object, and the last
 * number issued is the group's ``seq`` (no attribute to keep up to date on every call).
 *
 * ``Active`` is the reentrancy guard, a mapping from thread ident to the record id of the
 * call the thread is inside (``HotState.active``): a call made inside a recorded one (object
 * collectives call others) is not recorded, and dumps mark the threads inside a call. The C
 * path sets and clears it by ident, without int objects or hashing; the Python path and the
 * dumper use it as a dict. A handful of threads call collectives at once: a small array. */
typedef struct {
    PyObject_HEAD
    unsigned long long value; /* the last number issued; 0 before the first */
    /* None, or a callable returning the ProcessGroup's own last sequence number: where torch
     * numbers calls flightrec never sees, a group's numbers come from it (GroupInfo). */
    PyObject *source;
} Counter;

static PyObject *
Counter_next(Counter *self)
{
    return PyLong_FromUnsignedLongLong(++self->value);
}

static void
Counter_dealloc(Counter *self)
{
    Py_CLEAR(self->source);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
Counter_raise_to(Counter *self, PyObject *arg)
{
    unsigned long long n = PyLong_AsUnsignedLongLong(arg);
    if (n == (unsigned long long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    if (n > self->value) {
        self->value = n;
    }
    Py_RETURN_NONE;
}

static PyMethodDef Counter_methods[] = {
    {"raise_to", (PyCFunction)Counter_raise_to, METH_O,
     "raise_to(n): make n the last number issued, unless a higher one was."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Counter_members[] = {
    {"value", T_ULONGLONG, offsetof(Counter, value), READONLY,
     "The last number issued (0 before the first)."},
    {"source", T_OBJECT, offsetof(Counter, source), 0,
     "None, or a callable giving the ProcessGroup's last sequence number."},
    {NULL, 0, 0, 0, NULL},
};

/* The number a new call on the counter's group takes from its source: the ProcessGroup's last
 * number plus one. 0 where there is no source or it fails (the counter's own number then).
 * Runs Python code (a pybind11 method, about 0.1 us): only where a source is set. */
COLD static unsigned long long
counter_from_source(Counter *c)
{
    PyObject *r = PyObject_CallNoArgs(c->source);
    if (r == NULL) {
        PyErr_Clear();
        return 0;
    }
    unsigned long long n = PyLong_Check(r) ? PyLong_AsUnsignedLongLong(r) : 0;
    Py_DECREF(r);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return n + 1;
}

static PyTypeObject CounterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "flightrec.recorder.hotpath._fast.Counter",
    .tp_basicsize = sizeof(Counter),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Counter(): 1, 2, 3, ... like itertools.count(1); .value is the last one issued.",
    .tp_new = PyType_GenericNew,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)Counter_next,
    .tp_members = Counter_members,
    .tp_methods = Counter_methods,
    .tp_dealloc = (destructor)Counter_dealloc,
};

#define ACTIVE_INLINE 4
typedef struct {
    PyObject_HEAD
    Py_ssize_t n, cap;
    unsigned long *ident; /* ident_in, or heap memory once more threads are inside calls */
    long long *rid;
    /* The first few threads in the object itself: the hot path's guard reads one cache line
     * instead of three (the object and two arrays). */
    unsigned long ident_in[ACTIVE_INLINE];
    long long rid_in[ACTIVE_INLINE];
} Active;

static Py_ssize_t
active_find(Active *a, unsigned long ident)
{
    for (Py_ssize_t i = 0; i < a->n; i++) {
        if (a->ident[i] == ident) {
            return i;
        }
    }
    return -1;
}

/* Room for one more thread: the inline arrays first, then the heap. */
COLD static int
active_grow(Active *a)
{
    if (a->ident == NULL) {
        a->ident = a->ident_in;
        a->rid = a->rid_in;
        a->cap = ACTIVE_INLINE;
        return 0;
    }
    Py_ssize_t cap = a->cap * 2;
    unsigned long *idents = PyMem_Malloc(cap * sizeof *idents);
    long long *rids = PyMem_Malloc(cap * sizeof *rids);
    if (idents == NULL || rids == NULL) {
        PyMem_Free(idents);
        PyMem_Free(rids);
        PyErr_NoMemory();
        return -1;
    }
    memcpy(idents, a->ident, a->n * sizeof *idents);
    memcpy(rids, a->rid, a->n * sizeof *rids);
    if (a->ident != a->ident_in) {
        PyMem_Free(a->ident);
        PyMem_Free(a->rid);
    }
    a->ident = idents;
    a->rid = rids;
    a->cap = cap;
    return 0;
}

/* Set the thread's record id; its index in the arrays, or -1 (out of memory). */
static Py_ssize_t
active_put(Active *a, unsigned long ident, long long rid)
{
    Py_ssize_t i = active_find(a, ident);
    if (i < 0) {
        if (UNLIKELY(a->n == a->cap) && active_grow(a) < 0) {
            return -1;
        }
        i = a->n++;
        a->ident[i] = ident;
    }
    a->rid[i] = rid;
    return i;
}

static int
active_drop(Active *a, unsigned long ident)
{
    Py_ssize_t i = active_find(a, ident);
    if (i < 0) {
        return 0;
    }
    a->n--;
    a->ident[i] = a->ident[a->n];
    a->rid[i] = a->rid[a->n];
    return 1;
}

/* A key as a thread ident; -1 (no exception set) when it cannot be one. */
static int
active_key(PyObject *key, unsigned long *ident)
{
    if (!PyLong_Check(key)) {
        return -1;
    }
    *ident = PyLong_AsUnsignedLong(key);
    if (*ident == (unsigned long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    return 0;
}

static int
Active_contains(Active *self, PyObject *key)
{
    unsigned long ident;
    return active_key(key, &ident) == 0 && active_find(self, ident) >= 0;
}

static Py_ssize_t
Active_length(Active *self)
{
    return self->n;
}

static PyObject *
Active_getitem(Active *self, PyObject *key)
{
    unsigned long ident;
    Py_ssize_t i = active_key(key, &ident) == 0 ? active_find(self, ident) : -1;
    if (i < 0) {
        PyErr_SetObject(PyExc_KeyError, key);
        return NULL;
    }
    return PyLong_FromLongLong(self->rid[i]);
}

static int
Active_setitem(Active *self, PyObject *key, PyObject *value)
{
    unsigned long ident;
    if (active_key(key, &ident) < 0) {
        PyErr_SetString(PyExc_TypeError, "Active keys are thread idents");
        return -1;
    }
    if (value == NULL) {
        if (!active_drop(self, ident)) {
            PyErr_SetObject(PyExc_KeyError, key);
            return -1;
        }
        return 0;
    }
    long long rid = PyLong_AsLongLong(value);
    if (rid == -1 && PyErr_Occurred()) {
        return -1;
    }
    return active_put(self, ident, rid) < 0 ? -1 : 0;
}

static PyObject *
Active_pop(Active *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "pop() takes a key and an optional default");
        return NULL;
    }
    unsigned long ident;
    Py_ssize_t i = active_key(args[0], &ident) == 0 ? active_find(self, ident) : -1;
    if (i < 0) {
        if (nargs == 2) {
            Py_INCREF(args[1]);
            return args[1];
        }
        PyErr_SetObject(PyExc_KeyError, args[0]);
        return NULL;
    }
    PyObject *rid = PyLong_FromLongLong(self->rid[i]);
    if (rid != NULL) {
        active_drop(self, ident);
    }
    return rid;
}

static PyObject *
Active_keys(Active *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *out = PyList_New(self->n);
    for (Py_ssize_t i = 0; out != NULL && i < self->n; i++) {
        PyObject *k = PyLong_FromUnsignedLong(self->ident[i]);
        if (k == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, k);
    }
    return out;
}

static PyObject *
Active_items(Active *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *out = PyList_New(self->n);
    for (Py_ssize_t i = 0; out != NULL && i < self->n; i++) {
        PyObject *pair = Py_BuildValue("(kL)", self->ident[i], self->rid[i]);
        if (pair == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, pair);
    }
    return out;
}

static PyObject *
Active_iter(Active *self)
{
    PyObject *keys = Active_keys(self, NULL);
    if (keys == NULL) {
        return NULL;
    }
    PyObject *it = PyObject_GetIter(keys);
    Py_DECREF(keys);
    return it;
}

static void
Active_dealloc(Active *self)
{
    if (self->ident != self->ident_in) {
        PyMem_Free(self->ident);
        PyMem_Free(self->rid);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Active_methods[] = {
    {"pop", (PyCFunction)(void (*)(void))Active_pop, METH_FASTCALL,
     "pop(ident[, default]): remove a thread and return its record id."},
    {"keys", (PyCFunction)Active_keys, METH_NOARGS, "The thread idents inside a call."},
    {"items", (PyCFunction)Active_items, METH_NOARGS, "(thread ident, record id) pairs."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods Active_as_sequence = {
    .sq_contains = (objobjproc)Active_contains,
};

static PyMappingMethods Active_as_mapping = {
    .mp_length = (lenfunc)Active_length,
    .mp_subscript = (binaryfunc)Active_getitem,
    .mp_ass_subscript = (objobjargproc)Active_setitem,
};

static PyTypeObject ActiveType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "flightrec.recorder.hotpath._fast.Active",
    .tp_basicsize = sizeof(Active),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Active(): thread ident -> record id of the recorded call it is inside.",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)Active_dealloc,
    .tp_iter = (getiterfunc)Active_iter,
    .tp_as_sequence = &Active_as_sequence,
    .tp_as_mapping = &Active_as_mapping,
    .tp_methods = Active_methods,
};

/* One frame of a stack as the interpreter keeps it: its code and instruction offset. */
typedef struct {
    PyCodeObject *code; /* only compared; the StackTable keeps it alive */
    int lasti;
} WalkPair;

#define WT_SLOTS 256     /* stacks kept by their frames (a power of two) */
#define WT_PROBES 4      /* slots tried from a stack's hash */
#define WT_DEPTH_MAX 64  /* deeper stack settings are not kept this way */

/* One cached tensor spec (see spec_of): the fields a hit compares, then its answer. */
typedef struct {
    PyObject *specs; /* the group's specs dict (strong reference); NULL: unused */
    PyObject *dtype; /* strong reference */
    uint32_t sig, dev;
    int64_t ndim; /* -1: the shape does not fit (more than RAW_DIMS dimensions) */
    int64_t sizes[RAW_DIMS];
    PyObject *shape; /* a plain tuple (strong reference), for hits through the getters */
} SpecEntry;

/* The hot path's state. Fields a recorded call reads come first, packed: torch's call around
 * it (about 40K instructions) evicts them from the data cache at every call, so each cache
 * line they span is a miss per call (callgrind). Objects the Python path shares (Active, the
 * Counters, the ring) are reached through pointers; what only start-up, misses and dumps use
 * comes last. */
typedef struct {
    PyObject_HEAD
    /* HotState.enabled, pushed here by Recorder.enabled's setter (reading the attribute cost
     * a sixth of the path). */
    int enabled;
    int depth;
    char *ring; /* the ring's memory (buf.buf) */
    Py_ssize_t capacity, ring_len;
    Active *active;  /* thread ident -> record id (the reentrancy guard) */
    Counter *ids;    /* record ids (shared with the Python path) */
    /* The group argument that by_pg mapped to g_info, and by_pg's version tag then: while the
     * dict is unchanged (any insert, removal or clear changes the tag) the same group object
     * maps to the same info, without hashing the group and probing the dict (a tenth of the
     * C path). Only compared, never dereferenced: by_pg held the key when it was cached, and
     * dropping it changes the tag. */
    PyObject *by_pg; /* dict: group (or None) -> GroupInfo */
    const void *g_key;
    uint64_t g_version;
    int g_key_valid;
    uint32_t g_gen; /* moves whenever the fields below change (see do_enter) */
    /* The fields of the GroupInfo seen last (strong references): attribute lookups cost a
     * tenth of the C path, and a GroupInfo's specs, counter, ranks, index and backend never
     * change. Valid while by_pg still maps the call's group to that same object. */
    PyObject *g_specs, *g_ranks;
    Counter *g_counter;
    uint32_t g_index;
    int g_gpu;
    /* The thread name index of the thread seen last (``threads``' value for it), until the
     * recorder forgets thread names at a dump (``forget_threads``). 0: none cached. */
    unsigned long th_ident;
    uint32_t th_index;
    /* Reduce ops seen last, by identity: hashing a pybind11 enum member runs its Python-level
     * __hash__ (about 0.2 us, a tenth of the budget). The dict hit for an object never
     * changes (tables only grow), and the strong reference keeps the identity valid. */
    uint32_t red_idx[RED_CACHE];
    PyObject *red_obj[RED_CACHE];
    int sc_last; /* the spec cache's entry hit last, probed first */
    /* Stacks of the last few threads, keyed by the caller's caller (see stack_of): their
     * idents here, so that finding the calling thread's cache reads no line of its own. */
    unsigned long tc_ident[TC_THREADS]; /* 0: unused */
    /* Tensors' shape and dtype read from memory (its hot fields first, its dtype table last). */
    Layout raw;
    /* The last few tensor specs hit: (group specs dict, shape, dtype) -> (signature, device),
     * compared in C without building, hashing and looking up a key (see spec_of). */
    SpecEntry sc[SPEC_CACHE];
    TCache tc[TC_THREADS];
    int red_next, sc_next, tc_next;
    /* Stacks by their frames (see walk_hit): WT_SLOTS slots of a hash, a frame count, a
     * stack index and ``depth`` (code, offset) pairs; NULL where not kept. */
    uint64_t *wt_hash; /* 0: an empty slot */
    int32_t *wt_n;
    uint32_t *wt_index;
    WalkPair *wt_pairs;
    PyObject *raw_of; /* StackTable.raw(index) -> ((code, offset), ...), or NULL */
    unsigned long long walk_hits; /* calls whose stack walk_hit found */
    /* -- the rest: start-up, misses, dumps -- */
    PyObject *g_info; /* the GroupInfo whose fields g_* holds (strong reference) */
    PyObject *settle;  /* settle(rid, result, is_async, info): async and GPU completion */
    PyObject *fail;    /* fail(rid, exc): a recorded call raised */
    PyObject *threads; /* dict: thread ident -> thread name index */
    PyObject *tcaches; /* dict: thread ident -> stacks._ThreadCache */
    PyObject *reds;    /* dict: reduce op -> string index */
    PyObject *capture; /* StackTable.capture(frame, ident) -> int */
    Py_buffer buf;     /* the ring's buffer (bytearray or the black box's mmap) */
    int has_buf;
    /* The calling thread's ident as an int object, for the dict keys (one allocation per
     * thread switch instead of two per call). */
    unsigned long tid_ident;
    PyObject *tid_obj;
    /* The ``shape`` and ``dtype`` getters of the tensor type seen last, valid while the type
     * is unchanged (its version tag: assigning an attribute on it or a base changes it). */
    PyTypeObject *tt_type; /* strong reference */
    unsigned int tt_version;
    getter tt_shape, tt_dtype;
    void *tt_shape_closure, *tt_dtype_closure;
} FastPath;

static inline int64_t
now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* what time.monotonic_ns() reads */
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline void
put_u32(char *p, uint32_t v)
{
    memcpy(p, &v, 4);
}

static inline void
put_u64(char *p, uint64_t v)
{
    memcpy(p, &v, 8);
}

/* A dict value as a C long in [0, 2^32): the (signature, device) pair of a spec cache hit,
 * or a table index. Returns 0 on success, -1 when the value is not what the Python path
 * would have stored (then the caller falls back). */
static int
as_index(PyObject *v, uint32_t *out)
{
    if (!PyLong_CheckExact(v)) {
        return -1;
    }
    long x = PyLong_AsLong(v);
    if (x < 0 || x > 0xFFFFFFFFL) {
        PyErr_Clear();
        return -1;
    }
    *out = (uint32_t)x;
    return 0;
}

/* Cache ``info``'s fields the hot path reads (see FastPath.g_info). */
static int
group_fields(FastPath *self, PyObject *info)
{
    if (info == self->g_info) {
        return 0;
    }
    PyObject *specs = PyObject_GetAttr(info, s_specs);
    PyObject *counter = PyObject_GetAttr(info, s_counter);
    PyObject *ranks = PyObject_GetAttr(info, s_ranks);
    PyObject *index = PyObject_GetAttr(info, s_index);
    PyObject *gpu = PyObject_GetAttr(info, s_gpu);
    uint32_t idx = 0;
    int g = gpu == NULL ? -1 : PyObject_IsTrue(gpu);
    int ok = specs != NULL && PyDict_CheckExact(specs) && counter != NULL &&
             Py_IS_TYPE(counter, &CounterType) && ranks != NULL &&
             PyTuple_CheckExact(ranks) && index != NULL && as_index(index, &idx) == 0 && g >= 0;
    Py_XDECREF(index);
    Py_XDECREF(gpu);
    if (!ok) {
        Py_XDECREF(specs);
        Py_XDECREF(counter);
        Py_XDECREF(ranks);
        return -1;
    }
    self->g_gen++;
    Py_INCREF(info);
    Py_XSETREF(self->g_info, info);
    Py_XSETREF(self->g_specs, specs);
    Py_XSETREF(self->g_counter, (Counter *)counter);
    Py_XSETREF(self->g_ranks, ranks);
    self->g_index = idx;
    self->g_gpu = g;
    return 0;
}

/* by_pg's version tag (PEP 509; deprecated in 3.12 but kept up to date on every change through
 * 3.13); FR_DICT_VERSION is 0 where there is none, and every call looks the group up. */
#if PY_VERSION_HEX < 0x030E0000 && !defined(Py_LIMITED_API) && !defined(PYPY_VERSION)
#define FR_DICT_VERSION 1
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
static inline uint64_t
dict_version(PyObject *d)
{
    return ((PyDictObject *)d)->ma_version_tag;
}
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
#else
#define FR_DICT_VERSION 0
#endif

/* Cache the fields of the GroupInfo that by_pg maps ``group`` to: 0, or -1 (no exception
 * set) when there is none or it is not what the Python path stores. */
COLD static int
group_lookup(FastPath *self, PyObject *group)
{
    self->g_key_valid = 0;
    PyObject *info = PyDict_GetItemWithError(self->by_pg, group); /* borrowed */
    if (info == NULL || info == Py_None || group_fields(self, info) < 0) {
        PyErr_Clear();
        return -1;
    }
#if FR_DICT_VERSION
    self->g_key = (const void *)group;
    self->g_version = dict_version(self->by_pg);
    self->g_key_valid = 1;
#endif
    return 0;
}

/* The g_* fields hold ``group``'s GroupInfo: 0, or -1 where it has none (see group_lookup). */
static inline int
group_of(FastPath *self, PyObject *group)
{
#if FR_DICT_VERSION
    if (LIKELY(self->g_key_valid && self->g_key == (const void *)group &&
               self->g_version == dict_version(self->by_pg))) {
        return 0;
    }
#endif
    return group_lookup(self, group);
}

/* The calling thread's ident (threading.get_ident()), from its thread state: the interpreter
 * keeps it there, in a cache line it reads all the time, where pthread_self() reads one of
 * its own (about 4 data-cache misses a call, for two calls). */
static inline unsigned long
ident_of(PyThreadState *ts)
{
    unsigned long ident = ts->thread_id;
    return LIKELY(ident != 0) ? ident : PyThread_get_thread_ident();
}

static inline unsigned long
thread_ident(void)
{
    return ident_of(PyThreadState_Get());
}

/* The calling thread's ident as an int (new reference). */
static PyObject *
thread_id(FastPath *self)
{
    unsigned long ident = thread_ident();
    if (self->tid_obj == NULL || self->tid_ident != ident) {
        PyObject *obj = PyLong_FromUnsignedLong(ident);
        if (obj == NULL) {
            return NULL;
        }
        Py_XSETREF(self->tid_obj, obj);
        self->tid_ident = ident;
    }
    Py_INCREF(self->tid_obj);
    return self->tid_obj;
}

/* ``getattr(obj, name)`` for a data descriptor implemented in C (torch's ``Tensor.shape`` and
 * ``.dtype``): the getter itself, without the generic lookup around it. The same call
 * PyObject_GetAttr ends in, since a getset descriptor on the type wins over the instance
 * dict; anything else takes the generic path. */
static PyObject *
c_getattr(PyObject *obj, PyObject *name)
{
    PyTypeObject *type = Py_TYPE(obj);
    if (type->tp_getattro == PyObject_GenericGetAttr) {
        PyObject *descr = _PyType_Lookup(type, name); /* borrowed, from the type's cache */
        if (descr != NULL && Py_IS_TYPE(descr, &PyGetSetDescr_Type)) {
            PyGetSetDef *gs = ((PyGetSetDescrObject *)descr)->d_getset;
            if (gs->get != NULL) {
                return gs->get(obj, gs->closure);
            }
        }
    }
    return PyObject_GetAttr(obj, name);
}

/* The getter ``name`` resolves to on ``type`` (a getset descriptor, which wins over the
 * instance dict), or 0 where getattr does something else. */
static int
getset_of(PyTypeObject *type, PyObject *name, getter *get, void **closure)
{
    if (type->tp_getattro != PyObject_GenericGetAttr) {
        return 0;
    }
    PyObject *descr = _PyType_Lookup(type, name); /* borrowed */
    if (descr == NULL || !Py_IS_TYPE(descr, &PyGetSetDescr_Type)) {
        return 0;
    }
    PyGetSetDef *gs = ((PyGetSetDescrObject *)descr)->d_getset;
    if (gs->get == NULL) {
        return 0;
    }
    *get = gs->get;
    *closure = gs->closure;
    return 1;
}

/* Whether ``type`` has a valid version tag: one that changes whenever the type or a base is
 * modified, so that getters found once stay right while it does not move. CPython 3.11 and
 * 3.12 mark it with Py_TPFLAGS_VALID_VERSION_TAG; 3.13 no longer sets that flag (the tag
 * itself says it: 0 is never a valid one), which left this check false there and turned the
 * tensor-memory reader and the getter cache off on 3.13 and later. */
static inline int
valid_version_tag(PyTypeObject *type)
{
#if PY_VERSION_HEX < 0x030D0000
    if (!PyType_HasFeature(type, Py_TPFLAGS_VALID_VERSION_TAG)) {
        return 0;
    }
#endif
    return type->tp_version_tag != 0;
}

/* An attribute by name as a getter (its closure: the name), for types whose getters are not
 * kept (see shape_dtype_slow). */
static PyObject *
by_name(PyObject *obj, void *name)
{
    return c_getattr(obj, (PyObject *)name);
}

/* ``tensor.shape`` and ``tensor.dtype`` through the given getters (new references; 0, or -1
 * with an error). */
static inline int
read_shape_dtype(PyObject *tensor, getter gs, void *cs, getter gd, void *cd, PyObject **shape,
                 PyObject **dtype)
{
    *shape = gs(tensor, cs);
    if (UNLIKELY(*shape == NULL)) {
        return -1;
    }
    *dtype = gd(tensor, cd);
    if (UNLIKELY(*dtype == NULL)) {
        Py_CLEAR(*shape);
        return -1;
    }
    return 0;
}

/* ``tensor.shape`` and ``tensor.dtype`` (new references; 0, or -1 with an error).
 * The getters of the last tensor type are kept with the type's version tag, so a hit calls
 * them straight away; any other type takes c_getattr's path. */
COLD static int
shape_dtype_slow(FastPath *self, PyObject *tensor, PyObject **shape, PyObject **dtype)
{
    PyTypeObject *type = Py_TYPE(tensor);
    getter gs = NULL, gd = NULL;
    void *cs = NULL, *cd = NULL;
    /* _PyType_Lookup assigns the type a valid version tag where it can. */
    int ok = getset_of(type, s_shape, &gs, &cs) && getset_of(type, s_dtype, &gd, &cd) &&
             valid_version_tag(type);
    if (!ok) {
        return read_shape_dtype(tensor, by_name, s_shape, by_name, s_dtype, shape, dtype);
    }
    Py_INCREF(type);
    Py_XSETREF(self->tt_type, type);
    self->tt_version = type->tp_version_tag;
    self->tt_shape = gs;
    self->tt_shape_closure = cs;
    self->tt_dtype = gd;
    self->tt_dtype_closure = cd;
    return read_shape_dtype(tensor, gs, cs, gd, cd, shape, dtype);
}

static inline int
shape_dtype(FastPath *self, PyObject *tensor, PyObject **shape, PyObject **dtype)
{
    PyTypeObject *type = Py_TYPE(tensor);
    if (UNLIKELY(type != self->tt_type || type->tp_version_tag != self->tt_version ||
                 !valid_version_tag(type))) {
        return shape_dtype_slow(self, tensor, shape, dtype);
    }
    return read_shape_dtype(tensor, self->tt_shape, self->tt_shape_closure, self->tt_dtype,
                            self->tt_dtype_closure, shape, dtype);
}

/* Whether two shapes (tuples of exact ints) are equal, without calling into Python. */
static int
same_shape(PyObject *a, PyObject *b)
{
    Py_ssize_t n = PyTuple_GET_SIZE(a);
    if (PyTuple_GET_SIZE(b) != n) {
        return 0;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyTuple_GET_ITEM(a, i), *y = PyTuple_GET_ITEM(b, i);
        if (x == y) {
            continue; /* small ints are shared */
        }
        if (!PyLong_CheckExact(x) || !PyLong_CheckExact(y)) {
            return 0;
        }
        int overflow_x = 0, overflow_y = 0;
        long long vx = PyLong_AsLongLongAndOverflow(x, &overflow_x);
        long long vy = PyLong_AsLongLongAndOverflow(y, &overflow_y);
        if (overflow_x || overflow_y || vx != vy) {
            PyErr_Clear();
            return 0;
        }
    }
    return 1;
}

COLD static int spec_miss(FastPath *self, PyObject *specs, PyObject *shape, PyObject *dtype,
                          uint32_t *sig, uint32_t *dev);
static int spec_getters(FastPath *self, PyObject *tensor, uint32_t *sig, uint32_t *dev);

/* A shape tuple's sizes as C integers (its length), or -1 where it does not fit RAW_DIMS. */
static int64_t
c_sizes(PyObject *shape, int64_t *out)
{
    Py_ssize_t n = PyTuple_GET_SIZE(shape);
    if (n > RAW_DIMS) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyTuple_GET_ITEM(shape, i);
        int overflow = 0;
        out[i] = PyLong_CheckExact(x) ? PyLong_AsLongLongAndOverflow(x, &overflow) : -1;
        if (!PyLong_CheckExact(x) || overflow || (out[i] == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return -1;
        }
    }
    return n;
}

/* The inline sizes of TensorImpl ``impl`` (their count in ``ndim``) and its dtype (borrowed);
 * NULL where they cannot be read this way (more dimensions, a dtype not calibrated). */
static inline const int64_t *
raw_fields(const Layout *L, const char *impl, int64_t *ndim, PyObject **dtype)
{
    int64_t n;
    uint16_t d;
    memcpy(&n, impl + L->off_ndim, sizeof n);
    memcpy(&d, impl + L->off_dtype, sizeof d);
    if (UNLIKELY(n < 0 || n > RAW_DIMS || d >= RAW_DTYPES || L->dtypes[d] == NULL)) {
        return NULL;
    }
    *ndim = n;
    *dtype = L->dtypes[d];
    return (const int64_t *)(impl + L->off_ndim + 8);
}

/* The calibrated type's version tag moved (an attribute was set on it or a base): go on
 * reading its tensors only while ``shape`` and ``dtype`` are still torch's getters. */
COLD static int
raw_rearm(Layout *L, PyTypeObject *type)
{
    getter gs = NULL, gd = NULL;
    void *cs = NULL, *cd = NULL;
    if (!getset_of(type, s_shape, &gs, &cs) || !getset_of(type, s_dtype, &gd, &cd) ||
        gs != L->shape_get || gd != L->dtype_get || cs != L->shape_closure ||
        cd != L->dtype_closure || !valid_version_tag(type)) {
        return 0;
    }
    L->version = type->tp_version_tag;
    return 1;
}

/* A key set not seen yet: allowed bits only, and this tensor read both ways must agree. A
 * disagreement means the layout is not what calibration found: the path turns off. */
COLD static int
raw_admit(FastPath *self, PyObject *tensor, const char *impl, uint64_t keys)
{
    Layout *L = &self->raw;
    if ((keys & ~L->allowed) != 0 || L->nseen >= RAW_KEYS) {
        return 0;
    }
    int64_t n = 0;
    PyObject *raw_dtype = NULL, *shape, *dtype;
    const int64_t *sizes = raw_fields(L, impl, &n, &raw_dtype);
    if (sizes == NULL) {
        return 0; /* not readable this way (more dimensions): no judgement on the key set */
    }
    if (read_shape_dtype(tensor, L->shape_get, L->shape_closure, L->dtype_get,
                         L->dtype_closure, &shape, &dtype) < 0) {
        PyErr_Clear(); /* the getters' path raises it again */
        return 0;
    }
    int64_t got[RAW_DIMS];
    int agree = dtype == raw_dtype && PyTuple_Check(shape) && c_sizes(shape, got) == n &&
                memcmp(got, sizes, 8 * (size_t)n) == 0;
    Py_DECREF(shape);
    Py_DECREF(dtype);
    if (!agree) {
        L->on = 0;
        return 0;
    }
    /* The getters may have run Python code (a torch-function mode) and let another thread in,
     * which may have filled the slots or cleared the layout meanwhile. */
    if (!L->on || L->nseen >= RAW_KEYS) {
        return 0;
    }
    L->seen[L->nseen++] = keys;
    return 1;
}

/* The shape (dimension count and a pointer to the sizes) and dtype (borrowed) of ``tensor``
 * read from torch's objects: 1, or 0 where Layout's conditions do not hold (use the getters). */
static inline int
raw_read(FastPath *self, PyObject *tensor, int64_t *ndim, const int64_t **sizes,
         PyObject **dtype)
{
    Layout *L = &self->raw;
    PyTypeObject *type = Py_TYPE(tensor);
    if (UNLIKELY(!L->on || type != L->type)) {
        return 0;
    }
    if (UNLIKELY(type->tp_version_tag != L->version) && !raw_rearm(L, type)) {
        return 0;
    }
    const char *impl = *(const char *const *)((const char *)tensor + L->off_impl);
    if (UNLIKELY(impl == NULL)) {
        return 0;
    }
    uint64_t keys;
    memcpy(&keys, impl + L->off_keys, sizeof keys);
    int known = 0;
    for (int i = 0; i < L->nseen; i++) {
        if (L->seen[i] == keys) {
            known = 1;
            break;
        }
    }
    if (UNLIKELY(!known) && !raw_admit(self, tensor, impl, keys)) {
        return 0;
    }
    *sizes = raw_fields(L, impl, ndim, dtype);
    return *sizes != NULL;
}

/* Whether ``n`` sizes are equal (an inline loop: n is a dimension count, mostly 1 to 3, where
 * a call to memcmp costs more than the compare). */
static inline int
same_sizes(const int64_t *a, const int64_t *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        if (a[i] != b[i]) {
            return 0;
        }
    }
    return 1;
}

/* specs.get((tensor.shape, tensor.dtype)) -> (signature index, device index); -1 on a miss.
 * The last few hits are kept in C and compared by value (the shape is read at every call:
 * a tensor reshaped in place between two calls gets its new signature). */
static int
spec_of(FastPath *self, PyObject *specs, PyObject *tensor, uint32_t *sig, uint32_t *dev)
{
    int64_t n;
    const int64_t *sizes;
    PyObject *dtype;
    if (LIKELY(raw_read(self, tensor, &n, &sizes, &dtype))) {
        /* The entry hit last first: a loop over one tensor reads one entry's cache line. */
        for (int k = 0, i = self->sc_last; k < SPEC_CACHE; k++, i = (i + 1) % SPEC_CACHE) {
            const SpecEntry *e = &self->sc[i];
            if (e->specs == specs && e->dtype == dtype && e->ndim == n &&
                same_sizes(e->sizes, sizes, n)) {
                *sig = e->sig;
                *dev = e->dev;
                self->sc_last = i;
                return 0;
            }
        }
    }
    return spec_getters(self, tensor, sig, dev);
}

/* spec_of through torch's getters, which may run Python code (a subclass, a torch-function
 * mode): on the group cache's current specs dict, held meanwhile; do_enter's g_gen check
 * catches a cache that changed since the call began. */
static int
spec_getters(FastPath *self, PyObject *tensor, uint32_t *sig, uint32_t *dev)
{
    PyObject *shape, *dtype, *specs = self->g_specs;
    Py_INCREF(specs);
    int rc = -1;
    if (UNLIKELY(shape_dtype(self, tensor, &shape, &dtype) < 0)) {
        goto done;
    }
    if (UNLIKELY(!PyTuple_Check(shape))) {
        Py_DECREF(shape);
        Py_DECREF(dtype);
        goto done;
    }
    for (int i = 0; i < SPEC_CACHE; i++) {
        const SpecEntry *e = &self->sc[i];
        if (e->specs == specs && e->dtype == dtype && same_shape(e->shape, shape)) {
            *sig = e->sig;
            *dev = e->dev;
            Py_DECREF(shape);
            Py_DECREF(dtype);
            rc = 0;
            goto done;
        }
    }
    rc = spec_miss(self, specs, shape, dtype, sig, dev);
done:
    Py_DECREF(specs);
    return rc;
}

/* spec_of's miss: the group's dict, then a place in the C cache. Takes shape and dtype. */
COLD static int
spec_miss(FastPath *self, PyObject *specs, PyObject *shape, PyObject *dtype, uint32_t *sig,
          uint32_t *dev)
{
    int rc = -1;
    PyObject *key = PyTuple_Pack(2, shape, dtype);
    PyObject *value = key == NULL ? NULL : PyDict_GetItemWithError(specs, key); /* borrowed */
    Py_XDECREF(key);
    if (value != NULL && PyTuple_CheckExact(value) && PyTuple_GET_SIZE(value) == 2 &&
        as_index(PyTuple_GET_ITEM(value, 0), sig) == 0 &&
        as_index(PyTuple_GET_ITEM(value, 1), dev) == 0) {
        /* Keep a plain tuple copy: the cache must not hold a subclass whose items change. */
        PyObject *copy = PyTuple_GetSlice(shape, 0, PyTuple_GET_SIZE(shape));
        if (copy != NULL) {
            SpecEntry *e = &self->sc[self->sc_next];
            self->sc_next = (self->sc_next + 1) % SPEC_CACHE;
            Py_INCREF(specs);
            Py_XSETREF(e->specs, specs);
            Py_XSETREF(e->shape, copy);
            Py_INCREF(dtype);
            Py_XSETREF(e->dtype, dtype);
            e->ndim = c_sizes(copy, e->sizes);
            e->sig = *sig;
            e->dev = *dev;
        }
        rc = 0;
    }
    PyErr_Clear();
    Py_DECREF(shape);
    Py_DECREF(dtype);
    return rc;
}

/* The thread's C stack cache, or NULL when it has none (``create``: take a slot for it). */
static TCache *
tcache_of(FastPath *self, unsigned long ident, int create)
{
    for (int i = 0; i < TC_THREADS; i++) {
        if (self->tc_ident[i] == ident) {
            return &self->tc[i];
        }
    }
    if (!create) {
        return NULL;
    }
    int i = self->tc_next;
    self->tc_next = (i + 1) % TC_THREADS;
    TCache *c = &self->tc[i];
    Py_CLEAR(c->parent);
    self->tc_ident[i] = ident;
    c->nheads = c->next_head = 0;
    return c;
}

#if FR_IFRAME
/* What PyFrame_GetLasti answers for the frame object of ``f``. */
static inline int
iframe_lasti(_PyInterpreterFrame *f)
{
    int lasti = _PyInterpreterFrame_LASTI(f);
    return lasti < 0 ? -1 : lasti * (int)sizeof(_Py_CODEUNIT);
}

/* ``f`` or the first frame below it that has started running (what PyEval_GetFrame and
 * PyFrame_GetBack skip to: frames still setting up, and 3.12+'s C-stack entry frames). */
static inline _PyInterpreterFrame *
first_complete(_PyInterpreterFrame *f)
{
    while (f != NULL && _PyFrame_IsIncomplete(f)) {
        f = f->previous;
    }
    return f;
}

/* The stack index of the calling thread's current Python frame (the Site's caller) from the
 * C cache, read off the interpreter's frames; -1 on a miss. The caller's caller is compared
 * through its frame object, which the cache holds (``parent``): a live interpreter frame
 * points to its frame object, so it matches only the very activation that was cached, and
 * one that was never materialized (frame_obj NULL) is a miss. */
static int
stack_hit_here(FastPath *self, PyThreadState *ts, unsigned long ident, uint32_t *out)
{
#if PY_VERSION_HEX >= 0x030D0000
    _PyInterpreterFrame *f = first_complete(ts->current_frame);
#else
    _PyInterpreterFrame *f = first_complete(ts->cframe->current_frame);
#endif
    if (f == NULL || self->depth < 2) {
        return -1;
    }
    _PyInterpreterFrame *p = first_complete(f->previous);
    if (p == NULL || p->frame_obj == NULL) {
        return -1;
    }
    TCache *c = tcache_of(self, ident, 0);
    if (c == NULL || c->parent != (PyObject *)p->frame_obj || c->parent_lasti != iframe_lasti(p)) {
        return -1;
    }
#if PY_VERSION_HEX >= 0x030D0000
    PyCodeObject *code = _PyFrame_GetCode(f);
#else
    PyCodeObject *code = f->f_code;
#endif
    int lasti = iframe_lasti(f);
    for (int i = 0; i < c->nheads; i++) {
        if (c->head[i].code == code && c->head[i].lasti == lasti) {
            *out = c->head[i].index;
            return 0;
        }
    }
    return -1;
}

/* The calling thread's stack as (code, offset) pairs, innermost first, at most ``depth``
 * frames: the frames StackTable.capture walks from PyEval_GetFrame() through f_back, read
 * off the interpreter's frames without creating frame objects. Returns the count, and a
 * hash of the pairs (never 0). */
static int
walk_frames(FastPath *self, PyThreadState *ts, WalkPair *out, uint64_t *hash)
{
#if PY_VERSION_HEX >= 0x030D0000
    _PyInterpreterFrame *f = first_complete(ts->current_frame);
#else
    _PyInterpreterFrame *f = first_complete(ts->cframe->current_frame);
#endif
    uint64_t h = 1469598103934665603ULL; /* FNV-1a over the pairs */
    int n = 0;
    while (f != NULL && n < self->depth) {
#if PY_VERSION_HEX >= 0x030D0000
        PyCodeObject *code = _PyFrame_GetCode(f);
#else
        PyCodeObject *code = f->f_code;
#endif
        int lasti = iframe_lasti(f);
        out[n].code = code;
        out[n].lasti = lasti;
        h = (h ^ (uint64_t)(uintptr_t)code) * 1099511628211ULL;
        h = (h ^ (uint64_t)(uint32_t)lasti) * 1099511628211ULL;
        n++;
        f = first_complete(f->previous);
    }
    *hash = h | 1;
    return n;
}

static inline int
same_walk(const WalkPair *a, const WalkPair *b, int n)
{
    for (int i = 0; i < n; i++) {
        if (a[i].code != b[i].code || a[i].lasti != b[i].lasti) {
            return 0;
        }
    }
    return 1;
}

/* The stack index of the calling thread's stack from the stacks kept by their frames; -1 on a
 * miss. The second cache after stack_hit_here, whose key is the caller's caller as an
 * activation: a collective called through one more helper (``train`` -> ``step`` ->
 * ``helper`` -> all_reduce) has a new caller's caller at every call, and would take the
 * Python walk each time (about 14,000 instructions). Walking 16 frames in C costs about 750
 * (callgrind); the whole walk is the key, so any stack matches only itself. */
static int
walk_hit(FastPath *self, PyThreadState *ts, uint32_t *out)
{
    if (self->wt_hash == NULL) {
        return -1;
    }
    WalkPair pairs[WT_DEPTH_MAX];
    uint64_t h;
    int n = walk_frames(self, ts, pairs, &h);
    for (int k = 0; k < WT_PROBES; k++) {
        size_t s = (size_t)(h + (uint64_t)k) & (WT_SLOTS - 1);
        if (self->wt_hash[s] == 0) {
            return -1;
        }
        if (self->wt_hash[s] == h && self->wt_n[s] == n &&
            same_walk(self->wt_pairs + s * (size_t)self->depth, pairs, n)) {
            *out = self->wt_index[s];
            self->walk_hits++;
            return 0;
        }
    }
    return -1;
}

/* After StackTable.capture interned the calling thread's stack as ``index``: keep it by its
 * frames, where the StackTable's own record of it is exactly this walk (its code objects are
 * then kept alive by the table, so a pointer here can never name another code object; a
 * stack capture starts elsewhere, past flightrec's own frames, is not kept). */
COLD static void
walk_remember(FastPath *self, uint32_t index)
{
    if (self->wt_hash == NULL || self->raw_of == NULL) {
        return;
    }
    WalkPair pairs[WT_DEPTH_MAX];
    uint64_t h;
    int n = walk_frames(self, PyThreadState_Get(), pairs, &h);
    PyObject *raw = PyObject_CallFunction(self->raw_of, "I", index);
    int same = raw != NULL && PyTuple_CheckExact(raw) && PyTuple_GET_SIZE(raw) == n;
    for (int i = 0; same && i < n; i++) {
        PyObject *pair = PyTuple_GET_ITEM(raw, i);
        same = PyTuple_CheckExact(pair) && PyTuple_GET_SIZE(pair) == 2 &&
               PyTuple_GET_ITEM(pair, 0) == (PyObject *)pairs[i].code &&
               PyLong_CheckExact(PyTuple_GET_ITEM(pair, 1)) &&
               PyLong_AsLong(PyTuple_GET_ITEM(pair, 1)) == pairs[i].lasti;
    }
    Py_XDECREF(raw);
    PyErr_Clear();
    /* capture() and raw() ran Python code: the frames walked are still the calling thread's
     * (this call has not returned), but the table may have been dropped meanwhile. */
    if (!same || self->wt_hash == NULL) {
        return;
    }
    size_t s = (size_t)h & (WT_SLOTS - 1);
    for (int k = 0; k < WT_PROBES; k++) {
        size_t t = (size_t)(h + (uint64_t)k) & (WT_SLOTS - 1);
        if (self->wt_hash[t] == 0) {
            s = t;
            break;
        }
    }
    self->wt_hash[s] = h;
    self->wt_n[s] = n;
    self->wt_index[s] = index;
    memcpy(self->wt_pairs + s * (size_t)self->depth, pairs, (size_t)n * sizeof *pairs);
}
#endif

/* The stack index of the caller ``frame`` (NULL: the calling thread's current Python frame,
 * the Site's caller): from the C cache when the caller's caller is the cached frame at the
 * same instruction and the caller's code and offset were seen under it, else
 * StackTable.capture (which walks, interns and refreshes its own caches). */
COLD static int stack_of_frame(FastPath *self, PyObject *frame, unsigned long ident,
                               uint32_t *out);

static inline int
stack_of(FastPath *self, PyThreadState *ts, PyObject *frame, unsigned long ident,
         uint32_t *out)
{
    if (self->depth == 0 || frame == Py_None) {
        *out = 0;
        return 0;
    }
#if FR_IFRAME
    if (frame == NULL) {
        if (LIKELY(stack_hit_here(self, ts, ident, out) == 0) || walk_hit(self, ts, out) == 0) {
            return 0;
        }
        int rc = stack_of_frame(self, frame, ident, out);
        if (rc == 0) {
            walk_remember(self, *out);
        }
        return rc;
    }
#endif
    return stack_of_frame(self, frame, ident, out);
}

/* stack_of with a frame object (NULL: the current one, materialized here for the walk). */
COLD static int
stack_of_frame(FastPath *self, PyObject *frame, unsigned long ident, uint32_t *out)
{
    if (frame == NULL) {
        frame = (PyObject *)PyEval_GetFrame(); /* borrowed; materialized for the walk */
        if (frame == NULL) {
            return -1;
        }
    }
    if (!PyFrame_Check(frame)) {
        return -1;
    }
    PyFrameObject *f = (PyFrameObject *)frame;
    PyCodeObject *code = PyFrame_GetCode(f); /* new reference */
    int lasti = PyFrame_GetLasti(f);
    PyFrameObject *parent = self->depth > 1 ? PyFrame_GetBack(f) : NULL; /* new reference */
    int parent_lasti = parent != NULL ? PyFrame_GetLasti(parent) : -1;
    TCache *c = parent != NULL ? tcache_of(self, ident, 0) : NULL;
    if (c != NULL && c->parent == (PyObject *)parent && c->parent_lasti == parent_lasti) {
        for (int i = 0; i < c->nheads; i++) {
            if (c->head[i].code == code && c->head[i].lasti == lasti) {
                *out = c->head[i].index;
                Py_DECREF(code);
                Py_DECREF(parent);
                return 0;
            }
        }
    }
    PyObject *tid = thread_id(self);
    PyObject *index =
        tid == NULL ? NULL : PyObject_CallFunctionObjArgs(self->capture, frame, tid, NULL);
    Py_XDECREF(tid);
    int rc = index == NULL ? -1 : as_index(index, out);
    Py_XDECREF(index);
    if (rc == 0 && parent != NULL) {
        /* capture() ran Python code: look the thread's slot up again. */
        c = tcache_of(self, ident, 1);
        if (c->parent != (PyObject *)parent || c->parent_lasti != parent_lasti) {
            Py_INCREF(parent);
            Py_XSETREF(c->parent, (PyObject *)parent);
            c->parent_lasti = parent_lasti;
            c->nheads = c->next_head = 0;
        }
        int h = c->next_head;
        c->next_head = (h + 1) % TC_HEADS;
        if (c->nheads < TC_HEADS) {
            c->nheads++;
        }
        c->head[h].code = code;
        c->head[h].lasti = lasti;
        c->head[h].index = *out;
    }
    Py_DECREF(code);
    Py_XDECREF(parent);
    return rc;
}

/* enter(op, flags, group, tensor_in, tensor_out, red, root, group_root, async_op, frame)
 *
 * op: string index of the operation; flags: its constant EntryFlag bits; tensor_in /
 * tensor_out: single tensors, or the int 0 where the function has no such argument; red:
 * the reduce op, or the int 0 where the function has none; root: the root as a global rank,
 * or None; group_root: the same as a rank within the group, or None (used when root is
 * None); async_op: the argument; frame: the caller's frame (sys._getframe(1)), or None
 * without stacks (NULL, from the Site only: the calling thread's current frame).
 *
 * Returns the record id (> 0) of the entry written, 0 when the call must not be recorded
 * (tracing off, or a call made inside a recorded one), -1 when the Python path must decide.
 */
/* The reduce op's string index, past the identity cache (a dict hit is then cached). */
COLD static int
red_slow(FastPath *self, PyObject *red, uint32_t *red_i)
{
    if (PyLong_CheckExact(red)) {
        return as_index(red, red_i);
    }
    PyObject *v = PyDict_GetItemWithError(self->reds, red);
    if (v == NULL || as_index(v, red_i) < 0) {
        return -1;
    }
    int slot = self->red_next;
    self->red_next = (slot + 1) % RED_CACHE;
    Py_INCREF(red);
    Py_XSETREF(self->red_obj[slot], red);
    self->red_idx[slot] = *red_i;
    return 0;
}

/* The root or peer as a global rank, as the Python path's PyPath.peer: ``root``, else the
 * global rank of group rank ``group_root`` (-1 out of range). -1 on anything unexpected. */
static int
peer_of(PyObject *root, PyObject *group_root, PyObject *ranks, int32_t *peer)
{
    if (root != Py_None) {
        if (!PyLong_CheckExact(root)) {
            return -1;
        }
        long r = PyLong_AsLong(root);
        if ((r == -1 && PyErr_Occurred()) || r < INT32_MIN || r > INT32_MAX) {
            return -1;
        }
        *peer = (int32_t)r;
        return 0;
    }
    if (!PyLong_CheckExact(group_root)) {
        return -1;
    }
    Py_ssize_t g = PyLong_AsSsize_t(group_root);
    if (g == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (g >= 0 && g < PyTuple_GET_SIZE(ranks)) {
        PyObject *r = PyTuple_GET_ITEM(ranks, g);
        long v = PyLong_CheckExact(r) ? PyLong_AsLong(r) : -1;
        if (!PyLong_CheckExact(r) || (v == -1 && PyErr_Occurred()) || v < INT32_MIN ||
            v > INT32_MAX) {
            return -1;
        }
        *peer = (int32_t)v;
    }
    return 0;
}

/* The thread name index of a thread other than the one seen last (``threads`` dict). */
COLD static int
thread_slow(FastPath *self, unsigned long ident, uint32_t *thread)
{
    PyObject *tid = thread_id(self);
    PyObject *th = tid == NULL ? NULL : PyDict_GetItemWithError(self->threads, tid);
    int rc = th == NULL ? -1 : as_index(th, thread);
    Py_XDECREF(tid);
    if (rc == 0) {
        self->th_ident = ident;
        self->th_index = *thread;
    }
    return rc;
}

/* The (signature, device) of the tensor arguments; 0 where there are none, -1 on a miss. */
static inline int
tensors_of(FastPath *self, PyObject *specs, PyObject *tin, PyObject *tout, uint32_t *sig_in,
           uint32_t *sig_out, uint32_t *dev)
{
    int has_in = !PyLong_CheckExact(tin), has_out = !PyLong_CheckExact(tout);
    if (!has_in && !has_out) {
        return 0;
    }
    if (has_in && spec_of(self, specs, tin, sig_in, dev) < 0) {
        return -1;
    }
    if (has_out && tout == tin) {
        *sig_out = *sig_in;
    }
    else if (has_out) {
        uint32_t dev_out = 0;
        if (spec_of(self, specs, tout, sig_out, &dev_out) < 0) {
            return -1;
        }
        if (!has_in) {
            *dev = dev_out;
        }
    }
    return 0;
}

static long
do_enter(FastPath *self, uint32_t op, uint32_t base_flags, PyObject *group, PyObject *tin,
         PyObject *tout, PyObject *red, PyObject *root, PyObject *group_root, PyObject *async_op,
         PyObject *frame, int *gpu, unsigned long *ident_out)
{
    uint32_t sig_in = 0, sig_out = 0, dev = 0, red_i = 0, thread = 0, stack = 0;
    int32_t peer = -1;

    if (UNLIKELY(!self->enabled || (base_flags & FLAG_IS_P2P) || self->ring == NULL)) {
        return -1; /* the Python path handles "off", and point-to-point */
    }
    PyThreadState *ts = PyThreadState_Get();
    unsigned long ident = ident_of(ts);
    if (UNLIKELY(active_find(self->active, ident) >= 0)) {
        return 0; /* inside a recorded call */
    }
    if (UNLIKELY(group_of(self, group) < 0)) {
        goto fallback;
    }
    /* The cached group's fields are borrowed from the FastPath, which holds them. Steps that
     * may run Python code (cache misses: a stack walk, torch's getters, a dict lookup that
     * hashes) may let another thread's call replace them: each such step holds what it uses
     * itself, and g_gen, which every replacement moves, is compared before the fields are
     * used again. No Python code runs before peer_of. */
    uint32_t gen = self->g_gen;
    if ((root != Py_None || group_root != Py_None) &&
        peer_of(root, group_root, self->g_ranks, &peer) < 0) {
        goto fallback;
    }
    int64_t t0 = now_ns();
    if (UNLIKELY(tensors_of(self, self->g_specs, tin, tout, &sig_in, &sig_out, &dev) < 0)) {
        goto fallback;
    }
    int red_hit = 0;
    if (PyLong_CheckExact(red)) {
        red_hit = as_index(red, &red_i) == 0; /* the int 0: the function has none */
    }
    else {
        for (int i = 0; i < RED_CACHE; i++) {
            if (self->red_obj[i] == red) {
                red_i = self->red_idx[i];
                red_hit = 1;
                break;
            }
        }
    }
    if (!red_hit && red_slow(self, red, &red_i) < 0) {
        goto fallback;
    }
    if (LIKELY(self->th_ident == ident && ident != 0)) {
        thread = self->th_index;
    }
    else if (thread_slow(self, ident, &thread) < 0) {
        goto fallback;
    }
    int is_async = async_op == Py_False ? 0 : PyObject_IsTrue(async_op);
    if (UNLIKELY(is_async < 0)) {
        goto fallback;
    }
    /* Last step that may run Python code (a stack walk on a miss): nothing is consumed yet. */
    if (UNLIKELY(stack_of(self, ts, frame, ident, &stack) < 0)) {
        goto fallback;
    }
    Counter *counter = self->g_counter;
    unsigned long long native = 0;
    if (UNLIKELY(counter->source != NULL && counter->source != Py_None)) {
        native = counter_from_source(counter); /* Python code: before the check below */
    }
    if (UNLIKELY(self->g_gen != gen)) {
        goto fallback; /* the group cache changed under a miss: the Python path decides */
    }

    Py_ssize_t guard = active_put(self->active, ident, 0);
    if (UNLIKELY(guard < 0)) {
        goto fallback; /* no memory for the guard: let the Python path decide */
    }
    /* From here on nothing can fail: take the sequence number and the record id (the
     * counters are C integers; no Python code runs between here and the slot's write). */
    /* Following the ProcessGroup's counter: its next number, or the next of ours where that
     * is higher (threads issuing at once read torch's count alike: no number goes out twice). */
    unsigned long long seq = counter->value + 1;
    if (native > seq) {
        seq = native;
    }
    counter->value = seq;
    unsigned long long rid = ++self->ids->value;
    char *p = self->ring +
              (Py_ssize_t)((rid - 1) % (unsigned long long)self->capacity) * SLOT_SIZE;
    /* Every byte of the slot, in place (no copy through the stack): the record id first, the
     * same id again last, after a compiler barrier, so that a reader of the black box's file
     * taking a copy meanwhile sees the two differ (the Python readers hold the GIL). */
    put_u64(p + OFF_RID, rid);
    put_u64(p + OFF_ENQ, (uint64_t)t0);
    put_u64(p + OFF_COMPLETE, 0);
    put_u32(p + OFF_STATE, ENQUEUED); /* the state byte and its three bytes of padding */
    put_u64(p + OFF_SEQ, seq);
    put_u64(p + OFF_P2P, 0);
    put_u32(p + OFF_GROUP, self->g_index);
    put_u32(p + OFF_OP, op);
    put_u32(p + OFF_RED, red_i);
    put_u32(p + OFF_PEER, (uint32_t)peer);
    put_u32(p + OFF_THREAD, thread);
    put_u32(p + OFF_STACK, stack);
    put_u32(p + OFF_IN, sig_in);
    put_u32(p + OFF_OUT, sig_out);
    put_u32(p + OFF_DEV, dev);
    put_u32(p + OFF_FLAGS, base_flags | (is_async ? 1u : 0u));
    COMPILER_BARRIER();
    put_u64(p + OFF_RID2, rid);
    self->active->rid[guard] = (long long)rid;
    *gpu = self->g_gpu;
    *ident_out = ident;
    return (long)rid;

fallback:
    /* Errors here are the Python path's to meet again (and to report as torch would). */
    PyErr_Clear();
    return -1;
}

static PyObject *
FastPath_enter(FastPath *self, PyObject *const *args, Py_ssize_t nargs)
{
    uint32_t op = 0, base_flags = 0;
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "enter() takes 10 arguments");
        return NULL;
    }
    if (as_index(args[0], &op) < 0 || as_index(args[1], &base_flags) < 0) {
        PyErr_Clear();
        return PyLong_FromLong(-1);
    }
    int gpu = 0;
    unsigned long ident = 0;
    return PyLong_FromLong(do_enter(self, op, base_flags, args[2], args[3], args[4], args[5],
                                    args[6], args[7], args[8], args[9], &gpu, &ident));
}

/* ``gpu``: the group's backend tracks completion through CUDA events (1), or not (0), as
 * enter() found it; -1: unknown (the Python-level leave()), looked up here. */
static void
do_leave(FastPath *self, unsigned long ident, long rid_l, PyObject *result, PyObject *async_op,
         PyObject *group, int gpu)
{
    active_drop(self->active, ident);
    if (rid_l <= 0) {
        return;
    }
    unsigned long long rid = (unsigned long long)rid_l;
    int is_async = async_op == Py_False ? 0 : PyObject_IsTrue(async_op);
    PyObject *info = NULL;
    if (is_async != 0 || gpu != 0) {
        info = PyDict_GetItemWithError(self->by_pg, group); /* borrowed */
        if (info != NULL && gpu < 0) {
            PyObject *g = PyObject_GetAttr(info, s_gpu);
            gpu = g == NULL ? 1 : PyObject_IsTrue(g); /* unsure: let settle() decide */
            Py_XDECREF(g);
        }
        PyErr_Clear();
    }
    if (is_async != 0 || gpu != 0) {
        if (info == NULL) {
            return; /* the group left the cache: the entry stays as recorded */
        }
        Py_INCREF(info); /* settle() runs Python code: keep it alive */
        PyObject *ridobj = PyLong_FromLong(rid_l);
        PyObject *r = ridobj == NULL ? NULL
                                     : PyObject_CallFunctionObjArgs(
                                           self->settle, ridobj, result,
                                           is_async > 0 ? Py_True : Py_False, info, NULL);
        if (r == NULL) {
            PyErr_Clear(); /* settle() reports its own errors; nothing may reach the caller */
        }
        Py_XDECREF(r);
        Py_XDECREF(ridobj);
        Py_DECREF(info);
        return;
    }
    Py_ssize_t off = (Py_ssize_t)((rid - 1) % (unsigned long long)self->capacity) * SLOT_SIZE;
    if (off + SLOT_SIZE <= self->ring_len) {
        char *p = self->ring + off;
        uint64_t have;
        memcpy(&have, p + OFF_RID, 8);
        if (have == rid) { /* not yet overwritten by other threads' entries */
            put_u64(p + OFF_COMPLETE, (uint64_t)now_ns());
            p[OFF_STATE] = COMPLETED;
        }
    }
}

/* leave(rid, result, async_op, group): the call returned. A synchronous CPU call is
 * complete now (written in place unless the ring already reused the slot); async and GPU
 * calls go to ``settle`` (HotState.settle). Never raises: the call ran, its result must
 * reach the caller. */
static PyObject *
FastPath_leave(FastPath *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "leave() takes 4 arguments");
        return NULL;
    }
    long rid = PyLong_AsLong(args[0]);
    if (rid == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        rid = 0;
    }
    do_leave(self, thread_ident(), rid, args[1], args[2], args[3], -1);
    Py_RETURN_NONE;
}

/* purge(live): drop cached frames no longer on their thread's stack (``live`` is
 * sys._current_frames(); the watchdog calls this with StackTable.purge). */
static PyObject *
FastPath_purge(FastPath *self, PyObject *live)
{
    if (!PyDict_Check(live)) {
        PyErr_SetString(PyExc_TypeError, "purge() takes sys._current_frames()");
        return NULL;
    }
    for (int i = 0; i < TC_THREADS; i++) {
        TCache *c = &self->tc[i];
        if (c->parent == NULL) {
            continue;
        }
        PyObject *key = PyLong_FromUnsignedLong(self->tc_ident[i]);
        if (key == NULL) {
            return NULL;
        }
        PyObject *top = PyDict_GetItemWithError(live, key); /* borrowed */
        Py_DECREF(key);
        if (top == NULL && PyErr_Occurred()) {
            return NULL;
        }
        int alive = 0;
        PyFrameObject *f = top != NULL && PyFrame_Check(top) ? (PyFrameObject *)top : NULL;
        Py_XINCREF(f);
        while (f != NULL && !alive) {
            alive = (PyObject *)f == c->parent;
            PyFrameObject *back = PyFrame_GetBack(f);
            Py_DECREF(f);
            f = back;
        }
        Py_XDECREF(f);
        if (!alive) {
            self->tc_ident[i] = 0;
            c->nheads = c->next_head = 0;
            Py_CLEAR(c->parent);
        }
    }
    Py_RETURN_NONE;
}

/* forget_threads(): the recorder forgot its thread names (at a dump): so does the cache. */
static PyObject *
FastPath_forget_threads(FastPath *self, PyObject *Py_UNUSED(ignored))
{
    self->th_ident = 0;
    Py_RETURN_NONE;
}

static void
raw_clear(Layout *L)
{
    L->on = 0;
    L->nseen = 0;
    Py_CLEAR(L->type);
    for (int i = 0; i < RAW_DTYPES; i++) {
        Py_CLEAR(L->dtypes[i]);
    }
}

/* set_layout(type, impl, ndim, dtype, keys, allowed, dtypes): read the shape and dtype of
 * ``type``'s tensors from memory at these offsets (see Layout; layout.py finds them).
 * ``dtypes`` maps TypeMeta indexes to torch.dtype objects. Raises on arguments out of
 * range; the path stays off until a call succeeds. */
static PyObject *
FastPath_set_layout(FastPath *self, PyObject *args)
{
    PyTypeObject *type;
    Py_ssize_t off[4];
    unsigned long long allowed;
    PyObject *dtypes;
    if (!PyArg_ParseTuple(args, "O!nnnnKO!:set_layout", &PyType_Type, &type, &off[0], &off[1],
                          &off[2], &off[3], &allowed, &PyDict_Type, &dtypes)) {
        return NULL;
    }
    Layout *L = &self->raw;
    raw_clear(L);
    if (off[0] < (Py_ssize_t)sizeof(PyObject) || off[0] + 8 > type->tp_basicsize ||
        off[0] % 8 || off[1] < 0 || off[1] % 8 || off[1] + 8 * (RAW_DIMS + 1) > RAW_SPAN ||
        off[2] < 0 || off[2] % 2 || off[2] + 2 > RAW_SPAN || off[3] < 0 || off[3] % 8 ||
        off[3] + 8 > RAW_SPAN) {
        PyErr_SetString(PyExc_ValueError, "set_layout: offset out of range");
        return NULL;
    }
    getter gs = NULL, gd = NULL;
    void *cs = NULL, *cd = NULL;
    if (!getset_of(type, s_shape, &gs, &cs) || !getset_of(type, s_dtype, &gd, &cd) ||
        !valid_version_tag(type)) {
        PyErr_SetString(PyExc_ValueError, "set_layout: shape and dtype are not C getters");
        return NULL;
    }
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(dtypes, &pos, &key, &value)) {
        long i = PyLong_Check(key) ? PyLong_AsLong(key) : -1;
        if (i < 0 || i >= RAW_DTYPES) {
            PyErr_Clear();
            raw_clear(L);
            PyErr_SetString(PyExc_ValueError, "set_layout: dtype index out of range");
            return NULL;
        }
        Py_INCREF(value);
        Py_XSETREF(L->dtypes[i], value);
    }
    Py_INCREF(type);
    L->type = type;
    L->version = type->tp_version_tag;
    L->shape_get = gs;
    L->shape_closure = cs;
    L->dtype_get = gd;
    L->dtype_closure = cd;
    L->off_impl = off[0];
    L->off_ndim = off[1];
    L->off_dtype = off[2];
    L->off_keys = off[3];
    L->allowed = allowed;
    L->on = 1;
    Py_RETURN_NONE;
}

static PyObject *
FastPath_clear_layout(FastPath *self, PyObject *Py_UNUSED(ignored))
{
    raw_clear(&self->raw);
    Py_RETURN_NONE;
}

/* raw_spec(tensor) -> (sizes, dtype) read from memory, or None where the getters would be
 * used: what the hot path sees (tests, and layout.py's check of its own offsets). */
static PyObject *
FastPath_raw_spec(FastPath *self, PyObject *tensor)
{
    int64_t n;
    const int64_t *sizes;
    PyObject *dtype;
    if (!raw_read(self, tensor, &n, &sizes, &dtype)) {
        Py_RETURN_NONE;
    }
    PyObject *shape = PyTuple_New((Py_ssize_t)n);
    for (int64_t i = 0; shape != NULL && i < n; i++) {
        PyObject *x = PyLong_FromLongLong(sizes[i]);
        if (x == NULL) {
            Py_CLEAR(shape);
            break;
        }
        PyTuple_SET_ITEM(shape, (Py_ssize_t)i, x);
    }
    return shape == NULL ? NULL : Py_BuildValue("(NO)", shape, dtype);
}

/* Drop the stacks kept by their frames (walk_hit). */
static void
walk_free(FastPath *self)
{
    PyMem_Free(self->wt_hash);
    PyMem_Free(self->wt_n);
    PyMem_Free(self->wt_index);
    PyMem_Free(self->wt_pairs);
    self->wt_hash = NULL;
    self->wt_n = NULL;
    self->wt_index = NULL;
    self->wt_pairs = NULL;
    Py_CLEAR(self->raw_of);
}

static int
FastPath_init(FastPath *self, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"settle", "fail", "by_pg", "active", "threads", "tcaches", "reds",
                         "ids", "capture", "buffer", "capacity", "depth", "raw", NULL};
    PyObject *settle, *fail, *by_pg, *active, *threads, *tcaches, *reds, *ids, *capture, *buffer;
    PyObject *raw = Py_None;
    Py_ssize_t capacity;
    int depth;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO!O!O!O!O!O!OOni|O", kw, &settle, &fail,
                                     &PyDict_Type,
                                     &by_pg, &ActiveType, &active, &PyDict_Type, &threads,
                                     &PyDict_Type, &tcaches, &PyDict_Type, &reds, &CounterType,
                                     &ids, &capture, &buffer, &capacity, &depth, &raw)) {
        return -1;
    }
    walk_free(self);
    if (raw != Py_None && depth >= 1 && depth <= WT_DEPTH_MAX) {
        self->wt_hash = PyMem_Calloc(WT_SLOTS, sizeof *self->wt_hash);
        self->wt_n = PyMem_Calloc(WT_SLOTS, sizeof *self->wt_n);
        self->wt_index = PyMem_Calloc(WT_SLOTS, sizeof *self->wt_index);
        self->wt_pairs = PyMem_Calloc((size_t)WT_SLOTS * (size_t)depth, sizeof *self->wt_pairs);
        if (self->wt_hash == NULL || self->wt_n == NULL || self->wt_index == NULL ||
            self->wt_pairs == NULL) {
            walk_free(self);
            PyErr_NoMemory();
            return -1;
        }
        Py_INCREF(raw);
        Py_XSETREF(self->raw_of, raw);
    }
    if (capacity < 1) {
        PyErr_SetString(PyExc_ValueError, "capacity must be at least 1");
        return -1;
    }
    /* No ring until this succeeds: the hot path falls back while ``ring`` is NULL. */
    self->ring = NULL;
    self->ring_len = 0;
    if (self->has_buf) {
        PyBuffer_Release(&self->buf);
        self->has_buf = 0;
    }
    if (PyObject_GetBuffer(buffer, &self->buf, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        return -1;
    }
    self->has_buf = 1;
    if (self->buf.len < capacity * SLOT_SIZE) {
        PyErr_SetString(PyExc_ValueError, "ring buffer smaller than capacity slots");
        return -1;
    }
    Py_INCREF(settle);
    Py_XSETREF(self->settle, settle);
    Py_INCREF(fail);
    Py_XSETREF(self->fail, fail);
    Py_INCREF(by_pg);
    Py_XSETREF(self->by_pg, by_pg);
    Py_INCREF(active);
    Py_XSETREF(self->active, (Active *)active);
    Py_INCREF(threads);
    Py_XSETREF(self->threads, threads);
    Py_INCREF(tcaches);
    Py_XSETREF(self->tcaches, tcaches);
    Py_INCREF(reds);
    Py_XSETREF(self->reds, reds);
    Py_INCREF(ids);
    Py_XSETREF(self->ids, (Counter *)ids);
    Py_INCREF(capture);
    Py_XSETREF(self->capture, capture);
    self->capacity = capacity;
    self->depth = depth;
    self->ring = (char *)self->buf.buf;
    self->ring_len = self->buf.len;
    self->enabled = 1;
    return 0;
}

static int
FastPath_traverse(FastPath *self, visitproc visit, void *arg)
{
    Py_VISIT(self->settle);
    Py_VISIT(self->fail);
    Py_VISIT(self->by_pg);
    Py_VISIT(self->active);
    Py_VISIT(self->threads);
    Py_VISIT(self->tcaches);
    Py_VISIT(self->reds);
    Py_VISIT(self->ids);
    Py_VISIT(self->capture);
    Py_VISIT(self->raw_of);
    for (int i = 0; i < RED_CACHE; i++) {
        Py_VISIT(self->red_obj[i]);
    }
    Py_VISIT(self->tt_type);
    Py_VISIT(self->raw.type);
    for (int i = 0; i < RAW_DTYPES; i++) {
        Py_VISIT(self->raw.dtypes[i]);
    }
    Py_VISIT(self->g_info);
    Py_VISIT(self->g_specs);
    Py_VISIT(self->g_counter);
    Py_VISIT(self->g_ranks);
    for (int i = 0; i < TC_THREADS; i++) {
        Py_VISIT(self->tc[i].parent);
    }
    for (int i = 0; i < SPEC_CACHE; i++) {
        Py_VISIT(self->sc[i].specs);
        Py_VISIT(self->sc[i].shape);
        Py_VISIT(self->sc[i].dtype);
    }
    return 0;
}

static int
FastPath_clear(FastPath *self)
{
    Py_CLEAR(self->settle);
    Py_CLEAR(self->fail);
    Py_CLEAR(self->by_pg);
    Py_CLEAR(self->active);
    Py_CLEAR(self->threads);
    Py_CLEAR(self->tcaches);
    Py_CLEAR(self->reds);
    Py_CLEAR(self->ids);
    Py_CLEAR(self->capture);
    walk_free(self);
    for (int i = 0; i < RED_CACHE; i++) {
        Py_CLEAR(self->red_obj[i]);
    }
    self->g_key_valid = 0;
    self->g_gen++;
    Py_CLEAR(self->tt_type);
    raw_clear(&self->raw);
    Py_CLEAR(self->g_info);
    Py_CLEAR(self->g_specs);
    Py_CLEAR(self->g_counter);
    Py_CLEAR(self->g_ranks);
    Py_CLEAR(self->tid_obj);
    for (int i = 0; i < TC_THREADS; i++) {
        Py_CLEAR(self->tc[i].parent);
        self->tc_ident[i] = 0;
    }
    for (int i = 0; i < SPEC_CACHE; i++) {
        Py_CLEAR(self->sc[i].specs);
        Py_CLEAR(self->sc[i].shape);
        Py_CLEAR(self->sc[i].dtype);
    }
    return 0;
}

static void
FastPath_dealloc(FastPath *self)
{
    PyObject_GC_UnTrack(self);
    FastPath_clear(self);
    if (self->has_buf) {
        self->ring = NULL;
        PyBuffer_Release(&self->buf);
        self->has_buf = 0;
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef FastPath_methods[] = {
    {"enter", (PyCFunction)(void (*)(void))FastPath_enter, METH_FASTCALL,
     "Record the start of a call on cache hits; see the module source for the arguments."},
    {"leave", (PyCFunction)(void (*)(void))FastPath_leave, METH_FASTCALL,
     "Record that a call entered with enter() returned."},
    {"purge", (PyCFunction)FastPath_purge, METH_O,
     "Forget cached frames that are no longer on their thread's stack."},
    {"set_layout", (PyCFunction)FastPath_set_layout, METH_VARARGS,
     "Read tensors' shape and dtype from memory at these offsets (see layout.py)."},
    {"clear_layout", (PyCFunction)FastPath_clear_layout, METH_NOARGS,
     "Take torch's getters again for every tensor."},
    {"raw_spec", (PyCFunction)FastPath_raw_spec, METH_O,
     "(sizes, dtype) of a tensor as the hot path reads it from memory, or None."},
    {"forget_threads", (PyCFunction)FastPath_forget_threads, METH_NOARGS,
     "Forget the cached thread name index (the recorder's thread names were forgotten)."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef FastPath_members[] = {
    {"enabled", T_INT, offsetof(FastPath, enabled), 0,
     "Whether calls are recorded (Recorder.enabled sets it)."},
    {"raw_on", T_INT, offsetof(FastPath, raw.on), READONLY,
     "Whether tensors' shape and dtype are read from memory (set_layout, and no "
     "disagreement with torch's getters since)."},
    {"walk_hits", T_ULONGLONG, offsetof(FastPath, walk_hits), READONLY,
     "Calls whose stack was found by walking the interpreter's frames (the second cache)."},
    {"raw_key_sets", T_INT, offsetof(FastPath, raw.nseen), READONLY,
     "How many dispatch key sets were read both ways and found to agree."},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject FastPathType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "flightrec.recorder.hotpath._fast.FastPath",
    .tp_basicsize = sizeof(FastPath),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The recorder's hot path over its live tables and ring buffer.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)FastPath_init,
    .tp_dealloc = (destructor)FastPath_dealloc,
    .tp_traverse = (traverseproc)FastPath_traverse,
    .tp_clear = (inquiry)FastPath_clear,
    .tp_methods = FastPath_methods,
    .tp_members = FastPath_members,
};


/* -- Site: a traced function with the hot path in front and no Python frame of its own -------
 *
 * Calling a Python wrapper costs a frame and its bytecodes on every call; a Site binds the few
 * arguments the recorder reads (group, tensors, reduce op, root, async_op) straight from the
 * vectorcall arguments, records, and forwards the caller's arguments to torch untouched. Any
 * call it cannot bind plainly (too many arguments, an unknown or repeated keyword, a missing
 * required argument) and any cache miss goes to ``fallback``, the generated Python wrapper,
 * which binds, records, and lets torch raise its own errors exactly as without this code. */

#define NPARAM_MAX 24
enum { R_GROUP, R_IN, R_OUT, R_RED, R_ROOT, R_GROUP_ROOT, R_ASYNC, R_COUNT };

typedef struct {
    PyObject_HEAD
    /* What a call reads, first (the interpreter reads ``vectorcall``). */
    vectorcallfunc vectorcall;
    FastPath *fast;
    PyObject *orig;     /* torch's function */
    PyObject *defaults; /* defaults of parameters required.. */
    uint32_t op, flags;
    int16_t nparams, required;
    int8_t where[R_COUNT]; /* parameter index of each role, -1 where the function has none */
    PyObject *fallback;    /* the generated Python wrapper: the Python path */
    PyObject *names;       /* tuple of the parameter names, in order */
    PyObject *dict;
} Site;

static PyObject *s_qualname, *zero;

static Py_ssize_t
param_index(Site *self, PyObject *key)
{
    for (Py_ssize_t i = 0; i < self->nparams; i++) {
        if (PyTuple_GET_ITEM(self->names, i) == key) {
            return i; /* keywords are interned: identity is the common case */
        }
    }
    for (Py_ssize_t i = 0; i < self->nparams; i++) {
        int eq = PyUnicode_Compare(PyTuple_GET_ITEM(self->names, i), key);
        if (eq == 0) {
            return i;
        }
        if (eq == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return -1;
        }
    }
    return -1;
}

static void
report_failure(FastPath *fast, long rid)
{
    /* ``fail(rid, exc)`` (HotState.fail) marks the entry FAILED and dumps; the exception
     * then goes on unchanged, as the Python wrapper's bare ``raise`` does. */
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL) {
        PyException_SetTraceback(value, tb);
    }
    PyObject *ridobj = PyLong_FromLong(rid);
    PyObject *r = ridobj == NULL ? NULL
                                 : PyObject_CallFunctionObjArgs(fast->fail, ridobj,
                                                                value ? value : Py_None, NULL);
    if (r == NULL) {
        PyErr_Clear();
    }
    Py_XDECREF(r);
    Py_XDECREF(ridobj);
    PyErr_Restore(type, value, tb);
}

static PyObject *
Site_vectorcall(Site *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Py_ssize_t n = self->nparams;
    PyObject *vals[NPARAM_MAX];
    if (nargs > n) {
        goto python;
    }
    if (kwnames == NULL) {
        /* Positional only, the common shape (``all_reduce(t)``): arguments, then defaults. */
        if (nargs < self->required) {
            goto python;
        }
        for (Py_ssize_t i = 0; i < nargs; i++) {
            vals[i] = args[i];
        }
        for (Py_ssize_t i = nargs; i < n; i++) {
            vals[i] = PyTuple_GET_ITEM(self->defaults, i - self->required);
        }
        goto bound;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        vals[i] = i < nargs ? args[i] : NULL;
    }
    {
        Py_ssize_t nk = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t k = 0; k < nk; k++) {
            Py_ssize_t j = param_index(self, PyTuple_GET_ITEM(kwnames, k));
            if (j < 0 || vals[j] != NULL) {
                goto python;
            }
            vals[j] = args[nargs + k];
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (vals[i] == NULL) {
            if (i < self->required) {
                goto python;
            }
            vals[i] = PyTuple_GET_ITEM(self->defaults, i - self->required);
        }
    }
bound:;
#define ROLE(r, absent) (self->where[r] >= 0 ? vals[self->where[r]] : (absent))
    PyObject *group = ROLE(R_GROUP, Py_None), *async_op = ROLE(R_ASYNC, Py_False);
    /* No frame of our own: the current frame is the caller's (sys._getframe(1) in the Python
     * wrapper); NULL tells stack_of to read it there, without materializing it on a hit. */
    PyObject *frame = self->fast->depth > 0 ? NULL : Py_None;
    int gpu = 0;
    unsigned long ident = 0;
    long rid = do_enter(self->fast, self->op, self->flags, group, ROLE(R_IN, zero),
                        ROLE(R_OUT, zero), ROLE(R_RED, zero), ROLE(R_ROOT, Py_None),
                        ROLE(R_GROUP_ROOT, Py_None), async_op, frame, &gpu, &ident);
#undef ROLE
    if (rid <= 0) {
        goto python;
    }
    /* vals are borrowed from args, which the caller keeps alive for the whole call. */
    Py_INCREF(group);
    Py_INCREF(async_op);
    /* torch's function (a Python function) through its own vectorcall: PyObject_Vectorcall
     * adds a dispatch and a result check the interpreter already guarantees (about 45
     * instructions a call). */
    PyObject *orig = self->orig;
    vectorcallfunc call = Py_IS_TYPE(orig, &PyFunction_Type)
                              ? ((PyFunctionObject *)orig)->vectorcall /* no type lookup */
                              : PyVectorcall_Function(orig);
    PyObject *result = call != NULL ? call(self->orig, args, nargsf, kwnames)
                                    : PyObject_Vectorcall(self->orig, args, nargsf, kwnames);
    if (result == NULL) {
        report_failure(self->fast, rid);
    }
    else {
        do_leave(self->fast, ident, rid, result, async_op, group, gpu);
    }
    Py_DECREF(group);
    Py_DECREF(async_op);
    return result;

python:
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

static int
Site_init(Site *self, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"fast", "orig", "fallback", "names", "required", "defaults", "where",
                         "op", "flags", NULL};
    PyObject *fast, *orig, *fallback, *names, *defaults, *where;
    Py_ssize_t required;
    unsigned int op, flags;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OOO!nO!O!II", kw, &FastPathType, &fast,
                                     &orig, &fallback, &PyTuple_Type, &names, &required,
                                     &PyTuple_Type, &defaults, &PyTuple_Type, &where, &op,
                                     &flags)) {
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(names);
    if (n > NPARAM_MAX || required < 0 || required > n ||
        PyTuple_GET_SIZE(defaults) != n - required || PyTuple_GET_SIZE(where) != R_COUNT) {
        PyErr_SetString(PyExc_ValueError, "Site: inconsistent parameters");
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyUnicode_Check(PyTuple_GET_ITEM(names, i))) {
            PyErr_SetString(PyExc_TypeError, "Site: parameter names must be str");
            return -1;
        }
    }
    for (int r = 0; r < R_COUNT; r++) {
        long w = PyLong_AsLong(PyTuple_GET_ITEM(where, r));
        if ((w == -1 && PyErr_Occurred()) || w < -1 || w >= n) {
            PyErr_SetString(PyExc_ValueError, "Site: role index out of range");
            return -1;
        }
        self->where[r] = (int8_t)w;
    }
    if (!PyCallable_Check(orig) || !PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, "Site: orig and fallback must be callable");
        return -1;
    }
    Py_INCREF(fast);
    Py_XSETREF(self->fast, (FastPath *)fast);
    Py_INCREF(orig);
    Py_XSETREF(self->orig, orig);
    Py_INCREF(fallback);
    Py_XSETREF(self->fallback, fallback);
    Py_INCREF(names);
    Py_XSETREF(self->names, names);
    Py_INCREF(defaults);
    Py_XSETREF(self->defaults, defaults);
    self->nparams = (int16_t)n;
    self->required = (int16_t)required;
    self->op = op;
    self->flags = flags;
    self->vectorcall = (vectorcallfunc)Site_vectorcall;
    return 0;
}

static int
Site_traverse(Site *self, visitproc visit, void *arg)
{
    Py_VISIT(self->fast);
    Py_VISIT(self->orig);
    Py_VISIT(self->fallback);
    Py_VISIT(self->names);
    Py_VISIT(self->defaults);
    Py_VISIT(self->dict);
    return 0;
}

static int
Site_clear(Site *self)
{
    Py_CLEAR(self->fast);
    Py_CLEAR(self->orig);
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->names);
    Py_CLEAR(self->defaults);
    Py_CLEAR(self->dict);
    return 0;
}

static void
Site_dealloc(Site *self)
{
    PyObject_GC_UnTrack(self);
    Site_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
Site_reduce(Site *self, PyObject *Py_UNUSED(ignored))
{
    /* Pickled by reference, like the function it stands in for. */
    return PyObject_GetAttr((PyObject *)self, s_qualname);
}

static PyObject *
Site_repr(Site *self)
{
    return PyUnicode_FromFormat("<flightrec wrapper of %R>", self->orig);
}

static PyMethodDef Site_methods[] = {
    {"__reduce__", (PyCFunction)Site_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Site_members[] = {
    {"fast", T_OBJECT, offsetof(Site, fast), READONLY, "The FastPath this site records through."},
    {"fallback", T_OBJECT, offsetof(Site, fallback), READONLY, "The Python path."},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef Site_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject SiteType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "flightrec.recorder.hotpath._fast.Site",
    .tp_basicsize = sizeof(Site),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A traced function: records through its FastPath, then calls torch's own.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Site_init,
    .tp_dealloc = (destructor)Site_dealloc,
    .tp_traverse = (traverseproc)Site_traverse,
    .tp_clear = (inquiry)Site_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Site, vectorcall),
    .tp_dictoffset = offsetof(Site, dict),
    .tp_methods = Site_methods,
    .tp_members = Site_members,
    .tp_getset = Site_getset,
    .tp_repr = (reprfunc)Site_repr,
};

static struct PyModuleDef fastmodule = {
    PyModuleDef_HEAD_INIT, "_fast", "flightrec's recording hot path in C (optional).", -1, NULL,
};

PyMODINIT_FUNC
PyInit__fast(void)
{
#define INTERN(var, text)                                \
    if ((var = PyUnicode_InternFromString(text)) == NULL) \
        return NULL;
    INTERN(s_enabled, "enabled");
    INTERN(s_specs, "specs");
    INTERN(s_shape, "shape");
    INTERN(s_dtype, "dtype");
    INTERN(s_counter, "counter");
    INTERN(s_index, "index");
    INTERN(s_gpu, "gpu");
    INTERN(s_top, "top");
    INTERN(s_top_lasti, "top_lasti");
    INTERN(s_top_index, "top_index");
    INTERN(s_ranks, "ranks");
    INTERN(s_qualname, "__qualname__");
    if ((zero = PyLong_FromLong(0)) == NULL) {
        return NULL;
    }
#undef INTERN
    PyObject *m = PyModule_Create(&fastmodule);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "SLOT_SIZE", SLOT_SIZE) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    /* What this build decided by the Python version it was compiled for (``flightrec
     * doctor`` reports them): the walk over interpreter frames, and the group cache's dict
     * version check. */
    if (PyModule_AddIntConstant(m, "FRAME_WALK", FR_IFRAME) < 0 ||
        PyModule_AddIntConstant(m, "DICT_VERSION", FR_DICT_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    /* The offsets this file writes at, for the test that checks them against
     * flightrec.format.slot.SLOT (the layout's one definition). */
    PyObject *layout = Py_BuildValue(
        "{sisisisisisisisisisisisisisisisisisisisi}", "record_id", OFF_RID, "enqueue_ns", OFF_ENQ,
        "complete_ns", OFF_COMPLETE, "state", OFF_STATE, "seq", OFF_SEQ, "p2p_seq", OFF_P2P,
        "group", OFF_GROUP, "op", OFF_OP, "reduce_op", OFF_RED, "peer", OFF_PEER, "thread",
        OFF_THREAD, "stack", OFF_STACK, "inputs", OFF_IN, "outputs", OFF_OUT, "device", OFF_DEV,
        "flags", OFF_FLAGS, "record_id_again", OFF_RID2, "ENQUEUED", ENQUEUED, "COMPLETED",
        COMPLETED, "IS_P2P", FLAG_IS_P2P);
    if (layout == NULL || PyModule_AddObject(m, "LAYOUT", layout) < 0) {
        Py_XDECREF(layout);
        Py_DECREF(m);
        return NULL;
    }
    /* Each type under the last part of its tp_name (PyModule_AddType readies it). */
    PyTypeObject *types[] = {&CounterType, &ActiveType, &FastPathType, &SiteType};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        if (PyModule_AddType(m, types[i]) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}
