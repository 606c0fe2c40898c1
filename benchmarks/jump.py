"""
Jump-forward decoding's figures (batchmask/run/jump.py): the same tasks through BatchGenerator with and without
jump_forward, and what each costs.

    .venv/bin/python benchmarks/jump.py [--quick] [--device cpu|cuda] [--batches 1,16] [--json out.json]

Per workload and batch size, both arms: tokens (every token a call wrote, EOS included), row steps (forward
passes the rows took part in: their sampled tokens), tokens per step (1.0 without), steps per call, batch steps,
calls/s and ms per batch step, and the share of valid calls (parsed, arguments checked by jsonschema).

Workloads: the built-in tools and the shared 12-tool catalogue (../shared/tools/agent_tools.json, when present),
in the json format and in hermes, with the Llama 2 tokenizer (or a synthetic one; the output says which), and the
catalogue in hermes on the Qwen2 vocabulary (151936 ids; ../shared/qwen2 or --qwen2 DIR, skipped with a note when
absent). Two models each:
- `random`: a stories15M-shaped random checkpoint (context raised to hold the catalogue's prompt). It writes
  nonsense values that run to the ceiling, all sampled: its tokens per step is a floor.
- `scripted` (benchmarks/scripted_model.py): writes a reference call per task, short realistic values checked by
  jsonschema, the way a trained model that knows the answer does: the figure a real model's run approaches.
On a CPU a ragged step costs compute per token, so calls/s may gain less than steps fall; on a GPU a step is bound
by memory and a few more tokens a row cost about nothing. The machine may be shared: the load average is stored with
every figure. The plot (beside the JSON, or --plot; --plot-from JSON redraws it): steps per call and calls/s against
batch size, one line per workload and arm, a column per model.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import jsonschema
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # runnable as a script from anywhere (last: see tests/conftest.py)

from batchmask.api import compile_grammar  # noqa: E402
from batchmask.run.generation import BatchGenerator, GenerationConfig  # noqa: E402
from batchmask.tools.envelope import get_envelope, native_args_schema  # noqa: E402
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
from benchmarks.model import STORIES15M, idle_cores  # noqa: E402
from benchmarks.scripted_model import ScriptedModel, reference_calls  # noqa: E402

CATALOGUE = ROOT.parent / "shared" / "tools" / "agent_tools.json"
QWEN2 = ROOT.parent / "shared" / "qwen2"
FORMATS = ("json", "hermes")


def workloads(tokenizer, qwen2=None) -> list[tuple[str, ToolRegistry, object, tuple[str, ...]]]:
    """(name, registry, tokenizer, formats) for each workload present."""
    out = [("built-in", ToolRegistry.defaults(), tokenizer, FORMATS)]
    if CATALOGUE.exists():
        out.append(("catalogue", ToolRegistry.from_json(CATALOGUE), tokenizer, FORMATS))
        if qwen2 is not None:
            out.append(("catalogue qwen2", ToolRegistry.from_json(CATALOGUE), qwen2, ("hermes",)))
    return out


def valid_call(result, registry) -> bool:
    """A finished call (not cut at the ceiling) whose arguments jsonschema accepts against its tool's parameters."""
    if result.cut or result.error is not None or not isinstance(result.call, dict):
        return False
    name = result.call.get("name", result.call.get("tool"))
    args = result.call.get("arguments", result.call.get("args"))
    tool = {t.name: t for t in registry.tools}.get(name)
    if tool is None:
        return False
    try:
        jsonschema.validate(args, tool.parameters or native_args_schema(tool, 256))
    except jsonschema.ValidationError:
        return False
    return True


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
                    "seconds": stats.seconds,
                    "valid_calls": sum(valid_call(r, registry) for r in results) / len(results),
                    "cut_calls": sum(r.cut for r in results) / len(results),
                    "forced_bytes": gen.jump.nbytes if gen.jump is not None else 0, "load": load})
    return out


def header() -> str:
    return (f"{'workload':<32} {'B':>4} {'jump':<5} {'tokens':>7} {'steps':>6} {'tok/step':>8} {'steps/call':>10} "
            f"{'calls/s':>8} {'ms/step':>8} {'valid':>6} {'cut':>5} {'load':>5}")


def line(name: str, r: dict) -> str:
    return (f"{name:<32} {r['B']:>4} {'on' if r['jump_forward'] else 'off':<5} {r['tokens']:>7} {r['row_steps']:>6} "
            f"{r['tokens_per_step']:>8.2f} {r['steps_per_call']:>10.1f} {r['calls_per_s']:>8.2f} "
            f"{r['ms_per_step']:>8.2f} {r['valid_calls']:>6.0%} {r['cut_calls']:>5.0%} {r['load']:>5.2f}")


