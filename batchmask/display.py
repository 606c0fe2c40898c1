"""What batchmask shows a person: the progress line, `--show`'s annotated calls, and text made safe to print.

Model output, task text, token pieces and names reach the terminal through `printable`: a NUL, an ESC
sequence or a lone CR in them would otherwise be run by the terminal (clear the screen, move the cursor,
hide what was printed before) instead of shown. Error lines quote values through `short`.
"""
from __future__ import annotations

import json
import re
import sys
import time

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


# --- generate's stderr -----------------------------------------------------------------------------


class Progress:
    """tasks done / total and tokens/s on stderr: a live line on a terminal, a line every 5 s otherwise."""

    def __init__(self, total: int, enabled: bool = True):
        self.total, self.enabled, self.tty = total, enabled, sys.stderr.isatty()
        self.t0 = self.last = time.perf_counter()

    def __call__(self, done: int, tokens: int, force: bool = False):
        now = time.perf_counter()
        if not self.enabled or (not force and now - self.last < (0.25 if self.tty else 5.0)):
            return
        self.last = now
        rate = tokens / max(now - self.t0, 1e-9)
        msg = f"[{done}/{self.total}] {tokens} tokens, {rate:,.0f} tok/s"
        print(("\r" + msg) if self.tty else msg, end="" if self.tty else "\n", file=sys.stderr, flush=True)

    def close(self):
        if self.enabled and self.tty:
            print(file=sys.stderr)


def show_call(res, tokenizer, stream=None):
    """Each token of a call marked by how many tokens were legal when it was chosen.

    Legal count 1 is the grammar dictating (dim); large counts are the model choosing (bright).
    """
    stream = stream or sys.stderr
    tty = stream.isatty()
    parts = []
    for tok, n in zip(res.token_ids or [], res.legal_counts or []):
        stops = getattr(tokenizer, "stop_ids", (tokenizer.eos_id,))
        piece = "<eos>" if tok in stops else printable(tokenizer.token_bytes[tok].decode("utf-8", errors="replace"))
        if tty:
            color = "2" if n == 1 else ("33" if n < 100 else "1;32")
            parts.append(f"\x1b[{color}m{piece}\x1b[0m\x1b[2m{_sub(n)}\x1b[0m")
        else:
            parts.append(f"{piece}[{n}]")
    print(f"task: {printable(res.task)}", file=stream)
    print("  " + ("".join(parts) if tty else " ".join(parts)), file=stream)
    print(f"  -> {'OK ' + json.dumps(res.call) if res.call else 'ERROR ' + printable(str(res.error))}"
          f"{' (cut)' if res.cut else ''}", file=stream)


def _sub(n: int) -> str:
    return str(n).translate(str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉"))
