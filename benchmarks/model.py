"""
Decode and prefill throughput of the batched llama2.c model (models/llama.py) for a
stories15M-shaped random checkpoint (dim 288, hidden 768, 6 layers, 6 heads, vocab 32000,
seq_len 256), written to disk and loaded like a real one.

Each figure is put against a roofline: the fp32 matmul rate measured here (same shapes as the
model's largest matmul, and a large square one) divided by the FLOPs a token costs.  Targets (CPU):
decode B=1 >= 74 tok/s, B=64 >= 1,000 tok/s aggregate.  On CUDA, decode replays a CUDA graph.

    python benchmarks/model.py [--json out.json] [--threads N] [--batches 1,8,64,256] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from batchmask.models.checkpoint import ModelConfig, random_weights, write_checkpoint  # noqa: E402
from batchmask.models.llama import load_checkpoint  # noqa: E402

STORIES15M = ModelConfig(dim=288, hidden_dim=768, n_layers=6, n_heads=6, n_kv_heads=6, vocab_size=32000, seq_len=256)
PROMPT_LEN = 16  # decode starts after a prompt of this length in every row


def flops_per_token(c: ModelConfig, context: float, classifier: float = 1.0) -> float:
    """2 x (matmul weights) + attention (q.k and att.v over `context` positions).

    classifier: the share of tokens that pay for the [vocab, dim] classifier (prefill: 1 / T).
    """
    q_dim = c.n_heads * c.head_dim
    per_layer = c.dim * (q_dim + 2 * c.kv_dim) + q_dim * c.dim + 3 * c.dim * c.hidden_dim
    matmul = c.n_layers * per_layer + classifier * c.vocab_size * c.dim
    attention = c.n_layers * 2 * q_dim * context
    return 2.0 * (matmul + attention)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def best_seconds(fn, device, repeats=5):
    """Fastest of `repeats` timed calls (after one warm-up): the machine may be shared, and the
    minimum is the figure least disturbed by other work."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        best = min(best, time.perf_counter() - start)
    return best


def matmul_gflops(device, m, k, n) -> float:
    """fp32 rate of [m, k] @ [k, n] (n x k stored like an nn.Linear weight, as the model does)."""
    a = torch.randn(m, k, device=device)
    w = torch.randn(n, k, device=device)
    reps = max(1, int(2e8 // (2 * m * k * n)))  # ~0.2 GFLOP per timing

    def run():
        for _ in range(reps):
            torch.nn.functional.linear(a, w)
    return 2.0 * m * k * n * reps / best_seconds(run, device) / 1e9


def bench_decode(model, B, block, blocks, device, graphed):
    """Decode tokens/s for B rows: `blocks` timed blocks of `block` steps, from position PROMPT_LEN.

    Returns (tokens/s of the fastest block, seconds per step, mean context length)."""
    c = model.config
    g = torch.Generator().manual_seed(B)
    model.setup_cache(B)
    prompts = torch.randint(0, c.vocab_size, (B, PROMPT_LEN), generator=g).to(device)
    tokens = [model.prefill(torch.arange(B), prompts, torch.full((B,), PROMPT_LEN)).argmax(-1)]
    step = model.decode
    if graphed:
        model.capture_decode()
        step = model.decode_graphed

    def run_block():
        for _ in range(block):  # greedy keeps the loop honest: each step needs the previous one
            tokens[0] = step(tokens[0]).argmax(-1)
    seconds = best_seconds(run_block, device, repeats=blocks)
    context = PROMPT_LEN + block * (blocks + 1) / 2
    return B * block / seconds, seconds / block, context


def bench_prefill(model, B, T, device):
    c = model.config
    model.setup_cache(B)
    prompts = torch.randint(0, c.vocab_size, (B, T)).to(device)
    rows, lengths = torch.arange(B), torch.full((B,), T)
    return B * T / best_seconds(lambda: model.prefill(rows, prompts, lengths), device, repeats=3)


def idle_cores() -> int:
    """CPUs this process may use minus the 1-minute load: on a shared machine, extra threads that
    must wait for a busy core make every matmul's barrier slower, not faster."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, cpus - int(os.getloadavg()[0]))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--threads", type=int, default=idle_cores(),
                    help="torch intra-op threads (default: the cores not busy with other work)")
    ap.add_argument("--batches", default="1,8,64,256")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "stories15M_random.bin"
        write_checkpoint(path, STORIES15M, random_weights(STORIES15M, seed=0), version=0)
        model = load_checkpoint(path, device=device)

    c = STORIES15M
    batches = [int(b) for b in args.batches.split(",")]
    peak = matmul_gflops(device, 1024, 1024, 1024)
    print(f"device {device}, threads {torch.get_num_threads()}, torch {torch.__version__}")
    print(f"fp32 matmul {peak:.1f} GFLOP/s at 1024x1024x1024 (best of 5)")
    results = {"device": str(device), "threads": torch.get_num_threads(), "torch": torch.__version__,
               "machine": platform.processor() or platform.machine(), "config": c.__dict__,
               "matmul_gflops_1024": peak, "decode": [], "prefill": []}
    graphed = device.type == "cuda"

    # the roofline of a step is the rate of a matmul of the step's own shape (memory-bound at B=1,
    # compute-bound at large B) divided by the FLOPs of a token
    print(f"\n{'decode':>8} {'B':>5} {'tok/s':>9} {'ms/step':>8} {'GFLOP/s':>8} {'matmul GFLOP/s':>15} "
          f"{'roofline tok/s':>15} {'% roof':>7}")
    for B in batches:
        block = max(2, min(20, 512 // B))
        blocks = 5 if B <= 64 else 3
        tps, step_s, context = bench_decode(model, B, block, blocks, device, graphed)
        fpt = flops_per_token(c, context)
        rate = matmul_gflops(device, B, c.dim, c.vocab_size)
        roof = rate * 1e9 / fpt
        row = {"batch": B, "tokens_per_s": tps, "ms_per_step": step_s * 1e3, "gflops": tps * fpt / 1e9,
               "flops_per_token": fpt, "mean_context": context, "matmul_gflops_same_shape": rate,
               "roofline_tokens_per_s": roof, "graphed": graphed}
        results["decode"].append(row)
        print(f"{'':>8} {B:>5} {tps:>9.0f} {step_s * 1e3:>8.2f} {row['gflops']:>8.1f} {rate:>15.1f} {roof:>15.0f} "
              f"{100 * tps / roof:>6.0f}%")

    print(f"\n{'prefill':>8} {'B x T':>9} {'tok/s':>9} {'GFLOP/s':>8} {'roofline tok/s':>15} {'% roof':>7}")
    for B, T in [(1, 128), (8, 128)]:
        tps = bench_prefill(model, B, T, device)
        fpt = flops_per_token(c, T / 2, classifier=1 / T)  # the classifier runs on the last token only
        roof = peak * 1e9 / fpt
        results["prefill"].append({"batch": B, "length": T, "tokens_per_s": tps, "gflops": tps * fpt / 1e9,
                                   "flops_per_token": fpt, "roofline_tokens_per_s": roof})
        print(f"{'':>8} {f'{B} x {T}':>9} {tps:>9.0f} {tps * fpt / 1e9:>8.1f} {roof:>15.0f} {100 * tps / roof:>6.0f}%")

    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
