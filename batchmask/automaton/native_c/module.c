/* batchmask.automaton._native: automaton/tree.py's subset construction (`_Subsets.run_python`) in C (this file:
   what it does and its entry point; native.h: what the other files share), and a Lit's NFA states (nfa.c).

   Why: the Python construction costs a dict lookup, a tuple and a frozenset per move: 17.4 s of search on 500
   random JSONSchemaBench schemas, 5 of the shared catalogue's 32 ms warm compile, seconds on the largest schemas.
   Here it is 1.2 s on those 500: one pass over int64 arrays, with the same result: the same explicit states in the
   same order (so the same ids), the same edges in the same order, the same lone block positions, block exits and
   delegated classes, and the same NFA states made by the lockstep merge (handed back for the caller to add, in
   order, to its NFA).

   run(kind, next, arg, loops, limit, end, barg_of, btab, vt_off, T, I, P, A, mask_ptr, mask_cls, C, starts,
       max_explicit, max_parallel) -> a tuple of int64 bytearrays (automaton/native.py reads them), or an int:
       1 too many parallel states, 2 too many explicit states, 3 too many NFA states (the caller raises its error).
     kind, next, arg: the NFA's lists (nfa.py); loops: its loop states; limit: the NFA's size limit; end: its END
     state; barg_of int64 [N]: each BLOCK state's block argument (-1 for others); btab int64 [B, 4]: per argument
     its value type, min, max (UNBOUNDED for none) and saturating row (-1 unless unbounded); vt_off int64 [V + 1]:
     each value type's first row in T, I (int64 [rows, C]: sub-state and units after each byte class), P (pending
     units per sub-state) and A (accepting per sub-state); mask_ptr, mask_cls: each byte mask's classes; C: byte
     classes (at most 256); starts: the start state of each tree.

   Elements are int64 codes: an NFA state id (a BYTE or END state) as it is, a block position (j, n, q) as
   -1 - p for its interned number p. A target code is an explicit state's id, or -1 - k for the k-th lone block
   position (the order tree.py gives them). The GIL is held (the NFA's ALT options are read from its Python
   tuples); Ctrl-C is checked every few thousand states. */
#include "native.h"

/* --- the inputs, read once ------------------------------------------------------------------------------------ */

typedef struct {
    Py_buffer view;
    const int64_t *a;
} In;

