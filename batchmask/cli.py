"""`batchmask` command line: generate, ablate, compile.

    batchmask generate --tasks tasks.txt [--out calls.jsonl] [--checkpoint model.bin --tokenizer tokenizer.model]
    batchmask ablate [--n 30] [--json ablation.json]
    batchmask compile [--tools tools.json] [--tokenizer ...] --out grammar.pt

Every error a user can cause ends as one line on stderr and a non-zero exit.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

# The embedded model ships inside batchmask.models (the repository's models/default/): found through the
# package, so an installed wheel and an editable install both find it (without importing torch here).
DEFAULT_DIR = Path(importlib.util.find_spec("batchmask.models").submodule_search_locations[0]) / "default"


# --- loading ------------------------------------------------------------------------------------
def _device(name: str | None):
    import torch
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: CUDA is not available on this machine")
    return dev


def _dtype(name: str | None, device):
    import torch
    if name in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if name not in table:
        raise ValueError(f"--dtype {name}: expected one of float32, bfloat16, float16")
    return table[name]


def load_model_and_tokenizer(checkpoint, tokenizer_path, device, dtype, eos_id=None):
    """The checkpoint and tokenizer (default: the embedded model), checked against each other."""
    from batchmask.models.checkpoint import check_vocab
    from batchmask.models.llama import load_checkpoint
    from batchmask.models.tokenizer import load_tokenizer

    if checkpoint is None:
        checkpoint = DEFAULT_DIR / "model.bin"
        if tokenizer_path is None:
            tokenizer_path = DEFAULT_DIR / "tokenizer.model"
        if not Path(checkpoint).exists():
            raise ValueError(f"the embedded default model is missing ({checkpoint}); pass --checkpoint")
    if tokenizer_path is None:
        # llama2.c's convention: the tokenizer sits beside the checkpoint
        for name in ("tokenizer.model", "tokenizer.bin"):
            if (Path(checkpoint).parent / name).exists():
                tokenizer_path = Path(checkpoint).parent / name
                break
        else:
            raise ValueError(f"no --tokenizer given and no tokenizer.model/.bin beside {checkpoint}")
    for what, p in (("checkpoint", checkpoint), ("tokenizer", tokenizer_path)):
        if not Path(p).exists():
            raise ValueError(f"{what} not found: {p}")
    tokenizer = load_tokenizer(tokenizer_path, eos_id=eos_id)
    model = load_checkpoint(checkpoint, device=device, dtype=dtype)
    tokenizer.pad_to(model.config.vocab_size)  # an embedding padded past a HF/raw-byte vocabulary: never legal
    check_vocab(model.config, tokenizer.vocab_size, checkpoint, tokenizer_path)
    return model, tokenizer


def load_registry(path):
    from .registry import ToolRegistry
    return ToolRegistry.defaults() if path is None else ToolRegistry.from_json(path)


def load_grammar(args, registry, tokenizer, device):
    from .compiler import CompiledGrammar, compile_grammar
    if getattr(args, "grammar", None):
        return CompiledGrammar.load(args.grammar, device=device, registry=registry, tokenizer=tokenizer,
                                    max_string=args.max_string, utf8=not args.bytes)
    return compile_grammar(registry, tokenizer, max_string=args.max_string, utf8=not args.bytes, device=device)


def read_tasks(path: str) -> tuple[list[str], list[int | None]]:
    """One task per line, or JSONL objects with a "task" field (and optionally "max_new_tokens");
    '-' reads stdin. Returns the tasks and each one's token ceiling (None: the command's default)."""
    if path == "-":
        raw, name = sys.stdin.read(), "<stdin>"
    else:
        p = Path(path)
        if not p.exists():
            raise ValueError(f"tasks file not found: {p}")
        try:
            raw = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"{p}: cannot read tasks file: {e}") from None
        name = str(p)
    lines = [(i + 1, ln) for i, ln in enumerate(raw.splitlines()) if ln.strip()]
    if not lines:
        raise ValueError(f"{name}: no tasks (the file is empty)")
    if all(ln.lstrip().startswith("{") for _, ln in lines):
        tasks, limits = [], []
        for n, ln in lines:
            try:
                obj = json.loads(ln)
            except json.JSONDecodeError as e:
                raise ValueError(f"{name} line {n}: not valid JSON ({e.msg})") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("task"), str) or not obj["task"].strip():
                raise ValueError(f"{name} line {n}: expected an object with a non-empty string \"task\"")
            limit = obj.get("max_new_tokens")
            if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
                raise ValueError(f"{name} line {n}: \"max_new_tokens\" must be a positive integer, got {limit!r}")
            tasks.append(obj["task"])
            limits.append(limit)
        return tasks, limits
    return [ln.strip() for _, ln in lines], [None] * len(lines)


# --- output -------------------------------------------------------------------------------------
def done_indices(out_path: Path) -> set[int]:
    """Indices already in an output file (for --resume); a torn last line is cut off."""
    if not out_path.exists():
        return set()
    data = out_path.read_bytes()
    keep = data[: data.rfind(b"\n") + 1]
    if len(keep) != len(data):
        out_path.write_bytes(keep)
    done = set()
    for n, line in enumerate(keep.decode("utf-8", errors="replace").splitlines(), 1):
        try:
            done.add(int(json.loads(line)["index"]))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            raise ValueError(f"{out_path} line {n}: not a batchmask result line; cannot --resume from it") from None
    return done


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


def show_call(res, tokenizer, stream=sys.stderr):
    """Each token of a call marked by how many tokens were legal when it was chosen.

    Legal count 1 is the grammar dictating (dim); large counts are the model choosing (bright).
    """
    tty = stream.isatty()
    parts = []
    for tok, n in zip(res.token_ids or [], res.legal_counts or []):
        piece = "<eos>" if tok == tokenizer.eos_id else tokenizer.token_bytes[tok].decode("utf-8", errors="replace")
        if tty:
            color = "2" if n == 1 else ("33" if n < 100 else "1;32")
            parts.append(f"\x1b[{color}m{piece}\x1b[0m\x1b[2m{_sub(n)}\x1b[0m")
        else:
            parts.append(f"{piece}[{n}]")
    print(f"task: {res.task}", file=stream)
    print("  " + ("".join(parts) if tty else " ".join(parts)), file=stream)
    print(f"  -> {'OK ' + json.dumps(res.call) if res.call else 'ERROR ' + str(res.error)}"
          f"{' (cut)' if res.cut else ''}", file=stream)


def _sub(n: int) -> str:
    return str(n).translate(str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉"))


# --- commands -----------------------------------------------------------------------------------
def cmd_generate(args) -> int:
    import torch

    from . import distributed
    from .generation import BatchGenerator, GenerationConfig

    dist = distributed.setup(args.device)
    device = dist.device if dist else _device(args.device)
    tasks, task_limits = read_tasks(args.tasks)
    registry = load_registry(args.tools)
    model, tokenizer = load_model_and_tokenizer(args.checkpoint, args.tokenizer, device, _dtype(args.dtype, device),
                                                args.eos_id)
    grammar = None if args.no_constrain else load_grammar(args, registry, tokenizer, device)
    out_path = Path(args.out) if args.out and args.out != "-" else None
    if args.resume and out_path is None:
        raise ValueError("--resume needs --out FILE")
    skip = done_indices(out_path) if args.resume else set()
    if out_path and dist is None and not args.resume and out_path.exists() and not args.force:
        raise ValueError(f"{out_path} exists; pass --resume to continue it or --force to overwrite")
    todo = [i for i in range(len(tasks)) if i not in skip]
    if dist:
        todo = todo[dist.rank::dist.world]
    # Validate every prompt before writing anything.
    from .generation import encode_prompts
    encode_prompts([tasks[i] for i in todo], tokenizer, registry, model.config.seq_len)

    limits = [task_limits[i] or args.max_new_tokens for i in todo]
    config = GenerationConfig(batch_size=args.batch_size, max_new_tokens=max([args.max_new_tokens, *limits]),
                              temperature=args.temperature, top_p=args.top_p, seed=args.seed,
                              constrain=not args.no_constrain, record_counts=args.show)
    gen = BatchGenerator(model, tokenizer, registry, grammar, config)
    sink = distributed.Sink(out_path, dist, append=bool(args.resume))
    progress = Progress(len(todo), enabled=not args.quiet)
    parsed = 0

    def on_result(res):
        nonlocal parsed
        parsed += res.call is not None
        sink.write(res.record())
        if args.show:
            show_call(res, tokenizer)

    t0 = time.perf_counter()
    try:
        stats = gen.run([tasks[i] for i in todo], indices=todo, on_result=on_result, on_progress=progress,
                        limits=limits)
    except KeyboardInterrupt:
        progress.close()
        sink.close()
        print(f"batchmask: interrupted; {sink.count} finished results kept"
              + (f" in {out_path} (rerun with --resume to continue)" if out_path else ""), file=sys.stderr)
        return 130
    progress(stats.tasks, stats.tokens, force=True)
    progress.close()
    sink.close()
    wall = time.perf_counter() - t0
    if not args.quiet:
        arm = "free" if args.no_constrain else "constrained"
        print(f"batchmask: {stats.tasks} tasks ({arm}), {parsed} parsed as calls, {stats.tokens} tokens in "
              f"{wall:.2f} s ({stats.tokens / max(wall, 1e-9):,.0f} tok/s, batch {args.batch_size}, "
              f"{device}{', rank ' + str(dist.rank) if dist else ''})", file=sys.stderr)
    if dist:
        sink.merge()
        distributed.teardown()
    del torch
    return 0


def cmd_ablate(args) -> int:
    from .ablation import run_ablation
    device = _device(args.device)
    model, tokenizer = load_model_and_tokenizer(args.checkpoint, args.tokenizer, device, _dtype(args.dtype, device),
                                                args.eos_id)
    report = run_ablation(model, tokenizer, n=args.n, batch_size=args.batch_size,
                          max_new_tokens=args.max_new_tokens, seed=args.seed, max_string=args.max_string)
    print(report.table())
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_json(), indent=2))
        print(f"wrote {args.json}")
    return 0


def cmd_compile(args) -> int:
    from batchmask.models.tokenizer import load_tokenizer

    from .compiler import compile_grammar
    registry = load_registry(args.tools)
    tok_path = args.tokenizer or (DEFAULT_DIR / "tokenizer.model")
    if not Path(tok_path).exists():
        raise ValueError(f"tokenizer not found: {tok_path}")
    tokenizer = load_tokenizer(tok_path, eos_id=args.eos_id)
    t = time.perf_counter()
    g = compile_grammar(registry, tokenizer, max_string=args.max_string, utf8=not args.bytes,
                        device=_device(args.device))
    dt = time.perf_counter() - t
    print(f"registry: {', '.join(registry.names)}")
    print(f"vocabulary: {tokenizer.vocab_size} tokens ({tok_path})")
    print(f"states: {g.num_states}  rows: {g.num_rows}  token classes: {g.num_classes}  "
          f"table: {tuple(g.row_next.shape)} {str(g.row_next.dtype).removeprefix('torch.')}  "
          f"device bytes: {g.nbytes:,}  compile: {dt * 1e3:.1f} ms")
    if args.out:
        g.save(args.out)
        print(f"wrote {args.out}")
    return 0


# --- argument parsing ---------------------------------------------------------------------------
def _eos_arg(p):
    p.add_argument("--eos-id", type=int, help="the end-of-sequence token id, for a vocabulary whose files name none "
                   "(the end tokens they do name stay stop ids)")


def _model_args(p):
    p.add_argument("--checkpoint", help="llama2.c checkpoint (.bin); default: the embedded model")
    p.add_argument("--tokenizer", help="tokenizer.model or tokenizer.bin; default: beside the checkpoint")
    _eos_arg(p)
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N (default: cuda if available)")
    p.add_argument("--dtype", default="auto", help="float32 (CPU default), bfloat16 (CUDA default), float16")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=160,
                   help="token ceiling per call (also capped by the context left after the prompt)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-string", type=int, default=256, help="byte cap of one argument value (default 256)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="batchmask", description="Batched grammar-constrained tool calling.")
    sub = ap.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="one tool call per task, batched")
    g.add_argument("--tasks", required=True, help="text file (one task per line), JSONL ({\"task\": ...}) or -")
    g.add_argument("--tools", help="tool registry JSON (default: the built-in tools)")
    g.add_argument("--grammar", help="a cache file written by `batchmask compile`")
    _model_args(g)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--no-constrain", action="store_true", help="the free arm: no grammar mask")
    g.add_argument("--bytes", action="store_true", help="the seed's byte rule instead of whole UTF-8 characters")
    g.add_argument("--out", help="JSONL output (default: stdout)")
    g.add_argument("--resume", action="store_true", help="skip tasks already in --out and append")
    g.add_argument("--force", action="store_true", help="overwrite an existing --out")
    g.add_argument("--show", action="store_true", help="print each call with every token's legal count")
    g.add_argument("--quiet", action="store_true", help="no progress or summary on stderr")
    g.set_defaults(func=cmd_generate)

    a = sub.add_parser("ablate", help="the same model with and without the mask")
    _model_args(a)
    a.add_argument("--n", type=int, default=30, help="trials per arm (default 30)")
    a.add_argument("--json", help="write per-arm counts as JSON")
    a.set_defaults(func=cmd_ablate, batch_size=30)

    c = sub.add_parser("compile", help="compile a registry against a tokenizer and write the cache file")
    c.add_argument("--tools", help="tool registry JSON (default: the built-in tools)")
    c.add_argument("--tokenizer", help="tokenizer.model, tokenizer.bin, tokenizer.json or a model directory "
                   "(default: the embedded model's)")
    _eos_arg(c)
    c.add_argument("--max-string", type=int, default=256)
    c.add_argument("--bytes", action="store_true", help="the seed's byte rule instead of whole UTF-8 characters")
    c.add_argument("--device", default="cpu")
    c.add_argument("--out", help="cache file to write")
    c.set_defaults(func=cmd_compile)
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("batchmask: interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError, RuntimeError) as e:
        if os.environ.get("BATCHMASK_DEBUG"):
            raise
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"batchmask: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
