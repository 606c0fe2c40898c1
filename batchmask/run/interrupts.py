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

SIGTERM (a scheduler's or `kill`'s stop) is handled the same way, as `Terminated`, a KeyboardInterrupt that
ends with status 143 (128 + SIGTERM) and says "terminated": the same regimes, the same finished lines kept. A
SIGTERM that was ignored when we started stays ignored.
"""
from __future__ import annotations

import os
import signal
import sys

_HARD = False
_TERM = False


class Terminated(KeyboardInterrupt):
    """SIGTERM during generation: stops the run where Ctrl-C does, but exits 143 and says "terminated"."""
    status = 143
    word = "terminated"


def status_of(stop: KeyboardInterrupt) -> int:
    """The exit status of a stop: 143 for SIGTERM, 130 for Ctrl-C."""
    return getattr(stop, "status", 130)


def word_of(stop: KeyboardInterrupt) -> str:
    return getattr(stop, "word", "interrupted")


def exit_at_once(signum, frame) -> None:
    from .locks import unlink_held_locks
    unlink_held_locks()
    if signum == signal.SIGTERM:
        os.write(2, b"batchmask: terminated\n")
        os._exit(143)
    os.write(2, b"batchmask: interrupted\n")
    os._exit(130)


def raise_terminated(signum, frame) -> None:
    raise Terminated()


def install_for_program() -> None:
    """The program's first regime (unless SIGINT was ignored when we started, or this is not the main thread)."""
    global _HARD, _TERM
    current = signal.getsignal(signal.SIGINT)
    if current is signal.default_int_handler or getattr(current, "batchmask_early", False):
        try:
            signal.signal(signal.SIGINT, exit_at_once)
            _HARD = True
        except ValueError:
            pass
    current = signal.getsignal(signal.SIGTERM)
    if current is signal.SIG_DFL or getattr(current, "batchmask_early", False):
        try:
            signal.signal(signal.SIGTERM, exit_at_once)
            _TERM = True
        except ValueError:
            pass


def raise_from_now_on() -> None:
    """The second regime: from here on (the generation loop) Ctrl-C raises KeyboardInterrupt."""
    if _HARD and signal.getsignal(signal.SIGINT) is exit_at_once:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if _TERM and signal.getsignal(signal.SIGTERM) is exit_at_once:
        signal.signal(signal.SIGTERM, raise_terminated)


def say_interrupted(message: str = "interrupted") -> None:
    """Say so on stderr; a second Ctrl-C or SIGTERM meanwhile must not turn into a traceback."""
    try:
        previous = (signal.signal(signal.SIGINT, signal.SIG_IGN), signal.signal(signal.SIGTERM, signal.SIG_IGN))
    except ValueError:                         # not the main thread: nothing to guard
        previous = None
    try:
        print(f"batchmask: {message}", file=sys.stderr)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous[0])
            signal.signal(signal.SIGTERM, previous[1])
