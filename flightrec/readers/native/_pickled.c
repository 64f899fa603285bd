/* A native Flight Recorder pickle read straight into checked entry columns, in C.
 *
 * Why C: a 2,000-entry native dump unpickles into some 50,000 dicts, tuples, strings and
 * integers that the Python reader then walks column by column and frees again: 15 ms of CPU
 * per file, 80% of reading it (benchmarks/bench_vs_fr_trace.py). Here the pickle's opcodes
 * are run against a small arena of tagged values (no Python object per value), the entries
 * table is read from the arena into the columns the Python reader would produce, and only
 * what repeats (strings, tensor signatures, frames, stacks) becomes a Python object, once
 * per distinct value.
 *
 * What it computes is defined in Python, which stays the reference and the fallback where
 * this extension is not built: ``load_plain_pickle`` then ``entries.check_columns``
 * (flightrec/readers/native/). This reader only takes the common shape: the plain-data
 * opcodes (no global, no persistent id, no set, no bytes, no integer beyond 64 bits) and
 * entries whose values have the types torch writes (or None where Python reads None as a
 * default). On anything else, including every damaged or hostile file, ``read`` answers
 * None and the Python path reads the file and explains what is wrong with it; so every
 * error message still comes from Python. tests/unit/test_native_fastread.py checks that the
 * two paths agree on real torch dumps and on arbitrary generated ones.
 *
 * Bounds: the file is at most 64 MB here, values, containers and memo slots are counted,
 * and the walk over entries counts every value it reads against the budget the caller passes,
 * the Python reader's (``reader.MAX_CELLS``): past any bound the answer is None.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_BYTES (64 * 1024 * 1024)
#define MAX_VALUES (16 * 1024 * 1024)
#define MAX_MEMO (16 * 1024 * 1024)
#define MAX_DEPTH 64
#define MAX_FRAMES 64     /* entries.MAX_FRAMES_PER_ENTRY */
#define MAX_TENSORS 4096  /* entries.MAX_TENSORS_PER_ENTRY */
#define MAX_DIMS 64       /* entries.MAX_DIMS */
#define MAX_LINE 0xFFFFFFFFLL

enum { T_UNSET, T_NONE, T_BOOL, T_INT, T_FLOAT, T_STR, T_LIST, T_TUPLE, T_DICT, T_MARK };

/* One value: the tag, a string or container index, and an integer (or a double's bits). */
typedef struct {
    uint32_t tag;
    uint32_t ref;
    int64_t i;
} Val;

typedef struct {
    const char *p;
    Py_ssize_t n;
    int32_t canon; /* id of the distinct content, -1 until looked up */
    int32_t key;   /* which known key it spells, -2 until looked up, -1 none */
} Str;

/* A container's items (a dict's keys and values alternate) are contiguous in ``items``;
 * growing one past its capacity moves it to the end of the arena, doubling. */
typedef struct {
    uint32_t kind;
    Py_ssize_t off, len, cap;
} Cont;

typedef struct {
    Val *v;
    Py_ssize_t n, cap;
} Vec;

/* Distinct keys (byte strings) numbered in order of first sight; open addressing. */
typedef struct {
    char *bytes;
    Py_ssize_t nbytes, bcap;
    Py_ssize_t *off; /* per id: where its key starts; off[id + 1] where it ends */
    uint64_t *hash;
    Py_ssize_t count, idcap;
    int32_t *slots;
    Py_ssize_t nslots;
} Interner;

typedef struct {
    const unsigned char *data;
    Py_ssize_t size, pos;
    /* Where the opcode being read must end: the end of the current frame (protocol 4+), else
     * of the data. Python's unpickler, reading a file, cannot run an opcode across the end of
     * a frame (writers never put one there): one that would is declined. */
    Py_ssize_t limit;
    Vec stack;
    Py_ssize_t *marks;
    Py_ssize_t nmarks, mcap;
    Val *memo;
    Py_ssize_t memo_cap, memo_count;
    Str *strs;
    Py_ssize_t nstrs, scap;
    Cont *conts;
    Py_ssize_t nconts, ccap;
    Vec items;
    Py_ssize_t values; /* allocated so far, bounded by MAX_VALUES */
    Py_ssize_t work, max_work; /* values read, bounded as the Python reader bounds them */
    Interner text; /* distinct string contents */
    PyObject **text_obj;
    Py_ssize_t text_cap;
} P;

/* -- small helpers ------------------------------------------------------------------------ */

static int
grow(void **buf, Py_ssize_t *cap, Py_ssize_t need, size_t item)
{
    if (need <= *cap)
        return 0;
    Py_ssize_t c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    void *nb = realloc(*buf, (size_t)c * item);
    if (nb == NULL)
        return -1;
    *buf = nb;
    *cap = c;
    return 0;
}

static uint64_t
hash_bytes(const char *p, Py_ssize_t n)
{
    /* Eight bytes a step (keys are mostly int64 sequences); multiply and fold. */
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (uint64_t)n;
    Py_ssize_t k = 0;
    for (; k + 8 <= n; k += 8) {
        uint64_t w;
        memcpy(&w, p + k, 8);
        h = (h ^ w) * 0xBF58476D1CE4E5B9ULL;
        h ^= h >> 31;
    }
    uint64_t w = 0;
    memcpy(&w, p + k, (size_t)(n - k));
    h = (h ^ w) * 0x94D049BB133111EBULL;
    return h ^ (h >> 29);
}

static void
interner_free(Interner *t)
{
    free(t->bytes);
    free(t->off);
    free(t->hash);
    free(t->slots);
    memset(t, 0, sizeof(*t));
}

/* The id of key ``p[0:n]``, adding it if new (``*fresh`` set); -1 when out of memory. */
static Py_ssize_t
intern(Interner *t, const void *p, Py_ssize_t n, int *fresh)
{
    uint64_t h = hash_bytes((const char *)p, n);
    if (t->nslots == 0 || (t->count + 1) * 2 > t->nslots) {
        Py_ssize_t ns = t->nslots ? t->nslots * 2 : 64;
        int32_t *s = malloc((size_t)ns * sizeof(int32_t));
        if (s == NULL)
            return -1;
        for (Py_ssize_t k = 0; k < ns; k++)
            s[k] = -1;
        for (Py_ssize_t id = 0; id < t->count; id++) {
            Py_ssize_t k = (Py_ssize_t)(t->hash[id] & (uint64_t)(ns - 1));
            while (s[k] >= 0)
                k = (k + 1) & (ns - 1);
            s[k] = (int32_t)id;
        }
        free(t->slots);
        t->slots = s;
        t->nslots = ns;
    }
    Py_ssize_t k = (Py_ssize_t)(h & (uint64_t)(t->nslots - 1));
    while (t->slots[k] >= 0) {
        Py_ssize_t id = t->slots[k];
        if (t->hash[id] == h && t->off[id + 1] - t->off[id] == n &&
            memcmp(t->bytes + t->off[id], p, (size_t)n) == 0) {
            *fresh = 0;
            return id;
        }
        k = (k + 1) & (t->nslots - 1);
    }
    if (grow((void **)&t->bytes, &t->bcap, t->nbytes + n + 1, 1) < 0 ||
        grow((void **)&t->off, &t->idcap, t->count + 2, sizeof(Py_ssize_t)) < 0)
        return -1;
    Py_ssize_t hcap = t->idcap;
    uint64_t *nh = realloc(t->hash, (size_t)hcap * sizeof(uint64_t));
    if (nh == NULL)
        return -1;
    t->hash = nh;
    memcpy(t->bytes + t->nbytes, p, (size_t)n);
    Py_ssize_t id = t->count++;
    t->off[id] = t->nbytes;
    t->nbytes += n;
    t->off[id + 1] = t->nbytes;
    t->hash[id] = h;
    t->slots[k] = (int32_t)id;
    *fresh = 1;
    return id;
}

