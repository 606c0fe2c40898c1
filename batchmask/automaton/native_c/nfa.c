/* NFA.build (nfa.py) in C for the common nodes, without an interpreter round trip per node and per byte (four fifths
   of a large schema's NFA states are its literals' bytes): each state hash-conses by its key in the NFA's own index
   dict and is appended to its own lists, exactly as NFA._add does. */
#include "native.h"

/* --- NFA.build for the common nodes ---------------------------------------------------------------------------------
   build_node(nfa, node, k, where) is NFA.build: the memo (nfa._built, by (id(node), k)), then Lit, Seq, Alt and
   ByteSet here,
   the same states in the same order as NFA._build makes them; any other node (and a Lit or Alt that would raise, a
   Lit byte or a ByteSet without its mask yet) goes to NFA._build, whose children come back here through NFA.build. */

static PyObject *LitT, *SeqT, *AltT, *ByteSetT;     /* grammar/nodes.py's classes (bind_nodes) */
static PyObject *s_mask, *s_text, *s_items, *s_options, *s_build, *s_too_large, *s_dot_items, *s_dot_options, *byte_kind, *alt_kind,
    *minus_one;

typedef struct {
    PyObject *nfa, *built, *index, *kind, *arg, *next, *mask_of, *mask_id;
    Py_ssize_t limit;
} Ctx;

PyObject *py_bind_nodes(PyObject *self, PyObject *args)
{
    PyObject *lit, *seq, *alt, *byteset;
    if (!PyArg_ParseTuple(args, "OOOO", &lit, &seq, &alt, &byteset))
        return NULL;
    Py_INCREF(lit);
    Py_INCREF(seq);
    Py_INCREF(alt);
    Py_INCREF(byteset);
    Py_XDECREF(LitT);
    Py_XDECREF(SeqT);
    Py_XDECREF(AltT);
    Py_XDECREF(ByteSetT);
    LitT = lit, SeqT = seq, AltT = alt, ByteSetT = byteset;
    if (!s_text) {
        s_mask = PyUnicode_InternFromString("mask");
        s_text = PyUnicode_InternFromString("text");
        s_items = PyUnicode_InternFromString("items");
        s_options = PyUnicode_InternFromString("options");
        s_build = PyUnicode_InternFromString("_build");
        s_too_large = PyUnicode_InternFromString("too_large");
        s_dot_items = PyUnicode_InternFromString(".items");
        s_dot_options = PyUnicode_InternFromString(".options");
        byte_kind = PyLong_FromLong(BYTE);
        alt_kind = PyLong_FromLong(ALT);
        minus_one = PyLong_FromLong(-1);
        if (!s_mask || !s_text || !s_items || !s_options || !s_build || !s_too_large || !s_dot_items || !s_dot_options ||
            !byte_kind || !alt_kind || !minus_one)
            return NULL;
    }
    Py_RETURN_NONE;
}

/* the NFA's error for a build past its limit, raised */
static PyObject *too_large(Ctx *c)
{
    PyObject *err = PyObject_CallMethodNoArgs(c->nfa, s_too_large);
    if (err) {
        PyErr_SetObject((PyObject *)Py_TYPE(err), err);
        Py_DECREF(err);
    }
    return NULL;
}

/* NFA._add(kind, arg, next): the state of that key, made when new (new reference) */
static PyObject *add_state(Ctx *c, PyObject *kind, PyObject *arg, PyObject *next)
{
    PyObject *key = PyTuple_Pack(3, kind, arg, next);
    if (!key)
        return NULL;
    PyObject *got = PyDict_GetItemWithError(c->index, key);
    if (got) {
        Py_DECREF(key);
        Py_INCREF(got);
        return got;
    }
    if (PyErr_Occurred() || PyList_GET_SIZE(c->kind) >= c->limit) {
        Py_DECREF(key);
        return PyErr_Occurred() ? NULL : too_large(c);
    }
    got = PyLong_FromSsize_t(PyList_GET_SIZE(c->kind));
    if (!got || PyDict_SetItem(c->index, key, got) < 0 || PyList_Append(c->kind, kind) < 0 ||
        PyList_Append(c->arg, arg) < 0 || PyList_Append(c->next, next) < 0) {
        Py_XDECREF(got);
        Py_DECREF(key);
        return NULL;
    }
    Py_DECREF(key);
    return got;
}

