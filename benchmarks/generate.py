"""
End-to-end generation throughput: tool calls per task through BatchGenerator, constrained vs free, and
continuous vs static batching, with a stories15M-shaped random checkpoint (dim 288, hidden 768, 6 layers,
6 heads, vocab 32000, seq_len 256) and the Llama 2 tokenizer.

    .venv/bin/python benchmarks/generate.py [--quick] [--device cpu|cuda] [--graphs] [--json out.json]

Measurements:
  generate    BatchGenerator.run on the same task list, constrained and free, at B in {1, 16, 64}:
              tokens/s (sampled tokens, EOS included, over the whole run with its prefills) and ms/step.
  overhead    the decode loop alone (no refills, no prefill), free and constrained blocks interleaved so a
              shared machine's load hits both alike: constrained ms/step / free ms/step.
              Target (CPU): <= 1.05 at B = 64.
  mixed       (--mixed) 64 rows over 16 tool sets in one table vs one tool set: benchmarks/mixed.py
  batching    continuous vs static batching on one constrained task list mixing short and long calls
              (a quarter may run to 96 tokens, the rest are capped at 12 and closed by finish());
              lengths reported as a distribution. Target: continuous >= 1.3x static.

A random-weight model writes nonsense, but constrained it still writes a valid call; free it rarely emits
EOS, so free rows run to their token ceiling. That is why the overhead figure compares steps, not runs.
The machine may be shared: the 1-minute load average is printed and stored next to every figure.
The other benchmarks' helpers are reused: the model shape and thread choice from benchmarks/model.py.
The plot (beside the JSON, or --plot; --plot-from JSON redraws it): tokens/s against batch size per arm
(constrained, constrained with jump-forward, free) and the decode loop's ms/step, free against constrained.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # runnable as a script from anywhere (last: see tests/conftest.py)

from batchmask.models import sampling  # noqa: E402

from batchmask.compiler.compiled import compile_grammar  # noqa: E402
from batchmask.masker import BatchMasker  # noqa: E402
from batchmask.run.generation import BatchGenerator, GenerationConfig, encode_prompts  # noqa: E402
from batchmask.tools.registry import ToolRegistry  # noqa: E402
from benchmarks.common import (  # noqa: E402
    MemoEncode,
    add_plot_options,
    batch_axis,
    find_tokenizer,
    finish_plot,
    make_tasks,
    random_model,
    replot,
)
from benchmarks.model import STORIES15M, idle_cores, sync  # noqa: E402

BATCHES = [1, 16, 64]
MAX_NEW_TOKENS = 96

class GraphedDecode:
    """The model with `decode` replaced by a CUDA-graph replay, for BatchGenerator (which calls model.decode).

    The graph is captured on the first decode after each setup_cache (BatchGenerator sets the cache up in its
    constructor); prefill and reset write the cache buffers in place, so the graph stays valid across refills.
    The logits it returns are the graph's static output buffer: BatchGenerator only reads it (and writes
    prefilled rows into it) before the next decode, which is exactly the use decode_graphed allows.
    """

    def __init__(self, model):
        self.model = model
        self._captured = False

    def __getattr__(self, name):  # everything but setup_cache / decode is the model's own
        return getattr(self.model, name)

    def setup_cache(self, *args, **kwargs):
        self.model.setup_cache(*args, **kwargs)
        self._captured = False

    def capture(self) -> None:
        """Record the decode step now (otherwise the first decode does it); needs setup_cache first."""
        self.model.capture_decode()
        self._captured = True

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        if not self._captured:
            self.capture()
        return self.model.decode_graphed(tokens)


# ----------------------------------------------------------------------------------------------------------
# measurements

def length_stats(lengths: list[int], cap: int) -> dict:
    """Distribution of tokens per call; `capped` = share of calls that hit the token ceiling."""
    s = sorted(lengths)
    q = statistics.quantiles(s, n=4) if len(s) > 1 else [s[0]] * 3
    return {"n": len(s), "min": s[0], "p25": q[0], "median": q[1], "p75": q[2], "max": s[-1],
            "mean": statistics.fmean(s), "capped": sum(n >= cap for n in s) / len(s)}


def run_generation(model, tokenizer, registry, grammar, tasks: list[str], batch_size: int, *, constrain: bool,
                   continuous: bool = True, max_new_tokens: int = MAX_NEW_TOKENS, temperature: float = 0.0,
                   graphs: bool = False, backend: str = "auto", limits: list[int] | None = None,
                   jump_forward: bool = False) -> dict:
    """One BatchGenerator.run over `tasks`; tokens/s, ms/step, tokens per row step, steps per call, calls/s and
    the distribution of call lengths."""
    config = GenerationConfig(batch_size=batch_size, max_new_tokens=max_new_tokens, temperature=temperature,
                              seed=1, constrain=constrain, continuous=continuous, jump_forward=jump_forward)
    if graphs and not isinstance(model, GraphedDecode):
        model = GraphedDecode(model)
    gen = BatchGenerator(model, tokenizer, registry, grammar if constrain else None, config, backend=backend)
    if isinstance(model, GraphedDecode):
        model.capture()  # after the generator's setup_cache, before its clock: set-up, not a decoding step
    lengths, valid = [], []

    def keep(res):
        lengths.append(res.tokens)
        valid.append(res.error is None)

    load = os.getloadavg()[0]
    stats = gen.run(tasks, on_result=keep, limits=limits)  # run() reads back per step: its clock ends synchronised
    mode = ("constr+jump" if jump_forward else "constrained") if constrain else "free"
    return {"B": batch_size, "mode": mode, "continuous": continuous, "jump_forward": jump_forward,
            "graphs": isinstance(model, GraphedDecode), "tasks": stats.tasks, "tokens": stats.tokens,
            "steps": stats.steps, "row_steps": stats.row_steps, "tokens_per_step": stats.tokens_per_step,
            "steps_per_call": stats.row_steps / max(stats.tasks, 1), "calls_per_s": stats.tasks / stats.seconds,
            "prefill_tokens": stats.prefill_tokens, "seconds": stats.seconds, "tokens_per_s": stats.tokens_per_s,
            "ms_per_step": 1e3 * stats.seconds / max(stats.steps, 1), "valid_calls": sum(valid) / len(valid),
            "lengths": length_stats(lengths, max_new_tokens), "load": load}


def prompt_batch(prompts: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids [n, T] and lengths [n] for model.prefill."""
    T = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), T, dtype=torch.long)  # [n, T]
    for j, p in enumerate(prompts):
        ids[j, :len(p)] = torch.tensor(p)
    return ids.to(device), torch.tensor([len(p) for p in prompts], device=device)


