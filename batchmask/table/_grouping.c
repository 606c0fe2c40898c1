/* batchmask.table._grouping: the compile's grouping helpers as one pass each, in C.

   table/classes.py groups tokens, rows and columns with a dozen numpy/torch operations per call (hash, sort,
   verify); a compile makes ~15 such calls, so on a small schema their per-operation cost is most of the work.
   Here each is one pass over the entries, exact (a hash table whose collisions are settled by comparing the
   entries themselves), and gives the same partition as its reference in classes.py (tests/test_grouping.py);
   ids are numbered by first use, which classes.py's callers accept (only the grouping is promised).

   Optional: setup.py builds it where a C compiler is present; without it (or with BATCHMASK_NATIVE=0)
   classes.py runs its numpy/torch reference (table/native.py). Arrays come through the buffer protocol
   (numpy arrays: C-contiguous int64), so it needs neither numpy's headers nor torch's.

     refine(base, item, col, val, out) -> classes
         base int64 [V] dense class ids, or None (every item in one class); item, col, val int64 [P]: sparse rows
         {col: val} per item, each (item, col) at most once; out int64 [V] is written. Items in the same base class
         with equal rows share a class; an item without entries keeps its base class (with base None: class 0,
         and the ids stay dense). Returns the number of classes.
     first_of_each(inverse) -> bytearray
         inverse int64 [V] ids >= 0; the first index of each id 0..max (V for an id that does not occur), as int64
         [max + 1] in a bytearray (numpy.frombuffer reads it without a copy).
     first_fit(occupied, used, order, start, n, col, base, tries) -> None
         Packed rows (table/packed.py place_rows): occupied/used bool [L] the slots and bases taken so far; the rows
         of `order` (int64 [k], in placement order; row r's columns col[start[r]:start[r] + n[r]], ascending) each at
         the lowest base whose slots are free and that no row holds, among the first `tries` candidates (its first
         column on each free slot from the lowest up), else the lowest from its span below the top slot taken;
         a row without columns takes the lowest free base. base int64 [R] is written at the rows of `order`.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* --- arrays ---------------------------------------------------------------------------------------------- */

