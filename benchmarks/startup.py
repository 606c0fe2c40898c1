"""Start-up of one `batchmask generate` task, end to end and phase by phase (issue 26: at most 3 s with the
grammar cache warm, aim 1.5 s, on a stories15M-sized checkpoint).

    .venv/bin/python benchmarks/startup.py [--runs 5] [--tokenizer PATH] [--json benchmarks/results/startup.json]
                                           [--plot OUT.png]
    .venv/bin/python benchmarks/startup.py --plot-from benchmarks/results/startup.json      (redraw the plot, no run)

The checkpoint is stories15M's shape (dim 288, 6 layers, vocabulary 32000) with random weights, written as a
llama2.c file; the tokenizer is Llama 2's (../shared/llama2/tokenizer.model, or --tokenizer), else a synthetic
32000-piece one (said in the output). The task is one line; --max-new-tokens caps the call (random weights run
to the cap, so every run generates about the same number of tokens). Each row is the median (and min) of
--runs fresh processes:

    bare interpreter        python -c pass: what no program can save
    import torch            python -c "import torch": the floor under any torch program
    end to end, cold cache  the `batchmask` console script, a fresh --grammar-cache directory (compiles)
    end to end, warm cache  the same command with the cache filled by an earlier run (what a user re-runs)

and the warm run phase by phase, in a child process that runs cli.main itself: interpreter start and exit
(the process's wall time less its own clock), imports (torch, the CLI), then the CLI's own phases as
batchmask/run/display.phase records them (loading the model and tokenizer; compiling the grammars and encoding
the prompts; generating), and the rest (checks, the run file, writing the output). The 1-minute load average
is printed: other jobs on the cores inflate every figure.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # runnable as a script from anywhere (last: see tests/conftest.py)

from benchmarks.common import TOKENIZER, add_plot_options, finish_plot, replot, synthetic_tokenizer  # noqa: E402
from benchmarks.model import STORIES15M  # noqa: E402

TARGET_S, AIM_S = 3.0, 1.5

# the child that runs the CLI in-process and reports its own clock (one JSON line on stdout)
CHILD = """
import json, sys, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
from batchmask.run import cli, display
t2 = time.perf_counter()
rc = cli.main(sys.argv[1:])
t3 = time.perf_counter()
print(json.dumps({"rc": rc, "torch": t1 - t0, "cli import": t2 - t1, "main": t3 - t2,
                  "phases": display.PHASE_SECONDS, "clock": t3 - t0}))
