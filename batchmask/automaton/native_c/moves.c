/* Closures and moves: what an NFA state stands for, what each element does on each byte class, what a set of
   elements does (tree.py closure, elem_moves, set_moves), memoised in flat pools (native.h). */
#include "native.h"

/* per-NFA-state memo arrays follow the NFA as the merge grows it */
int follow_nfa(S *s)
{
    int64_t n = nfa_size(s);
    if (grow_to(&s->clo_off, n, -1) < 0 || grow_to(&s->clo_len, n, -1) < 0 || grow_to(&s->em_start, n, -1) < 0 ||
        grow_to(&s->em_n, n, -1) < 0 || grow_to(&s->ex_start, n, -1) < 0 || grow_to(&s->ex_n, n, -1) < 0 ||
        grow_to(&s->stamp_nfa, n, 0) < 0 || grow_to(&s->depth, n, -1) < 0)
        return -1;
    return 0;
}

/* --- closure: the elements an NFA state stands for, in priority order (nfa.py closure) ------------------------ */

int closure(S *s, int64_t i, int depth)
{
    if (s->clo_off.a[i] >= 0)
        return 0;
    if (depth > 10000) {
        PyErr_SetString(PyExc_RecursionError, "grammar: ALT states nest too deep");
        return -1;
    }
    int64_t k = s->kind.a[i];
    if (k == BLOCK) {
        int64_t p;
        if (position(s, i, 0, 0, &p) < 0 || push(&s->codes, p) < 0)
            return -1;
        s->clo_off.a[i] = s->codes.n - 1;
        s->clo_len.a[i] = 1;
        return 0;
    }
    if (k != ALT) {
        if (push(&s->codes, i) < 0)
            return -1;
        s->clo_off.a[i] = s->codes.n - 1;
        s->clo_len.a[i] = 1;
        return 0;
    }
    int64_t n_opt;
    PyObject *tup = NULL;
    if (i < s->n0) {
        tup = PyList_GET_ITEM(s->py_arg, i);
        if (!PyTuple_Check(tup)) {
            PyErr_Format(PyExc_TypeError, "NFA state %lld: ALT options must be a tuple", (long long)i);
            return -1;
        }
        n_opt = PyTuple_GET_SIZE(tup);
    } else {
        n_opt = s->opts_n.a[i - s->n0];
    }
    for (int64_t o = 0; o < n_opt; o++) {
        int64_t opt = tup ? PyLong_AsLongLong(PyTuple_GET_ITEM(tup, o)) : s->opts.a[s->arg.a[i] + o];
        if (opt == -1 && PyErr_Occurred())
            return -1;
        if (closure(s, opt, depth + 1) < 0)
            return -1;
    }
    /* the options' closures, concatenated, first occurrence kept */
    s->gen++;
    int64_t start = s->codes.n;
    for (int64_t o = 0; o < n_opt; o++) {
        int64_t opt = tup ? PyLong_AsLongLong(PyTuple_GET_ITEM(tup, o)) : s->opts.a[s->arg.a[i] + o];
        int64_t off = s->clo_off.a[opt], n = s->clo_len.a[opt];
        if (reserve(&s->codes, n) < 0)
            return -1;
        for (int64_t t = 0; t < n; t++) {
            int64_t e = s->codes.a[off + t];
            if (!mark(s, e))
                s->codes.a[s->codes.n++] = e;
        }
    }
    s->clo_off.a[i] = start;
    s->clo_len.a[i] = s->codes.n - start;
    return 0;
}

/* the element code of block position (j, n, q): -1 - its interned number */
int position(S *s, int64_t j, int64_t n, int64_t q, int64_t *code)
{
    int64_t key[3] = {j, n, q};
    uint64_t h = seq_hash(key, 3);
    int64_t p = seq_find(&s->pos, key, 3, h);
    if (p < 0) {
        p = seq_add(&s->pos, key, 3, h);
        if (p < 0 || push(&s->pm_start, -1) < 0 || push(&s->pm_n, -1) < 0 || push(&s->stamp_pos, 0) < 0 ||
            push(&s->lone_of, -1) < 0)
            return -1;
    }
    *code = -1 - p;
    return 0;
}


/* --- moves: per element, then per set (tree.py elem_moves, set_moves) ------------------------------------------ */


int exit_moves(S *s, int64_t j)
{
    if (s->ex_start.a[j] >= 0)
        return 0;
    int64_t nx = s->next.a[j];
    if (closure(s, nx, 0) < 0)
        return -1;
    int64_t n = s->clo_len.a[nx];
    int64_t *copy = malloc((size_t)(n ? n : 1) * 8);        /* set_moves grows `codes`: not a pointer into it */
    if (!copy) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(copy, s->codes.a + s->clo_off.a[nx], n * 8);
    int64_t st, cnt;
    int rc = set_moves(s, copy, n, &st, &cnt);
    free(copy);
    if (rc < 0)
        return -1;
    s->ex_start.a[j] = st;
    s->ex_n.a[j] = cnt;
    return 0;
}

static int push_move(S *s, int64_t c, int64_t off, int64_t len)
{
    return push(&s->mv_cls, c) < 0 || push(&s->mv_off, off) < 0 || push(&s->mv_len, len) < 0 ? -1 : 0;
}