/* -- the opcode machine ------------------------------------------------------------------- */

static int
push(P *s, Val v)
{
    if (s->stack.n >= s->stack.cap &&
        grow((void **)&s->stack.v, &s->stack.cap, s->stack.n + 1, sizeof(Val)) < 0)
        return -1;
    s->stack.v[s->stack.n++] = v;
    return 0;
}

static Py_ssize_t
fence(P *s)
{
    return s->nmarks ? s->marks[s->nmarks - 1] : 0;
}

static int
pop(P *s, Val *out)
{
    if (s->stack.n <= fence(s))
        return -1;
    *out = s->stack.v[--s->stack.n];
    return 0;
}

static int
new_cont(P *s, uint32_t kind, Py_ssize_t cap, Val *out)
{
    if (s->nconts >= INT32_MAX || s->values + cap > MAX_VALUES ||
        grow((void **)&s->conts, &s->ccap, s->nconts + 1, sizeof(Cont)) < 0 ||
        grow((void **)&s->items.v, &s->items.cap, s->items.n + cap, sizeof(Val)) < 0)
        return -1;
    Cont *c = &s->conts[s->nconts];
    c->kind = kind;
    c->off = s->items.n;
    c->len = 0;
    c->cap = cap;
    s->items.n += cap;
    s->values += cap;
    out->tag = kind;
    out->ref = (uint32_t)s->nconts++;
    out->i = 0;
    return 0;
}

/* Append ``n`` values to container ``ref`` (moving it to the arena's end when full). */
static int
extend(P *s, uint32_t ref, const Val *src, Py_ssize_t n)
{
    Cont *c = &s->conts[ref];
    if (c->len + n > c->cap) {
        /* The first batch gets what it needs (most containers get one); later ones double. */
        Py_ssize_t cap = c->cap ? c->cap * 2 : n;
        while (cap < c->len + n)
            cap *= 2;
        if (s->values + cap > MAX_VALUES ||
            grow((void **)&s->items.v, &s->items.cap, s->items.n + cap, sizeof(Val)) < 0)
            return -1;
        c = &s->conts[ref];
        memcpy(s->items.v + s->items.n, s->items.v + c->off, (size_t)c->len * sizeof(Val));
        c->off = s->items.n;
        c->cap = cap;
        s->items.n += cap;
        s->values += cap;
    }
    memcpy(s->items.v + c->off + c->len, src, (size_t)n * sizeof(Val));
    c->len += n;
    return 0;
}

static int
hashable(const Val *v)
{
    /* Keys that Python's unpickler accepts without question; anything else declines. */
    return v->tag == T_STR || v->tag == T_INT || v->tag == T_BOOL || v->tag == T_NONE ||
           v->tag == T_FLOAT;
}

static int
is_ascii(const unsigned char *p, Py_ssize_t n)
{
    for (Py_ssize_t k = 0; k < n; k++)
        if (p[k] & 0x80)
            return 0;
    return 1;
}

static int
new_str(P *s, const unsigned char *p, Py_ssize_t n, Val *out)
{
    if (!is_ascii(p, n)) {
        /* Python's unpickler decodes with "surrogatepass": refuse what it refuses. */
        PyObject *u = PyUnicode_DecodeUTF8((const char *)p, n, "surrogatepass");
        if (u == NULL) {
            PyErr_Clear();
            return -1;
        }
        Py_DECREF(u);
    }
    if (s->nstrs >= INT32_MAX || grow((void **)&s->strs, &s->scap, s->nstrs + 1, sizeof(Str)) < 0)
        return -1;
    Str *t = &s->strs[s->nstrs];
    t->p = (const char *)p;
    t->n = n;
    t->canon = -1;
    t->key = -2;
    out->tag = T_STR;
    out->ref = (uint32_t)s->nstrs++;
    out->i = 0;
    return 0;
}

static int
need(P *s, Py_ssize_t n)
{
    return n >= 0 && s->pos + n <= s->limit ? 0 : -1;
}

static uint64_t
le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int k = n - 1; k >= 0; k--)
        v = (v << 8) | p[k];
    return v;
}

static int
memo_put(P *s, Py_ssize_t idx)
{
    /* A writer numbers its memo from 0, one slot per value memoized, and each took an
     * opcode: an index beyond the file's size is no dump's (and would cost a large memo). */
    if (s->stack.n <= fence(s) || idx < 0 || idx >= MAX_MEMO || idx > s->size)
        return -1;
    if (idx >= s->memo_cap) {
        Py_ssize_t old = s->memo_cap;
        if (grow((void **)&s->memo, &s->memo_cap, idx + 1, sizeof(Val)) < 0)
            return -1;
        memset(s->memo + old, 0, (size_t)(s->memo_cap - old) * sizeof(Val));
    }
    if (s->memo[idx].tag == T_UNSET)
        s->memo_count++;
    s->memo[idx] = s->stack.v[s->stack.n - 1];
    return 0;
}

