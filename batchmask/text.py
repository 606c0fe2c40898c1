"""Text made safe to print, and how error lines quote values: the lowest layer, used by every stage.

Model output, task text, token pieces and names reach the terminal through `printable`: a NUL, an ESC
sequence or a lone CR in them would otherwise be run by the terminal (clear the screen, move the cursor,
hide what was printed before) instead of shown. Error lines quote values through `short`.

Every error and warning line the `batchmask` program prints goes through `say_error` / `say_warning`: one
prefix (`batchmask: error: ...`, `batchmask: warning: ...`), one line, escaped.
"""
from __future__ import annotations

import re
import sys

# --- text made safe to print ---------------------------------------------------------------------
# C0 controls, DEL, C1 controls (U+0080-U+009F: some terminals run U+009B as CSI) and the line/paragraph
# separators (Python's splitlines breaks on them); lone surrogates (JSON's "\ud800" reads as one) cannot be
# encoded at all. A backslash is kept as is: the text stays readable.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(m: re.Match) -> str:
    c = m.group()
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def printable(text: str) -> str:
    """`text` with every control character written as its escape (\\n, \\t, \\x00, \\x1b, \\u2028), as repr does;
    everything else, non-ASCII letters included, unchanged."""
    return _UNPRINTABLE.sub(_escape, text)


def short(x, limit: int = 60) -> str:
    """repr(x) cut to `limit` characters ("..." marks the cut): how an error line quotes a value."""
    r = repr(x)
    return r if len(r) <= limit else r[:limit - 3] + "..."


# --- the program's error and warning lines -------------------------------------------------------
PROGRAM = "batchmask"


def say_error(message) -> None:
    """`batchmask: error: MESSAGE` on stderr: the first line of the message only, control characters escaped."""
    _say("error", message)


def say_warning(message) -> None:
    """`batchmask: warning: MESSAGE` on stderr (one line, escaped), for what the run goes on despite."""
    _say("warning", message)


def _say(kind: str, message) -> None:
    lines = str(message).strip().splitlines()
    print(f"{PROGRAM}: {kind}: {printable(lines[0] if lines else kind)}", file=sys.stderr, flush=True)