static int get_i64(PyObject *obj, Py_buffer *view, int writable, const char *name)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0)
        return -1;
    const char *f = view->format ? view->format : "B";
    char code = f[strlen(f) - 1];
    if (view->itemsize != 8 || (code != 'l' && code != 'q')) {
        PyErr_Format(PyExc_TypeError, "%s: expected a C-contiguous int64 array, got format '%s' (%zd-byte items)",
                     name, f, view->itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* --- refine ---------------------------------------------------------------------------------------------- */

typedef struct { int64_t col, val; } Entry;

static int by_col(const void *a, const void *b)
{
    int64_t x = ((const Entry *)a)->col, y = ((const Entry *)b)->col;
    return (x > y) - (x < y);
}

static void sort_entries(Entry *e, int64_t n)
{
    if (n > 16) {
        qsort(e, (size_t)n, sizeof(Entry), by_col);
        return;
    }
    for (int64_t i = 1; i < n; i++) {          /* a row has a few entries, mostly */
        Entry x = e[i];
        int64_t j = i - 1;
        while (j >= 0 && e[j].col > x.col) {
            e[j + 1] = e[j];
            j--;
        }
        e[j + 1] = x;
    }
}

static uint64_t mix(uint64_t x)
{
    x ^= x >> 31;
    x *= 0x7FB5D329728EA185ULL;
    x ^= x >> 27;
    x *= 0x81DADEF4BC2DD44DULL;
    x ^= x >> 33;
    return x;
}

/* Returns the number of classes, or -1 (out of memory), -2 - k (entry k names an item outside [0, V)). */
static int64_t refine_core(const int64_t *base, const int64_t *item, const int64_t *col, const int64_t *val,
                           int64_t P, int64_t V, int64_t *out)
{
    int64_t result = -1;
    int64_t *start = calloc((size_t)V + 1, sizeof(int64_t));      /* entries of item i: start[i]..start[i+1] */
    Entry *ent = malloc((size_t)(P ? P : 1) * sizeof(Entry));
    int64_t *slot_item = NULL, *slot_id = NULL, *base_id = NULL;
    if (!start || !ent)
        goto done;
    for (int64_t p = 0; p < P; p++) {
        if (item[p] < 0 || item[p] >= V) {
            result = -2 - p;
            goto done;
        }
        start[item[p] + 1]++;
    }
    int64_t rows = 0;                                             /* items with entries */
    for (int64_t i = 0; i < V; i++) {
        rows += start[i + 1] > 0;
        start[i + 1] += start[i];                                 /* now start[i]: item i's first entry */
    }
    for (int64_t p = 0; p < P; p++) {                             /* counting sort by item */
        int64_t k = start[item[p]]++;
        ent[k].col = col[p];
        ent[k].val = val[p];
    }
    for (int64_t i = V; i > 0; i--)                               /* start[i] moved on to item i + 1's first */
        start[i] = start[i - 1];
    start[0] = 0;

    int64_t nbase = 1;
    if (base) {
        for (int64_t i = 0; i < V; i++)
            if (base[i] + 1 > nbase)
                nbase = base[i] + 1;
    }
    base_id = malloc((size_t)nbase * sizeof(int64_t));
    int64_t cap = 16;
    while (cap < 2 * rows + 1)
        cap <<= 1;
    slot_item = malloc((size_t)cap * sizeof(int64_t));
    slot_id = malloc((size_t)cap * sizeof(int64_t));
    if (!base_id || !slot_item || !slot_id)
        goto done;
    for (int64_t b = 0; b < nbase; b++)
        base_id[b] = -1;
    for (int64_t s = 0; s < cap; s++)
        slot_item[s] = -1;

    int64_t next = base ? 0 : 1;                                  /* base None: 0 is "no entries" */
    int any_empty = 0;
    for (int64_t i = 0; i < V; i++) {
        int64_t a = start[i], n = start[i + 1] - a;
        int64_t b = base ? base[i] : 0;
        if (b < 0) {
            result = -2 - P - i;                                  /* a negative base id */
            goto done;
        }
        if (n == 0) {
            if (!base) {
                out[i] = 0;
                any_empty = 1;
            } else {
                if (base_id[b] < 0)
                    base_id[b] = next++;
                out[i] = base_id[b];
            }
            continue;
        }
        sort_entries(ent + a, n);
        uint64_t h = mix((uint64_t)b * 0x9E3779B97F4A7C15ULL + (uint64_t)n);
        for (int64_t k = a; k < a + n; k++)
            h = mix(h ^ (mix((uint64_t)ent[k].col) + (uint64_t)ent[k].val * 0xC2B2AE3D27D4EB4FULL));
        int64_t s = (int64_t)(h & (uint64_t)(cap - 1));
        for (;;) {
            int64_t j = slot_item[s];
            if (j < 0) {                                          /* a new row */
                slot_item[s] = i;
                slot_id[s] = next++;
                out[i] = slot_id[s];
                break;
            }
            int64_t aj = start[j];
            if ((base ? base[j] : 0) == b && start[j + 1] - aj == n &&
                memcmp(ent + aj, ent + a, (size_t)n * sizeof(Entry)) == 0) {
                out[i] = slot_id[s];
                break;
            }
            s = (s + 1) & (cap - 1);
        }
    }
    if (!base && !any_empty) {                                    /* ids stay dense: no class 0 */
        for (int64_t i = 0; i < V; i++)
            out[i] -= 1;
        next -= 1;
    }
    result = next;
done:
    free(start);
    free(ent);
    free(slot_item);
    free(slot_id);
    free(base_id);
    return result;
}

static PyObject *py_refine(PyObject *self, PyObject *args)
{
    PyObject *base_o, *item_o, *col_o, *val_o, *out_o;
    if (!PyArg_ParseTuple(args, "OOOOO:refine", &base_o, &item_o, &col_o, &val_o, &out_o))
        return NULL;
    Py_buffer base = {0}, item = {0}, col = {0}, val = {0}, out = {0};
    int have_base = base_o != Py_None;
    PyObject *ret = NULL;
    if (get_i64(item_o, &item, 0, "item") < 0)
        return NULL;
    if (get_i64(col_o, &col, 0, "col") < 0)
        goto release_item;
    if (get_i64(val_o, &val, 0, "val") < 0)
        goto release_col;
    if (get_i64(out_o, &out, 1, "out") < 0)
        goto release_val;
    if (have_base && get_i64(base_o, &base, 0, "base") < 0)
        goto release_out;
    Py_ssize_t P = item.len / 8, V = out.len / 8;
    if (col.len / 8 != P || val.len / 8 != P) {
        PyErr_Format(PyExc_ValueError, "refine: item, col and val differ in length (%zd, %zd, %zd)", P,
                     col.len / 8, val.len / 8);
        goto release_base;
    }
    if (have_base && base.len / 8 != V) {
        PyErr_Format(PyExc_ValueError, "refine: base has %zd ids, out %zd", base.len / 8, V);
        goto release_base;
    }
    int64_t got;
    Py_BEGIN_ALLOW_THREADS
    got = refine_core(have_base ? (const int64_t *)base.buf : NULL, item.buf, col.buf, val.buf, P, V, out.buf);
    Py_END_ALLOW_THREADS
    if (got == -1)
        PyErr_NoMemory();
    else if (got < -1 && -2 - got < P)
        PyErr_Format(PyExc_ValueError, "refine: item[%lld] = %lld is outside [0, %zd)", (long long)(-2 - got),
                     (long long)((const int64_t *)item.buf)[-2 - got], V);
    else if (got < -1)
        PyErr_Format(PyExc_ValueError, "refine: base[%lld] is negative", (long long)(-2 - got - P));
    else
        ret = PyLong_FromLongLong(got);
release_base:
    if (have_base)
        PyBuffer_Release(&base);
release_out:
    PyBuffer_Release(&out);
release_val:
    PyBuffer_Release(&val);
release_col:
    PyBuffer_Release(&col);
release_item:
    PyBuffer_Release(&item);
    return ret;
}

/* --- first_of_each --------------------------------------------------------------------------------------- */

static PyObject *py_first_of_each(PyObject *self, PyObject *args)
{
    PyObject *inv_o;
    if (!PyArg_ParseTuple(args, "O:first_of_each", &inv_o))
        return NULL;
    Py_buffer inv = {0};
    if (get_i64(inv_o, &inv, 0, "inverse") < 0)
        return NULL;
    Py_ssize_t V = inv.len / 8, C = 0, bad = -1;
    const int64_t *x = inv.buf;
    for (Py_ssize_t i = 0; i < V; i++) {
        if (x[i] < 0) {
            bad = i;
            break;
        }
        if (x[i] >= C)
            C = (Py_ssize_t)x[i] + 1;
    }
    if (bad >= 0) {
        PyErr_Format(PyExc_ValueError, "first_of_each: inverse[%zd] = %lld is negative", bad, (long long)x[bad]);
        PyBuffer_Release(&inv);
        return NULL;
    }
    PyObject *out = PyByteArray_FromStringAndSize(NULL, C * 8);
    if (!out) {
        PyBuffer_Release(&inv);
        return NULL;
    }
    int64_t *rep = (int64_t *)PyByteArray_AS_STRING(out);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t c = 0; c < C; c++)
        rep[c] = V;
    for (Py_ssize_t i = V - 1; i >= 0; i--)         /* backwards: the last write is the first index */
        rep[x[i]] = i;
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&inv);
    return out;
}

