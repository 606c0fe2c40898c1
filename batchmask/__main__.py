"""`python -m batchmask`: the command line (batchmask/run/cli.py), behind console.py's early Ctrl-C handler."""
from .console import main  # first: installs the handler before anything heavy is imported

raise SystemExit(main())
