"""The compiled grouping helpers (table/_grouping.c), when they are there.

`grouping` is the extension module, or None: where it was not built (no C compiler at install time: setup.py
marks it optional) or where the environment sets BATCHMASK_NATIVE=0. table/classes.py then runs its numpy/torch
reference, which gives the same partitions (tests/test_grouping.py checks one against the other).
"""
from __future__ import annotations

import os

try:
    from . import _grouping as _built
except ImportError:                      # not built here: the reference runs
    _built = None

grouping = None if os.environ.get("BATCHMASK_NATIVE", "1") == "0" else _built

__all__ = ["grouping"]