static int get_in(PyObject *obj, In *in, const char *name)
{
    if (PyObject_GetBuffer(obj, &in->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    const char *f = in->view.format ? in->view.format : "B";
    char code = f[strlen(f) - 1];
    if (in->view.itemsize != 8 || (code != 'l' && code != 'q')) {
        PyErr_Format(PyExc_TypeError, "%s: expected a C-contiguous int64 array, got format '%s'", name, f);
        PyBuffer_Release(&in->view);
        in->view.obj = NULL;
        return -1;
    }
    in->a = in->view.buf;
    return 0;
}

/* --- the module ---------------------------------------------------------------------------------------------------- */

static PyObject *as_bytes(const int64_t *a, int64_t n)
{
    return PyByteArray_FromStringAndSize((const char *)a, (Py_ssize_t)(n * 8));
}

static void s_free(S *s)
{
    Vec *vs[] = {&s->kind, &s->next, &s->arg, &s->opts, &s->opts_n, &s->consed_state, &s->codes, &s->clo_off,
                 &s->clo_len, &s->mv_cls, &s->mv_off, &s->mv_len, &s->em_start, &s->em_n, &s->pm_start, &s->pm_n,
                 &s->ex_start, &s->ex_n, &s->stamp_nfa, &s->stamp_pos, &s->st_off, &s->st_len, &s->st_elems,
                 &s->queue, &s->lone_of, &s->lone, &s->depth, &s->seen, &s->e_src, &s->e_cls, &s->e_tgt, &s->x_j,
                 &s->x_c, &s->x_tgt, &s->d_i, &s->d_p, &s->d_c, &s->tbuf, &s->mbuf, &s->kbuf, &s->ebuf};
    for (size_t k = 0; k < sizeof vs / sizeof vs[0]; k++)
        free(vs[k]->a);
    seq_free(&s->consed);
    seq_free(&s->pos);
    seq_free(&s->key);
}

/* the caller's NFA: kinds and continuations copied, a BYTE state's mask and a BLOCK state's argument per state */
static int read_nfa(S *s, PyObject *kind, PyObject *next, const int64_t *barg_of, int64_t nbarg)
{
    if (!PyList_Check(kind) || !PyList_Check(next) || !PyList_Check(s->py_arg) || PyList_GET_SIZE(next) != s->n0 ||
        PyList_GET_SIZE(s->py_arg) != s->n0 || nbarg != s->n0) {
        PyErr_SetString(PyExc_TypeError, "run: kind, next and arg must be lists, and barg_of an array, of one length");
        return -1;
    }
    if (reserve(&s->kind, s->n0) < 0 || reserve(&s->next, s->n0) < 0 || reserve(&s->arg, s->n0) < 0)
        return -1;
    for (int64_t i = 0; i < s->n0; i++) {
        int64_t k = PyLong_AsLongLong(PyList_GET_ITEM(kind, i)), nx = PyLong_AsLongLong(PyList_GET_ITEM(next, i));
        int64_t a = k == BYTE ? PyLong_AsLongLong(PyList_GET_ITEM(s->py_arg, i)) : k == BLOCK ? barg_of[i] : -1;
        if (PyErr_Occurred())
            return -1;
        s->kind.a[s->kind.n++] = k;
        s->next.a[s->next.n++] = nx;
        s->arg.a[s->arg.n++] = a;
    }
    return follow_nfa(s);
}

static PyObject *py_run(PyObject *self, PyObject *args)
{
    PyObject *kind, *next, *o[12], *out = NULL;
    long long limit, end, C, max_explicit, max_parallel;
    S s;
    memset(&s, 0, sizeof s);
    if (!PyArg_ParseTuple(args, "OOOOLLOOOOOOOOOLOLL", &kind, &next, &s.py_arg, &o[0], &limit, &end, &o[1], &o[2],
                          &o[3], &o[4], &o[5], &o[6], &o[7], &o[8], &o[9], &C, &o[10], &max_explicit, &max_parallel))
        return NULL;
    static const char *names[10] = {"loops", "barg_of", "btab", "vt_off", "T", "I", "P", "A", "mask_ptr",
                                    "mask_cls"};
    In in[11];
    memset(in, 0, sizeof in);
    int ok = C >= 1 && C <= 256;
    if (!ok)
        PyErr_Format(PyExc_ValueError, "run: %lld byte classes (1 to 256)", C);
    for (int k = 0; ok && k < 10; k++)
        ok = get_in(o[k], &in[k], names[k]) == 0;
    ok = ok && get_in(o[10], &in[10], "starts") == 0;
    if (ok) {
        s.n0 = PyList_Check(kind) ? PyList_GET_SIZE(kind) : -1;
        s.limit = limit, s.end = end, s.C = C, s.max_explicit = max_explicit, s.max_parallel = max_parallel;
        s.loops = in[0].a, s.nloops = in[0].view.len / 8;
        s.btab = in[2].a, s.vt_off = in[3].a, s.T = in[4].a, s.I = in[5].a, s.P = in[6].a, s.A = in[7].a;
        s.mask_ptr = in[8].a, s.mask_cls = in[9].a;
        Vec starts = {0};
        if (read_nfa(&s, kind, next, in[1].a, in[1].view.len / 8) == 0 &&
            construct(&s, in[10].a, in[10].view.len / 8, &starts) == 0) {
            Vec acc = {0}, depth = {0};
            int rc = 0;
            for (int64_t i = 0; rc == 0 && i < s.st_len.n; i++)
                for (int64_t t = s.st_off.a[i]; t < s.st_off.a[i] + s.st_len.a[i]; t++)
                    if (s.st_elems.a[t] == s.end) {
                        rc = push(&acc, i);
                        break;
                    }
            for (int64_t t = 0; rc == 0 && t < s.seen.n; t++)
                rc = push(&depth, s.depth.a[s.seen.a[t]]);
            int64_t n0 = s.n0, nn = s.kind.n - s.n0;
            if (rc == 0)
                out = Py_BuildValue(
                    "(NNNNNNNNNNNNNNNNNNNNNN)", as_bytes(starts.a, starts.n), as_bytes(s.e_src.a, s.e_src.n),
                    as_bytes(s.e_cls.a, s.e_cls.n), as_bytes(s.e_tgt.a, s.e_tgt.n), as_bytes(s.st_len.a, s.st_len.n),
                    as_bytes(s.st_elems.a, s.st_elems.n), as_bytes(s.pos.data.a, s.pos.data.n),
                    as_bytes(s.lone.a, s.lone.n), as_bytes(s.seen.a, s.seen.n), as_bytes(depth.a, depth.n),
                    as_bytes(s.x_j.a, s.x_j.n), as_bytes(s.x_c.a, s.x_c.n), as_bytes(s.x_tgt.a, s.x_tgt.n),
                    as_bytes(s.d_i.a, s.d_i.n), as_bytes(s.d_p.a, s.d_p.n), as_bytes(s.d_c.a, s.d_c.n),
                    as_bytes(acc.a, acc.n), as_bytes(s.kind.a + n0, nn), as_bytes(s.next.a + n0, nn),
                    as_bytes(s.arg.a + n0, nn), as_bytes(s.opts_n.a, s.opts_n.n), as_bytes(s.opts.a, s.opts.n));
            free(acc.a);
            free(depth.a);
        } else if (s.verdict && !PyErr_Occurred()) {
            out = PyLong_FromLong(s.verdict);
        }
        free(starts.a);
    }
    for (int k = 0; k < 11; k++)
        if (in[k].view.obj)
            PyBuffer_Release(&in[k].view);
    s_free(&s);
    return out;
}

static PyMethodDef methods[] = {
    {"bind_nodes", py_bind_nodes, METH_VARARGS, "bind_nodes(Lit, Seq, Alt, ByteSet): the node classes build_node takes on"},
    {"build_node", py_build_node, METH_VARARGS, "build_node(nfa, node, k, where) -> NFA.build(node, k, where) (nfa.c)"},
    {"run", py_run, METH_VARARGS, "run(kind, next, arg, loops, limit, end, barg_of, btab, vt_off, T, I, P, A, "
     "mask_ptr, mask_cls, C, starts, max_explicit, max_parallel) -> results or a verdict (see the module docstring)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native", "automaton/tree.py's subset construction in C (batchmask/automaton/native.py).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__native(void)
{
    return PyModule_Create(&module);
}