/* --- first_fit: packed rows (table/packed.py) --------------------------------------------------------- */

typedef struct {
    uint8_t *occ, *used;      /* [size] slot taken, base held */
    int64_t *skip;            /* [size] skip[s] > s: every slot in [s, skip[s]) is taken (a hint; s: none) */
    int64_t size;
} Space;

/* The lowest free slot at or above s (size if none below it), skipping taken runs by their hints, which it then
   shortens (path compression: scanning a dense region costs about once, not once per row). */
static int64_t next_free(Space *sp, int64_t s)
{
    int64_t r = s;
    while (r < sp->size && sp->occ[r])
        r = sp->skip[r] > r ? sp->skip[r] : r + 1;
    while (s < r && sp->occ[s]) {
        int64_t t = sp->skip[s] > s ? sp->skip[s] : s + 1;
        sp->skip[s] = r;
        s = t;
    }
    return r;
}

static int grow(Space *sp, int64_t need)
{
    if (need <= sp->size)
        return 0;
    int64_t size = sp->size + sp->size / 2;
    if (size < need)
        size = need;
    uint8_t *occ = realloc(sp->occ, (size_t)size), *used;
    if (!occ)
        return -1;
    sp->occ = occ;
    used = realloc(sp->used, (size_t)size);
    if (!used)
        return -1;
    sp->used = used;
    int64_t *skip = realloc(sp->skip, (size_t)size * sizeof(int64_t));
    if (!skip)
        return -1;
    sp->skip = skip;
    memset(sp->occ + sp->size, 0, (size_t)(size - sp->size));
    memset(sp->used + sp->size, 0, (size_t)(size - sp->size));
    for (int64_t x = sp->size; x < size; x++)
        skip[x] = x;
    sp->size = size;
    return 0;
}

