"""
Jump-forward decoding's figures (batchmask/run/jump.py): the same tasks through BatchGenerator with and without
jump_forward, and what each costs.

    .venv/bin/python benchmarks/jump.py [--quick] [--device cpu|cuda] [--batches 1,16] [--json out.json]

Per workload and batch size, both arms: tokens (every token a call wrote, EOS included), row steps (forward
passes the rows took part in: their sampled tokens), tokens per step (1.0 without), steps per call, batch steps,
calls/s and ms per batch step, and the share of valid calls (parsed, arguments checked by jsonschema).

Workloads: the built-in tools and the shared 12-tool catalogue (../shared/tools/agent_tools.json, when present),
in the json format and in hermes, on a stories15M-shaped random checkpoint (context raised to hold the catalogue's
prompt) with the Llama 2 tokenizer (or a synthetic one; the output says which). A random model writes nonsense
values, so its values run long and are all sampled: tokens per step here is a floor for a trained model, whose
values are short. On a CPU a ragged step costs compute per token, so calls/s may gain less than steps fall; on a
GPU a step is bound by memory and a few more tokens a row cost about nothing. The machine may be shared: the load
average is stored with every figure.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # runnable as a script from anywhere

from batchmask.api import compile_grammar  # noqa: E402
from batchmask.run.generation import BatchGenerator, GenerationConfig  # noqa: E402
from batchmask.tools.registry import ToolRegistry  # noqa: E402
from benchmarks.common import MemoEncode, find_tokenizer, make_tasks, random_model  # noqa: E402
from benchmarks.model import STORIES15M, idle_cores  # noqa: E402

CATALOGUE = ROOT.parent / "shared" / "tools" / "agent_tools.json"
FORMATS = ("json", "hermes")


def workloads() -> list[tuple[str, ToolRegistry]]:
    out = [("built-in", ToolRegistry.defaults())]
    if CATALOGUE.exists():
        out.append(("catalogue", ToolRegistry.from_json(CATALOGUE)))
    return out


def run_arms(model, tokenizer, registry, grammar, tasks: list[str], batch_size: int, *, fmt: str,
             max_new_tokens: int, backend: str = "auto") -> list[dict]:
    """BatchGenerator.run over `tasks` without and with jump_forward: one record per arm."""
    out = []
    for jump in (False, True):
        config = GenerationConfig(batch_size=batch_size, max_new_tokens=max_new_tokens, format=fmt, jump_forward=jump)
        gen = BatchGenerator(model, tokenizer, registry, grammar, config, backend=backend)
        results = []
        load = os.getloadavg()[0]
        stats = gen.run(tasks, on_result=results.append)   # run() reads back every step: its clock ends in sync
        out.append({"B": batch_size, "format": fmt, "jump_forward": jump, "tasks": stats.tasks,
                    "tokens": stats.tokens, "row_steps": stats.row_steps, "batch_steps": stats.steps,
                    "tokens_per_step": stats.tokens_per_step, "steps_per_call": stats.row_steps / stats.tasks,
                    "calls_per_s": stats.tasks / stats.seconds, "ms_per_step": 1e3 * stats.seconds / stats.steps,
                    "seconds": stats.seconds, "valid_calls": sum(r.error is None for r in results) / len(results),
                    "forced_bytes": gen.jump.nbytes if gen.jump is not None else 0, "load": load})
    return out


def header() -> str:
    return (f"{'workload':<22} {'B':>4} {'jump':<5} {'tokens':>7} {'steps':>6} {'tok/step':>8} {'steps/call':>10} "
            f"{'calls/s':>8} {'ms/step':>8} {'valid':>6} {'load':>5}")


def line(name: str, r: dict) -> str:
    return (f"{name:<22} {r['B']:>4} {'on' if r['jump_forward'] else 'off':<5} {r['tokens']:>7} {r['row_steps']:>6} "
            f"{r['tokens_per_step']:>8.2f} {r['steps_per_call']:>10.1f} {r['calls_per_s']:>8.2f} "
            f"{r['ms_per_step']:>8.2f} {r['valid_calls']:>6.0%} {r['load']:>5.2f}")


def run(tokenizer, device, batches: list[int], *, quick: bool = False, model=None, config=None,
        max_new_tokens: int = 96, backend: str = "auto", log=print) -> dict:
    """Every workload x format x batch size, both arms; returns {"runs": [...], "forced_bytes": {...}}."""
    config = config or dataclasses.replace(STORIES15M, seq_len=2048)
    dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    model = model or random_model(config, device, dtype)
    runs, sizes = [], {}
    log(header())
    for name, registry in workloads():
        for fmt in FORMATS:
            grammar = compile_grammar(registry, tokenizer, format=fmt, device=device)
            sizes[f"{name} {fmt}"] = {"table_bytes": grammar.nbytes,
                                      "forced_bytes": grammar.forced_tokens(tokenizer).nbytes}
            for B in batches:
                tasks = make_tasks(max(B, 4) if quick else max(2 * B, 8), seed=B)
                for r in run_arms(model, tokenizer, registry, grammar, tasks, B, fmt=fmt,
                                  max_new_tokens=max_new_tokens, backend=backend):
                    r["workload"] = name
                    runs.append(r)
                    log(line(f"{name} {fmt}", r))
    for key, s in sizes.items():
        log(f"# {key}: table {s['table_bytes']:,} bytes, forced tokens {s['forced_bytes']:,} bytes")
    return {"runs": runs, "sizes": sizes, "model": config.__dict__ | {"rope": str(config.rope)},
            "max_new_tokens": max_new_tokens}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="few tasks, 48 new tokens")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--tokenizer", help="tokenizer file (default ../shared/llama2/tokenizer.model)")
    ap.add_argument("--threads", type=int, default=idle_cores())
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tokenizer, note = find_tokenizer(args.tokenizer)
    print(f"# jump-forward, {args.device}, {torch.get_num_threads()} threads; tokenizer: {note}; "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs", flush=True)
    t0 = time.perf_counter()
    out = run(MemoEncode(tokenizer), args.device, [int(b) for b in args.batches.split(",")], quick=args.quick,
              max_new_tokens=48 if args.quick else 96, log=lambda m: print(m, flush=True))
    out.update(tokenizer=note, device=args.device, threads=torch.get_num_threads(), seconds=time.perf_counter() - t0)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
        print(f"# wrote {args.json}")


if __name__ == "__main__":
    main()
