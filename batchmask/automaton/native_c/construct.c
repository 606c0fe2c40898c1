/* The search: the lockstep merge (with the NFA states it hash-conses), the target of a move, each explicit state's
   edges and delegated classes, each block's exits, breadth first from the starts (tree.py run_python). */
#include "native.h"

/* --- hash-consed NFA states made by the lockstep merge (nfa.py _add) --------------------------------------------- */

static int cons_key(S *s, int64_t i, Vec *key, const char *loop)
{
    key->n = 0;
    if (s->kind.a[i] == BLOCK)
        return push(key, BLOCK) < 0 || push(key, s->arg.a[i]) < 0 || push(key, s->next.a[i]) < 0 ? -1 : 1;
    if (s->kind.a[i] != ALT || loop[i])                 /* a loop's key is not its options: never matched */
        return 0;
    PyObject *tup = PyList_GET_ITEM(s->py_arg, i);
    if (!PyTuple_Check(tup) || push(key, ALT) < 0)
        return -1;
    for (Py_ssize_t o = 0; o < PyTuple_GET_SIZE(tup); o++) {
        int64_t v = PyLong_AsLongLong(PyTuple_GET_ITEM(tup, o));
        if ((v == -1 && PyErr_Occurred()) || push(key, v) < 0)
            return -1;
    }
    return 1;
}

/* the keys of the caller's BLOCK and (not loop) ALT states, once, at the first merge */
static int cons_ready(S *s)
{
    if (s->consed_ready)
        return 0;
    char *loop = calloc((size_t)(s->n0 ? s->n0 : 1), 1);
    Vec key = {0};
    int rc = loop ? 0 : -1;
    if (!loop)
        PyErr_NoMemory();
    for (int64_t t = 0; rc == 0 && t < s->nloops; t++)
        if (s->loops[t] >= 0 && s->loops[t] < s->n0)
            loop[s->loops[t]] = 1;
    for (int64_t i = 0; rc == 0 && i < s->n0; i++) {
        int got = cons_key(s, i, &key, loop);
        if (got <= 0) {
            rc = got;
            continue;
        }
        uint64_t h = seq_hash(key.a, key.n);
        if (seq_find(&s->consed, key.a, key.n, h) < 0)
            rc = seq_add(&s->consed, key.a, key.n, h) < 0 || push(&s->consed_state, i) < 0 ? -1 : 0;
    }
    free(loop);
    free(key.a);
    s->consed_ready = rc == 0;
    return rc;
}

/* the NFA state of `key` ([BLOCK, argument, next] or [ALT, options...]): the one there, or a new one */
static int cons(S *s, const int64_t *key, int64_t n, int64_t *state)
{
    if (cons_ready(s) < 0)
        return -1;
    uint64_t h = seq_hash(key, n);
    int64_t id = seq_find(&s->consed, key, n, h);
    if (id >= 0) {
        *state = s->consed_state.a[id];
        return 0;
    }
    int64_t st = nfa_size(s);
    if (st >= s->limit) {
        s->verdict = TOO_MANY_NFA;
        return -1;
    }
    int is_block = key[0] == BLOCK;
    if (push(&s->kind, key[0]) < 0 || push(&s->next, is_block ? key[2] : -1) < 0 ||
        push(&s->arg, is_block ? key[1] : s->opts.n) < 0 || push(&s->opts_n, is_block ? 0 : n - 1) < 0 ||
        seq_add(&s->consed, key, n, h) < 0 || push(&s->consed_state, st) < 0 || follow_nfa(s) < 0)
        return -1;
    for (int64_t o = 1; !is_block && o < n; o++)
        if (push(&s->opts, key[o]) < 0)
            return -1;
    *state = st;
    return 0;
}

/* --- the lockstep merge and the target of a move (tree.py merge_lockstep, target) -------------------------------- */

typedef struct { int64_t arg, n, q, k; } Pos;

static int pos_cmp(const void *x, const void *y)
{
    const Pos *a = x, *b = y;
    if (a->arg != b->arg) return a->arg < b->arg ? -1 : 1;
    if (a->n != b->n) return a->n < b->n ? -1 : 1;
    if (a->q != b->q) return a->q < b->q ? -1 : 1;
    return a->k < b->k ? -1 : a->k > b->k;
}

/* block positions of one argument and cell, as one position of a block whose continuation is the ALT of theirs;
   writes the (maybe) shorter element list to s->mbuf; returns 1 if anything merged */