/* Run the pickle; 0 and the root value, or -1 to decline. */
static int
run(P *s, Val *root)
{
    Val v, w;
    for (;;) {
        if (s->pos == s->limit)
            s->limit = s->size; /* the frame ended, at an opcode's end */
        if (need(s, 1) < 0)
            return -1;
        unsigned char op = s->data[s->pos++];
        const unsigned char *a = s->data + s->pos;
        switch (op) {
        case 0x80: /* PROTO */
            if (need(s, 1) < 0 || a[0] < 2 || a[0] > 5)
                return -1;
            s->pos += 1;
            break;
        case 0x95: /* FRAME */
            if (s->limit != s->size || need(s, 8) < 0)
                return -1; /* (a frame inside a frame: no writer does that) */
            {
                uint64_t n = le(a, 8);
                s->pos += 8;
                if (n > (uint64_t)(s->size - s->pos))
                    return -1;
                s->limit = s->pos + (Py_ssize_t)n;
            }
            break;
        case '.': /* STOP */
            if (pop(s, root) < 0 || s->pos != s->size)
                return -1;
            return 0;
        case '(': /* MARK */
            if (grow((void **)&s->marks, &s->mcap, s->nmarks + 1, sizeof(Py_ssize_t)) < 0)
                return -1;
            s->marks[s->nmarks++] = s->stack.n;
            break;
        case '0': /* POP */
            if (pop(s, &v) < 0)
                return -1;
            break;
        case '1': /* POP_MARK */
            if (s->nmarks == 0)
                return -1;
            s->stack.n = s->marks[--s->nmarks];
            break;
        case 'N':
            v.tag = T_NONE, v.ref = 0, v.i = 0;
            if (push(s, v) < 0)
                return -1;
            break;
        case 0x88: /* NEWTRUE */
        case 0x89: /* NEWFALSE */
            v.tag = T_BOOL, v.ref = 0, v.i = op == 0x88;
            if (push(s, v) < 0)
                return -1;
            break;
        case 'K': /* BININT1 */
        case 'M': /* BININT2 */
        case 'J': /* BININT */
        {
            int n = op == 'K' ? 1 : op == 'M' ? 2 : 4;
            if (need(s, n) < 0)
                return -1;
            v.tag = T_INT, v.ref = 0;
            v.i = op == 'J' ? (int64_t)(int32_t)(uint32_t)le(a, 4) : (int64_t)le(a, n);
            s->pos += n;
            if (push(s, v) < 0)
                return -1;
            break;
        }
        case 0x8a: /* LONG1 */
        {
            if (need(s, 1) < 0)
                return -1;
            int n = a[0];
            if (n > 8 || need(s, 1 + n) < 0)
                return -1; /* beyond 64 bits: Python reads it */
            uint64_t u = n ? le(a + 1, n) : 0;
            if (n && n < 8 && (a[n] & 0x80))
                u |= ~(uint64_t)0 << (8 * n); /* sign-extend */
            v.tag = T_INT, v.ref = 0, v.i = (int64_t)u;
            s->pos += 1 + n;
            if (push(s, v) < 0)
                return -1;
            break;
        }
        case 'G': /* BINFLOAT, big-endian */
        {
            if (need(s, 8) < 0)
                return -1;
            uint64_t u = 0;
            for (int k = 0; k < 8; k++)
                u = (u << 8) | a[k];
            v.tag = T_FLOAT, v.ref = 0;
            memcpy(&v.i, &u, 8);
            s->pos += 8;
            if (push(s, v) < 0)
                return -1;
            break;
        }
        case 0x8c: /* SHORT_BINUNICODE */
        case 'X':  /* BINUNICODE */
        case 0x8d: /* BINUNICODE8 */
        {
            int w8 = op == 0x8c ? 1 : op == 'X' ? 4 : 8;
            if (need(s, w8) < 0)
                return -1;
            uint64_t n = le(a, w8);
            s->pos += w8;
            if (n > (uint64_t)(s->limit - s->pos))
                return -1;
            if (new_str(s, s->data + s->pos, (Py_ssize_t)n, &v) < 0)
                return -1;
            s->pos += (Py_ssize_t)n;
            if (push(s, v) < 0)
                return -1;
            break;
        }
        case '}': /* EMPTY_DICT */
        case ']': /* EMPTY_LIST */
            if (new_cont(s, op == '}' ? T_DICT : T_LIST, 0, &v) < 0 || push(s, v) < 0)
                return -1;
            break;
        case ')': /* EMPTY_TUPLE */
        case 0x85: /* TUPLE1 */
        case 0x86: /* TUPLE2 */
        case 0x87: /* TUPLE3 */
        case 't':  /* TUPLE */
        case 'l':  /* LIST */
        case 'd':  /* DICT */
        {
            Py_ssize_t from;
            if (op == 't' || op == 'l' || op == 'd') {
                if (s->nmarks == 0)
                    return -1;
                from = s->marks[--s->nmarks];
            }
            else {
                Py_ssize_t n = op == ')' ? 0 : op - 0x84;
                from = s->stack.n - n;
                if (from < fence(s))
                    return -1;
            }
            Py_ssize_t n = s->stack.n - from;
            uint32_t kind = op == 'l' ? T_LIST : op == 'd' ? T_DICT : T_TUPLE;
            if (kind == T_DICT) {
                if (n % 2)
                    return -1;
                for (Py_ssize_t k = from; k < s->stack.n; k += 2)
                    if (!hashable(&s->stack.v[k]))
                        return -1;
            }
            if (new_cont(s, kind, n, &v) < 0 || extend(s, v.ref, s->stack.v + from, n) < 0)
                return -1;
            s->stack.n = from;
            if (push(s, v) < 0)
                return -1;
            break;
        }
        case 'a': /* APPEND */
            if (pop(s, &w) < 0 || s->stack.n <= fence(s))
                return -1;
            v = s->stack.v[s->stack.n - 1];
            if (v.tag != T_LIST || extend(s, v.ref, &w, 1) < 0)
                return -1;
            break;
        case 'e': /* APPENDS */
        case 'u': /* SETITEMS */
        {
            if (s->nmarks == 0)
                return -1;
            Py_ssize_t from = s->marks[--s->nmarks];
            if (from < 1 || from - 1 < fence(s))
                return -1;
            v = s->stack.v[from - 1];
            Py_ssize_t n = s->stack.n - from;
            if (op == 'e' && v.tag != T_LIST)
                return -1;
            if (op == 'u') {
                if (v.tag != T_DICT || n % 2)
                    return -1;
                for (Py_ssize_t k = from; k < s->stack.n; k += 2)
                    if (!hashable(&s->stack.v[k]))
                        return -1;
            }
            if (n && extend(s, v.ref, s->stack.v + from, n) < 0)
                return -1;
            s->stack.n = from;
            break;
        }
        case 's': /* SETITEM */
        {
            Val kv[2];
            if (pop(s, &kv[1]) < 0 || pop(s, &kv[0]) < 0 || s->stack.n <= fence(s))
                return -1;
            v = s->stack.v[s->stack.n - 1];
            if (v.tag != T_DICT || !hashable(&kv[0]) || extend(s, v.ref, kv, 2) < 0)
                return -1;
            break;
        }
        case 0x94: /* MEMOIZE */
            if (s->memo_count < s->memo_cap && s->stack.n > fence(s) &&
                s->memo[s->memo_count].tag == T_UNSET) {
                s->memo[s->memo_count++] = s->stack.v[s->stack.n - 1];
                break;
            }
            if (memo_put(s, s->memo_count) < 0)
                return -1;
            break;
        case 'q': /* BINPUT */
        case 'r': /* LONG_BINPUT */
        {
            int n = op == 'q' ? 1 : 4;
            if (need(s, n) < 0)
                return -1;
            Py_ssize_t idx = (Py_ssize_t)le(a, n);
            s->pos += n;
            if (memo_put(s, idx) < 0)
                return -1;
            break;
        }
        case 'h': /* BINGET: a third of a dump's opcodes, so the short way first */
            if (s->pos < s->limit && a[0] < s->memo_cap && s->memo[a[0]].tag != T_UNSET &&
                s->stack.n < s->stack.cap) {
                s->stack.v[s->stack.n++] = s->memo[a[0]];
                s->pos++;
                break;
            }
            /* fall through: the checks below say which one failed */
        case 'j': /* LONG_BINGET */
        {
            int n = op == 'h' ? 1 : 4;
            if (need(s, n) < 0)
                return -1;
            Py_ssize_t idx = (Py_ssize_t)le(a, n);
            s->pos += n;
            if (idx >= s->memo_cap || s->memo[idx].tag == T_UNSET || push(s, s->memo[idx]) < 0)
                return -1;
            break;
        }
        default:
            return -1; /* globals, sets, bytes, protocol 0 text...: Python reads it */
        }
    }
}

