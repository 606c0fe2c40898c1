/* walk: the explicit states' tokens over the vocabulary trie (table/trie.py; module.c says what it does). */
#include "native.h"

/* --- walk: the explicit states' tokens over the vocabulary trie (table/trie.py) ------------------------------ */

typedef struct {
    const int64_t *byte, *child_at, *child_n, *end_at, *end_n, *end_tok;   /* the trie, levels one after another */
    const int64_t *level_start;                                           /* [L + 1] */
    int64_t levels;
    const int32_t *delta;                                                 /* [Sc * K] next state per class, -1 */
    int64_t K;
    const int64_t *cls;                                                   /* [256] byte class */
} Trie;

static int over(int64_t x, int64_t limit) { return x > limit; }
static int over2(int64_t x, int64_t limit) { return x > limit && x - limit > limit; }      /* x > 2 limit, no wrap */

/* trie.py _walk_distinct's levels, in its order: 0 done, 1 refused (past the budget), -1 out of memory. */
static int walk_core(const Trie *t, const int64_t *first, const int64_t *src, const int64_t *byte,
                     const int64_t *after, int64_t n, int64_t limit, Vec out[3], int64_t *found_out)
{
    Vec who = {0}, node = {0}, cur = {0}, who2 = {0}, node2 = {0}, cur2 = {0};
    int rc = -1;
    int64_t found = 0, tried = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t b = byte[i];
        int64_t nd = (b >= 0 && b < 256) ? first[b] : -1;
        if (after[i] >= 0 && nd >= 0)
            if (push(&who, src[i]) < 0 || push(&node, nd) < 0 || push(&cur, after[i]) < 0)
                goto done;
    }
    for (int64_t d = 0; d < t->levels; d++) {
        found += node.n;
        if (over(found, limit) || over2(tried, limit)) {
            rc = 1;
            goto done;
        }
        for (int64_t i = 0; i < node.n; i++) {                            /* tokens spelled by these prefixes */
            int64_t nd = node.p[i], a = t->end_at[nd];
            for (int64_t k = a; k < a + t->end_n[nd]; k++)
                if (push(&out[0], who.p[i]) < 0 || push(&out[1], t->end_tok[k]) < 0 || push(&out[2], cur.p[i]) < 0)
                    goto done;
        }
        if (d + 1 == t->levels)
            break;
        for (int64_t i = 0; i < node.n; i++)
            tried += t->child_n[node.p[i]];
        if (over2(tried, limit)) {                                         /* refused before they are stepped */
            rc = 1;
            goto done;
        }
        who2.n = node2.n = cur2.n = 0;
        for (int64_t i = 0; i < node.n; i++) {
            int64_t nd = node.p[i], a = t->child_at[nd], base = cur.p[i] * t->K;
            for (int64_t c = a; c < a + t->child_n[nd]; c++) {
                int32_t nx = t->delta[base + t->cls[t->byte[c]]];
                if (nx >= 0)
                    if (push(&who2, who.p[i]) < 0 || push(&node2, c) < 0 || push(&cur2, nx) < 0)
                        goto done;
            }
        }
        Vec x;
        x = who; who = who2; who2 = x;
        x = node; node = node2; node2 = x;
        x = cur; cur = cur2; cur2 = x;
        if (!node.n)
            break;
    }
    rc = 0;
    *found_out = found;
done:
    free(who.p); free(node.p); free(cur.p); free(who2.p); free(node2.p); free(cur2.p);
    return rc;
}

static PyObject *vec_bytes(Vec *v)
{
    PyObject *b = PyByteArray_FromStringAndSize(v->p ? (const char *)v->p : "", v->n * 8);
    return b;
}