def run(tokenizer, device, batches: list[int], *, quick: bool = False, model=None, config=None,
        max_new_tokens: int = 96, backend: str = "auto", log=print, qwen2=None,
        models: tuple[str, ...] = ("random", "scripted")) -> dict:
    """Every workload x format x model x batch size, both arms; returns {"runs": [...], "sizes": {...}}."""
    config = config or dataclasses.replace(STORIES15M, seq_len=2048)
    dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    randoms = {}
    runs, sizes = [], {}
    log(header())
    for name, registry, tok, formats in workloads(tokenizer, qwen2):
        for fmt in formats:
            grammar = compile_grammar(registry, tok, format=fmt, device=device)
            sizes[f"{name} {fmt}"] = {"table_bytes": grammar.nbytes, "forced_bytes": grammar.forced_tokens(tok).nbytes}
            for kind in models:
                for B in batches:
                    n = max(B, 4) if quick else max(2 * B, 8)
                    if kind == "scripted":
                        calls = reference_calls(registry, get_envelope(fmt), n, seed=B)
                        tasks = [t for t, _ in calls]
                        m = ScriptedModel(tok.token_bytes, dict(calls), eos_id=tok.eos_id, seq_len=config.seq_len,
                                          decode_text=tok.decode).to(device)
                    else:
                        tasks = make_tasks(n, seed=B)
                        V = tok.vocab_size
                        if V not in randoms:
                            randoms[V] = model if model is not None and V == model.config.vocab_size else \
                                random_model(dataclasses.replace(config, vocab_size=V), device, dtype)
                        m = randoms[V]
                    for r in run_arms(m, tok, registry, grammar, tasks, B, fmt=fmt, max_new_tokens=max_new_tokens,
                                      backend=backend):
                        r["workload"], r["model"] = name, kind
                        if kind == "scripted":
                            r["off_script_steps_both_arms"] = m.off_script
                        runs.append(r)
                        log(line(f"{name} {fmt} {kind}", r))
    for key, s in sizes.items():
        log(f"# {key}: table {s['table_bytes']:,} bytes, forced tokens {s['forced_bytes']:,} bytes")
    return {"runs": runs, "sizes": sizes, "model": config.__dict__ | {"rope": str(config.rope)},
            "max_new_tokens": max_new_tokens}


def draw(plt, out: dict):
    """Steps per call (top) and calls/s (bottom) against B, a column per model; a colour per workload and format,
    solid and dots with jump-forward, dashed and crosses without (a single batch size draws markers only)."""
    runs = out["runs"]
    models = list(dict.fromkeys(r["model"] for r in runs))
    fig, axes = plt.subplots(2, len(models), figsize=(5 * len(models) + 3, 8), squeeze=False, layout="constrained")
    keys = list(dict.fromkeys(f"{r['workload']} {r['format']}" for r in runs))
    colours = {k: f"C{i}" for i, k in enumerate(keys)}
    for col, kind in enumerate(models):
        for key in keys:
            for jump in (False, True):
                rows = sorted((r for r in runs if r["model"] == kind and f"{r['workload']} {r['format']}" == key
                               and r["jump_forward"] == jump), key=lambda r: r["B"])
                if not rows:
                    continue
                style = dict(color=colours[key], linestyle="-" if jump else "--", marker="o" if jump else "x",
                             label=f"{key}, jump {'on' if jump else 'off'}")
                for row, metric in ((0, "steps_per_call"), (1, "calls_per_s")):
                    axes[row][col].plot([r["B"] for r in rows], [r[metric] for r in rows], **style)
        axes[0][col].set(title=f"{kind} model, {out.get('device', '')}", ylabel="row steps per call")
        axes[1][col].set(ylabel="calls/s", yscale="log")
        for row in (0, 1):
            batch_axis(axes[row][col], [r["B"] for r in runs])
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="outside right upper", fontsize=8)  # off the lines
    return fig


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="few tasks, 48 new tokens")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--tokenizer", help="tokenizer file (default ../shared/llama2/tokenizer.model)")
    ap.add_argument("--qwen2", type=Path, default=QWEN2, help="Qwen2 tokenizer folder for the hermes workload "
                    "(default ../shared/qwen2; skipped with a note when absent)")
    ap.add_argument("--models", default="random,scripted", help="which models to run (random, scripted)")
    ap.add_argument("--threads", type=int, default=idle_cores())
    ap.add_argument("--json", type=Path, help="write the results here")
    add_plot_options(ap)
    args = ap.parse_args(argv)
    if args.plot_from:
        return replot(args, draw)
    torch.set_num_threads(args.threads)
    tokenizer, note = find_tokenizer(args.tokenizer)
    print(f"# jump-forward, {args.device}, {torch.get_num_threads()} threads; tokenizer: {note}; "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs", flush=True)
    qwen2 = None
    if (args.qwen2 / "tokenizer.json").is_file():
        from batchmask.models.tokenizer import load_tokenizer
        qwen2 = MemoEncode(load_tokenizer(args.qwen2))
    else:
        print(f"# no Qwen2 vocabulary at {args.qwen2}: its workload is skipped", flush=True)
    t0 = time.perf_counter()
    out = run(MemoEncode(tokenizer), args.device, [int(b) for b in args.batches.split(",")], quick=args.quick,
              max_new_tokens=48 if args.quick else 96, log=lambda m: print(m, flush=True), qwen2=qwen2,
              models=tuple(args.models.split(",")))
    out.update(tokenizer=note, device=args.device, threads=torch.get_num_threads(), seconds=time.perf_counter() - t0)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
        print(f"# wrote {args.json}")
    finish_plot(args, draw, out, args.json)


if __name__ == "__main__":
    sys.exit(main())