/* -- reading values ------------------------------------------------------------------------ */

static Cont *
cont(P *s, const Val *v)
{
    return &s->conts[v->ref];
}

static Val *
items(P *s, const Val *v)
{
    return s->items.v + s->conts[v->ref].off;
}

static int
spend(P *s, Py_ssize_t n)
{
    s->work += n;
    return s->work > s->max_work ? -1 : 0;
}

static int
same_text(const Str *t, const char *lit)
{
    size_t n = strlen(lit);
    return (size_t)t->n == n && memcmp(t->p, lit, n) == 0;
}

/* The distinct-content id of string ``ref``; -1 when out of memory. */
static Py_ssize_t
canon(P *s, uint32_t ref)
{
    Str *t = &s->strs[ref];
    if (t->canon >= 0)
        return t->canon;
    int fresh;
    Py_ssize_t id = intern(&s->text, t->p, t->n, &fresh);
    if (id < 0)
        return -1;
    if (fresh) {
        if (grow((void **)&s->text_obj, &s->text_cap, id + 1, sizeof(PyObject *)) < 0)
            return -1;
        s->text_obj[id] = NULL;
    }
    t->canon = (int32_t)id;
    return id;
}

/* The Python string of text id ``id`` (borrowed, one object per content). */
static PyObject *
text_obj(P *s, Py_ssize_t id)
{
    if (s->text_obj[id] == NULL) {
        const char *p = s->text.bytes + s->text.off[id];
        Py_ssize_t n = s->text.off[id + 1] - s->text.off[id];
        s->text_obj[id] = PyUnicode_DecodeUTF8(p, n, "surrogatepass");
    }
    return s->text_obj[id];
}

/* The Python string of string ``ref`` (borrowed). */
static PyObject *
text_of(P *s, uint32_t ref)
{
    Py_ssize_t id = canon(s, ref);
    return id < 0 ? NULL : text_obj(s, id);
}

/* Build a Python object from a value (everything but the entries); NULL declines. */
static PyObject *
to_python(P *s, const Val *v, PyObject **made, int depth)
{
    if (depth > MAX_DEPTH || spend(s, 1) < 0)
        return NULL;
    switch (v->tag) {
    case T_NONE:
        Py_RETURN_NONE;
    case T_BOOL:
        return PyBool_FromLong((long)v->i);
    case T_INT:
        return PyLong_FromLongLong(v->i);
    case T_FLOAT:
    {
        double d;
        memcpy(&d, &v->i, 8);
        return PyFloat_FromDouble(d);
    }
    case T_STR:
    {
        PyObject *o = text_of(s, v->ref);
        Py_XINCREF(o);
        return o;
    }
    default:
        break;
    }
    if (made[v->ref]) {
        Py_INCREF(made[v->ref]);
        return made[v->ref];
    }
    Cont *c = cont(s, v);
    Py_ssize_t n = c->len;
    const Val *it = items(s, v);
    if (v->tag == T_TUPLE) {
        PyObject *t = PyTuple_New(n);
        if (t == NULL)
            return NULL;
        for (Py_ssize_t k = 0; k < n; k++) {
            PyObject *o = to_python(s, &it[k], made, depth + 1);
            if (o == NULL) {
                Py_DECREF(t);
                return NULL;
            }
            PyTuple_SET_ITEM(t, k, o);
            it = items(s, v);
        }
        made[v->ref] = t; /* shared like the pickle shares it */
        Py_INCREF(t);
        return t;
    }
    PyObject *o = v->tag == T_LIST ? PyList_New(0) : PyDict_New();
    if (o == NULL)
        return NULL;
    made[v->ref] = o; /* before the items: a list may hold itself */
    Py_INCREF(o);
    for (Py_ssize_t k = 0; k < n; k += v->tag == T_LIST ? 1 : 2) {
        PyObject *x = to_python(s, &items(s, v)[k], made, depth + 1);
        if (x == NULL)
            goto fail;
        int bad;
        if (v->tag == T_LIST)
            bad = PyList_Append(o, x);
        else {
            PyObject *y = to_python(s, &items(s, v)[k + 1], made, depth + 1);
            bad = y == NULL || PyDict_SetItem(o, x, y) < 0;
            Py_XDECREF(y);
        }
        Py_DECREF(x);
        if (bad)
            goto fail;
    }
    return o;
fail:
    Py_DECREF(o);
    return NULL;
}

/* -- the entries table -------------------------------------------------------------------- */

enum {
    K_PROFILING_NAME, K_PROCESS_GROUP, K_COLLECTIVE_SEQ_ID, K_RECORD_ID, K_IS_P2P,
    K_INPUT_SIZES, K_INPUT_DTYPES, K_OUTPUT_SIZES, K_OUTPUT_DTYPES, K_FRAMES, K_PG_ID,
    K_P2P_SEQ_ID, K_STATE, K_TIME_CREATED_NS, K_TIME_DISCOVERED_STARTED_NS,
    K_TIME_DISCOVERED_COMPLETED_NS, K_THREAD_NAME, K_TIMEOUT_MS, N_COLUMNS,
    K_LINE = N_COLUMNS, K_FILENAME, K_NAME, N_KEYS
};

static const char *KEYS[N_KEYS] = {
    "profiling_name", "process_group", "collective_seq_id", "record_id", "is_p2p",
    "input_sizes", "input_dtypes", "output_sizes", "output_dtypes", "frames", "pg_id",
    "p2p_seq_id", "state", "time_created_ns", "time_discovered_started_ns",
    "time_discovered_completed_ns", "thread_name", "timeout_ms",
    "line", "filename", "name",
};