static PyObject *build(Ctx *c, PyObject *node, PyObject *k, PyObject *where);

static PyObject *child(Ctx *c, PyObject *node, PyObject *k, PyObject *where, PyObject *field, Py_ssize_t i)
{
    PyObject *at = PyLong_FromSsize_t(i), *w = at ? PyTuple_Pack(3, where, field, at) : NULL;
    Py_XDECREF(at);
    if (!w)
        return NULL;
    PyObject *got = build(c, node, k, w);
    Py_DECREF(w);
    return got;
}

/* a Lit's states, or Py_None (a borrowed marker) where NFA._build must do it */
static PyObject *build_lit(Ctx *c, PyObject *node, PyObject *k)
{
    PyObject *text = PyObject_GetAttr(node, s_text);
    if (!text)
        return NULL;
    if (!PyBytes_Check(text)) {                      /* bytearray or wrong: NFA._build converts or raises */
        Py_DECREF(text);
        return Py_None;
    }
    const unsigned char *t = (const unsigned char *)PyBytes_AS_STRING(text);
    Py_ssize_t n = PyBytes_GET_SIZE(text);
    for (Py_ssize_t i = 0; i < n; i++)
        if (PyLong_AsLong(PyList_GET_ITEM(c->mask_of, t[i])) < 0) {    /* a mask NFA._build makes first */
            Py_DECREF(text);
            return PyErr_Occurred() ? NULL : Py_None;
        }
    Py_INCREF(k);
    for (Py_ssize_t i = n - 1; i >= 0 && k; i--) {
        PyObject *got = add_state(c, byte_kind, PyList_GET_ITEM(c->mask_of, t[i]), k);
        Py_DECREF(k);
        k = got;
    }
    Py_DECREF(text);
    return k;
}

/* a ByteSet's state where its mask (bytes) has an id already, else Py_None: NFA._build checks and makes it */
static PyObject *build_byteset(Ctx *c, PyObject *node, PyObject *k)
{
    PyObject *mask = PyObject_GetAttr(node, s_mask);
    if (!mask)
        return NULL;
    PyObject *m = PyBytes_CheckExact(mask) ? PyDict_GetItemWithError(c->mask_id, mask) : NULL, *out = Py_None;
    if (m) {
        out = add_state(c, byte_kind, m, k);
    } else if (PyErr_Occurred()) {
        out = NULL;
    }
    Py_DECREF(mask);
    return out;
}

/* node.<field> as a fast sequence (new reference), or NULL with an error */
static PyObject *children(PyObject *node, PyObject *field, const char *what)
{
    PyObject *got = PyObject_GetAttr(node, field);
    if (!got)
        return NULL;
    PyObject *seq = PySequence_Fast(got, what);
    Py_DECREF(got);
    return seq;
}

static PyObject *build_seq(Ctx *c, PyObject *node, PyObject *k, PyObject *where)
{
    PyObject *seq = children(node, s_items, "Seq.items must be a sequence");
    if (!seq)
        return NULL;
    Py_INCREF(k);
    for (Py_ssize_t i = PySequence_Fast_GET_SIZE(seq) - 1; i >= 0 && k; i--) {
        PyObject *got = child(c, PySequence_Fast_GET_ITEM(seq, i), k, where, s_dot_items, i);
        Py_DECREF(k);
        k = got;
    }
    Py_DECREF(seq);
    return k;
}

static PyObject *build_alt(Ctx *c, PyObject *node, PyObject *k, PyObject *where)
{
    PyObject *seq = children(node, s_options, "Alt.options must be a sequence");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), m = 0;
    if (n == 0) {
        Py_DECREF(seq);
        return Py_None;                              /* NFA._build raises its error */
    }
    PyObject *opts = PyTuple_New(n), *out = NULL;
    if (!opts)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {             /* each option's state, first occurrence kept */
        PyObject *got = child(c, PySequence_Fast_GET_ITEM(seq, i), k, where, s_dot_options, i);
        if (!got)
            goto done;
        int seen = 0;
        for (Py_ssize_t j = 0; j < m && !seen; j++) {
            int eq = PyObject_RichCompareBool(PyTuple_GET_ITEM(opts, j), got, Py_EQ);
            if (eq < 0) {
                Py_DECREF(got);
                goto done;
            }
            seen = eq;
        }
        if (seen)
            Py_DECREF(got);
        else
            PyTuple_SET_ITEM(opts, m++, got);
    }
    if (m == 1) {
        out = PyTuple_GET_ITEM(opts, 0);
        Py_INCREF(out);
    } else {
        PyObject *exact = PyTuple_GetSlice(opts, 0, m);
        if (exact) {
            out = add_state(c, alt_kind, exact, minus_one);
            Py_DECREF(exact);
        }
    }
