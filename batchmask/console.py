"""The `batchmask` console script's entry point (pyproject.toml [project.scripts] batchmask.console:main).

The script pip writes is `from batchmask.console import main; sys.exit(main())`. Importing this module is
the first thing batchmask runs, and it installs the early Ctrl-C handler at once: a SIGINT from here on,
while batchmask.run.cli, argparse and the command's own modules (torch, the model) are still being imported,
exits 130 with one line instead of a KeyboardInterrupt traceback from inside some import. cli.main() then
takes over (batchmask/run/interrupts.py: it replaces a handler marked `batchmask_early`). `python -m batchmask`
imports this module first too (batchmask/__main__.py).

Only the program imports this module (the handler ends the process: no library or test should install it).
"""
import _signal  # the C module behind `signal` (which imports enum: milliseconds of open window)
import os  # already imported by the interpreter's start-up: free
import sys  # likewise


def _interrupted(signum, frame) -> None:
    """Ctrl-C before the command line runs: nothing to save yet (no output is open), so exit at once."""
    os.write(2, b"batchmask: interrupted\n")
    os._exit(130)


_interrupted.batchmask_early = True                 # interrupts.install_for_program takes over from it

if _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:   # not when started with SIGINT ignored
    try:
        _signal.signal(_signal.SIGINT, _interrupted)
    except ValueError:                              # imported outside the main thread: nothing to install
        pass


def main() -> int:
    """The command line (batchmask.run.cli.main), imported only now: after the handler is in place.

    The process then ends at once with the command's status, its output flushed: the interpreter's own
    teardown after torch is loaded (freeing every module and object one by one) takes 0.45 s, a sixth of a
    one-task run, and batchmask has closed everything it wrote by the time cli.main returns.
    """
    from .run.cli import main as cli_main
    status = cli_main()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):               # the reader left (a pipe to `head`) or the stream is closed
            pass
    os._exit(status if isinstance(status, int) else 1)
