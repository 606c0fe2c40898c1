"""Train the default model: a SentencePiece vocabulary and a small llama2.c Transformer, on the CPU.

    python -m recipes.default_model.train --out models/default --minutes 26.5 --threads 2            # train
    python -m recipes.default_model.train --out models/default --minutes 26.5 --threads 2 --resume   # continue
    python -m recipes.default_model.train --out models/default --eval-only    # evaluate the shipped model

Run from the repository root. Data: generated tool-use tasks (the training split, tasks.py), encoded
as generation sees them (data.py); the vocabulary is learnt on the same text (vocab.py). The loss is
taken only on the call tokens and the EOS. Evaluation: the library's held-out eval split
(batchmask/evaluation/taskgen.py), greedy and unmasked.

Speed trick: every prompt begins with the same tool catalogue (~140 of ~180 tokens), so a batch
shares that prefix. `forward_shared_prefix` runs the prefix once (batch 1) and lets every row's
suffix attend to its keys/values; gradients still flow into the prefix. Mathematically the same
as the plain causal forward of the concatenated sequence (tested), at a fraction of the cost.

Written to --out: model.bin (llama2.c legacy v0), tokenizer.model, tokenizer.bin, eval.json.
The resumable state (train_state.pt) and the encoded data (data.pt) live in --work (not shipped);
both load with weights_only=True (state.py).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
from batchmask.models.checkpoint import CheckpointError, ModelConfig, write_checkpoint
from batchmask.models.llama import Transformer, load_checkpoint
from batchmask.models.tokenizer import Tokenizer, TokenizerError, load_tokenizer

from batchmask.evaluation.taskgen import EVAL, KIND_WEIGHTS, judge, make_examples
from batchmask.tools.prompt import render_prompt
from batchmask.tools.registry import ToolRegistry

from .data import Dataset, build_dataset
from .state import TrainError, load_data, load_state, save_data, save_state
from .vocab import MAX_PIECE_LEN, VOCAB_SIZE, train_tokenizer

# Defaults sized for ~28 minutes on 2 CPU cores (see models/default/CARD.md): ~1M parameters.
DEFAULT_CONFIG = dict(dim=128, hidden_dim=384, n_layers=4, n_heads=4, n_kv_heads=4, seq_len=512)
DATA_SEED, EVAL_SEED = 1, 3


# --- model ------------------------------------------------------------------------------------
def _attend(attn: torch.nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            mask: torch.Tensor | None = None) -> torch.Tensor:
    """q [B, H, Tq, hd], k/v [B, KV, Tk, hd] -> [B, Tq, H * hd]; causal when mask is None."""
    group = attn.n_heads // attn.n_kv_heads
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
    return out.transpose(1, 2).flatten(2)


def forward_shared_prefix(model: Transformer, prefix: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Logits of `tokens` [B, T] placed after a prefix [P] common to every row -> [B, T, V].

    Equal to model(cat(prefix, tokens))[:, P:], but the prefix is computed once, not B times.
    """
    P, (B, T) = prefix.numel(), tokens.shape
    if P + T > model.config.seq_len:
        raise TrainError(f"prefix {P} + suffix {T} tokens exceed the model's seq_len={model.config.seq_len}")
    cos, sin = model.rope_cos, model.rope_sin  # [seq_len, hd] (or hd/2): RoPE tables, row = position
    xp = model.tok_embeddings(prefix)[None]  # [1, P, dim]
    xs = model.tok_embeddings(tokens)  # [B, T, dim]
    # suffix position i (absolute P + i) sees the whole prefix and suffix positions <= i
    mask = torch.ones(T, P + T, dtype=torch.bool, device=tokens.device).tril(P)  # [T, P + T]
    for layer in model.layers:
        attn = layer.attention
        qp, kp, vp = attn._qkv(layer.attention_norm(xp), cos[:P, None], sin[:P, None])  # [1, P, H|KV, hd]
        qs, ks, vs = attn._qkv(layer.attention_norm(xs), cos[P:P + T, None], sin[P:P + T, None])  # [B, T, .]
        qp, kp, vp, qs, ks, vs = (t.transpose(1, 2) for t in (qp, kp, vp, qs, ks, vs))  # [., H|KV, ., hd]
        k_all = torch.cat([kp.expand(B, -1, -1, -1), ks], dim=2)  # [B, KV, P + T, hd]
        v_all = torch.cat([vp.expand(B, -1, -1, -1), vs], dim=2)
        xp = xp + attn.wo(_attend(attn, qp, kp, vp))  # [1, P, dim]
        xs = xs + attn.wo(_attend(attn, qs, k_all, v_all, mask))  # [B, T, dim]
        xp = xp + layer.feed_forward(layer.ffn_norm(xp))
        xs = xs + layer.feed_forward(layer.ffn_norm(xs))
    return model.output(model.norm(xs))  # [B, T, V]


