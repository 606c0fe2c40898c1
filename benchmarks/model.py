"""
Decode and prefill throughput of the batched model (models/llama.py) for two random checkpoints, written to
disk and loaded like real ones:

  stories15M    llama2.c legacy file: dim 288, hidden 768, 6 layers, 6 heads, vocab 32000, seq_len 256
  smollm2-135m  Hugging Face directory (config.json + bfloat16 model.safetensors) shaped like SmolLM2-135M:
                dim 576, intermediate 1536, 30 layers, 9 heads / 3 KV heads (GQA), head_dim 64, vocab 49152,
                tied embeddings, rope_theta 100000; loaded in float32 with the context capped at 512

Each figure is put against a roofline: the fp32 matmul rate measured here (same shapes as the
model's largest matmul, and a large square one) divided by the FLOPs a token costs.  Targets (CPU):
stories15M decode B=1 >= 74 tok/s, B=64 >= 1,000 tok/s aggregate.  On CUDA, decode replays a CUDA graph.

    python benchmarks/model.py [--json out.json] [--threads N] [--models stories15M,smollm2-135m]
        [--batches 1,8,64,256] [--hf-batches 1,16,64] [--device cpu|cuda] [--quick] [--plot PNG]
    python benchmarks/model.py --plot-from out.json [--plot PNG]      (redraw the plot, no run)

The plot (beside the JSON, or --plot): decode tokens/s against batch size per model, beside its roofline.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.append(str(Path(__file__).resolve().parents[1]))  # last: see tests/conftest.py

from batchmask.models.checkpoint import ModelConfig, random_weights, write_checkpoint  # noqa: E402
from batchmask.models.config import RopeConfig  # noqa: E402
from batchmask.models.llama import load_checkpoint  # noqa: E402

from benchmarks.common import add_plot_options, batch_axis, finish_plot, replot  # noqa: E402

STORIES15M = ModelConfig(dim=288, hidden_dim=768, n_layers=6, n_heads=6, n_kv_heads=6, vocab_size=32000, seq_len=256)
SMOLLM2_135M = ModelConfig(dim=576, hidden_dim=1536, n_layers=30, n_heads=9, n_kv_heads=3, vocab_size=49152,
                           seq_len=512, shared_classifier=True, rope=RopeConfig(theta=100000.0))
PROMPT_LEN = 16  # decode starts after a prompt of this length in every row


def write_random_hf(directory: Path, c: ModelConfig, max_positions: int = 8192, seed: int = 0) -> Path:
    """A random Llama-architecture HF directory of config `c`: config.json + one bfloat16 model.safetensors,
    named and shaped as transformers writes them (the loader under test reads it like a real download)."""
    from safetensors.torch import save_file
    directory.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": c.dim,
              "intermediate_size": c.hidden_dim, "num_hidden_layers": c.n_layers, "num_attention_heads": c.n_heads,
              "num_key_value_heads": c.n_kv_heads, "vocab_size": c.vocab_size, "head_dim": c.head_dim,
              "max_position_embeddings": max_positions, "rms_norm_eps": c.norm_eps,
              "tie_word_embeddings": c.shared_classifier, "hidden_act": "silu", "dtype": "bfloat16",
              "rope_parameters": {"rope_type": "default", "rope_theta": c.rope.theta}}
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, norm=False):
        t = 1.0 + 0.1 * torch.randn(shape, generator=g) if norm else 0.05 * torch.randn(shape, generator=g)
        return t.to(torch.bfloat16)
    tensors = {"model.embed_tokens.weight": rand(c.vocab_size, c.dim), "model.norm.weight": rand(c.dim, norm=True)}
    for l in range(c.n_layers):
        p = f"model.layers.{l}."
        tensors.update({p + "input_layernorm.weight": rand(c.dim, norm=True),
                        p + "post_attention_layernorm.weight": rand(c.dim, norm=True),
                        p + "self_attn.q_proj.weight": rand(c.q_dim, c.dim),
                        p + "self_attn.k_proj.weight": rand(c.kv_dim, c.dim),
                        p + "self_attn.v_proj.weight": rand(c.kv_dim, c.dim),
                        p + "self_attn.o_proj.weight": rand(c.dim, c.q_dim),
                        p + "mlp.gate_proj.weight": rand(c.hidden_dim, c.dim),
                        p + "mlp.up_proj.weight": rand(c.hidden_dim, c.dim),
                        p + "mlp.down_proj.weight": rand(c.dim, c.hidden_dim)})
    if not c.shared_classifier:
        tensors["lm_head.weight"] = rand(c.vocab_size, c.dim)
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory


def flops_per_token(c: ModelConfig, context: float, classifier: float = 1.0) -> float:
    """2 x (matmul weights) + attention (q.k and att.v over `context` positions).

    classifier: the share of tokens that pay for the [vocab, dim] classifier (prefill: 1 / T).
    """
    q_dim = c.q_dim
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


def bench_model(name, model, batches, device, peak, quick, prefill_shapes) -> dict:
    """Decode at each batch size and prefill at each (B, T), printed and returned with their rooflines."""
    c = model.config
    graphed = device.type == "cuda"
    out = {"model": name, "config": dataclasses.asdict(c), "decode": [], "prefill": []}
    # the roofline of a step is the rate of a matmul of the step's own shape (memory-bound at B=1,
    # compute-bound at large B) divided by the FLOPs of a token
    print(f"\n{name}: dim {c.dim}, {c.n_layers} layers, {c.n_heads}/{c.n_kv_heads} heads, vocab {c.vocab_size}")
    print(f"{'decode':>8} {'B':>5} {'tok/s':>9} {'ms/step':>8} {'GFLOP/s':>8} {'matmul GFLOP/s':>15} "
          f"{'roofline tok/s':>15} {'% roof':>7}")
    for B in batches:
        block = max(2, min(20 if not quick else 8, 512 // B))
        blocks = 2 if quick else (5 if B <= 64 else 3)
        tps, step_s, context = bench_decode(model, B, block, blocks, device, graphed)
        fpt = flops_per_token(c, context)
        rate = matmul_gflops(device, B, c.dim, c.vocab_size)
        roof = rate * 1e9 / fpt
        row = {"batch": B, "tokens_per_s": tps, "ms_per_step": step_s * 1e3, "gflops": tps * fpt / 1e9,
               "flops_per_token": fpt, "mean_context": context, "matmul_gflops_same_shape": rate,
               "roofline_tokens_per_s": roof, "graphed": graphed}
        out["decode"].append(row)
        print(f"{'':>8} {B:>5} {tps:>9.0f} {step_s * 1e3:>8.2f} {row['gflops']:>8.1f} {rate:>15.1f} {roof:>15.0f} "
              f"{100 * tps / roof:>6.0f}%")
    model.setup_cache(1)  # release the largest cache before the next model

    print(f"{'prefill':>8} {'B x T':>9} {'tok/s':>9} {'GFLOP/s':>8} {'roofline tok/s':>15} {'% roof':>7}")
    for B, T in prefill_shapes:
        tps = bench_prefill(model, B, T, device)
        fpt = flops_per_token(c, T / 2, classifier=1 / T)  # the classifier runs on the last token only
        roof = peak * 1e9 / fpt
        out["prefill"].append({"batch": B, "length": T, "tokens_per_s": tps, "gflops": tps * fpt / 1e9,
                               "flops_per_token": fpt, "roofline_tokens_per_s": roof})
        print(f"{'':>8} {f'{B} x {T}':>9} {tps:>9.0f} {tps * fpt / 1e9:>8.1f} {roof:>15.0f} {100 * tps / roof:>6.0f}%")
    return out


def load_model(name: str, tmp: Path, device):
    if name == "stories15M":
        path = tmp / "stories15M_random.bin"
        write_checkpoint(path, STORIES15M, random_weights(STORIES15M, seed=0), version=0)
        return load_checkpoint(path, device=device)
    if name == "smollm2-135m":
        path = write_random_hf(tmp / "smollm2-135m", SMOLLM2_135M)
        return load_checkpoint(path, device=device, max_context=SMOLLM2_135M.seq_len)
    raise SystemExit(f"--models: unknown model {name!r} (stories15M, smollm2-135m)")


def draw(plt, results: dict):
    """Decode tokens/s against B, one colour per model: measured (solid) and its roofline (dotted)."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, m in enumerate(results["models"]):
        rows = sorted(m["decode"], key=lambda r: r["batch"])
        bs = [r["batch"] for r in rows]
        ax.plot(bs, [r["tokens_per_s"] for r in rows], marker="o", color=f"C{i}", label=f"{m['model']} decode")
        ax.plot(bs, [r["roofline_tokens_per_s"] for r in rows], linestyle=":", color=f"C{i}",
                label=f"{m['model']} roofline")
    batch_axis(ax, [r["batch"] for m in results["models"] for r in m["decode"]])
    ax.set(yscale="log", ylabel="tokens/s (aggregate)",
           title=f"decode, {results['device']}, {results['threads']} threads{' (quick)' if results['quick'] else ''}")
    ax.legend()
    fig.tight_layout()
    return fig


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--threads", type=int, default=idle_cores(),
                    help="torch intra-op threads (default: the cores not busy with other work)")
    ap.add_argument("--models", default="stories15M,smollm2-135m")
    ap.add_argument("--batches", default="1,8,64,256", help="stories15M decode batch sizes")
    ap.add_argument("--hf-batches", default="1,16,64", help="smollm2-135m decode batch sizes")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="fewer and shorter timed blocks (a rough figure)")
    add_plot_options(ap)
    args = ap.parse_args(argv)
    if args.plot_from:
        return replot(args, draw)
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    peak = matmul_gflops(device, 1024, 1024, 1024)
    print(f"device {device}, threads {torch.get_num_threads()}, torch {torch.__version__}")
    print(f"fp32 matmul {peak:.1f} GFLOP/s at 1024x1024x1024 (best of 5)")
    results = {"device": str(device), "threads": torch.get_num_threads(), "torch": torch.__version__,
               "machine": platform.processor() or platform.machine(), "matmul_gflops_1024": peak,
               "load_avg": os.getloadavg(), "quick": args.quick, "models": []}
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            model = load_model(name, Path(tmp), device)
            load_s = time.perf_counter() - t0
        print(f"\nloaded {name} in {load_s:.2f} s")
        stories = name == "stories15M"
        batches = [int(b) for b in (args.batches if stories else args.hf_batches).split(",")]
        prefill = [(1, 128), (8, 128)] if stories else [(1, 128)]
        results["models"].append({**bench_model(name, model, batches, device, peak, args.quick, prefill),
                                  "load_s": load_s})
        del model

    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
        print(f"\nwrote {args.json}")
    finish_plot(args, draw, results, args.json)


if __name__ == "__main__":
    sys.exit(main())
