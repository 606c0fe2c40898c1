/* first_fit: a packed table's rows by first fit (table/packed.py place_rows; module.c says what it does). */
#include "native.h"

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

PyObject *py_first_fit(PyObject *self, PyObject *args)
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