def masked_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the positions with a target: logits [B, T, V], targets [B, T]."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)


def make_optimizer(model: Transformer, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW; matrices decay, norm gains do not (decaying a gain pulls it towards 0, not 1)."""
    params = list(dict(model.named_parameters()).values())  # the tied embedding once
    decay = [p for p in params if p.dim() >= 2]
    rest = [p for p in params if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": rest, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))


def lr_at(step: int, progress: float, lr: float, warmup: int, min_ratio: float = 0.05) -> float:
    """Linear warm-up over the first `warmup` steps, then cosine decay to min_ratio * lr as the run's
    progress (the fraction of its step or time budget spent, 0..1) reaches 1."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, max(0.0, progress))
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def length_order(lengths: torch.Tensor, seed: int) -> torch.Tensor:
    """[n] example indices sorted by length, ties broken by a seeded shuffle: the batches' cut."""
    shuffled = torch.randperm(len(lengths), generator=torch.Generator().manual_seed(seed))  # [n]
    return shuffled[torch.sort(lengths[shuffled], stable=True).indices]  # [n]


def sample_batch(step: int, lengths: torch.Tensor, batch_size: int, seed: int, grouped: bool = True,
                 by_length: torch.Tensor | None = None) -> torch.Tensor:
    """Example indices of step `step` [B]: a function of (seed, step) only, so a resumed run sees
    exactly the batches the uninterrupted one would have.

    Length-grouped: the examples are cut once into batches of similar length (sorted by length
    after a seeded shuffle), and each epoch visits those batches in a fresh seeded order. A batch
    is padded to its longest row, so grouping saves most of the padding (about a third of the
    compute with letter-level tokens) while every example is still seen once per epoch.
    lengths [n]: each example's token count. grouped=False: B examples drawn uniformly instead.
    by_length: `length_order(lengths, seed)` when the caller already has it (it is the same every step).
    """
    n = len(lengths)
    if not grouped:
        return torch.randint(0, n, (batch_size,), generator=torch.Generator().manual_seed(seed * 1_000_003 + step))
    if by_length is None:
        by_length = length_order(lengths, seed)  # [n]
    n_batches = max(1, n // batch_size)  # the remainder (< batch_size examples) sits out
    epoch, k = divmod(step, n_batches)
    order = torch.randperm(n_batches, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))
    start = int(order[k]) * batch_size
    return by_length[start:start + batch_size]


def train_steps(model: Transformer, data: Dataset, optimizer: torch.optim.Optimizer, steps: range,
                progress: Callable[[int], float], args: argparse.Namespace, pad_id: int,
                log: Callable[[int, float], None] | None = None) -> float:
    """Run optimisation steps; `progress(step)` -> fraction of the run done (drives the cosine).

    Returns the mean loss of the last (up to 50) steps.
    """
    model.train()
    recent = []
    grouped = getattr(args, "length_groups", True)
    lengths = data.lengths  # [n]
    by_length = length_order(lengths, args.seed) if grouped else None  # [n], once, not every step
    for step in steps:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, progress(step), args.lr, args.warmup)
        idx = sample_batch(step, lengths, args.batch_size, args.seed, grouped, by_length)  # [B]
        inputs, targets = data.batch(idx, pad_id)
        loss = masked_loss(forward_shared_prefix(model, data.prefix, inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        recent = (recent + [loss.item()])[-50:]
        if log is not None:
            log(step, loss.item())
    return sum(recent) / max(1, len(recent))


# --- evaluation -------------------------------------------------------------------------------
@torch.no_grad()
def greedy_calls(model: Transformer, tok: Tokenizer, tasks: list[str], max_new: int = 192,
                 batch_size: int = 50) -> list[str]:
    """Free (unmasked) greedy decoding of the call for each task, batched through the KV cache."""
    registry = ToolRegistry.defaults()
    model.eval()
    texts = []
    for start in range(0, len(tasks), batch_size):
        chunk = tasks[start:start + batch_size]
        prompts = [tok.encode(render_prompt(registry, t), bos=True) for t in chunk]
        n = len(prompts)
        lengths = torch.tensor([len(p) for p in prompts])  # [n]
        padded = torch.zeros(n, int(lengths.max()), dtype=torch.long)  # [n, T]
        for i, p in enumerate(prompts):
            padded[i, :len(p)] = torch.tensor(p)
        model.setup_cache(n)
        logits = model.prefill(torch.arange(n), padded, lengths)  # [n, V]
        out = torch.zeros(n, 0, dtype=torch.long)  # [n, t]
        done = torch.zeros(n, dtype=torch.bool)  # [n]
        room = model.config.seq_len - int(lengths.max())
        for _ in range(min(max_new, room)):
            nxt = logits.argmax(-1)  # [n]
            nxt = torch.where(done, torch.full_like(nxt, tok.eos_id), nxt)
            out = torch.cat([out, nxt[:, None]], dim=1)
            done |= nxt == tok.eos_id
            if bool(done.all()):
                break
            logits = model.decode(nxt)
        for row in out.tolist():
            ids = row[:row.index(tok.eos_id)] if tok.eos_id in row else row
            texts.append(tok.decode_bytes(ids).decode("utf-8", errors="replace"))
    return texts


def evaluate(model: Transformer, tok: Tokenizer, n: int = 200, seed: int = EVAL_SEED) -> dict:
    """% parsed / right tool / right argument on n held-out eval tasks, overall and per kind."""
    examples = make_examples(n, seed, EVAL)
    calls = greedy_calls(model, tok, [ex.task for ex in examples])
    verdicts = [judge(ex, text) for ex, text in zip(examples, calls)]

    def rates(rows):
        return {k: round(100.0 * sum(v[k] for v in rows) / max(1, len(rows)), 1)
                for k in ("parsed", "right_tool", "right_arg")} | {"n": len(rows)}

    report = {"overall": rates(verdicts)}
    for kind in KIND_WEIGHTS:
        report[kind] = rates([v for ex, v in zip(examples, verdicts) if ex.kind == kind])
    report["samples"] = [{"task": ex.task, "call": text, **v}
                         for ex, text, v in list(zip(examples, calls, verdicts))[:12]]
    return report


# --- the run ------------------------------------------------------------------------------
def _logger(start_time: float, budget: str, every: int = 25) -> Callable[[int, float], None]:
    """A logger printing one progress line on stderr every `every` steps."""
    def log(step: int, loss: float) -> None:
        if step % every == 0:
            elapsed = time.time() - start_time
            print(f"step {step:5d}  loss {loss:.4f}  {elapsed / 60:5.1f} min of {budget}", file=sys.stderr, flush=True)
    return log


def run(args: argparse.Namespace) -> dict:
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    state_path = work / "train_state.pt"
    state = load_state(state_path, args) if args.resume and state_path.exists() else None
    if args.resume and state is None:
        print(f"no {state_path}: starting from scratch", file=sys.stderr)

    # Vocabulary: reuse the one a resumed run was trained with.
    tok_path = out / "tokenizer.model"
    tok = load_tokenizer(tok_path) if state is not None else \
        train_tokenizer(tok_path, vocab_size=args.vocab_size, max_piece_len=args.max_piece_len)
    data_path = work / "data.pt"
    if state is not None and data_path.exists():
        data, short = load_data(data_path)
    else:
        t0 = time.time()
        data = build_dataset(tok, args.n_examples, args.seed, max_len=args.seq_len)
        # The curriculum's first phase: other examples of the same kinds, without the catalogue.
        short = build_dataset(tok, args.n_examples, args.seed + 1, max_len=args.seq_len, catalogue=False) \
            if args.short_frac > 0 else None
        save_data(data_path, data, short)
        print(f"encoded {len(data)} examples in {time.time() - t0:.0f} s: shared prefix {len(data.prefix)} "
              f"tokens, longest {data.max_len}, {int((data.tokens.numel()) / len(data))} suffix tokens each",
              file=sys.stderr)

    config = ModelConfig(dim=args.dim, hidden_dim=args.hidden_dim, n_layers=args.n_layers, n_heads=args.n_heads,
                         n_kv_heads=args.n_heads, vocab_size=tok.vocab_size, seq_len=args.seq_len)
    if data.max_len > config.seq_len:
        raise TrainError(f"an example has {data.max_len} tokens, more than seq_len={config.seq_len}")
    model = Transformer(config)
    optimizer = make_optimizer(model, args.lr, args.weight_decay)
    n_params = sum(p.numel() for p in dict(model.named_parameters()).values())
    print(f"model {config}: {n_params / 1e6:.2f}M parameters", file=sys.stderr)

    step, elapsed, loss = 0, 0.0, float("nan")
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, elapsed = state["step"], state["elapsed"]
        print(f"resumed at step {step} ({elapsed / 60:.1f} min done)", file=sys.stderr)

    # The cosine follows the time budget (a shared machine's speed varies), or --steps if given.
    budget_s = args.minutes * 60
    start = time.time() - elapsed
    if args.steps:
        def progress(s):
            return s / args.steps
        budget = f"{args.steps} steps"
    else:
        def progress(s):
            return (time.time() - start) / budget_s
        budget = f"{args.minutes:g} min"
    log = _logger(start, budget)
    while progress(step) < 1.0:
        chunk = range(step, step + args.save_every if not args.steps else min(args.steps, step + args.save_every))
        phase = short if short is not None and progress(step) < args.short_frac else data
        loss = train_steps(model, phase, optimizer, chunk, progress, args, tok.eos_id, log)
        step = chunk.stop
        save_state(state_path, model, optimizer, step, time.time() - start, loss, args)
    elapsed = time.time() - start

    write_checkpoint(out / "model.bin", config, model.checkpoint_weights(), version=0)
    shipped = load_checkpoint(out / "model.bin")  # evaluate what was written, not what is in memory
    report = evaluate(shipped, load_tokenizer(out / "tokenizer.bin"), n=args.eval_n)
    report["train"] = {"steps": step, "minutes": round(elapsed / 60, 1),
                       "final_loss": round(loss, 4), "parameters": n_params, "config": asdict(config),
                       "examples": len(data), "batch_size": args.batch_size, "lr": args.lr}
    (out / "eval.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "samples"}, indent=1), file=sys.stderr)
    return report


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m recipes.default_model.train", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="models/default", help="where the shipped files go")
    p.add_argument("--work", default="runs/train", help="training state and encoded data (not shipped)")
    p.add_argument("--minutes", type=float, default=23.0, help="training time budget (the loop; setup and "
                   "evaluation add ~1-2 min)")
    p.add_argument("--steps", type=int, default=0, help="fixed number of steps (0: fit to --minutes)")
    p.add_argument("--resume", action="store_true", help="continue from WORK/train_state.pt")
    p.add_argument("--eval-only", action="store_true", help="evaluate OUT/model.bin and exit")
    p.add_argument("--eval-n", type=int, default=200)
    p.add_argument("--vocab-size", type=int, default=VOCAB_SIZE, help="SentencePiece's piece budget")
    p.add_argument("--max-piece-len", type=int, default=MAX_PIECE_LEN,
                   help="drop pieces longer than this many characters (0: keep all)")
    p.add_argument("--n-examples", type=int, default=120000,
                   help="generated examples (each seen about once: repeats let names be memorised)")
    # Small batches: on a slow CPU the number of steps decides when copying is learnt.
    p.add_argument("--batch-size", type=int, default=16)
    # Copying a name from the task is the skill that takes longest to appear. It appears sooner
    # when the task is not preceded by the catalogue's ~150 tokens (fewer positions to search at
    # the start), and carries over to the full prompt, which the rest of the run trains on.
    p.add_argument("--short-frac", type=float, default=0.3,
                   help="fraction of the run trained on prompts without the catalogue (0: none)")
    p.add_argument("--no-length-groups", dest="length_groups", action="store_false",
                   help="draw batches uniformly instead of grouping examples of similar length")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--save-every", type=int, default=50, help="steps between training-state saves")
    p.add_argument("--seed", type=int, default=DATA_SEED)
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (0: torch's default); 1 is fastest on a busy 2-core machine")
    for k, v in DEFAULT_CONFIG.items():
        if k != "n_kv_heads":
            p.add_argument("--" + k.replace("_", "-"), type=int, default=v)
    args = p.parse_args(argv)
    if not 0 <= args.short_frac < 1:
        p.error(f"--short-frac must be in [0, 1), got {args.short_frac}")
    if args.max_piece_len < 0:
        p.error(f"--max-piece-len must be >= 0 (0: keep every piece), got {args.max_piece_len}")
    if args.n_examples < args.batch_size:
        p.error(f"--n-examples ({args.n_examples}) must be at least --batch-size ({args.batch_size})")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        if args.eval_only:
            out = Path(args.out)
            model, tok = load_checkpoint(out / "model.bin"), load_tokenizer(out / "tokenizer.bin")
            print(json.dumps(evaluate(model, tok, n=args.eval_n), indent=1))
            return
        run(args)
    except (TrainError, CheckpointError, TokenizerError) as e:
        # Bad files or arguments: one clear line naming the thing, not a traceback.
        sys.exit(f"python -m recipes.default_model.train: error: {e}")


if __name__ == "__main__":
    main()
