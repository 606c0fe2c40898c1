"""The compile's hot loops in C (table/native_c/), when they are there: the grouping helpers of classes.py (refine,
sparse_classes, first_of_each), the packed rows' first fit (packed.py), the explicit states' trie walk (trie.py) and
a value type's signature simulation (signature.py).

`helpers` is the extension module, or None: where it was not built (no C compiler at install time: setup.py
marks it optional) or where the environment sets BATCHMASK_NATIVE=0. Each caller then runs its numpy/torch
reference, which gives the same partitions, the same walk and a valid packing (tests/test_native.py checks one
against the other).
"""
from __future__ import annotations

import os

try:
    from . import _native as _built
except ImportError:                      # not built here: the reference runs
    _built = None
if _built is not None and not all(hasattr(_built, f) for f in ("refine", "first_of_each", "first_fit", "walk",
                                                                 "refine_walked", "simulate")):
    _built = None                        # something else by that name (a stale build): the reference runs

helpers = None if os.environ.get("BATCHMASK_NATIVE", "1") == "0" else _built

__all__ = ["helpers"]
