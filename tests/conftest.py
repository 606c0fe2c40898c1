"""Shared test settings.

One torch thread: the tests run many small ops, and on a 2-core machine (CI's size) a second
thread mostly adds synchronisation, or worse when another process holds the other core.
"""
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)
sys.path.insert(0, str(Path(__file__).resolve().parent))   # the oracle and fixtures beside the tests
