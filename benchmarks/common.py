"""What the benchmarks share: task lists, the tokenizer they find (or a synthetic one), random models, and the
one way a script writes its plot (matplotlib, an optional extra: `pip install -e '.[bench]'`).

Every benchmark script imports its helpers from here (never from another benchmark), so the scripts stay
independent of each other.
"""
from __future__ import annotations

import argparse
import functools
import importlib
import json
import random
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # runnable as a script from anywhere (last: see tests/conftest.py)

from batchmask.models.checkpoint import ModelConfig, random_weights, write_checkpoint  # noqa: E402
from batchmask.models.llama import load_checkpoint  # noqa: E402
from batchmask.models.tokenizer import Tokenizer, load_tokenizer  # noqa: E402

from batchmask.tools.prompt import catalogue  # noqa: E402
from batchmask.tools.registry import ToolRegistry  # noqa: E402


def shared_or_vendored(rel: str) -> Path:
    """../shared/REL (CI keeps it beside the checkout), else the copy vendored for the tests (tests/data/REL), so
    a bare clone runs the benchmarks on the real vocabularies and catalogue too."""
    shared = ROOT.parent / "shared" / rel
    return shared if shared.exists() else ROOT / "tests" / "data" / rel


TOKENIZER = shared_or_vendored("llama2/tokenizer.model")

# words the tasks are made of (also the seed of the synthetic vocabulary, so prompts stay short)
NOUNS = ["notes", "report", "budget", "todo", "photos", "config", "data", "draft", "letter", "music", "logs"]
VERBS = ["summarise", "check", "open", "show", "count", "compare", "fix", "update"]


# ----------------------------------------------------------------------------------------------------------
# inputs: tasks, tokenizer, model

def make_tasks(n: int, seed: int = 0) -> list[str]:
    """n short user requests of varied wording and length (the five default tools' kind of work)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b, w, v = rng.randint(2, 999), rng.randint(2, 99), rng.choice(NOUNS), rng.choice(VERBS)
        out.append(rng.choice([
            f"what is {a} times {b}?",
            f"read the file {w}.txt and {v} it",
            f"list the files in the {w} folder",
            f"write 'hello {w}' to {w}_{b}.txt",
            f"please {v} my {w} and tell me what it says about {rng.choice(NOUNS)}",
            f"how much is {a} plus {b} minus {rng.randint(1, 50)}?",
        ]))
    return out


def synthetic_tokenizer(vocab_size: int = 32000, seed: int = 0) -> Tokenizer:
    """A SentencePiece-style vocabulary of vocab_size pieces for machines without the Llama 2 one.

    Specials and the 256 byte pieces, printable ASCII, every prefix of every word of the prompt text (so BPE
    merges reach whole words and prompts stay about as short as with Llama 2), then random concatenations of
    earlier pieces until the size is reached (so the grammar sees a realistic number of distinct tokens).
    """
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    chars = ["▁"] + [chr(c) for c in range(33, 127)]
    corpus = catalogue(ToolRegistry.defaults()) + " TASK: CALL: " + " ".join(make_tasks(200, seed=1))
    corpus += ' {"tool":"calc","args":{"expr":"1+2"}} {"tool":"answer","args":{"text":"hi"}}'
    words = []
    for word in corpus.split():
        for piece in ("▁" + word, word):
            words += [piece[:k] for k in range(2, len(piece) + 1)]
    known = dict.fromkeys(pieces + chars + words)  # ordered, no repeats
    rng = random.Random(seed)
    base = list(known)[259:]
    while len(known) < vocab_size:
        piece = rng.choice(base) + rng.choice(base)
        if len(piece) <= 16:
            known.setdefault(piece)
    pieces = list(known)[:vocab_size]
    # higher score merges first: short pieces first, so words are built up from their prefixes
    scores = [0.0] * 259 + [-float(len(p)) - i * 1e-6 for i, p in enumerate(pieces[259:])]
    return Tokenizer.from_pieces(pieces, scores, source=f"<synthetic {vocab_size}-piece vocabulary>")


def find_tokenizer(path=None, vocab_size: int = 32000) -> tuple[Tokenizer, str]:
    """(tokenizer, what it is): `path` if given and present, else ../shared/llama2/tokenizer.model, else a
    synthetic vocabulary of vocab_size pieces (with a note saying so)."""
    tried = [Path(path)] if path else []
    tried.append(TOKENIZER)
    for p in tried:
        if p.is_file():
            return load_tokenizer(p), f"Llama 2 tokenizer ({p})"
    return synthetic_tokenizer(vocab_size), (f"SYNTHETIC {vocab_size}-piece vocabulary: no tokenizer at "
                                             f"{', '.join(str(p) for p in tried)} (pass --tokenizer PATH)")


class MemoEncode:
    """The tokenizer with encode remembered per text: the same task list is run many times, and the Python BPE
    of a 1024-task list costs seconds of wall time that no figure includes (BatchGenerator encodes before its
    clock starts) but the session's time budget does."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._ids: dict[tuple, list[int]] = {}

        @functools.wraps(tokenizer.encode)   # the same signature: callers read its options (prefix_space, ...)
        def encode(text, *args, **options) -> list[int]:
            key = (text, args, tuple(sorted(options.items())))
            if key not in self._ids:
                self._ids[key] = tokenizer.encode(text, *args, **options)
            return list(self._ids[key])
        self.encode = encode

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