static int
key_of(P *s, uint32_t ref)
{
    Str *t = &s->strs[ref];
    if (t->key == -2) {
        t->key = -1;
        for (int k = 0; k < N_KEYS; k++)
            if (same_text(t, KEYS[k])) {
                t->key = k;
                break;
            }
    }
    return t->key;
}

/* The output columns, filled entry by entry, and the distinct values they refer to. */
typedef struct {
    Interner sigs, frames, stacks;
    PyObject *sig_objs, *stack_objs; /* lists, in id order */
    PyObject **frame_objs;
    Py_ssize_t frame_cap;
    /* Per container, what it was read as, -1 until read: shared containers (the pickle memo
     * keeps the writer's sharing) are read once. A signature depends on its dtypes list too,
     * kept beside it. */
    int32_t *frame_of_cont, *stack_of_cont, *sig_of_cont;
    int64_t *sig_dtypes_of_cont;
    PyObject *dtype_name;   /* raw dtype name -> torch's name (a Python callable) */
    PyObject **dtype_obj;   /* per distinct text id: torch's name, or NULL until asked */
    int64_t *dtype_final;   /* per distinct text id: the id of torch's name */
    Py_ssize_t dtype_cap;
    PyObject *final_ids; /* torch's name -> small int */
    int64_t *scratch;
    Py_ssize_t scratch_cap;
    Py_ssize_t empty_id; /* text id of "" (what None reads as) */
} Out;

/* An integer value (a bool is its number, None ``dflt``); -1 declines. */
static int
int_of(const Val *v, int64_t dflt, int64_t *out)
{
    if (v->tag == T_INT || v->tag == T_BOOL)
        *out = v->i;
    else if (v->tag == T_NONE)
        *out = dflt;
    else
        return -1;
    return 0;
}

/* The text id of a string value (None reads as ""); -1 declines. */
static Py_ssize_t
text_id(P *s, Out *o, const Val *v)
{
    if (v->tag == T_NONE)
        return o->empty_id;
    if (v->tag != T_STR)
        return -1;
    return canon(s, v->ref);
}

/* A string value (None is "") as a borrowed Python string; NULL declines. */
static PyObject *
str_of(P *s, Out *o, const Val *v)
{
    Py_ssize_t id = text_id(s, o, v);
    return id < 0 ? NULL : text_obj(s, id);
}

static int
scratch(Out *o, Py_ssize_t n)
{
    return grow((void **)&o->scratch, &o->scratch_cap, n, sizeof(int64_t));
}

/* Text id ``tid`` read as a dtype: torch's name for it is asked of Python once. */
static int
dtype_of(P *s, Out *o, Py_ssize_t tid)
{
    Py_ssize_t old = o->dtype_cap;
    if (grow((void **)&o->dtype_obj, &o->dtype_cap, tid + 1, sizeof(PyObject *)) < 0)
        return -1;
    if (o->dtype_cap > old) {
        Py_ssize_t cap = o->dtype_cap;
        int64_t *f = realloc(o->dtype_final, (size_t)cap * sizeof(int64_t));
        if (f == NULL)
            return -1;
        o->dtype_final = f;
        memset(o->dtype_obj + old, 0, (size_t)(cap - old) * sizeof(PyObject *));
    }
    if (o->dtype_obj[tid] != NULL)
        return 0;
    PyObject *raw = text_obj(s, tid);
    if (raw == NULL)
        return -1;
    PyObject *name = PyObject_CallOneArg(o->dtype_name, raw);
    if (name == NULL || !PyUnicode_CheckExact(name)) {
        Py_XDECREF(name);
        return -1;
    }
    PyObject *known = PyDict_GetItemWithError(o->final_ids, name);
    if (known != NULL)
        o->dtype_final[tid] = PyLong_AsLongLong(known);
    else {
        Py_ssize_t next = PyDict_GET_SIZE(o->final_ids);
        PyObject *n = PyLong_FromSsize_t(next);
        if (n == NULL || PyDict_SetItem(o->final_ids, name, n) < 0) {
            Py_XDECREF(n);
            Py_DECREF(name);
            return -1;
        }
        Py_DECREF(n);
        o->dtype_final[tid] = next;
    }
    o->dtype_obj[tid] = name; /* owned */
    return 0;
}

static int32_t sig_new(P *s, Out *o, const Val *sizes, const Val *dtypes);

/* An entry's tensor signature id (0 is the empty one), as ``entries._tensors_one``. */
static int32_t
sig_of(P *s, Out *o, const Val *sizes, const Val *dtypes)
{
    if (sizes->tag == T_NONE)
        return 0;
    if (sizes->tag != T_LIST && sizes->tag != T_TUPLE)
        return -1;
    int64_t dkey = ((int64_t)dtypes->tag << 32) | dtypes->ref;
    if (o->sig_of_cont[sizes->ref] >= 0 && o->sig_dtypes_of_cont[sizes->ref] == dkey)
        return o->sig_of_cont[sizes->ref];
    int32_t id = sig_new(s, o, sizes, dtypes);
    if (id >= 0) {
        o->sig_of_cont[sizes->ref] = id;
        o->sig_dtypes_of_cont[sizes->ref] = dkey;
    }
    return id;
}

static int32_t
sig_new(P *s, Out *o, const Val *sizes, const Val *dtypes)
{
    Py_ssize_t nd = 0;
    if (dtypes->tag == T_LIST || dtypes->tag == T_TUPLE)
        nd = cont(s, dtypes)->len;
    else if (dtypes->tag != T_NONE)
        return -1;
    Py_ssize_t nt = cont(s, sizes)->len;
    if (nt > MAX_TENSORS)
        nt = MAX_TENSORS;
    if (spend(s, 2 + nt + nd) < 0)
        return -1;
    /* The key, per tensor: its dims, their count, the id of torch's name of its dtype (read
     * back to front, it parses one way only). */
    Py_ssize_t len = 0;
    const Val none = {T_NONE, 0, 0};
    for (Py_ssize_t i = 0; i < nt; i++) {
        const Val *shape = &items(s, sizes)[i];
        if (shape->tag != T_LIST && shape->tag != T_TUPLE)
            return -1;
        Py_ssize_t ndims = cont(s, shape)->len;
        if (ndims > MAX_DIMS || spend(s, ndims) < 0 || scratch(o, len + ndims + 2) < 0)
            return -1;
        const Val *dims = items(s, shape);
        for (Py_ssize_t k = 0; k < ndims; k++) {
            if (dims[k].tag != T_INT)
                return -1;
            o->scratch[len++] = dims[k].i;
        }
        o->scratch[len++] = ndims;
        Py_ssize_t tid = text_id(s, o, i < nd ? &items(s, dtypes)[i] : &none);
        if (tid < 0 || dtype_of(s, o, tid) < 0)
            return -1;
        o->scratch[len++] = o->dtype_final[tid]; /* torch's name defines the signature */
    }
    int fresh;
    Py_ssize_t id = intern(&o->sigs, o->scratch, len * (Py_ssize_t)sizeof(int64_t), &fresh);
    if (id < 0 || id >= INT32_MAX)
        return -1;
    if (!fresh)
        return (int32_t)id;
    PyObject *sig = PyTuple_New(nt);
    if (sig == NULL)
        return -1;
    for (Py_ssize_t i = 0; i < nt; i++) {
        const Val *shape = &items(s, sizes)[i];
        Py_ssize_t ndims = cont(s, shape)->len;
        Py_ssize_t tid = text_id(s, o, i < nd ? &items(s, dtypes)[i] : &none);
        PyObject *dims = PyTuple_New(ndims);
        if (dims == NULL) {
            Py_DECREF(sig);
            return -1;
        }
        for (Py_ssize_t k = 0; k < ndims; k++) {
            PyObject *x = PyLong_FromLongLong(items(s, shape)[k].i);
            if (x == NULL) {
                Py_DECREF(dims);
                Py_DECREF(sig);
                return -1;
            }
            PyTuple_SET_ITEM(dims, k, x);
        }
        PyObject *pair = PyTuple_Pack(2, dims, o->dtype_obj[tid]);
        Py_DECREF(dims);
        if (pair == NULL) {
            Py_DECREF(sig);
            return -1;
        }
        PyTuple_SET_ITEM(sig, i, pair);
    }
    int bad = PyList_Append(o->sig_objs, sig);
    Py_DECREF(sig);
    return bad ? -1 : (int32_t)id;
}

