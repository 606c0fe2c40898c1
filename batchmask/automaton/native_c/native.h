/* What the automaton's C files share (module.c says what the extension does; pools.c: growable arrays and a map of
   int64 sequences; moves.c: closures and moves; construct.c: the merge, the targets, the search; nfa.c: a Lit's
   NFA states). */
#ifndef BATCHMASK_AUTOMATON_NATIVE_H
#define BATCHMASK_AUTOMATON_NATIVE_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { BYTE = 0, ALT = 1, BLOCK = 2, END = 3 };
enum { TOO_PARALLEL = 1, TOO_MANY_EXPLICIT = 2, TOO_MANY_NFA = 3 };   /* verdicts: the caller raises its error */

/* --- growable int64 arrays (pools.c) ---------------------------------------------------------------------- */

typedef struct { int64_t *a; int64_t n, cap; } Vec;

int reserve(Vec *v, int64_t extra);                 /* room for `extra` more (-1: out of memory, error set) */
int grow_to(Vec *v, int64_t n, int64_t fill);       /* grow to n entries, the new ones `fill` */

static inline int push(Vec *v, int64_t x)
{
    if (v->n == v->cap && reserve(v, 1) < 0)
        return -1;
    v->a[v->n++] = x;
    return 0;
}

/* --- a map from int64 sequences to dense ids (positions, explicit states, hash-consed NFA states; pools.c) ---- */

typedef struct {
    Vec data, off, len, hash;
    int64_t *slot;                  /* id + 1, 0 empty */
    int64_t nslot;
} SeqMap;

uint64_t seq_hash(const int64_t *s, int64_t n);
int64_t seq_find(const SeqMap *m, const int64_t *s, int64_t n, uint64_t h);
int64_t seq_add(SeqMap *m, const int64_t *s, int64_t n, uint64_t h);   /* s absent, not pointing into m: its id */
void seq_free(SeqMap *m);

enum { B_VT, B_LO, B_HI, B_SAT, B_N };                    /* per block argument (value type, min, max, saturation) */

typedef struct {
    /* NFA: the caller's states (ids < n0), then those the merge adds */
    Vec kind, next, arg;            /* arg: BYTE its mask, BLOCK its block argument, ALT (made here) offset in opts */
    Vec opts, opts_n;               /* options of the ALT states made here (opts_n per new state) */
    PyObject *py_arg;               /* nfa.arg: the options of the ALT states there before */
    int64_t n0, limit, end;
    const int64_t *loops; int64_t nloops;
    SeqMap consed;                  /* keys (BLOCK, argument, next) and (ALT, options...): nfa.py's _index */
    Vec consed_state;               /* per key: its NFA state */
    int consed_ready;
    /* block arguments, value types (rows of T/I/P/A at vt_off[vt]), byte classes, masks */
    const int64_t *btab, *T, *I, *P, *A, *vt_off, *mask_ptr, *mask_cls;   /* btab: B_N per block argument */
    int64_t C;
    /* memos */
    Vec codes;                      /* closures and move targets, back to back */
    Vec clo_off, clo_len;           /* per NFA state, -1 not yet */
    SeqMap pos;                     /* (j, n, q) -> p */
    Vec mv_cls, mv_off, mv_len;     /* moves: (class, target in codes) */
    Vec em_start, em_n;             /* per NFA element: its moves; -1 not yet */
    Vec pm_start, pm_n;             /* per position */
    Vec ex_start, ex_n;             /* per block state: the moves after its value ends */
    Vec stamp_nfa, stamp_pos; int64_t gen;
    /* the construction */
    SeqMap key;                     /* explicit states by their sorted elements */
    Vec st_off, st_len, st_elems;   /* their elements, in priority order */
    Vec queue; int64_t head;
    Vec lone_of, lone;              /* position -> lone index k (-1), and the positions of each k */
    Vec depth, seen;                /* block state -> deepest entry count (-1 unseen); block states in first-seen order */
    int64_t parallel, max_parallel, max_explicit;
    Vec e_src, e_cls, e_tgt, x_j, x_c, x_tgt, d_i, d_p, d_c;
    Vec tbuf, mbuf, kbuf, ebuf;     /* scratch: a target, a merged target, a sorted key, a state's elements */
    int verdict;                    /* a refusal (no Python error set): the run stops and returns it */
} S;

/* --- shared steps ---------------------------------------------------------------------------------------------- */

static inline int64_t nfa_size(S *s) { return s->kind.n; }
static inline int64_t block_arg(S *s, int64_t j) { return s->arg.a[j]; }
static inline const int64_t *pos_of(S *s, int64_t code) { return s->pos.data.a + s->pos.off.a[-1 - code]; }
static inline int64_t moves_start(S *s, int64_t e) { return e >= 0 ? s->em_start.a[e] : s->pm_start.a[-1 - e]; }
static inline int64_t moves_n(S *s, int64_t e) { return e >= 0 ? s->em_n.a[e] : s->pm_n.a[-1 - e]; }

/* dedup marks: a code is seen in the current generation (s->gen, raised before each list) */
static inline int mark(S *s, int64_t code)
{
    int64_t *slot = code >= 0 ? &s->stamp_nfa.a[code] : &s->stamp_pos.a[-1 - code];
    if (*slot == s->gen)
        return 1;
    *slot = s->gen;
    return 0;
}

/* moves.c */
int follow_nfa(S *s);                                           /* memo arrays grown to the NFA's size */
int closure(S *s, int64_t i, int depth);                        /* codes[clo_off[i] : + clo_len[i]] */
int position(S *s, int64_t j, int64_t n, int64_t q, int64_t *code);
int elem_moves(S *s, int64_t e);                                /* memoised: moves_start / moves_n */
int exit_moves(S *s, int64_t j);                                /* memoised: ex_start / ex_n */
int set_moves(S *s, const int64_t *elems, int64_t n, int64_t *start, int64_t *count);
/* construct.c */
int construct(S *s, const int64_t *starts, int64_t nstarts, Vec *start_codes);
/* nfa.c */
PyObject *py_bind_nodes(PyObject *self, PyObject *args);
PyObject *py_build_node(PyObject *self, PyObject *args);

#endif