def step_overhead(model, tokenizer, registry, grammar, batch_size: int, steps: int = 8, reps: int = 4,
                  graphs: bool = False, backend: str = "auto") -> dict:
    """ms per decode step, free (argmax) vs constrained (masker.sample, greedy), the loop and nothing else.

    One prefill, then `reps` pairs of `steps`-step blocks, one free one constrained, their order swapped
    every rep so that the growing context (and any change in machine load) falls on both alike.
    Each mode's figure is the median over its blocks.
    """
    B, dev = batch_size, next(model.parameters()).device
    need = 2 * reps * steps + 1
    m = GraphedDecode(model) if graphs and not isinstance(model, GraphedDecode) else model
    m.setup_cache(B)
    prompts = encode_prompts(make_tasks(B, seed=7), tokenizer, registry, model.config.seq_len - need)
    masker = BatchMasker(grammar, B, device=dev, backend=backend, max_tokens=need)
    ids, lengths = prompt_batch(prompts, dev)
    logits = m.prefill(torch.arange(B), ids, lengths)  # [B, V] float32
    if isinstance(m, GraphedDecode):
        m.capture()  # outside the timed blocks

    def free(x):  # the cheapest honest free step: argmax (sampling.sample sorts [B, V] even when greedy)
        return sampling.greedy(x)

    def constrained(x):
        return masker.sample(x, 0.0)

    times = {"free": [], "constrained": []}
    load = os.getloadavg()[0]
    for rep in range(reps):
        order = [("free", free), ("constrained", constrained)]
        for name, pick in (order if rep % 2 == 0 else order[::-1]):
            sync(dev)
            t0 = time.perf_counter()
            for _ in range(steps):
                logits = m.decode(pick(logits))
            sync(dev)
            times[name].append((time.perf_counter() - t0) / steps)
    masker.check()
    free_ms = 1e3 * statistics.median(times["free"])
    cons_ms = 1e3 * statistics.median(times["constrained"])
    return {"B": B, "graphs": isinstance(m, GraphedDecode), "steps_per_block": steps, "blocks": reps,
            "free_ms": free_ms, "constrained_ms": cons_ms, "ratio": cons_ms / free_ms, "load": load}


