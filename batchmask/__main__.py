"""`python -m batchmask`: the command line (batchmask/run/cli.py)."""
import os
import signal
import sys


def _interrupted(signum, frame):
    """Ctrl-C while the command line is still being imported: nothing to save yet, so exit at once (130)."""
    os.write(2, b"batchmask: interrupted\n")
    os._exit(130)


_interrupted.batchmask_early = True                                    # cli.main() takes over from it


if signal.getsignal(signal.SIGINT) is signal.default_int_handler:     # not when started with SIGINT ignored
    signal.signal(signal.SIGINT, _interrupted)

from .run.cli import main  # noqa: E402

sys.exit(main())
