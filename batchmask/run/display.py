"""What a run shows a person: progress (tqdm, on a terminal only) and `--show`'s annotated calls (text.printable)."""
from __future__ import annotations

import json
import sys
import time
from contextlib import contextmanager

from ..text import printable

# --- generate's stderr -----------------------------------------------------------------------------


class Progress:
    """Tasks done / total with tokens/s and an ETA on stderr, drawn by tqdm (a well-kept library, not our own
    terminal code); nothing at all unless enabled and stderr is a terminal (a log or a pipe gets the summary)."""

    def __init__(self, total: int, enabled: bool = True, desc: str = "generating"):
        self.t0 = time.perf_counter()
        self.bar = None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm
            self.bar = tqdm(total=total, desc=desc, unit="task", file=sys.stderr, dynamic_ncols=True, leave=False,
                            mininterval=0.25)

    def __call__(self, done: int, tokens: int, force: bool = False):
        if self.bar is None:
            return
        rate = tokens / max(time.perf_counter() - self.t0, 1e-9)
        self.bar.set_postfix_str(f"{tokens} tokens, {rate:,.0f} tok/s", refresh=False)
        self.bar.update(done - self.bar.n)
        if force:
            self.bar.refresh()

    def close(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


@contextmanager
def phase(desc: str, enabled: bool = True):
    """A long step with no count (a model load, a compile): on a terminal, its name while it runs and how long it
    took once done (tqdm's elapsed clock). Every phase's duration is kept in PHASE_SECONDS (benchmarks/startup.py)."""
    t0 = time.perf_counter()
    try:
        if enabled and sys.stderr.isatty():
            with _shown(desc):
                yield
        else:
            yield
    finally:
        PHASE_SECONDS.append((desc, time.perf_counter() - t0))


PHASE_SECONDS: list[tuple[str, float]] = []        # (phase, seconds) of this process's phases, in order


@contextmanager
def _shown(desc: str):
    from tqdm import tqdm
    t0 = time.perf_counter()
    bar = tqdm(total=1, desc=desc, file=sys.stderr, bar_format="{desc} ... {elapsed}", leave=False)
    try:
        yield
        bar.update(1)
    finally:
        bar.close()
    print(f"batchmask: {desc}: {tqdm.format_interval(time.perf_counter() - t0)}", file=sys.stderr)


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