static int merge(S *s, const int64_t *elems, int64_t n)
{
    Pos *ps = malloc((size_t)n * sizeof(Pos));
    int64_t *group = malloc((size_t)n * 8), *first = malloc((size_t)n * 8), np = 0, ng = 0;
    int rc = -1;
    if (!ps || !group || !first) {
        PyErr_NoMemory();
        goto done;
    }
    for (int64_t k = 0; k < n; k++)
        if (elems[k] < 0) {
            const int64_t *jnq = pos_of(s, elems[k]);
            ps[np++] = (Pos){block_arg(s, jnq[0]), jnq[1], jnq[2], k};
        }
    qsort(ps, (size_t)np, sizeof(Pos), pos_cmp);
    for (int64_t t = 0; t < np; t++) {                      /* group of each element; a group's run in ps */
        if (t == 0 || pos_cmp(&(Pos){ps[t].arg, ps[t].n, ps[t].q, 0}, &(Pos){ps[t - 1].arg, ps[t - 1].n, ps[t - 1].q, 0}))
            first[ng++] = t;
        group[ps[t].k] = ng - 1;
    }
    if (ng == np) {
        rc = 0;
        goto done;
    }
    first[ng] = np;                                          /* (first has room: ng < np) */
    s->mbuf.n = 0;
    for (int64_t k = 0; k < n; k++) {
        if (elems[k] >= 0) {
            if (push(&s->mbuf, elems[k]) < 0)
                goto done;
            continue;
        }
        int64_t g = group[k], a = first[g], z = first[g + 1];
        if (ps[a].k != k)                                    /* the group was placed at its first member */
            continue;
        int64_t code = elems[k];
        if (z - a > 1) {
            Vec *key = &s->kbuf;
            key->n = 0;
            s->gen++;
            if (push(key, ALT) < 0)
                goto done;
            for (int64_t t = a; t < z; t++) {                /* the members' continuations, first kept */
                int64_t nx = s->next.a[pos_of(s, elems[ps[t].k])[0]];
                if (!mark(s, nx) && push(key, nx) < 0)
                    goto done;
            }
            int64_t nx = key->a[1], j;
            if (key->n > 2 && cons(s, key->a, key->n, &nx) < 0)
                goto done;
            int64_t bkey[3] = {BLOCK, ps[a].arg, nx};
            if (cons(s, bkey, 3, &j) < 0 || position(s, j, ps[a].n, ps[a].q, &code) < 0)
                goto done;
        }
        if (push(&s->mbuf, code) < 0)
            goto done;
    }
    rc = 1;
done:
    free(ps);
    free(group);
    free(first);
    return rc;
}

static int cmp_i64(const void *x, const void *y)
{
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return a < b ? -1 : a > b;
}

static inline int64_t count_positions(const int64_t *e, int64_t n)
{
    int64_t c = 0;
    for (int64_t k = 0; k < n; k++)
        c += e[k] < 0;
    return c;
}

/* the target code of a move to `elems` (not a pointer into s->mbuf or s->kbuf): an explicit state's id, made and
   queued when new, or -1 - k for the k-th lone block position */
static int target(S *s, const int64_t *elems, int64_t n, int64_t *code)
{
    int64_t npos = count_positions(elems, n);
    if (n > 1 && npos > 1) {
        int got = merge(s, elems, n);
        if (got < 0)
            return -1;
        if (got) {
            elems = s->mbuf.a;
            n = s->mbuf.n;
            npos = count_positions(elems, n);
        }
    }
    if (n == 1 && elems[0] < 0) {
        int64_t p = -1 - elems[0];
        if (s->lone_of.a[p] < 0) {
            const int64_t *jnq = pos_of(s, elems[0]);
            int64_t j = jnq[0], depth = jnq[1];
            if (s->depth.a[j] < 0) {
                s->depth.a[j] = 0;
                if (push(&s->queue, -1 - j) < 0 || push(&s->seen, j) < 0)
                    return -1;
            }
            if (depth > s->depth.a[j])
                s->depth.a[j] = depth;
            s->lone_of.a[p] = s->lone.n;
            if (push(&s->lone, p) < 0)
                return -1;
        }
        *code = -1 - s->lone_of.a[p];
        return 0;
    }
    Vec *key = &s->kbuf;                                     /* the set of elements: sorted */
    key->n = 0;
    if (reserve(key, n) < 0)
        return -1;
    memcpy(key->a, elems, n * 8);
    key->n = n;
    if (n > 1)
        qsort(key->a, (size_t)n, 8, cmp_i64);
    uint64_t h = seq_hash(key->a, n);
    int64_t id = seq_find(&s->key, key->a, n, h);
    if (id >= 0) {
        *code = id;
        return 0;
    }
    id = seq_add(&s->key, key->a, n, h);
    if (id < 0 || push(&s->st_off, s->st_elems.n) < 0 || push(&s->st_len, n) < 0 || reserve(&s->st_elems, n) < 0)
        return -1;
    memcpy(s->st_elems.a + s->st_elems.n, elems, n * 8);
    s->st_elems.n += n;
    if (push(&s->queue, id) < 0)
        return -1;
    if (n > 1 && npos > 1)
        s->parallel++;
    if (s->parallel > s->max_parallel)
        s->verdict = TOO_PARALLEL;
    else if (s->st_len.n > s->max_explicit)
        s->verdict = TOO_MANY_EXPLICIT;
    *code = id;
    return s->verdict ? -1 : 0;
}

