/* A Lit's states in the NFA (nfa.py NFA._build): one BYTE state per byte, right to left, each hash-consed by its key
   (BYTE, mask, next) in the NFA's own index dict and appended to its own lists, exactly as NFA._add does; here
   without an interpreter round trip per byte (four fifths of a large schema's NFA states are its literals' bytes). */
#include "native.h"

/* lit_states(index, kind, arg, next, mask_of, text, k, limit) -> the state reading `text` then going on to k, or
   None where the NFA would pass `limit` states (the caller raises its error). mask_of: a list of 256 mask ids (each
   byte of text has one: the caller makes them first, in nfa.py's order). */
PyObject *py_lit_states(PyObject *self, PyObject *args)
{
    PyObject *index, *kind, *arg, *next, *mask_of, *k;
    Py_buffer text;
    long long limit;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!y*OL", &PyDict_Type, &index, &PyList_Type, &kind, &PyList_Type, &arg,
                          &PyList_Type, &next, &PyList_Type, &mask_of, &text, &k, &limit))
        return NULL;
    PyObject *out = NULL, *byte_kind = PyLong_FromLong(BYTE);
    const unsigned char *t = text.buf;
    if (!byte_kind || PyList_GET_SIZE(mask_of) != 256) {
        if (byte_kind)
            PyErr_SetString(PyExc_ValueError, "lit_states: mask_of must hold 256 mask ids");
        goto done;
    }
    Py_INCREF(k);
    for (Py_ssize_t i = text.len - 1; i >= 0; i--) {
        PyObject *m = PyList_GET_ITEM(mask_of, t[i]);
        PyObject *key = PyTuple_Pack(3, byte_kind, m, k);
        if (!key)
            goto fail;
        PyObject *got = PyDict_GetItemWithError(index, key);         /* borrowed */
        if (got) {
            Py_INCREF(got);
        } else if (PyErr_Occurred()) {
            Py_DECREF(key);
            goto fail;
        } else if (PyList_GET_SIZE(kind) >= limit) {
            Py_DECREF(key);
            Py_DECREF(k);
            Py_INCREF(Py_None);
            out = Py_None;
            goto done;
        } else {
            got = PyLong_FromSsize_t(PyList_GET_SIZE(kind));
            if (!got || PyDict_SetItem(index, key, got) < 0 || PyList_Append(kind, byte_kind) < 0 ||
                PyList_Append(arg, m) < 0 || PyList_Append(next, k) < 0) {
                Py_XDECREF(got);
                Py_DECREF(key);
                goto fail;
            }
        }
        Py_DECREF(key);
        Py_DECREF(k);
        k = got;
    }
    out = k;
    goto done;
fail:
    Py_DECREF(k);
done:
    Py_XDECREF(byte_kind);
    PyBuffer_Release(&text);
    return out;
}