done:
    if (opts) {
        for (Py_ssize_t j = m; j < n; j++)           /* unfilled slots: a tuple's dealloc reads them */
            PyTuple_SET_ITEM(opts, j, NULL);
        Py_DECREF(opts);
    }
    Py_DECREF(seq);
    return out;
}

static PyObject *build(Ctx *c, PyObject *node, PyObject *k, PyObject *where)
{
    PyObject *id = PyLong_FromVoidPtr(node), *key = id ? PyTuple_Pack(2, id, k) : NULL, *got = NULL;
    Py_XDECREF(id);
    if (!key)
        return NULL;
    got = PyDict_GetItemWithError(c->built, key);
    if (got || PyErr_Occurred()) {
        Py_XINCREF(got);
        Py_DECREF(key);
        return got;
    }
    if (Py_EnterRecursiveCall(" while building the grammar's NFA")) {
        Py_DECREF(key);
        return NULL;
    }
    PyTypeObject *t = Py_TYPE(node);
    got = (PyObject *)t == LitT ? build_lit(c, node, k) : (PyObject *)t == SeqT ? build_seq(c, node, k, where)
        : (PyObject *)t == AltT ? build_alt(c, node, k, where) : (PyObject *)t == ByteSetT ? build_byteset(c, node, k)
        : Py_None;
    if (got == Py_None)                              /* the other nodes, and the cases above NFA._build takes */
        got = PyObject_CallMethodObjArgs(c->nfa, s_build, node, k, where, NULL);
    Py_LeaveRecursiveCall();
    if (got && PyDict_SetItem(c->built, key, got) < 0)
        Py_CLEAR(got);
    Py_DECREF(key);
    return got;
}

PyObject *py_build_node(PyObject *self, PyObject *args)
{
    PyObject *nfa, *node, *k, *where, *limit = NULL;
    if (!PyArg_ParseTuple(args, "OOOO", &nfa, &node, &k, &where))
        return NULL;
    if (!LitT) {
        PyErr_SetString(PyExc_RuntimeError, "build_node: bind_nodes(Lit, Seq, Alt, ByteSet) was not called");
        return NULL;
    }
    Ctx c = {nfa, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0};
    PyObject *out = NULL;
    if (!(c.built = PyObject_GetAttrString(nfa, "_built")) || !(c.index = PyObject_GetAttrString(nfa, "_index")) ||
        !(c.kind = PyObject_GetAttrString(nfa, "kind")) || !(c.arg = PyObject_GetAttrString(nfa, "arg")) ||
        !(c.next = PyObject_GetAttrString(nfa, "next")) || !(c.mask_of = PyObject_GetAttrString(nfa, "_byte_mask")) ||
        !(c.mask_id = PyObject_GetAttrString(nfa, "_mask_id")) ||
        !(limit = PyObject_GetAttrString(nfa, "limit")))
        goto done;
    if (!PyDict_Check(c.built) || !PyDict_Check(c.index) || !PyList_Check(c.kind) || !PyList_Check(c.arg) ||
        !PyList_Check(c.next) || !PyList_Check(c.mask_of) || PyList_GET_SIZE(c.mask_of) != 256 ||
        !PyDict_Check(c.mask_id)) {
        PyErr_SetString(PyExc_TypeError, "build_node: not an NFA (nfa.py: _built, _index, kind, arg, next, _byte_mask)");
        goto done;
    }
    c.limit = PyLong_AsSsize_t(limit);
    if (c.limit == -1 && PyErr_Occurred())
        goto done;
    out = build(&c, node, k, where);
done:
    Py_XDECREF(c.built); Py_XDECREF(c.index); Py_XDECREF(c.kind); Py_XDECREF(c.arg); Py_XDECREF(c.next);
    Py_XDECREF(c.mask_of); Py_XDECREF(c.mask_id); Py_XDECREF(limit);
    return out;
}
