"""The automaton's compiled helpers (native_c/, the extension batchmask.automaton._native), when they are there.

`helpers` is the extension module, or None: where it was not built (no C compiler at install time: setup.py marks
it optional) or where the environment sets BATCHMASK_NATIVE=0. Its callers then run their Python references, which
give the same NFA and the same automaton (tests/test_automaton_native.py checks one against the other):

    run(...)            the subset construction (native.py hands it tree.py's `_Subsets` and reads its result)
    build_node(...)     NFA.build for Lit, Seq, Alt and ByteSet nodes (the others go back to NFA._build), in the
                        NFA's own memo, index and lists (nfa.py); bind_nodes(...) names their classes once
"""
from __future__ import annotations

import os

try:
    from . import _native as _built
except ImportError:                      # not built here: the references run
    _built = None
if _built is not None and not all(hasattr(_built, f) for f in ("run", "build_node", "bind_nodes")):
    _built = None                        # something else by that name (a stale build)
if _built is not None:
    from ..grammar.nodes import Alt, ByteSet, Lit, Seq
    _built.bind_nodes(Lit, Seq, Alt, ByteSet)

helpers = None if os.environ.get("BATCHMASK_NATIVE", "1") == "0" else _built

__all__ = ["helpers"]