/* The frame id of a frame dict, as ``entries._stack_one`` reads one frame. */
static Py_ssize_t
frame_of(P *s, Out *o, const Val *f)
{
    if (f->tag != T_DICT)
        return -1;
    if (o->frame_of_cont[f->ref] >= 0)
        return o->frame_of_cont[f->ref];
    Val line = {T_NONE, 0, 0}, file = {T_NONE, 0, 0}, name = {T_NONE, 0, 0};
    Py_ssize_t n = cont(s, f)->len;
    if (spend(s, 1 + n / 2) < 0)
        return -1;
    const Val *it = items(s, f);
    for (Py_ssize_t k = 0; k < n; k += 2) {
        if (it[k].tag != T_STR)
            continue; /* only these three keys are read */
        int key = key_of(s, it[k].ref);
        if (key == K_LINE)
            line = it[k + 1];
        else if (key == K_FILENAME)
            file = it[k + 1];
        else if (key == K_NAME)
            name = it[k + 1];
    }
    int64_t key[3];
    if (int_of(&line, 0, &key[2]) < 0 || key[2] > MAX_LINE)
        return -1;
    if (key[2] < 0)
        key[2] = 0;
    key[0] = text_id(s, o, &file);
    key[1] = text_id(s, o, &name);
    if (key[0] < 0 || key[1] < 0)
        return -1;
    int fresh;
    Py_ssize_t id = intern(&o->frames, key, sizeof(key), &fresh);
    if (id < 0 || id >= INT32_MAX)
        return -1;
    if (fresh) {
        if (grow((void **)&o->frame_objs, &o->frame_cap, id + 1, sizeof(PyObject *)) < 0)
            return -1;
        PyObject *fs = text_obj(s, key[0]), *ns = text_obj(s, key[1]);
        o->frame_objs[id] = fs && ns ? Py_BuildValue("(OOL)", fs, ns, (long long)key[2]) : NULL;
        if (o->frame_objs[id] == NULL)
            return -1;
    }
    o->frame_of_cont[f->ref] = (int32_t)id;
    return id;
}

static int32_t stack_new(P *s, Out *o, const Val *frames);

/* An entry's stack id (0 is the empty one), as ``entries._stack_one``. */
static int32_t
stack_of(P *s, Out *o, const Val *frames)
{
    if (frames->tag == T_NONE)
        return 0;
    if (frames->tag != T_LIST && frames->tag != T_TUPLE)
        return -1;
    if (o->stack_of_cont[frames->ref] >= 0)
        return o->stack_of_cont[frames->ref];
    int32_t id = stack_new(s, o, frames);
    if (id >= 0)
        o->stack_of_cont[frames->ref] = id;
    return id;
}

static int32_t
stack_new(P *s, Out *o, const Val *frames)
{
    Py_ssize_t n = cont(s, frames)->len;
    if (n > MAX_FRAMES)
        n = MAX_FRAMES;
    if (spend(s, 1 + n) < 0 || scratch(o, n) < 0)
        return -1;
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_ssize_t f = frame_of(s, o, &items(s, frames)[k]);
        if (f < 0)
            return -1;
        o->scratch[k] = f;
    }
    int fresh;
    Py_ssize_t id = intern(&o->stacks, o->scratch, n * (Py_ssize_t)sizeof(int64_t), &fresh);
    if (id < 0 || id >= INT32_MAX)
        return -1;
    if (!fresh)
        return (int32_t)id;
    PyObject *t = PyTuple_New(n);
    if (t == NULL)
        return -1;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *fr = o->frame_objs[o->scratch[k]];
        Py_INCREF(fr);
        PyTuple_SET_ITEM(t, k, fr);
    }
    int bad = PyList_Append(o->stack_objs, t);
    Py_DECREF(t);
    return bad ? -1 : (int32_t)id;
}

enum { I_RECORD, I_PG, I_SEQ, I_P2P_SEQ, I_CREATED, I_STARTED, I_COMPLETED, I_TIMEOUT, N_INTS };
enum { L_PG_NAME, L_PG_DESC, L_NAME, L_IS_P2P, L_STATE, L_THREAD, N_LISTS };
enum { C_INPUTS, C_OUTPUTS, C_STACK, N_CODES };

static const int INT_KEY[N_INTS] = {
    K_RECORD_ID, K_PG_ID, K_COLLECTIVE_SEQ_ID, K_P2P_SEQ_ID, K_TIME_CREATED_NS,
    K_TIME_DISCOVERED_STARTED_NS, K_TIME_DISCOVERED_COMPLETED_NS, K_TIMEOUT_MS,
};

static int
set_list(PyObject *list, Py_ssize_t i, PyObject *o)
{
    if (o == NULL)
        return -1;
    Py_INCREF(o);
    PyList_SET_ITEM(list, i, o);
    return 0;
}

/* Fill the columns from the entries list ``es``; -1 declines. ``later`` holds 3 values
 * per entry. */
