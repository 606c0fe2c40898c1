/* simulate(table, inc, accept, flat, offset, lengths) -> (pid, code, units, q_end, pos) as int64 bytearrays: every
   token run through a value type's loop automaton from every sub-state (table/signature.py compute_signature's
   simulation, once per tokenizer and value type, a byte at a time here where numpy steps all pairs at once).

   table, inc: int64 [Q * 256] the sub-state and units after each byte (-1: refused); accept: bool [Q]; flat: uint8
   [N + 1] the vocabulary's bytes; offset, lengths: int64 [V]. A pair (q, t) (pid q * V + t) whose bytes all stay
   inside the value gives (STAYS, units, end sub-state, -1); one that meets a byte its sub-state refuses where the
   value may end gives (STOPS, units so far, that sub-state, the byte's position in the token); one that dies gives
   nothing, nor does a token without bytes. Records come in pid order. */
#include "native.h"

enum { STAYS = 1, STOPS = 2 };

PyObject *py_simulate(PyObject *self, PyObject *args)
{
    PyObject *tab_o, *inc_o, *acc_o, *flat_o, *off_o, *len_o, *ret = NULL;
    if (!PyArg_ParseTuple(args, "OOOOOO:simulate", &tab_o, &inc_o, &acc_o, &flat_o, &off_o, &len_o))
        return NULL;
    Py_buffer v[6];
    int got = 0;
    Vec out[5] = {{0}};
    PyObject *objs[6] = {tab_o, inc_o, acc_o, flat_o, off_o, len_o};
    const char *names[6] = {"table", "inc", "accept", "flat", "offset", "lengths"};
    for (; got < 6; got++)                              /* accept and flat are bytes, the others int64 */
        if ((got == 2 || got == 3 ? get_bool(objs[got], &v[got], names[got])
                                  : get_i64(objs[got], &v[got], 0, names[got])) < 0)
            goto release;
    int64_t Q = v[2].len, V = v[4].len / 8, N1 = v[3].len;
    const int64_t *table = v[0].buf, *inc = v[1].buf, *offset = v[4].buf, *lengths = v[5].buf;
    const unsigned char *accept = v[2].buf, *flat = v[3].buf;
    int bad = v[0].len / 8 != Q * 256 || v[1].len / 8 != Q * 256 || v[5].len / 8 != V;
    for (int64_t t = 0; t < V && !bad; t++)
        bad = lengths[t] < 0 || offset[t] < 0 || offset[t] + lengths[t] > N1;
    for (int64_t i = 0; i < Q * 256 && !bad; i++)
        bad = table[i] >= Q;
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "simulate: table and inc must be [Q * 256] for accept's Q sub-states, "
                        "lengths [V] like offset, every token inside flat and every sub-state below Q");
        goto release;
    }
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    for (int64_t q = 0; q < Q && !failed; q++)
        for (int64_t t = 0; t < V && !failed; t++) {
            int64_t n = lengths[t];
            if (!n)
                continue;
            const unsigned char *p = flat + offset[t];
            int64_t cur = q, k = 0, i = 0, code = STAYS;
            for (; i < n; i++) {
                int64_t cell = cur * 256 + p[i], nq = table[cell];
                if (nq < 0) {
                    code = accept[cur] ? STOPS : 0;
                    break;
                }
                cur = nq;
                k += inc[cell];
            }
            if (code)
                failed = push(&out[0], q * V + t) || push(&out[1], code) || push(&out[2], k) ||
                         push(&out[3], cur) || push(&out[4], code == STOPS ? i : -1);
        }
    Py_END_ALLOW_THREADS
    if (failed) {
        PyErr_NoMemory();
        goto release;
    }
    ret = PyTuple_New(5);
    for (int j = 0; ret && j < 5; j++) {
        PyObject *b = PyByteArray_FromStringAndSize(out[j].p ? (const char *)out[j].p : "", (Py_ssize_t)(out[j].n * 8));
        if (!b) {
            Py_CLEAR(ret);
            break;
        }
        PyTuple_SET_ITEM(ret, j, b);
    }
release:
    for (int j = 0; j < 5; j++)
        free(out[j].p);
    for (int j = 0; j < got; j++)
        PyBuffer_Release(&v[j]);
    return ret;
}
