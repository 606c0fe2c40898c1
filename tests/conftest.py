"""Shared test settings.

Triton's interpreter on machines without a GPU (see below).

One torch thread: the tests run many small ops, and on a 2-core machine (CI's size) a second
thread mostly adds synchronisation, or worse when another process holds the other core.
"""
import os
import sys
from pathlib import Path

# The repository root holds kernels/ and models/ (they install as batchmask.kernels and batchmask.models). First on
# sys.path (`python -m pytest` puts the working directory there) they would shadow the PyPI packages of those names:
# transformers >= 5 imports the `kernels` package (Hugging Face's) and met this folder instead. The root goes last:
# batchmask itself is installed (editable), and the scripts under benchmarks/ append it for the same reason.
_ROOT = Path(__file__).resolve().parents[1]
_at_root = [p for p in sys.path if Path(p or ".").resolve() == _ROOT]
sys.path[:] = [p for p in sys.path if p not in _at_root] + [str(_ROOT)]

# Without a GPU the Triton kernels run in Triton's interpreter. The switch is read when triton is first
# imported, and any test module may be the first to import it: so it is set here, before all of them.
if not os.path.exists("/dev/nvidiactl"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Compiled grammars are cached on disk between runs (batchmask/run/grammar_store.py): the tests' own directory,
# never the user's ~/.cache (subprocesses inherit it).
if "BATCHMASK_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile
    os.environ["BATCHMASK_CACHE_DIR"] = tempfile.mkdtemp(prefix="batchmask-test-cache-")
    atexit.register(shutil.rmtree, os.environ["BATCHMASK_CACHE_DIR"], True)

import torch  # noqa: E402

torch.set_num_threads(1)
sys.path.insert(0, str(Path(__file__).resolve().parent))   # the oracle and fixtures beside the tests