/* Each row of `order` (its columns col[start[r]:start[r] + n[r]], ascending) at the lowest base whose slots are free
   and that no row holds: `tries` bases from the lowest free slot up (its first column there), then every base from
   its span below the top; rows without entries at the lowest free bases. -1: out of memory. */
static int first_fit_core(Space *sp, const int64_t *order, int64_t k, const int64_t *start, const int64_t *n,
                          const int64_t *col, int64_t tries, int64_t *base)
{
    int64_t lo = 0, top = 0, top_base = -1, free_base = 0;
    for (int64_t s = 0; s < sp->size; s++)
        if (sp->occ[s])
            top = s + 1;
    for (int64_t s = 0; s < sp->size; s++)
        if (sp->used[s])
            top_base = s;
    for (int64_t i = 0; i < k; i++) {
        int64_t r = order[i], m = n[r];
        const int64_t *c = col + start[r];
        if (m == 0) {
            while (free_base < sp->size && sp->used[free_base])
                free_base++;
            if (grow(sp, free_base + 1) < 0)
                return -1;
            sp->used[free_base] = 1;
            base[r] = free_base;
            if (free_base > top_base)
                top_base = free_base;
            continue;
        }
        lo = next_free(sp, lo);
        /* first fit over the free slots from the lowest up, `tries` candidates; then on from the row's span below
           the top (where the last rows left room), every candidate: it ends at the top at the latest */
        int64_t b = -1, tried = 0, span = c[m - 1] + 1;
        int64_t s = next_free(sp, lo > c[0] ? lo : c[0]);
        while (s < top) {
            if (tried == tries) {
                tried++;
                if (top - span > s)
                    s = next_free(sp, top - span);
                if (s >= top)
                    break;
            } else if (tried < tries) {
                tried++;
            }
            int64_t cand = s - c[0];
            if (!sp->used[cand]) {
                int64_t j = 1;
                while (j < m && (cand + c[j] >= sp->size || !sp->occ[cand + c[j]]))
                    j++;
                if (j == m) {
                    b = cand;
                    break;
                }
            }
            s = next_free(sp, s + 1);
        }
        if (b < 0) {                                             /* past every slot and base placed */
            b = top - c[0];
            if (b <= top_base)
                b = top_base + 1;
            if (b < 0)
                b = 0;
        }
        if (grow(sp, b + c[m - 1] + 1) < 0)
            return -1;
        for (int64_t j = 0; j < m; j++)
            sp->occ[b + c[j]] = 1;
        sp->used[b] = 1;
        base[r] = b;
        if (b + c[m - 1] + 1 > top)
            top = b + c[m - 1] + 1;
        if (b > top_base)
            top_base = b;
    }
    return 0;
}

