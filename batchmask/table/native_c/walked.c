/* refine_walked: the token classes of a walk's finds (table/build.py _walked_classes; module.c says what it does).

   classes.refine over Walked.moves() would first write every move out: a find (pair, token, next) once for each
   edge of its pair, tens of millions on a large schema. Here each token's row is gathered from its finds and their
   pairs' edges into a scratch buffer, hashed and compared there, and only the rows of the classes' first tokens are
   kept (and handed back: the moves the table is written from). */
#include "native.h"

typedef struct { Entry *p; int64_t n, cap; } Moves;      /* a token's moves: from state col to state val */

static int reserve(Moves *m, int64_t need)
{
    if (need <= m->cap)
        return 0;
    int64_t cap = m->cap ? m->cap : 1024;
    while (cap < need)
        cap *= 2;
    Entry *p = realloc(m->p, (size_t)cap * sizeof(Entry));
    if (!p)
        return -1;
    m->p = p;
    m->cap = cap;
    return 0;
}

/* Returns the number of classes; -1 out of memory. `kept` gets the first token of each class's moves. */
static int64_t refine_walked_core(const int64_t *base, int64_t V, const int64_t *pair, const int64_t *tok,
                                  const int64_t *nxt, int64_t P, const int64_t *edge_src, const int64_t *edge_at,
                                  const int64_t *edge_n, int64_t *out, Moves *kept, int64_t **kept_tok)
{
    int64_t result = -1, next = 0, nbase = 1, rows = 0, cap = 16;
    int64_t *fstart = calloc((size_t)V + 1, sizeof(int64_t)), *fidx = malloc((size_t)(P ? P : 1) * sizeof(int64_t));
    int64_t *base_id = NULL, *slot_tok = NULL, *slot_id = NULL, *slot_at = NULL, *slot_n = NULL;
    Moves row = {0};
    if (!fstart || !fidx)
        goto done;
    for (int64_t p = 0; p < P; p++)
        fstart[tok[p] + 1]++;
    for (int64_t i = 0; i < V; i++) {
        rows += fstart[i + 1] > 0;
        fstart[i + 1] += fstart[i];
    }
    for (int64_t p = 0; p < P; p++)                               /* the finds grouped by token, in find order */
        fidx[fstart[tok[p]]++] = p;
    for (int64_t i = V; i > 0; i--)
        fstart[i] = fstart[i - 1];
    fstart[0] = 0;
    for (int64_t i = 0; i < V; i++)
        if (base[i] + 1 > nbase)
            nbase = base[i] + 1;
    while (cap < 2 * rows + 1)
        cap <<= 1;
    base_id = malloc((size_t)nbase * sizeof(int64_t));
    slot_tok = malloc((size_t)cap * sizeof(int64_t));
    slot_id = malloc((size_t)cap * sizeof(int64_t));
    slot_at = malloc((size_t)cap * sizeof(int64_t));
    slot_n = malloc((size_t)cap * sizeof(int64_t));
    *kept_tok = NULL;
    if (!base_id || !slot_tok || !slot_id || !slot_at || !slot_n)
        goto done;
    for (int64_t b = 0; b < nbase; b++)
        base_id[b] = -1;
    for (int64_t s = 0; s < cap; s++)
        slot_tok[s] = -1;
    for (int64_t i = 0; i < V; i++) {
        int64_t b = base[i], n = 0;
        for (int64_t k = fstart[i]; k < fstart[i + 1]; k++)
            n += edge_n[pair[fidx[k]]];
        if (n == 0) {                                             /* no move: its base class */
            if (base_id[b] < 0)
                base_id[b] = next++;
            out[i] = base_id[b];
            continue;
        }
        if (reserve(&row, n) < 0)
            goto done;
        int64_t m = 0;
        for (int64_t k = fstart[i]; k < fstart[i + 1]; k++) {
            int64_t f = fidx[k], a = edge_at[pair[f]];
            for (int64_t e = a; e < a + edge_n[pair[f]]; e++) {
                row.p[m].col = edge_src[e];
                row.p[m].val = nxt[f];
                m++;
            }
        }
        sort_entries(row.p, n);
        uint64_t h = row_hash(b, row.p, n);
        int64_t s = (int64_t)(h & (uint64_t)(cap - 1));
        for (;;) {
            int64_t j = slot_tok[s];
            if (j < 0) {                                          /* a new class: its moves are kept */
                if (reserve(kept, kept->n + n) < 0)
                    goto done;
                memcpy(kept->p + kept->n, row.p, (size_t)n * sizeof(Entry));
                slot_tok[s] = i;
                slot_id[s] = next++;
                slot_at[s] = kept->n;
                slot_n[s] = n;
                kept->n += n;
                out[i] = slot_id[s];
                break;
            }
            if (base[j] == b && slot_n[s] == n && memcmp(kept->p + slot_at[s], row.p, (size_t)n * sizeof(Entry)) == 0) {
                out[i] = slot_id[s];
                break;
            }
            s = (s + 1) & (cap - 1);
        }
    }
    /* the token of each kept move, in order: the slots in the order they were made (their moves are consecutive) */
    *kept_tok = malloc((size_t)(kept->n ? kept->n : 1) * sizeof(int64_t));
    if (!*kept_tok)
        goto done;
    for (int64_t s = 0; s < cap; s++)
        if (slot_tok[s] >= 0)
            for (int64_t k = slot_at[s]; k < slot_at[s] + slot_n[s]; k++)
                (*kept_tok)[k] = slot_tok[s];
    result = next;
done:
    free(fstart);
    free(fidx);
    free(base_id);
    free(slot_tok);
    free(slot_id);
    free(slot_at);
    free(slot_n);
    free(row.p);
    return result;
}

