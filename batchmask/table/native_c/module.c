/* batchmask.table._native: the compile's hot loops in C, one pass each (this file: what each helper does, and the
   method table; grouping.c, packing.c, walk.c, walked.c: the helpers; native.h: what they share).

   The table build groups tokens, rows and columns with a dozen numpy/torch operations per call (hash, sort,
   verify; table/classes.py), ~15 calls a compile, places a packed table's rows in vectorised random rounds
   (table/packed.py) and walks the vocabulary trie level by level (table/trie.py); on a small schema the
   per-operation cost of those is much of the compile, on a large one their passes over millions of entries. Here
   each is one pass in C, and each gives what its reference gives: the same partitions (ids numbered by first use,
   which the callers accept: only the grouping is promised), the same walk in the same order with the same work
   counted against the same budget, and a valid packing (denser than the random rounds').

   Optional: setup.py builds it where a C compiler is present; without it (or with BATCHMASK_NATIVE=0) the
   references run (table/native.py). Arrays come through the buffer protocol (numpy arrays: C-contiguous int64,
   bool/uint8 or int32 where said), so it needs neither numpy's headers nor torch's; the GIL is released while a
   helper runs. tests/test_native.py checks each against its reference.

     refine(base, item, col, val, out) -> classes
         base int64 [V] dense class ids, or None (every item in one class); item, col, val int64 [P]: sparse rows
         {col: val} per item, each (item, col) at most once; out int64 [V] is written. Items in the same base class
         with equal rows share a class; an item without entries keeps its base class (with base None: class 0,
         and the ids stay dense). Returns the number of classes.
     first_of_each(inverse) -> bytearray
         inverse int64 [V] ids >= 0; the first index of each id 0..max (V for an id that does not occur), as int64
         [max + 1] in a bytearray (numpy.frombuffer reads it without a copy).
     first_fit(occupied, used, order, start, n, col, base, tries) -> None
         Packed rows (table/packed.py place_rows): occupied/used bool [L] the slots and bases taken so far; the rows
         of `order` (int64 [k], in placement order; row r's columns col[start[r]:start[r] + n[r]], ascending) each at
         the lowest base whose slots are free and that no row holds, among the first `tries` candidates (its first
         column on each free slot from the lowest up), else the lowest from its span below the top slot taken;
         a row without columns takes the lowest free base. base int64 [R] is written at the rows of `order`.
     simulate(table, inc, accept, flat, offset, lengths) -> (pid, code, units, q_end, pos), int64 bytearrays
         every token through a value type's loop automaton from every sub-state (signature.py compute_signature):
         the pairs that stay inside the value or stop where it may end, in pid (q * V + t) order (signature.c).
     walk(byte, child_at, child_n, end_at, end_n, end_tok, level_start, delta, K, byte_class, first, src, edge_byte,
          after, limit) -> (src, tok, nxt as int64 bytearrays, work) or None (refused: past `limit` live prefixes)
         trie.py _walk_distinct's level-by-level walk of the trie (VocabTrie.flat) from each edge's first byte,
         fed from state after[i] through delta (int32 [Sc * K], -1 illegal): the tokens that live past their
         last byte, in its order, and the live (edge, prefix) pairs it walked.
     refine_walked(base, pair, tok, nxt, edge_src, edge_at, edge_n, out) -> (classes, src, tok, nxt)
         refine(base, *Walked.moves()) without writing the moves out (table/trie.py Walked: find p is (pair[p],
         tok[p], nxt[p]), handed to the edges edge_src[edge_at[u]:edge_at[u] + edge_n[u]] of its pair u): out int64
         [V] gets the classes (tokens in one base class with equal moves {src: nxt}; by first use); handed back, as
         int64 bytearrays, the moves of each class's first token.
*/
#include "native.h"

static PyMethodDef methods[] = {
    {"refine", py_refine, METH_VARARGS, "refine(base, item, col, val, out) -> classes (see the module docstring)"},
    {"simulate", py_simulate, METH_VARARGS, "simulate(table, inc, accept, flat, offset, lengths) -> (pid, code, "
     "units, q_end, pos): a value type's signature pairs (signature.c)"},
    {"first_fit", py_first_fit, METH_VARARGS, "first_fit(occupied, used, order, start, n, col, base, tries)"},
    {"walk", py_walk, METH_VARARGS, "walk(trie arrays..., delta, K, byte_class, first, src, byte, after, limit)"},
    {"refine_walked", py_refine_walked, METH_VARARGS, "refine_walked(base, pair, tok, nxt, edge_src, edge_at, edge_n, "
     "out) -> (classes, src, tok, nxt)"},
    {"first_of_each", py_first_of_each, METH_VARARGS, "first_of_each(inverse) -> bytearray: the first index of each"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native", "The compile's hot loops in C (batchmask/table/native.py).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__native(void)
{
    return PyModule_Create(&module);
}