int elem_moves(S *s, int64_t e)
{
    if (e >= 0) {
        if (s->em_start.a[e] >= 0)
            return 0;
        int64_t start = s->mv_cls.n;
        if (s->kind.a[e] == BYTE) {
            int64_t m = s->arg.a[e], nx = s->next.a[e];
            if (s->mask_ptr[m + 1] > s->mask_ptr[m]) {
                if (closure(s, nx, 0) < 0)
                    return -1;
                for (int64_t t = s->mask_ptr[m]; t < s->mask_ptr[m + 1]; t++)
                    if (push_move(s, s->mask_cls[t], s->clo_off.a[nx], s->clo_len.a[nx]) < 0)
                        return -1;
            }
        }
        s->em_start.a[e] = start;
        s->em_n.a[e] = s->mv_cls.n - start;
        return 0;
    }
    int64_t p = -1 - e;
    if (s->pm_start.a[p] >= 0)
        return 0;
    const int64_t *jnq = pos_of(s, e);
    int64_t j = jnq[0], n = jnq[1], q = jnq[2], C = s->C;
    const int64_t *b = s->btab + B_N * block_arg(s, j);
    int64_t row = s->vt_off[b[B_VT]] + q, lo = b[B_LO], hi = b[B_HI], base = s->vt_off[b[B_VT]];
    int closes = s->A[row] && n >= lo && n <= hi;
    int64_t ex_at[256], ex_len[256];                           /* per class: the exit's target, len 0 none */
    for (int64_t c = 0; c < C; c++)
        ex_len[c] = 0;
    if (closes) {
        if (exit_moves(s, j) < 0)
            return -1;
        for (int64_t t = s->ex_start.a[j]; t < s->ex_start.a[j] + s->ex_n.a[j]; t++) {
            ex_at[s->mv_cls.a[t]] = s->mv_off.a[t];
            ex_len[s->mv_cls.a[t]] = s->mv_len.a[t];
        }
    }
    /* the targets go to `codes` first, then the moves, so that exit_moves above is done before both */
    int64_t start = s->mv_cls.n;
    for (int64_t c = 0; c < C; c++) {
        int64_t q2 = s->T[row * C + c], n2 = n + s->I[row * C + c];
        if (b[B_SAT] >= 0 && n2 > b[B_SAT])
            n2 = b[B_SAT];                                     /* no max: the count stops at the saturating row */
        int stays = q2 >= 0 && n2 + s->P[base + q2] <= hi;
        if (!stays && !ex_len[c])
            continue;
        int64_t off = s->codes.n;
        if (stays) {
            int64_t code;
            if (position(s, j, n2, q2, &code) < 0 || push(&s->codes, code) < 0)
                return -1;
        }
        if (ex_len[c]) {
            if (reserve(&s->codes, ex_len[c]) < 0)
                return -1;
            memcpy(s->codes.a + s->codes.n, s->codes.a + ex_at[c], ex_len[c] * 8);
            s->codes.n += ex_len[c];
        }
        if (push_move(s, c, off, s->codes.n - off) < 0)
            return -1;
    }
    s->pm_start.a[p] = start;
    s->pm_n.a[p] = s->mv_cls.n - start;
    return 0;
}


/* the moves of a set of elements: per class (ascending), the elements' targets in element order, first kept */
int set_moves(S *s, const int64_t *elems, int64_t n, int64_t *start, int64_t *count)
{
    int64_t C = s->C, cnt[257] = {0};
    for (int64_t k = 0; k < n; k++)
        if (elem_moves(s, elems[k]) < 0)
            return -1;
    for (int64_t k = 0; k < n; k++)
        for (int64_t t = moves_start(s, elems[k]), z = t + moves_n(s, elems[k]); t < z; t++)
            cnt[s->mv_cls.a[t] + 1] += s->mv_len.a[t];
    for (int64_t c = 0; c < C; c++)
        cnt[c + 1] += cnt[c];
    int64_t total = cnt[C], fill[256];
    int64_t *buf = malloc((size_t)(total ? total : 1) * 8);
    if (!buf) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(fill, cnt, C * 8);
    for (int64_t k = 0; k < n; k++)
        for (int64_t t = moves_start(s, elems[k]), z = t + moves_n(s, elems[k]); t < z; t++) {
            int64_t c = s->mv_cls.a[t];
            memcpy(buf + fill[c], s->codes.a + s->mv_off.a[t], s->mv_len.a[t] * 8);
            fill[c] += s->mv_len.a[t];
        }
    *start = s->mv_cls.n;
    int rc = reserve(&s->codes, total);
    for (int64_t c = 0; c < C && rc == 0; c++) {
        if (cnt[c + 1] == cnt[c])
            continue;
        s->gen++;
        int64_t off = s->codes.n;
        for (int64_t t = cnt[c]; t < cnt[c + 1]; t++)
            if (!mark(s, buf[t]))
                s->codes.a[s->codes.n++] = buf[t];
        rc = push_move(s, c, off, s->codes.n - off);
    }
    free(buf);
    *count = s->mv_cls.n - *start;
    return rc;
}
