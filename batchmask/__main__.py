"""`python -m batchmask`: the command line (batchmask/run/cli.py), behind console.py's early Ctrl-C handler."""
import sys
from pathlib import Path

# Run from a checkout's root, the working directory comes first on sys.path, and the checkout's kernels/ and models/
# folders (installed as batchmask.kernels, batchmask.models) would shadow the PyPI packages of those names
# (transformers >= 5 imports Hugging Face's `kernels`): that entry goes last.
_root = Path(__file__).resolve().parents[1]
if (_root / "pyproject.toml").is_file():                 # a checkout (an editable install), not site-packages
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _root] + [str(_root)]

from .console import main  # noqa: E402  first of ours: installs the handler before anything heavy is imported

raise SystemExit(main())