PyObject *py_refine_walked(PyObject *self, PyObject *args)
{
    PyObject *o[8];
    if (!PyArg_ParseTuple(args, "OOOOOOOO:refine_walked", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7]))
        return NULL;
    const char *names[8] = {"base", "pair", "tok", "nxt", "edge_src", "edge_at", "edge_n", "out"};
    Py_buffer v[8];
    int got = 0;
    PyObject *ret = NULL;
    for (int i = 0; i < 8; i++) {
        if (get_i64(o[i], &v[i], i == 7, names[i]) < 0)
            goto release;
        got = i + 1;
    }
    int64_t V = v[0].len / 8, P = v[1].len / 8, E = v[4].len / 8, U = v[5].len / 8;
    if (v[2].len / 8 != P || v[3].len / 8 != P || v[6].len / 8 != U || v[7].len / 8 != V) {
        PyErr_SetString(PyExc_ValueError, "refine_walked: pair/tok/nxt, edge_at/edge_n or base/out differ in length");
        goto release;
    }
    {   /* every index followed stays inside its array */
        const int64_t *base = v[0].buf, *pair = v[1].buf, *tok = v[2].buf, *at = v[5].buf, *n = v[6].buf;
        for (int64_t i = 0; i < V; i++)
            if (base[i] < 0) {
                PyErr_Format(PyExc_ValueError, "refine_walked: base[%lld] is negative", (long long)i);
                goto release;
            }
        for (int64_t u = 0; u < U; u++)
            if (at[u] < 0 || n[u] < 0 || at[u] + n[u] > E) {
                PyErr_Format(PyExc_ValueError, "refine_walked: pair %lld's edges are outside edge_src", (long long)u);
                goto release;
            }
        for (int64_t p = 0; p < P; p++)
            if (pair[p] < 0 || pair[p] >= U || tok[p] < 0 || tok[p] >= V) {
                PyErr_Format(PyExc_ValueError, "refine_walked: find %lld names pair %lld, token %lld (of %lld, %lld)",
                             (long long)p, (long long)pair[p], (long long)tok[p], (long long)U, (long long)V);
                goto release;
            }
    }
    Moves kept = {0};
    int64_t *kept_tok = NULL, classes;
    Py_BEGIN_ALLOW_THREADS
    classes = refine_walked_core(v[0].buf, V, v[1].buf, v[2].buf, v[3].buf, P, v[4].buf, v[5].buf, v[6].buf,
                                 v[7].buf, &kept, &kept_tok);
    Py_END_ALLOW_THREADS
    if (classes < 0) {
        PyErr_NoMemory();
    } else {
        PyObject *src = PyByteArray_FromStringAndSize(NULL, kept.n * 8);
        PyObject *tk = PyByteArray_FromStringAndSize(NULL, kept.n * 8);
        PyObject *nx = PyByteArray_FromStringAndSize(NULL, kept.n * 8);
        if (src && tk && nx) {
            int64_t *s = (int64_t *)PyByteArray_AS_STRING(src), *t = (int64_t *)PyByteArray_AS_STRING(tk);
            int64_t *x = (int64_t *)PyByteArray_AS_STRING(nx);
            for (int64_t k = 0; k < kept.n; k++) {
                s[k] = kept.p[k].col;
                t[k] = kept_tok[k];
                x[k] = kept.p[k].val;
            }
            ret = Py_BuildValue("(LNNN)", (long long)classes, src, tk, nx);
        } else {
            Py_XDECREF(src);
            Py_XDECREF(tk);
            Py_XDECREF(nx);
        }
    }
    free(kept.p);
    free(kept_tok);
release:
    for (int i = 0; i < got; i++)
        PyBuffer_Release(&v[i]);
    return ret;
}
