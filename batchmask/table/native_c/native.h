/* What the extension's files share (batchmask/table/native_c/module.c says what each helper does). */
#ifndef BATCHMASK_NATIVE_H
#define BATCHMASK_NATIVE_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* --- arrays ---------------------------------------------------------------------------------------------- */

static inline int get_i64(PyObject *obj, Py_buffer *view, int writable, const char *name)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0)
        return -1;
    const char *f = view->format ? view->format : "B";
    char code = f[strlen(f) - 1];
    if (view->itemsize != 8 || (code != 'l' && code != 'q')) {
        PyErr_Format(PyExc_TypeError, "%s: expected a C-contiguous int64 array, got format '%s' (%zd-byte items)",
                     name, f, view->itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static inline int get_bool(PyObject *obj, Py_buffer *view, const char *name)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    const char *f = view->format ? view->format : "B";
    if (view->itemsize != 1 || (strcmp(f, "?") != 0 && strcmp(f, "B") != 0)) {
        PyErr_Format(PyExc_TypeError, "%s: expected a C-contiguous bool or uint8 array, got format '%s'", name, f);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* --- a growable int64 array (walk.c, signature.c) --------------------------------------------------------------- */

typedef struct { int64_t *p; int64_t n, cap; } Vec;

static inline int push(Vec *v, int64_t x)            /* -1: out of memory (no error set: the caller sets it) */
{
    if (v->n == v->cap) {
        int64_t cap = v->cap ? 2 * v->cap : 1024;
        int64_t *p = realloc(v->p, (size_t)cap * sizeof(int64_t));
        if (!p)
            return -1;
        v->p = p;
        v->cap = cap;
    }
    v->p[v->n++] = x;
    return 0;
}

/* --- sparse rows: entries {col: val} as the grouping helpers sort, hash and compare them (grouping.c) ---------- */

typedef struct { int64_t col, val; } Entry;
void sort_entries(Entry *e, int64_t n);                 /* by col (a row holds each col once) */
uint64_t row_hash(int64_t base, const Entry *e, int64_t n);   /* of a sorted row in base class `base` */

PyObject *py_refine(PyObject *self, PyObject *args);
PyObject *py_first_of_each(PyObject *self, PyObject *args);
PyObject *py_first_fit(PyObject *self, PyObject *args);
PyObject *py_simulate(PyObject *self, PyObject *args);
PyObject *py_walk(PyObject *self, PyObject *args);
PyObject *py_refine_walked(PyObject *self, PyObject *args);

#endif