static int get_bool(PyObject *obj, Py_buffer *view, const char *name)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    const char *f = view->format ? view->format : "B";
    if (view->itemsize != 1 || (strcmp(f, "?") != 0 && strcmp(f, "B") != 0)) {
        PyErr_Format(PyExc_TypeError, "%s: expected a C-contiguous bool or uint8 array, got format '%s'", name, f);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *py_first_fit(PyObject *self, PyObject *args)
{
    PyObject *occ_o, *used_o, *order_o, *start_o, *n_o, *col_o, *base_o;
    long long tries;
    if (!PyArg_ParseTuple(args, "OOOOOOOL:first_fit", &occ_o, &used_o, &order_o, &start_o, &n_o, &col_o, &base_o,
                          &tries))
        return NULL;
    Py_buffer v[7];
    int got = 0;
    PyObject *ret = NULL;
    if (get_bool(occ_o, &v[0], "occupied") < 0)
        goto release;
    got = 1;
    if (get_bool(used_o, &v[1], "used") < 0)
        goto release;
    got = 2;
    PyObject *ints[5] = {order_o, start_o, n_o, col_o, base_o};
    const char *names[5] = {"order", "start", "n", "col", "base"};
    for (int i = 0; i < 5; i++) {
        if (get_i64(ints[i], &v[2 + i], i == 4, names[i]) < 0)
            goto release;
        got = 3 + i;
    }
    int64_t L = v[0].len, k = v[2].len / 8, R = v[3].len / 8, P = v[5].len / 8;
    if (v[1].len != L || v[4].len / 8 != R || v[6].len / 8 != R) {
        PyErr_SetString(PyExc_ValueError, "first_fit: occupied/used or start/n/base differ in length");
        goto release;
    }
    const int64_t *order = v[2].buf, *start = v[3].buf, *n = v[4].buf;
    for (int64_t i = 0; i < k; i++) {
        int64_t r = order[i];
        if (r < 0 || r >= R || n[r] < 0 || start[r] < 0 || start[r] + n[r] > P) {
            PyErr_Format(PyExc_ValueError, "first_fit: order[%lld] = %lld names no row's columns (rows %lld, "
                         "columns %lld)", (long long)i, (long long)r, (long long)R, (long long)P);
            goto release;
        }
    }
    Space sp = {malloc((size_t)(L ? L : 1)), malloc((size_t)(L ? L : 1)), malloc((size_t)(L ? L : 1) * 8), L};
    if (!sp.occ || !sp.used || !sp.skip) {
        free(sp.occ);
        free(sp.used);
        free(sp.skip);
        PyErr_NoMemory();
        goto release;
    }
    memcpy(sp.occ, v[0].buf, (size_t)L);
    memcpy(sp.used, v[1].buf, (size_t)L);
    for (int64_t x = 0; x < L; x++)
        sp.skip[x] = x;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = first_fit_core(&sp, order, k, start, n, v[5].buf, tries, v[6].buf);
    Py_END_ALLOW_THREADS
    free(sp.occ);
    free(sp.used);
    free(sp.skip);
    if (rc < 0)
        PyErr_NoMemory();
    else
        ret = Py_None, Py_INCREF(Py_None);
release:
    for (int i = 0; i < got; i++)
        PyBuffer_Release(&v[i]);
    return ret;
}

static PyMethodDef methods[] = {
    {"refine", py_refine, METH_VARARGS, "refine(base, item, col, val, out) -> classes (see the module docstring)"},
    {"first_fit", py_first_fit, METH_VARARGS, "first_fit(occupied, used, order, start, n, col, base, tries)"},
    {"first_of_each", py_first_of_each, METH_VARARGS, "first_of_each(inverse) -> bytearray of int64: the first index of each id"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_grouping", "The compile's grouping helpers in C (batchmask/table/native.py).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__grouping(void)
{
    return PyModule_Create(&module);
}