"""


def make_inputs(d: Path, tokenizer_path: str | None) -> tuple[Path, Path, str]:
    """(checkpoint, tokenizer file, what the tokenizer is) written into d."""
    from batchmask.models.checkpoint import random_weights, write_checkpoint
    ckpt = d / "stories15M-shape.bin"
    write_checkpoint(ckpt, STORIES15M, random_weights(STORIES15M, seed=0, std=0.02))
    for p in [Path(tokenizer_path)] if tokenizer_path else [TOKENIZER]:
        if p.is_file():
            return ckpt, p, f"Llama 2 tokenizer ({p})"
    tok = d / "tokenizer.bin"
    synthetic_tokenizer(STORIES15M.vocab_size).write_bin(tok)
    return ckpt, tok, f"SYNTHETIC {STORIES15M.vocab_size}-piece vocabulary (no tokenizer at {TOKENIZER})"


def timed(cmd: list[str], env: dict) -> tuple[float, str]:
    t = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if done.returncode != 0:
        raise SystemExit(f"startup.py: {' '.join(cmd[:3])} ... failed ({done.returncode}): {done.stderr[-500:]}")
    return wall, done.stdout


def summary(values: list[float]) -> dict:
    return {"median_s": statistics.median(values), "min_s": min(values), "runs": values}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="fresh processes per row (default 5)")
    ap.add_argument("--max-new-tokens", type=int, default=32, help="the call's token cap (default 32)")
    ap.add_argument("--tokenizer", help="tokenizer file (default ../shared/llama2/tokenizer.model)")
    ap.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "startup.json")
    add_plot_options(ap)
    args = ap.parse_args(argv)
    if args.plot_from:
        return replot(args, draw)
    script = Path(sys.executable).with_name("batchmask")
    if not script.is_file():
        raise SystemExit(f"startup.py: no console script at {script}; install batchmask (pip install -e .)")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("BATCHMASK_DEBUG", None)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        ckpt, tok, tok_note = make_inputs(d, args.tokenizer)
        (d / "task.txt").write_text("what is 12 times 34?\n")
        gen = ["generate", "--tasks", str(d / "task.txt"), "--checkpoint", str(ckpt), "--tokenizer", str(tok),
               "--max-new-tokens", str(args.max_new_tokens), "--out", str(d / "o.jsonl"), "--force", "--quiet"]
        warm = [*gen, "--grammar-cache", str(d / "cache")]
        rows: dict[str, list[float]] = {k: [] for k in ("bare interpreter", "import torch", "end to end, cold cache",
                                                        "end to end, warm cache")}
        phases: list[dict] = []
        timed([str(script), *warm], env)                                # fills the warm cache
        for r in range(args.runs):
            rows["bare interpreter"].append(timed([sys.executable, "-c", "pass"], env)[0])
            rows["import torch"].append(timed([sys.executable, "-c", "import torch"], env)[0])
            cold = [*gen, "--grammar-cache", str(d / f"cold{r}")]
            rows["end to end, cold cache"].append(timed([str(script), *cold], env)[0])
            rows["end to end, warm cache"].append(timed([str(script), *warm], env)[0])
            wall, out = timed([sys.executable, "-c", CHILD, *warm], env)
            rep = json.loads(out.strip().splitlines()[-1])
            named = dict(rep["phases"])
            split = {"interpreter start and exit": wall - rep["clock"], "import torch": rep["torch"],
                     "import the CLI": rep["cli import"], **named,
                     "the rest (checks, run file, output)": rep["main"] - sum(named.values())}
            phases.append(split)
        tokens = json.loads((d / "o.jsonl").read_text().splitlines()[0])["tokens"]
    load = os.getloadavg()[0]
    names = list(phases[0])
    phase_rows = {n: summary([p[n] for p in phases]) for n in names}
    print(f"# start-up of one task, stories15M-shaped checkpoint, {tokens} tokens generated; tokenizer: {tok_note}; "
          f"{args.runs} runs; load average {load:.2f} on {os.cpu_count()} CPUs")
    print(f"{'what':42} {'median s':>9} {'min s':>7}")
    for name, vals in rows.items():
        s = summary(vals)
        print(f"{name:42} {s['median_s']:9.3f} {s['min_s']:7.3f}")
    print("# the warm run, phase by phase")
    for name, s in phase_rows.items():
        print(f"  {name:40} {s['median_s']:9.3f} {s['min_s']:7.3f}")
    warm_s = statistics.median(rows["end to end, warm cache"])
    print(f"# warm end to end {warm_s:.2f} s: target <= {TARGET_S} s {'met' if warm_s <= TARGET_S else 'MISSED'}, "
          f"aim {AIM_S} s {'met' if warm_s <= AIM_S else 'not met'}")
    result = {"tokenizer": tok_note, "tokens": tokens, "runs": args.runs, "load_avg": load,
              "rows": {k: summary(v) for k, v in rows.items()}, "warm_phases": phase_rows,
              "target_s": TARGET_S, "aim_s": AIM_S}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.json}")
    finish_plot(args, draw, result, args.json)
    return 0


def draw(plt, result: dict):
    """One bar per end-to-end row, and the warm run's phases stacked, against the target and the aim."""
    fig, ax = plt.subplots(figsize=(12, 4))
    labels = list(result["rows"])
    ax.barh(labels, [result["rows"][k]["median_s"] for k in labels], color="#999999")
    left = 0.0
    for name, s in result["warm_phases"].items():
        ax.barh(["warm run, by phase"], [s["median_s"]], left=left, label=name)
        left += s["median_s"]
    for x, what in ((result["target_s"], "target"), (result["aim_s"], "aim")):
        ax.axvline(x, linestyle="--", color="black" if what == "target" else "grey")
        ax.text(x, len(labels) + 0.45, f" {what} {x} s", fontsize=8)
    ax.set_xlabel("seconds (median of runs)")
    ax.set_title(f"batchmask generate, one task: start-up (load average {result['load_avg']:.1f})")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    sys.exit(main())