/* target() of codes[off : off + n] (copied: target's merge may grow the pools) */
static int target_at(S *s, int64_t off, int64_t n, int64_t *code)
{
    s->tbuf.n = 0;
    if (reserve(&s->tbuf, n) < 0)
        return -1;
    memcpy(s->tbuf.a, s->codes.a + off, n * 8);
    return target(s, s->tbuf.a, n, code);
}

/* --- one explicit state: its edges, and the classes on which one block position alone moves (tree.py) ------------ */

static int moves_alone(S *s, int64_t i, const int64_t *elems, int64_t n, int64_t start, int64_t cnt)
{
    int64_t m_off[256], m_len[256];
    for (int64_t c = 0; c < s->C; c++)
        m_len[c] = 0;
    for (int64_t t = start; t < start + cnt; t++) {
        m_off[s->mv_cls.a[t]] = s->mv_off.a[t];
        m_len[s->mv_cls.a[t]] = s->mv_len.a[t];
    }
    for (int64_t k = 0; k < n; k++) {
        int64_t e = elems[k];
        if (e >= 0)
            continue;
        for (int64_t t = moves_start(s, e), z = t + moves_n(s, e); t < z; t++) {
            int64_t c = s->mv_cls.a[t], len = s->mv_len.a[t];
            if (m_len[c] == len && !memcmp(s->codes.a + m_off[c], s->codes.a + s->mv_off.a[t], len * 8))
                if (push(&s->d_i, i) < 0 || push(&s->d_p, -1 - e) < 0 || push(&s->d_c, c) < 0)
                    return -1;
        }
    }
    return 0;
}

static int edge(S *s, int64_t i, int64_t c, int64_t at)
{
    return push(&s->e_src, i) < 0 || push(&s->e_cls, c) < 0 || push(&s->e_tgt, at) < 0 ? -1 : 0;
}

static int explicit_state(S *s, int64_t i)
{
    int64_t n = s->st_len.a[i];
    Vec *eb = &s->ebuf;
    eb->n = 0;
    if (reserve(eb, n) < 0)
        return -1;
    memcpy(eb->a, s->st_elems.a + s->st_off.a[i], n * 8);   /* st_elems grows as targets are made */
    eb->n = n;
    int64_t *elems = eb->a;
    for (int64_t k = 0; k < n; k++)                          /* every memo this state reads, before the mark */
        if (elem_moves(s, elems[k]) < 0)
            return -1;
    if (n == 1 && elems[0] >= 0) {                           /* one byte set (most states): one target */
        int64_t a = s->em_start.a[elems[0]], z = a + s->em_n.a[elems[0]], at;
        if (a < z && target_at(s, s->mv_off.a[a], s->mv_len.a[a], &at) < 0)
            return -1;
        for (int64_t t = a; t < z; t++)
            if (edge(s, i, s->mv_cls.a[t], at) < 0)
                return -1;
        return 0;
    }
    int64_t mark_codes = s->codes.n, mark_mv = s->mv_cls.n, start, cnt;
    if (set_moves(s, elems, n, &start, &cnt) < 0 || (n > 1 && moves_alone(s, i, elems, n, start, cnt) < 0))
        return -1;
    int64_t prev_off = -1, prev_len = 0, at = 0;
    for (int64_t t = start; t < start + cnt; t++) {
        int64_t off = s->mv_off.a[t], len = s->mv_len.a[t];
        if (!(prev_off >= 0 && len == prev_len && !memcmp(s->codes.a + off, s->codes.a + prev_off, len * 8)))
            if (target_at(s, off, len, &at) < 0)
                return -1;
        prev_off = off;
        prev_len = len;
        if (edge(s, i, s->mv_cls.a[t], at) < 0)
            return -1;
    }
    s->codes.n = mark_codes;                                 /* the merged moves are this state's alone */
    s->mv_cls.n = s->mv_off.n = s->mv_len.n = mark_mv;
    return 0;
}

static int block_exits(S *s, int64_t j)
{
    if (exit_moves(s, j) < 0)
        return -1;
    for (int64_t t = s->ex_start.a[j], z = t + s->ex_n.a[j]; t < z; t++) {
        int64_t at;
        if (target_at(s, s->mv_off.a[t], s->mv_len.a[t], &at) < 0 || push(&s->x_j, j) < 0 ||
            push(&s->x_c, s->mv_cls.a[t]) < 0 || push(&s->x_tgt, at) < 0)
            return -1;
    }
    return 0;
}

int construct(S *s, const int64_t *starts, int64_t nstarts, Vec *start_codes)
{
    for (int64_t k = 0; k < nstarts; k++) {
        int64_t at;
        if (closure(s, starts[k], 0) < 0 ||
            target_at(s, s->clo_off.a[starts[k]], s->clo_len.a[starts[k]], &at) < 0 || push(start_codes, at) < 0)
            return -1;
    }
    for (int64_t steps = 0; s->head < s->queue.n; steps++) {
        int64_t i = s->queue.a[s->head++];
        if ((i >= 0 ? explicit_state(s, i) : block_exits(s, -1 - i)) < 0)
            return -1;
        if ((steps & 4095) == 4095 && PyErr_CheckSignals() < 0)
            return -1;
    }
    return 0;
}