def draw(plt, results: dict):
    """Two panels: tokens/s against B, one line per arm; the decode loop's ms/step against B, free and
    constrained (the overhead figure's two sides)."""
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    modes = dict.fromkeys(r["mode"] for r in results["generate"])  # in run order
    for mode in modes:
        rows = sorted((r for r in results["generate"] if r["mode"] == mode), key=lambda r: r["B"])
        ax.plot([r["B"] for r in rows], [r["tokens_per_s"] for r in rows], marker="o", label=mode)
    ax.set(ylabel="tokens/s (whole run, prefills included)",
           title=f"BatchGenerator, {results['device']}, {results['threads']} threads")
    rows = sorted(results["overhead"], key=lambda r: r["B"])
    for key, label in (("free_ms", "free (argmax)"), ("constrained_ms", "constrained (masker.sample)")):
        ax2.plot([r["B"] for r in rows], [r[key] for r in rows], marker="o", label=label)
    ax2.set(ylabel="ms per decode step", title="decode loop alone")
    for a in (ax, ax2):
        batch_axis(a, [r["B"] for r in results["generate"] + results["overhead"]])
        a.legend()
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="few tasks, 32 new tokens in the B sweep")
    ap.add_argument("--graphs", action="store_true", help="CUDA only: decode by CUDA-graph replay")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--threads", type=int, default=idle_cores(),
                    help="torch intra-op threads (default: the cores not busy with other work)")
    ap.add_argument("--tokenizer", help="tokenizer file (default ../shared/llama2/tokenizer.model)")
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    ap.add_argument("--mixed", action="store_true",
                    help="also 16 tool sets in one batch: compile, memory, per-token cost (benchmarks/mixed.py)")
    add_plot_options(ap)
    args = ap.parse_args(argv)
    if args.plot_from:
        return replot(args, draw)
    device = torch.device(args.device)
    if args.graphs and device.type != "cuda":
        ap.error("--graphs needs --device cuda")
    torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    batches = [int(b) for b in args.batches.split(",")]
    sweep_tokens = 32 if args.quick else MAX_NEW_TOKENS

    tokenizer, tok_note = find_tokenizer(args.tokenizer)
    tokenizer = MemoEncode(tokenizer)
    registry = ToolRegistry.defaults()
    t0 = time.perf_counter()
    grammar = compile_grammar(registry, tokenizer, device=device)
    compile_s = time.perf_counter() - t0
    model = random_model(STORIES15M, device, dtype)
    print(f"# batchmask end-to-end generation -- {device} ({platform.processor() or platform.machine()}), "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}, model stories15M-shaped random {dtype}")
    print(f"# tokenizer: {tok_note}; grammar S={grammar.num_states} C={grammar.num_classes} "
          f"compiled in {compile_s:.2f} s; graphs: {args.graphs}")
    print(f"# load average (1 min) at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs", flush=True)
    results = {"device": str(device), "threads": torch.get_num_threads(), "torch": torch.__version__,
               "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
               "tokenizer": tok_note, "dtype": str(dtype), "graphs": args.graphs, "compile_s": compile_s,
               "generate": [], "overhead": [], "batching": []}

    # Three arms per batch size: constrained, constrained with jump-forward (forced text appended without a
    # model step per token: tokens per row step > 1, steps per call fall) and free. `steps` counts batch steps.
    print(f"\n{'generate':<10} {'B':>4} {'mode':<12} {'tasks':>5} {'tokens':>7} {'steps':>6} {'tok/step':>8} "
          f"{'steps/call':>10} {'calls/s':>8} {'tok/s':>9} {'ms/step':>8} {'valid':>6} {'load':>5}")
    for B in batches:
        tasks = make_tasks(max(2 * B, 4) if not args.quick else max(B, 2))
        for constrain, jump in ((True, False), (True, True), (False, False)):
            r = run_generation(model, tokenizer, registry, grammar, tasks, B, constrain=constrain,
                               max_new_tokens=sweep_tokens, graphs=args.graphs, jump_forward=jump)
            results["generate"].append(r)
            print(f"{'':<10} {B:>4} {r['mode']:<12} {r['tasks']:>5} {r['tokens']:>7} {r['steps']:>6} "
                  f"{r['tokens_per_step']:>8.2f} {r['steps_per_call']:>10.1f} {r['calls_per_s']:>8.2f} "
                  f"{r['tokens_per_s']:>9.1f} {r['ms_per_step']:>8.2f} {r['valid_calls']:>6.0%} {r['load']:>5.2f}",
                  flush=True)

    print(f"\n{'overhead':<10} {'B':>4} {'free ms':>9} {'constr ms':>10} {'ratio':>7} {'target':>7} {'load':>5}")
    for B in batches:
        r = step_overhead(model, tokenizer, registry, grammar, B, steps=4 if args.quick else 8,
                          reps=3 if args.quick else 5, graphs=args.graphs)
        results["overhead"].append(r)
        print(f"{'':<10} {B:>4} {r['free_ms']:>9.2f} {r['constrained_ms']:>10.2f} {r['ratio']:>7.3f} "
              f"{'<=1.05' if B == 64 else '':>7} {r['load']:>5.2f}", flush=True)

    # The mixed workload: a quarter of the tasks may write up to MAX_NEW_TOKENS tokens, the rest are
    # short calls (a ceiling of SHORT tokens, then finish() closes the call). Static batching holds every
    # slot until the longest row of its batch is done; continuous batching refills a slot at once.
    B_mix, SHORT = 8, 12
    tasks = make_tasks(4 * B_mix if args.quick else 8 * B_mix, seed=3)
    limits = [MAX_NEW_TOKENS if i % 4 == 0 else SHORT for i in range(len(tasks))]
    print(f"\n{'batching':<10} {'B':>4} {'mode':<12} {'tasks':>5} {'tokens':>7} {'steps':>6} {'tok/s':>9} "
          f"{'load':>5}   call lengths (T=1, seeded; 1/4 capped at {MAX_NEW_TOKENS}, 3/4 at {SHORT})")
    for continuous in (True, False):
        r = run_generation(model, tokenizer, registry, grammar, tasks, B_mix, constrain=True, continuous=continuous,
                           temperature=1.0, graphs=args.graphs, limits=limits)
        results["batching"].append(r)
        L = r["lengths"]
        print(f"{'':<10} {B_mix:>4} {'continuous' if continuous else 'static':<12} {r['tasks']:>5} {r['tokens']:>7} "
              f"{r['steps']:>6} {r['tokens_per_s']:>9.1f} {r['load']:>5.2f}   min {L['min']} p25 {L['p25']:.0f} "
              f"median {L['median']:.0f} p75 {L['p75']:.0f} max {L['max']} capped {L['capped']:.0%}", flush=True)
    cont, stat = results["batching"]
    speedup = cont["tokens_per_s"] / stat["tokens_per_s"]
    step_gain = stat["steps"] / cont["steps"]
    results["continuous_speedup"] = speedup
    results["continuous_step_ratio"] = step_gain
    print(f"{'':<10} continuous / static: {speedup:.2f}x tokens/s (target >= 1.3x), "
          f"{step_gain:.2f}x fewer steps for the same tokens")
    if args.mixed:
        from benchmarks.mixed import run as run_mixed
        results["mixed"] = run_mixed(tokenizer, device, quick=args.quick, model=model)
    print(f"# load average (1 min) at end: {os.getloadavg()[0]:.2f}")

    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
        print(f"# wrote {args.json}")
    finish_plot(args, draw, results, args.json)


if __name__ == "__main__":
    sys.exit(main())
