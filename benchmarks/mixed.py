"""
Many tool sets in one batch (issue 16): 16 distinct tool sets drawn from the typed catalogue
(../shared/tools/agent_tools.json), compiled for the Llama 2 tokenizer into one table.

    .venv/bin/python benchmarks/mixed.py [--quick] [--sets 16] [--tools-per-set 6] [--json out.json]
    .venv/bin/python benchmarks/generate.py --mixed        (the same section, after the others)

Three measurements:
  compile   the 16 compiled together on a warm tokenizer (GrammarStore.together, what `generate` does: one
            automaton, a start per set, a tool several sets list compiled once), then read back from its cache
            file (a second run); beside it, the old way (each set apart, then grammar_set.combine), and 16
            catalogue-sized sets that share no tool (every tool and property renamed) compiled together,
            the median of 5 fresh batches of such sets. Target: 16 catalogue-sized sets in <= 16 x 20 ms.
  memory    device bytes of the combined table (what the masker holds) against the 16 tables side by side.
            Target: no more than the sum.
  step      B = 64 rows, 4 per tool set, each in its own grammar (one table), against 64 rows of one tool set in
            its own grammar (recorded greedy runs replayed through the maskers; see measure_step):
            model + mask + sample + advance per token. Target: mixed / single <= 1.1 (aim 1.02).

The plot (beside the JSON, or --plot; --plot-from JSON redraws it): the three as bars, each beside its target.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # last: see tests/conftest.py

from batchmask.models.checkpoint import ModelConfig  # noqa: E402

from batchmask import compile_grammar  # noqa: E402
from batchmask.compiler.sets import combine  # noqa: E402
from batchmask.masker import BatchMasker  # noqa: E402
from batchmask.run.generation import encode_prompts  # noqa: E402
from batchmask.run.grammar_store import GrammarStore  # noqa: E402
from batchmask.tools.registry import ToolRegistry  # noqa: E402
from benchmarks.common import add_plot_options, finish_plot, replot  # noqa: E402
from benchmarks.model import STORIES15M, sync  # noqa: E402

CATALOGUE = ROOT.parent / "shared" / "tools" / "agent_tools.json"
FORMAT = "json"
DISTINCT_REPS = 5           # fresh batches of renamed sets timed (the median is reported: single runs vary ~20%)


def tool_sets(n: int, per_set: int, seed: int = 0) -> list[ToolRegistry]:
    """n distinct tool sets of `per_set` tools each (random subsets of the catalogue, in random order)."""
    tools = json.loads(CATALOGUE.read_text())["tools"]
    rng = random.Random(seed)
    seen, out = set(), []
    while len(out) < n:
        pick = rng.sample(tools, min(per_set, len(tools)))
        key = json.dumps(pick)
        if key not in seen:
            seen.add(key)
            out.append(ToolRegistry.from_obj({"tools": pick}, source=f"<set {len(out)}>"))
    return out


def masker_bytes(m: BatchMasker) -> int:
    t = m.tables
    return sum(x.numel() * x.element_size() for x in (t.token_class, t.state_row, t.row_next, t.row_legal,
                                                      t.targets, t.segment_start, t.segment_base,
                                                      t.class_first_token))


def distinct_sets(n: int, first: int = 0) -> list[ToolRegistry]:
    """n catalogue-sized tool sets sharing no tool: the catalogue with every tool and property renamed per set
    (set k's names end in k, for k from `first`: another `first` gives sets no earlier compile has seen)."""
    out = []
    for k in range(first, first + n):
        tools = json.loads(CATALOGUE.read_text())["tools"]
        for t in tools:
            f, p = t["function"], t["function"]["parameters"]
            f["name"] = f"{f['name']}_v{k}"
            p["properties"] = {f"{name}{k}": v for name, v in p["properties"].items()}
            p["required"] = [f"{name}{k}" for name in p.get("required", [])]
        out.append(ToolRegistry.from_obj({"tools": tools}, source=f"<distinct set {k}>"))
    return out


def measure_compile(regs, tokenizer, device) -> tuple[list, dict]:
    """The run's way (GrammarStore.together: the sets compiled together, one cache file), then each set apart and
    combined (grammar_set.combine), as before, for comparison."""
    compile_grammar(regs[0], tokenizer, format=FORMAT)             # warm: the tokenizer's vocabulary work
    with tempfile.TemporaryDirectory() as cache:
        store = GrammarStore(tokenizer, format=FORMAT, device=device, cache_dir=Path(cache))
        t0 = time.perf_counter()
        table = store.together(regs)
        compile_s = time.perf_counter() - t0
        again = GrammarStore(tokenizer, format=FORMAT, device=device, cache_dir=Path(cache))
        t0 = time.perf_counter()
        again.together(regs)
        load_s = time.perf_counter() - t0
        assert again.compiled == 0
    each = []
    grammars = []
    for r in regs:
        t = time.perf_counter()
        grammars.append(compile_grammar(r, tokenizer, format=FORMAT, device=device))
        each.append(time.perf_counter() - t)
    t0 = time.perf_counter()
    combined = combine(grammars)
    combine_s = time.perf_counter() - t0
    return [grammars, table, combined], {
        "sets": len(regs), "compile_s": compile_s, "cache_load_s": load_s, "target_s": 0.020 * len(regs),
        "apart_s": sum(each), "apart_each_ms": [1e3 * x for x in each], "combine_s": combine_s}


def record(model, tokenizer, grammar, regs, tasks, starts, steps: int):
    """A constrained greedy run of len(tasks) rows (row r: tasks[r] with tool set regs[r], starting in starts[r]):
    the logits of every step, and the model's seconds per step."""
    dev = next(model.parameters()).device
    B = len(tasks)
    prompts = encode_prompts(tasks, tokenizer, regs, model.config.seq_len - steps - 1)
    model.setup_cache(B)
    T = max(len(p) for p in prompts)
    ids = torch.zeros(B, T, dtype=torch.long)
    for j, p in enumerate(prompts):
        ids[j, :len(p)] = torch.tensor(p)
    logits = model.prefill(torch.arange(B), ids.to(dev), torch.tensor([len(p) for p in prompts], device=dev))
    m = BatchMasker(grammar, B, device=dev, max_tokens=steps + 1)
    m.reset(starts=starts)
    seq, decode_s = [], []
    for _ in range(steps):
        seq.append(logits.clone())
        tokens = m.sample(logits, 0.0)
        sync(dev)
        t = time.perf_counter()
        logits = model.decode(tokens)
        sync(dev)
        decode_s.append(time.perf_counter() - t)
    m.check()
    return seq, statistics.median(decode_s)


def measure_step(model, tokenizer, regs, grammars, table, B: int, steps: int, reps: int) -> dict:
    """Per-token cost of B rows over the G tool sets (B / G each, one table) against B rows of one tool set.

    The model's step is the same in both (same B, same positions); what differs is the masker. Its inputs are
    recorded once: the mixed batch (row r in set r mod G) through the combined table, and for each set k a batch
    of B rows of set k through k's own grammar (the first B / G of them are the mixed batch's rows of set k, so
    both see the same kinds of states). The recordings use a small model (only their logits matter), and are
    replayed through the maskers, the mixed one and each set's, back to back, rep after rep. Per token:
    (model + mixed mask) / (model + mean over k of one set's mask), the model's ms measured on `model`.
    The masks' costs depend on the states the rows are in, so the table's own cost is shown apart: the combined
    table replaying each set's batch (every row in that set's grammar) against that set's grammar alone."""
    dev = next(model.parameters()).device
    G = len(grammars)
    from benchmarks.common import random_model
    small = random_model(ModelConfig(dim=64, hidden_dim=128, n_layers=1, n_heads=2, n_kv_heads=2,
                                     vocab_size=model.config.vocab_size, seq_len=model.config.seq_len), dev,
                         next(model.parameters()).dtype)
    groups = [r % G for r in range(B)]
    task = [f"task {r // G}: please do the thing" for r in range(B)]          # row r is set r % G's (r // G)-th
    mixed_seq, _ = record(small, tokenizer, table, [regs[g] for g in groups], task,
                          [table.starts[g] for g in groups], steps)
    single_seq = [record(small, tokenizer, grammars[k], [regs[k]] * B, [f"task {j}: please do the thing"
                                                                          for j in range(B)],
                         [grammars[k].start] * B, steps)[0] for k in range(G)]
    _, model_s = record(model, tokenizer, table, [regs[g] for g in groups], task, [table.starts[g] for g in groups],
                        min(steps, 8))

    def replay(m, stream, starts) -> float:
        m.reset(starts=starts)
        sync(dev)
        t0 = time.perf_counter()
        for x in stream:
            m.sample(x, 0.0)
        sync(dev)
        return (time.perf_counter() - t0) / len(stream)

    mixed_m = BatchMasker(table, B, device=dev, max_tokens=steps + 1)
    mixed_t, single_t, same_t = [], [[] for _ in range(G)], [[] for _ in range(G)]
    load = os.getloadavg()[0]
    for k in range(G):
        single = BatchMasker(grammars[k], B, device=dev, max_tokens=steps + 1)
        for _ in range(reps):
            mixed_t.append(replay(mixed_m, mixed_seq, [table.starts[g] for g in groups]))
            single_t[k].append(replay(single, single_seq[k], None))
            same_t[k].append(replay(mixed_m, single_seq[k], [table.starts[k]] * B))   # the table on set k's rows
    model_ms = 1e3 * model_s
    mixed_ms = 1e3 * statistics.median(mixed_t)
    single_ms = statistics.fmean(1e3 * statistics.median(t) for t in single_t)
    same_ms = statistics.fmean(1e3 * statistics.median(t) for t in same_t)
    return {"B": B, "sets": G, "steps": steps, "reps": reps, "model_ms": model_ms, "mixed_mask_ms": mixed_ms,
            "single_mask_ms": single_ms, "mask_ratio": mixed_ms / single_ms,
            "ratio": (model_ms + mixed_ms) / (model_ms + single_ms),
            "single_mask_ms_each": [1e3 * statistics.median(t) for t in single_t], "load": load,
            "table_on_single_rows_ms": same_ms, "table_vs_alone_same_rows": same_ms / single_ms}


def run(tokenizer, device, sets: int = 16, per_set: int = 6, quick: bool = False, model=None) -> dict:
    regs = tool_sets(sets, per_set)
    (grammars, table, combined), comp = measure_compile(regs, tokenizer, device)
    print(f"\n{'mixed':<10} compile {sets} sets of {per_set} tools together (warm tokenizer): "
          f"{comp['compile_s']:.3f} s (target <= {comp['target_s']:.2f} s); from the cache file "
          f"{comp['cache_load_s']:.3f} s; apart {comp['apart_s']:.2f} s (each {min(comp['apart_each_ms']):.0f}-"
          f"{max(comp['apart_each_ms']):.0f} ms) + combine {comp['combine_s']:.2f} s", flush=True)
    # each repetition a fresh batch of renamed sets (nothing of them compiled before, in memory or on disk)
    times = []
    for rep in range(DISTINCT_REPS):
        others = distinct_sets(sets, first=1000 * (rep + 1))
        t0 = time.perf_counter()
        distinct = GrammarStore(tokenizer, format=FORMAT, device=device, cache_dir=None).together(others)
        times.append(time.perf_counter() - t0)
        if rep + 1 < DISTINCT_REPS:
            del distinct
    comp["distinct_s"] = statistics.median(times)
    comp["distinct_runs_s"] = times
    comp["distinct_states"] = distinct.num_states
    comp["distinct_bytes"] = distinct.nbytes
    print(f"{'':<10} {sets} catalogue-sized sets sharing no tool ({len(json.loads(CATALOGUE.read_text())['tools'])} "
          f"tools each, all renamed) together: {comp['distinct_s']:.3f} s median of {DISTINCT_REPS} fresh batches "
          f"({min(times):.3f}-{max(times):.3f}; target <= {comp['target_s']:.2f} s; {distinct.num_states} states, "
          f"{distinct.num_rows} rows, {distinct.nbytes / 1e6:.1f} MB)", flush=True)
    del distinct
    apart = sum(g.nbytes for g in grammars)
    mem = {"combined_bytes": table.nbytes, "apart_bytes": apart, "ratio": table.nbytes / apart,
           "combined_apart_bytes": combined.nbytes,
           "states": table.num_states, "rows": table.num_rows, "classes": table.num_classes,
           "rows_apart": sum(g.num_rows for g in grammars),
           "classes_apart": [g.num_classes for g in grammars]}
    print(f"{'':<10} memory: together {table.nbytes / 1e6:.1f} MB ({table.num_states} states, {table.num_rows} rows "
          f"x {table.num_classes} classes, {str(table.row_next.dtype).removeprefix('torch.')}) vs {apart / 1e6:.1f} MB "
          f"apart ({mem['rows_apart']} rows, {min(mem['classes_apart'])}-{max(mem['classes_apart'])} classes): "
          f"{mem['ratio']:.2f}x (target <= 1); apart then combined {combined.nbytes / 1e6:.1f} MB", flush=True)
    if model is None:
        from benchmarks.common import random_model
        model = random_model(STORIES15M, device, torch.float32 if torch.device(device).type == "cpu" else
                             torch.bfloat16)
    step = measure_step(model, tokenizer, regs, grammars, table, 64, steps=12 if quick else 24, reps=3 if quick else 5)
    mem["masker_bytes_mixed"] = masker_bytes(BatchMasker(table, 1, device=device))
    print(f"{'':<10} step B=64: model {step['model_ms']:.1f} ms + mask: one tool set {step['single_mask_ms']:.2f} ms, "
          f"{sets} sets in one table {step['mixed_mask_ms']:.2f} ms ({step['mask_ratio']:.2f}x): "
          f"{step['ratio']:.3f}x per token (target <= 1.1, aim 1.02); the combined table on one set's rows "
          f"{step['table_vs_alone_same_rows']:.2f}x its grammar alone; load {step['load']:.2f}", flush=True)
    return {"compile": comp, "memory": mem, "step": step}


def draw(plt, out: dict):
    """Compile seconds (together, from the cache, apart + combine, sets sharing no tool), device MB (together
    vs apart) and ms per step at B = 64 (model, mask for one set vs many), each with its target as a line."""
    comp, mem, step = out["compile"], out["memory"], out["step"]
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(13, 4.5))
    a.bar(["together", "cache\nfile", "apart", "apart +\ncombine", "no shared\ntool"],
          [comp["compile_s"], comp["cache_load_s"], comp["apart_s"], comp["apart_s"] + comp["combine_s"],
           comp["distinct_s"]], color=["C0", "C0", "C1", "C1", "C2"])
    a.axhline(comp["target_s"], color="k", linestyle=":", label=f"target {comp['target_s']:.2f} s")
    a.set(ylabel="seconds", title=f"compile {comp['sets']} tool sets")
    b.bar(["one table", "apart", "apart,\ncombined"], [mem["combined_bytes"] / 1e6, mem["apart_bytes"] / 1e6,
                                                       mem["combined_apart_bytes"] / 1e6], color=["C0", "C1", "C1"])
    b.set(ylabel="MB on the device", title="memory (target: one table <= apart)")
    c.bar(["model", "mask, one set", f"mask, {step['sets']} sets"],
          [step["model_ms"], step["single_mask_ms"], step["mixed_mask_ms"]], color=["C7", "C1", "C0"])
    c.set(ylabel="ms per step", yscale="log",
          title=f"B = {step['B']}: {step['ratio']:.3f}x per token (target <= 1.1)")
    a.legend()
    for ax in (a, b, c):
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sets", type=int, default=16)
    ap.add_argument("--tools-per-set", type=int, default=6)
    ap.add_argument("--tokenizer", help="tokenizer file (default ../shared/llama2/tokenizer.model)")
    ap.add_argument("--json", type=Path)
    add_plot_options(ap)
    args = ap.parse_args(argv)
    if args.plot_from:
        return replot(args, draw)
    from benchmarks.common import MemoEncode, find_tokenizer
    tokenizer, note = find_tokenizer(args.tokenizer)
    print(f"# tokenizer: {note}; {torch.get_num_threads()} threads; load {os.getloadavg()[0]:.2f}")
    out = run(MemoEncode(tokenizer), torch.device(args.device), args.sets, args.tools_per_set, args.quick)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
        print(f"# wrote {args.json}")
    finish_plot(args, draw, out, args.json)


if __name__ == "__main__":
    sys.exit(main())