def random_model(config: ModelConfig, device="cpu", dtype=torch.float32, seed: int = 0):
    """A random checkpoint of `config`, written as a llama2.c file and loaded back the way a real one is."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "random.bin"
        write_checkpoint(path, config, random_weights(config, seed=seed), version=0)
        return load_checkpoint(path, device=device, dtype=dtype)


def optional_import(module: str, skipped: str):
    """(the module, None), or (None, a one-line note) when it is not installed: a peer a benchmark compares with
    (xgrammar, llguidance, transformers) is optional, and what its absence skips is said once, in one wording."""
    try:
        return importlib.import_module(module), None
    except ImportError:  # also a module set to None in sys.modules (how the tests simulate its absence)
        return None, f"{module} not installed: {skipped} skipped (pip install {module})"


class LLGuidanceTokens:
    """llguidance's TokenizerWrapper protocol over raw token bytes (specials have none): what
    llguidance.LLTokenizer reads. Its encoder is never called (the benchmarks run matchers with no forcing)."""
    is_tokenizer_wrapper = True

    def __init__(self, tok):
        self.tokens = list(tok.token_bytes)
        self.eos_token_id = int(tok.eos_id)
        self.bos_token_id = None
        self.special_token_ids = [i for i, b in enumerate(tok.token_bytes) if not b]

    def __call__(self, s):
        return []


# ----------------------------------------------------------------------------------------------------------
# plots: every script draws its figure through write_plot, so the rules live here once

PLOT_NOTE = "matplotlib not installed: no plot (pip install -e '.[bench]')"
PLOT_DPI = 120


def add_plot_options(ap: argparse.ArgumentParser) -> None:
    """--plot PATH (the PNG; default: the JSON's path with .png) and --plot-from JSON (redraw, no run)."""
    ap.add_argument("--plot", type=Path, default=None,
                    help="write the PNG here (default: the JSON's path with .png instead of .json)")
    ap.add_argument("--plot-from", type=Path, default=None, metavar="JSON",
                    help="redraw the PNG from a JSON this script wrote, without running the benchmark")


def plot_path(args: argparse.Namespace, json_path) -> Path | None:
    """Where the plot goes: --plot, else beside the JSON (None: no JSON, no --plot, no plot)."""
    if args.plot:
        return Path(args.plot)
    return Path(json_path).with_suffix(".png") if json_path else None


def write_plot(draw: Callable, data: dict, out) -> str:
    """draw(plt, data) -> Figure, saved to `out` and closed; the line to print. Without matplotlib, the note
    (the benchmark's JSON does not depend on it)."""
    try:
        import matplotlib
    except ImportError:
        return PLOT_NOTE
    matplotlib.use("Agg")  # files only: no display on a build machine or a GPU box
    import matplotlib.pyplot as plt
    fig = draw(plt, data)
    try:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=PLOT_DPI)
    finally:
        plt.close(fig)  # a long run (or a test session) draws many: pyplot keeps every open figure
    return f"plot written to {out}"


def finish_plot(args: argparse.Namespace, draw: Callable, data: dict, json_path) -> None:
    """After a run: the plot beside the JSON (or at --plot), with its line printed."""
    out = plot_path(args, json_path)
    if out is not None:
        print(write_plot(draw, json.loads(json.dumps(data, default=str)), out), flush=True)  # as the JSON reads


def replot(args: argparse.Namespace, draw: Callable) -> int:
    """--plot-from: redraw the plot from a recorded JSON (no benchmark run); the exit status."""
    data = json.loads(Path(args.plot_from).read_text())
    print(write_plot(draw, data, plot_path(args, args.plot_from)), flush=True)
    return 0


def batch_axis(ax, batches) -> None:
    """A batch-size x axis: log 2 scale, a tick at each size measured (not at matplotlib's powers of 10)."""
    sizes = sorted(set(batches))
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.minorticks_off()
    ax.set_xlabel("batch size")
    ax.grid(alpha=0.3)