PyObject *py_walk(PyObject *self, PyObject *args)
{
    PyObject *o[13];
    long long K, limit;
    if (!PyArg_ParseTuple(args, "OOOOOOOOLOOOOOL:walk", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &K,
                          &o[8], &o[9], &o[10], &o[11], &o[12], &limit))
        return NULL;
    /* trie byte, child_at, child_n, end_at, end_n, end_tok, level_start; delta (int32), K; byte_class, first;
       src, byte, after; limit */
    const char *names[13] = {"byte", "child_at", "child_n", "end_at", "end_n", "end_tok", "level_start", "delta",
                             "byte_class", "first", "src", "edge byte", "after"};
    Py_buffer v[13];
    int got = 0;
    PyObject *ret = NULL;
    for (int i = 0; i < 13; i++) {
        if (i == 7) {
            if (PyObject_GetBuffer(o[7], &v[7], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
                goto release;
            const char *f = v[7].format ? v[7].format : "B";
            char code = f[strlen(f) - 1];
            got = 8;
            if (v[7].itemsize != 4 || (code != 'i' && code != 'l')) {
                PyErr_Format(PyExc_TypeError, "delta: expected a C-contiguous int32 array, got format '%s'", f);
                goto release;
            }
            continue;
        }
        if (get_i64(o[i], &v[i], 0, names[i]) < 0)
            goto release;
        got = i + 1;
    }
    int64_t N = v[0].len / 8, L = v[6].len / 8 - 1, n = v[10].len / 8;
    for (int i = 1; i < 5; i++)
        if (v[i].len / 8 != N) {
            PyErr_Format(PyExc_ValueError, "walk: the trie's %s has %zd entries, its byte %lld", names[i], v[i].len / 8,
                         (long long)N);
            goto release;
        }
    if (v[8].len / 8 != 256 || v[9].len / 8 != 256 || v[11].len / 8 != n || v[12].len / 8 != n || L < 0 || K < 1) {
        PyErr_SetString(PyExc_ValueError, "walk: byte_class and first need 256 entries, src/byte/after one per edge");
        goto release;
    }
    {   /* the trie is checked once where it is flattened (trie.py VocabTrie.flat); the rest here, every call */
        const int64_t *fi = v[9].buf, *bc = v[8].buf;
        int64_t S = v[7].len / 4;
        for (int b = 0; b < 256; b++)
            if (fi[b] >= N || bc[b] < 0 || bc[b] >= K) {
                PyErr_Format(PyExc_ValueError, "walk: byte %d's first node or class is out of range", b);
                goto release;
            }
        const int32_t *dl = v[7].buf;
        int64_t states = S / K;
        for (int64_t i = 0; i < S; i++)
            if (dl[i] >= states) {
                PyErr_Format(PyExc_ValueError, "walk: delta[%lld] = %d is not a state (%lld)", (long long)i, dl[i],
                             (long long)states);
                goto release;
            }
        const int64_t *af = v[12].buf;
        for (int64_t i = 0; i < n; i++)
            if (af[i] >= states) {
                PyErr_Format(PyExc_ValueError, "walk: after[%lld] = %lld is not a state", (long long)i,
                             (long long)af[i]);
                goto release;
            }
    }
    Trie t = {v[0].buf, v[1].buf, v[2].buf, v[3].buf, v[4].buf, v[5].buf, v[6].buf, L, v[7].buf, K, v[8].buf};
    Vec out[3] = {{0}, {0}, {0}};
    int64_t found = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = walk_core(&t, v[9].buf, v[10].buf, v[11].buf, v[12].buf, n, limit, out, &found);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        PyErr_NoMemory();
    else if (rc > 0)
        ret = Py_None, Py_INCREF(Py_None);
    else
        ret = Py_BuildValue("(NNNL)", vec_bytes(&out[0]), vec_bytes(&out[1]), vec_bytes(&out[2]), (long long)found);
    for (int i = 0; i < 3; i++)
        free(out[i].p);
release:
    for (int i = 0; i < got; i++)
        PyBuffer_Release(&v[i]);
    return ret;
}
