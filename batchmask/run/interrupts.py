"""Ctrl-C at any moment ends `batchmask` with status 130 and no traceback, keeping every finished line.

Two regimes, for the program (cli.main with argv None; batchmask/__main__.py and the console script's
batchmask/console.py install the first handler before the CLI is imported, and cli.main takes over):
    until generation starts  nothing is worth saving: SIGINT exits at once (exit_at_once). Raising
                             KeyboardInterrupt there instead can land inside an import (torch, numpy) that
                             swallows it and leaves a half-made module behind, to fail later as another
                             error with a traceback.
    during generation        SIGINT is the KeyboardInterrupt, so the output is closed cleanly and the
                             command says how many results it kept (raise_from_now_on).
Called in-process with an argv (tests, scripts), main leaves the handlers alone: always the KeyboardInterrupt.
"""
from __future__ import annotations

import os
import signal
import sys

_HARD = False


def exit_at_once(signum, frame) -> None:
    from .locks import unlink_held_locks
    unlink_held_locks()
    os.write(2, b"batchmask: interrupted\n")
    os._exit(130)


def install_for_program() -> None:
    """The program's first regime (unless SIGINT was ignored when we started, or this is not the main thread)."""
    global _HARD
    current = signal.getsignal(signal.SIGINT)
    if current is signal.default_int_handler or getattr(current, "batchmask_early", False):
        try:
            signal.signal(signal.SIGINT, exit_at_once)
            _HARD = True
        except ValueError:
            pass


def raise_from_now_on() -> None:
    """The second regime: from here on (the generation loop) Ctrl-C raises KeyboardInterrupt."""
    if _HARD and signal.getsignal(signal.SIGINT) is exit_at_once:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def say_interrupted() -> None:
    """Say so on stderr; a second Ctrl-C meanwhile must not turn into a traceback."""
    try:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:                         # not the main thread: nothing to guard
        previous = None
    try:
        print("batchmask: interrupted", file=sys.stderr)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