static int
read_entries(P *s, Out *o, const Val *es, PyObject **ints, PyObject **lists, PyObject **codes,
             Val *later)
{
    Py_ssize_t n = cont(s, es)->len;
    int64_t *iv[N_INTS];
    int32_t *cv[N_CODES];
    for (int k = 0; k < N_INTS; k++)
        iv[k] = (int64_t *)PyBytes_AS_STRING(ints[k]);
    for (int k = 0; k < N_CODES; k++)
        cv[k] = (int32_t *)PyBytes_AS_STRING(codes[k]);
    for (Py_ssize_t i = 0; i < n; i++) {
        const Val *e = &items(s, es)[i];
        if (e->tag != T_DICT)
            return -1;
        Val col[N_COLUMNS];
        for (int k = 0; k < N_COLUMNS; k++)
            col[k].tag = T_NONE, col[k].ref = 0, col[k].i = 0; /* a missing key reads as None */
        Py_ssize_t len = cont(s, e)->len;
        if (spend(s, 1 + len / 2) < 0)
            return -1;
        const Val *it = items(s, e);
        for (Py_ssize_t k = 0; k < len; k += 2) {
            if (it[k].tag != T_STR)
                return -1;
            int key = key_of(s, it[k].ref);
            if (key >= 0 && key < N_COLUMNS)
                col[key] = it[k + 1]; /* the last of a repeated key, as dict does */
        }
        /* Integers: None is the default (the record id is the entry's position); the
         * columns read by ``Reader.naturals`` read a negative value as 0; pg_id does not. */
        if (col[K_COLLECTIVE_SEQ_ID].tag == T_NONE)
            return -1; /* format 1.x's seq_id: Python reads it */
        for (int k = 0; k < N_INTS; k++) {
            int64_t x;
            int64_t dflt = k == I_RECORD ? (int64_t)i : k == I_PG ? -1 : 0;
            if (int_of(&col[INT_KEY[k]], dflt, &x) < 0)
                return -1;
            iv[k][i] = (k != I_PG && x < 0) ? 0 : x;
        }
        /* Process group: (name, desc); None or missing parts read as "". */
        const Val *pg = &col[K_PROCESS_GROUP];
        PyObject *name = NULL, *desc = NULL;
        Val empty = {T_NONE, 0, 0};
        if (pg->tag == T_NONE)
            name = desc = str_of(s, o, &empty);
        else if (pg->tag == T_LIST || pg->tag == T_TUPLE) {
            Py_ssize_t np = cont(s, pg)->len;
            const Val *parts = items(s, pg);
            name = str_of(s, o, np > 0 ? &parts[0] : &empty);
            desc = str_of(s, o, np > 1 ? &parts[1] : &empty);
        }
        if (set_list(lists[L_PG_NAME], i, name) < 0 || set_list(lists[L_PG_DESC], i, desc) < 0)
            return -1;
        if (set_list(lists[L_NAME], i, str_of(s, o, &col[K_PROFILING_NAME])) < 0 ||
            set_list(lists[L_STATE], i, str_of(s, o, &col[K_STATE])) < 0 ||
            set_list(lists[L_THREAD], i, str_of(s, o, &col[K_THREAD_NAME])) < 0)
            return -1;
        const Val *p2p = &col[K_IS_P2P];
        if (p2p->tag != T_NONE && p2p->tag != T_BOOL && p2p->tag != T_INT)
            return -1;
        if (set_list(lists[L_IS_P2P], i, p2p->i ? Py_True : Py_False) < 0)
            return -1;
        int32_t a = sig_of(s, o, &col[K_INPUT_SIZES], &col[K_INPUT_DTYPES]);
        if (a < 0)
            return -1;
        cv[C_INPUTS][i] = a;
        /* Outputs and stacks are interned after all inputs, as Python does: kept for later. */
        later[3 * i] = col[K_OUTPUT_SIZES];
        later[3 * i + 1] = col[K_OUTPUT_DTYPES];
        later[3 * i + 2] = col[K_FRAMES];
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t b = sig_of(s, o, &later[3 * i], &later[3 * i + 1]);
        if (b < 0)
            return -1;
        cv[C_OUTPUTS][i] = b;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t c = stack_of(s, o, &later[3 * i + 2]);
        if (c < 0)
            return -1;
        cv[C_STACK][i] = c;
    }
    return 0;
}

static void
p_free(P *s)
{
    free(s->stack.v);
    free(s->marks);
    free(s->memo);
    free(s->strs);
    free(s->conts);
    free(s->items.v);
    for (Py_ssize_t k = 0; k < s->text.count; k++)
        Py_XDECREF(s->text_obj[k]);
    free(s->text_obj);
    interner_free(&s->text);
}

static void
out_free(Out *o)
{
    interner_free(&o->sigs);
    interner_free(&o->frames);
    interner_free(&o->stacks);
    Py_XDECREF(o->sig_objs);
    Py_XDECREF(o->stack_objs);
    for (Py_ssize_t k = 0; k < o->frames.count && k < o->frame_cap; k++)
        Py_XDECREF(o->frame_objs[k]);
    free(o->frame_objs);
    free(o->frame_of_cont);
    free(o->stack_of_cont);
    free(o->sig_of_cont);
    free(o->sig_dtypes_of_cont);
    for (Py_ssize_t k = 0; k < o->dtype_cap; k++)
        Py_XDECREF(o->dtype_obj[k]);
    free(o->dtype_obj);
    free(o->dtype_final);
    Py_XDECREF(o->final_ids);
    free(o->scratch);
}

/* Everything in the root dict but its entries, as Python objects; NULL declines. */
static PyObject *
rest_of(P *s, const Val *root, PyObject **made)
{
    PyObject *d = PyDict_New();
    if (d == NULL)
        return NULL;
    Py_ssize_t n = cont(s, root)->len;
    for (Py_ssize_t k = 0; k < n; k += 2) {
        const Val *it = items(s, root);
        if (it[k].tag == T_STR && same_text(&s->strs[it[k].ref], "entries"))
            continue;
        PyObject *key = to_python(s, &it[k], made, 1);
        PyObject *val = key ? to_python(s, &items(s, root)[k + 1], made, 1) : NULL;
        int bad = val == NULL || PyDict_SetItem(d, key, val) < 0;
        Py_XDECREF(key);
        Py_XDECREF(val);
        if (bad) {
            Py_DECREF(d);
            return NULL;
        }
    }
    return d;
}

PyDoc_STRVAR(read_doc,
"read(data, dtype_name, max_cells, /)\n--\n\n"
"Read a native dump's pickle into (rest, n, ints, lists, codes, tensor_sigs, stacks), or\n"
"None where the Python path must read it (see the module's source).\n\n"
"rest: the top-level dict without its entries; ints: 8 bytes objects of n int64 (record_id,\n"
"pg_id, seq, p2p_seq, created, started, completed, timeout_ms); lists: pg_name, pg_desc,\n"
"profiling_name, is_p2p, state, thread; codes: 3 bytes objects of n int32 (inputs, outputs,\n"
"stack) indexing tensor_sigs and stacks (index 0 the empty one). dtype_name maps a dtype\n"
"string as written to torch's name; max_cells bounds the values read (the Python reader's\n"
"budget, reader.MAX_CELLS).");

