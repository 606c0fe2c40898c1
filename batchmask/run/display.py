"""What a run shows a person: the progress line and `--show`'s annotated calls (through text.printable)."""
from __future__ import annotations

import json
import sys
import time

from ..text import printable

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
