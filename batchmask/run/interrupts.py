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

# What each stop ends as: (exit status, the word said). 130 and 143 are 128 + the signal, as a shell reports them.
STOPS = {signal.SIGINT: (130, "interrupted"), signal.SIGTERM: (143, "terminated")}
_INSTALLED: set = set()                          # the signals whose first-regime handler install_for_program set


class Terminated(KeyboardInterrupt):
    """SIGTERM during generation: stops the run where Ctrl-C does, but exits 143 and says "terminated"."""
    status, word = STOPS[signal.SIGTERM]


def status_of(stop: KeyboardInterrupt) -> int:
    """The exit status of a stop: 143 for SIGTERM, 130 for Ctrl-C."""
    return getattr(stop, "status", STOPS[signal.SIGINT][0])


def word_of(stop: KeyboardInterrupt) -> str:
    return getattr(stop, "word", STOPS[signal.SIGINT][1])


def exit_at_once(signum, frame) -> None:
    from .locks import unlink_held_locks
    unlink_held_locks()
    status, word = STOPS.get(signum, STOPS[signal.SIGINT])
    if os.environ.get("RANK", "0").strip() in ("", "0"):     # under torchrun every rank stops: rank 0 says it
        os.write(2, f"batchmask: {word}\n".encode())
    os._exit(status)


def raise_terminated(signum, frame) -> None:
    raise Terminated()


# each signal: the handler Python starts with (ours replaces only that one), and the second regime's handler
_REGIMES = ((signal.SIGINT, signal.default_int_handler, signal.default_int_handler),
            (signal.SIGTERM, signal.SIG_DFL, raise_terminated))


def install_for_program() -> None:
    """The program's first regime, for each signal unless it was ignored when we started (or this is not the main
    thread)."""
    for sig, default, _ in _REGIMES:
        current = signal.getsignal(sig)
        if current is default or getattr(current, "batchmask_early", False):
            try:
                signal.signal(sig, exit_at_once)
                _INSTALLED.add(sig)
            except ValueError:
                pass


def raise_from_now_on() -> None:
    """The second regime: from here on (the generation loop) Ctrl-C raises KeyboardInterrupt, SIGTERM Terminated."""
    for sig, _, handler in _REGIMES:
        if sig in _INSTALLED and signal.getsignal(sig) is exit_at_once:
            signal.signal(sig, handler)


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