static PyObject *
py_read(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "read(data, dtype_name, max_cells)");
        return NULL;
    }
    Py_ssize_t max_work = PyLong_AsSsize_t(args[2]);
    if (max_work < 0 && PyErr_Occurred())
        return NULL;
    Py_buffer buf;
    if (PyObject_GetBuffer(args[0], &buf, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *result = NULL;
    P s;
    Out o;
    memset(&s, 0, sizeof(s));
    memset(&o, 0, sizeof(o));
    PyObject **made = NULL;
    Val *later = NULL;
    PyObject *ints[N_INTS] = {0}, *lists[N_LISTS] = {0}, *codes[N_CODES] = {0}, *rest = NULL;
    if (buf.len > MAX_BYTES)
        goto decline;
    s.data = buf.buf;
    s.size = s.limit = buf.len;
    s.max_work = max_work;
    /* Every value in a container took at least one opcode byte: sized so, the arena almost
     * never moves (untouched pages of a large block cost nothing). The memo must be zeroed:
     * sized for what dumps memoize (a slot per 8-20 bytes), it grows beyond if need be. */
    if (grow((void **)&s.items.v, &s.items.cap, s.size + 64, sizeof(Val)) < 0)
        goto decline;
    s.memo_cap = s.size / 8 + 64 < MAX_MEMO ? s.size / 8 + 64 : MAX_MEMO; /* one in 8 bytes */
    if ((s.memo = calloc((size_t)s.memo_cap, sizeof(Val))) == NULL)
        goto decline;
    Val root;
    if (run(&s, &root) < 0 || root.tag != T_DICT)
        goto decline;
    const Val *es = NULL;
    for (Py_ssize_t k = 0; k < cont(&s, &root)->len; k += 2) {
        const Val *it = items(&s, &root);
        if (it[k].tag == T_STR && same_text(&s.strs[it[k].ref], "entries"))
            es = &it[k + 1];
    }
    if (es == NULL || (es->tag != T_LIST && es->tag != T_TUPLE) || cont(&s, es)->len == 0)
        goto decline;
    Py_ssize_t n = cont(&s, es)->len;
    o.dtype_name = args[1];
    o.sig_objs = PyList_New(0);
    o.stack_objs = PyList_New(0);
    o.final_ids = PyDict_New();
    size_t nc = (size_t)(s.nconts ? s.nconts : 1);
    o.frame_of_cont = malloc(nc * sizeof(int32_t));
    o.stack_of_cont = malloc(nc * sizeof(int32_t));
    o.sig_of_cont = malloc(nc * sizeof(int32_t));
    o.sig_dtypes_of_cont = malloc(nc * sizeof(int64_t));
    made = calloc(nc, sizeof(PyObject *));
    if (!o.sig_objs || !o.stack_objs || !o.final_ids || !o.frame_of_cont || !o.stack_of_cont ||
        !o.sig_of_cont || !o.sig_dtypes_of_cont || !made)
        goto decline;
    memset(o.frame_of_cont, 0xff, nc * sizeof(int32_t)); /* all -1 */
    memset(o.stack_of_cont, 0xff, nc * sizeof(int32_t));
    memset(o.sig_of_cont, 0xff, nc * sizeof(int32_t));
    int fresh;
    o.empty_id = intern(&s.text, "", 0, &fresh);
    if (o.empty_id < 0 ||
        grow((void **)&s.text_obj, &s.text_cap, s.text.count, sizeof(PyObject *)) < 0)
        goto decline;
    if (fresh)
        s.text_obj[o.empty_id] = NULL;
    /* Index 0 of the signatures and the stacks is the empty one. */
    PyObject *unit = PyTuple_New(0);
    if (unit == NULL || intern(&o.sigs, "", 0, &fresh) != 0 || intern(&o.stacks, "", 0, &fresh) != 0 ||
        PyList_Append(o.sig_objs, unit) < 0 || PyList_Append(o.stack_objs, unit) < 0) {
        Py_XDECREF(unit);
        goto decline;
    }
    Py_DECREF(unit);
    for (int k = 0; k < N_INTS; k++)
        if ((ints[k] = PyBytes_FromStringAndSize(NULL, n * 8)) == NULL)
            goto decline;
    for (int k = 0; k < N_CODES; k++)
        if ((codes[k] = PyBytes_FromStringAndSize(NULL, n * 4)) == NULL)
            goto decline;
    for (int k = 0; k < N_LISTS; k++)
        if ((lists[k] = PyList_New(n)) == NULL)
            goto decline;
    later = malloc((size_t)n * 3 * sizeof(Val));
    if (later == NULL || read_entries(&s, &o, es, ints, lists, codes, later) < 0)
        goto decline;
    rest = rest_of(&s, &root, made);
    if (rest == NULL)
        goto decline;
    PyObject *sigs = PyList_AsTuple(o.sig_objs), *stacks = PyList_AsTuple(o.stack_objs);
    if (sigs && stacks)
        result = Py_BuildValue(
            "(Nn(OOOOOOOO)(OOOOOO)(OOO)NN)", rest, n, ints[0], ints[1], ints[2], ints[3],
            ints[4], ints[5], ints[6], ints[7], lists[0], lists[1], lists[2], lists[3],
            lists[4], lists[5], codes[0], codes[1], codes[2], sigs, stacks);
    else {
        Py_XDECREF(sigs);
        Py_XDECREF(stacks);
        Py_DECREF(rest);
    }
    rest = NULL;
    if (result == NULL)
        goto decline;
    goto done;
decline:
    PyErr_Clear(); /* whatever went wrong, the Python path reads the file and says what */
    Py_XDECREF(rest);
    result = Py_None;
    Py_INCREF(result);
done:
    for (int k = 0; k < N_INTS; k++)
        Py_XDECREF(ints[k]);
    for (int k = 0; k < N_CODES; k++)
        Py_XDECREF(codes[k]);
    for (int k = 0; k < N_LISTS; k++) {
        /* A list not filled to the end holds NULLs, which list dealloc skips. */
        Py_XDECREF(lists[k]);
    }
    if (made) {
        for (Py_ssize_t k = 0; k < s.nconts; k++)
            Py_XDECREF(made[k]);
        free(made);
    }
    free(later);
    out_free(&o);
    p_free(&s);
    PyBuffer_Release(&buf);
    return result;
}

static PyMethodDef methods[] = {
    {"read", (PyCFunction)(void (*)(void))py_read, METH_FASTCALL, read_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_pickled",
    "A native Flight Recorder pickle read straight into checked entry columns.", -1, methods,
};

PyMODINIT_FUNC
PyInit__pickled(void)
{
    return PyModule_Create(&module);
}
