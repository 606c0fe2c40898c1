/* refine and first_of_each: table/classes.py's grouping helpers (module.c says what each does). */
#include "native.h"

/* --- refine ---------------------------------------------------------------------------------------------- */

static int by_col(const void *a, const void *b)
{
    int64_t x = ((const Entry *)a)->col, y = ((const Entry *)b)->col;
    return (x > y) - (x < y);
}

void sort_entries(Entry *e, int64_t n)
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

uint64_t row_hash(int64_t base, const Entry *e, int64_t n)
{
    uint64_t h = mix((uint64_t)base * 0x9E3779B97F4A7C15ULL + (uint64_t)n);
    for (int64_t k = 0; k < n; k++)
        h = mix(h ^ (mix((uint64_t)e[k].col) + (uint64_t)e[k].val * 0xC2B2AE3D27D4EB4FULL));
    return h;
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
        uint64_t h = row_hash(b, ent + a, n);
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

PyObject *py_refine(PyObject *self, PyObject *args)
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

PyObject *py_first_of_each(PyObject *self, PyObject *args)
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
