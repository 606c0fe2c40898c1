"""
transformers' model.generate with batchmask's LogitsProcessor, against generate without a processor and
with xgrammar's `contrib.hf.LogitsProcessor`, in the same run, on the same model, prompts and grammar.

    .venv/bin/python benchmarks/hf_processor.py [--quick] [--device cpu|cuda] [--json out.json] [--plot PNG]
    .venv/bin/python benchmarks/hf_processor.py --plot-from out.json [--plot PNG]     (redraw the plot, no run)

Model: a random LlamaForCausalLM written by transformers (hidden 64, 2 layers by default: small, so that the
processors' cost is visible next to the forward pass) with the Qwen2 vocabulary (../shared/qwen2, 151,936
ids). Grammar: a call in the llama3 format ({"name": ..., "parameters": {...}}, json.dumps spacing) to one of the
12 tools of ../shared/tools/agent_tools.json; xgrammar compiles the JSON Schema of the same call body
(batchmask.tools.envelope.call_schema) with the same separators and no free whitespace. Greedy decoding,
--new-tokens steps at most (a row that finishes its call stops; steps are counted from the output).

Per batch size: generate's wall time per step for each arm (median of --repeats runs), the time spent
inside each processor's __call__ per step (synchronised on CUDA), and the one-time setup of batchmask's processor
(its masker's tables for this grammar and device; reused across generate() calls through reset()). The CPU
runs one torch thread unless --threads says otherwise; the 1-minute load average is printed (other jobs share
the cores: compare figures taken under similar load).
Without transformers the benchmark is skipped with a note; without xgrammar, its arm is.
The plot (beside the JSON, or --plot): ms per generate step against batch size for each arm, and the ms spent
inside each processor per step (its overhead).
"""
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

from benchmarks.common import add_plot_options, batch_axis, finish_plot, optional_import, replot  # noqa: E402

SHARED = ROOT.parent / "shared"
TASKS = ["What is the weather in Paris this weekend?", "Book a table for two at 8pm", "Remind me to call mum",
         "Convert 30 euros to dollars", "Search the web for llama recipes", "Send an email to Ana about the meeting",
         "List the files in /tmp", "Translate hello into French"]


class Timed:
    """Wraps a logits processor, adding up the wall time spent in its calls (synchronised on CUDA)."""

    def __init__(self, proc, device):
        self.proc, self.cuda, self.seconds, self.calls = proc, device.type == "cuda", 0.0, 0

    def __call__(self, input_ids, scores):
        if self.cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        out = self.proc(input_ids, scores)
        if self.cuda:
            torch.cuda.synchronize()
        self.seconds += time.perf_counter() - t
        self.calls += 1
        return out


def build(device):
    import transformers
    from batchmask.models.tokenizer import load_tokenizer
    from transformers import AutoTokenizer

    from batchmask import ToolRegistry, compile_grammar
    from batchmask.tools.envelope import call_schema
    from batchmask.tools.prompt import encode_prompt

    tok = load_tokenizer(SHARED / "qwen2")
    V = 151936
    tok.pad_to(V)
    reg = ToolRegistry.from_json(SHARED / "tools" / "agent_tools.json")
    t = time.perf_counter()
    grammar = compile_grammar(reg, tok, format="llama3", device=device)
    ours_compile = time.perf_counter() - t
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=V, max_position_embeddings=4096,
                                   bos_token_id=tok.bos_id, eos_token_id=list(tok.stop_ids),
                                   pad_token_id=tok.stop_ids[0])
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval().to(device)
    prompts = [encode_prompt(reg, task, tok) for task in TASKS]   # the catalogue prompt (no template in the dir)
    xgr = None
    xgrammar, _ = optional_import("xgrammar", "its arm is")    # main() has said so
    if xgrammar is not None:
        hf_tok = AutoTokenizer.from_pretrained(str(SHARED / "qwen2"))
        info = xgrammar.TokenizerInfo.from_huggingface(hf_tok, vocab_size=V, stop_token_ids=list(tok.stop_ids))
        t = time.perf_counter()
        compiled = xgrammar.GrammarCompiler(info).compile_json_schema(
            json.dumps(call_schema(reg, "llama3")), any_whitespace=False, separators=(", ", ": "))
        xgr = (xgrammar, compiled, time.perf_counter() - t)
    return tok, grammar, ours_compile, model, prompts, xgr


def left_padded(prompts, pad, device):
    T = max(map(len, prompts))
    ids = torch.full((len(prompts), T), pad)
    mask = torch.zeros(len(prompts), T, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, T - len(p):] = torch.tensor(p)
        mask[i, T - len(p):] = 1
    return ids.to(device), mask.to(device)


def run_arm(model, ids, mask, make_proc, new_tokens, pad, device, repeats):
    """(median generate seconds per step, processor seconds per step or None, steps); make_proc() gives the
    processor for one generate() call (batchmask's is built once and reset(); xgrammar's is made anew)."""
    per_step, in_proc, steps = [], [], 0
    for _ in range(repeats):
        timed = Timed(make_proc(), device) if make_proc else None
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                                 pad_token_id=pad, logits_processor=[timed] if timed else None)
        if device.type == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - t
        steps = out.shape[1] - ids.shape[1]
        per_step.append(wall / steps)
        if timed:
            in_proc.append(timed.seconds / max(timed.calls, 1))
    return statistics.median(per_step), (statistics.median(in_proc) if in_proc else None), steps


def draw(plt, out: dict):
    """ms per generate step against B for each arm (left), and ms inside each processor per step (right)."""
    rows = sorted(out["results"], key=lambda r: r["batch"])
    bs = [r["batch"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.5))
    for key, label in (("generate_ms", "generate"), ("batchmask_ms", "+ batchmask"), ("xgrammar_ms", "+ xgrammar")):
        if all(key in r for r in rows):
            a.plot(bs, [r[key] for r in rows], marker="o", label=label)
    for key, label in (("batchmask_in_processor_ms", "batchmask"), ("xgrammar_in_processor_ms", "xgrammar")):
        if all(key in r for r in rows):
            b.plot(bs, [r[key] for r in rows], marker="o", label=label, color="C1" if "batchmask" in key else "C2")
    meta = out["meta"]
    a.set(ylabel="ms per generate step", title=f"model.generate, {meta['device']}, {meta['threads']} thread(s)")
    b.set(ylabel="ms inside the processor per step", title="the processors' overhead")
    for ax in (a, b):
        batch_axis(ax, bs)
        ax.legend()
    fig.tight_layout()
    return fig


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="batch sizes 1 and 8, fewer steps and repeats")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--new-tokens", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--json", help="write the results here")
    add_plot_options(ap)
    args = ap.parse_args(argv)
    if args.plot_from:
        return replot(args, draw)
    transformers, note = optional_import("transformers", "the benchmark is")
    if transformers is None:
        print(note)
        return 0
    _, note = optional_import("xgrammar", "its arm is")
    if note:
        print(f"# {note}")
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    batches = [1, 8] if args.quick else [1, 8, 32, 64]
    new_tokens = args.new_tokens or (24 if args.quick else 48)
    repeats = args.repeats or (2 if args.quick else 3)

    from transformers.utils import logging
    logging.set_verbosity_error()
    from batchmask.hf import LogitsProcessor

    tok, grammar, ours_compile, model, prompts, xgr = build(device)
    pad = tok.stop_ids[0]
    print(f"# model: random LlamaForCausalLM hidden 64, 2 layers, vocab 151936 (Qwen2), {device}, "
          f"{args.threads} thread(s), load {os.getloadavg()[0]:.2f}")
    print(f"# grammar: llama3 calls of agent_tools.json (12 tools); compile: batchmask {ours_compile * 1e3:.0f} ms"
          + (f", xgrammar {xgr[2] * 1e3:.0f} ms" if xgr else ""))
    print(f"# greedy, at most {new_tokens} new tokens, median of {repeats}; ms per generate step "
          f"(ms inside the processor per step)")
    print(f"{'B':>4} {'steps':>5} {'generate':>10} {'+ batchmask':>20} {'+ xgrammar':>20} {'setup ms':>9}")
    results = []
    for B in batches:
        batch_prompts = [prompts[i % len(prompts)] for i in range(B)]
        ids, mask = left_padded(batch_prompts, pad, device)
        base, _, steps = run_arm(model, ids, mask, None, new_tokens, pad, device, repeats)
        t = time.perf_counter()
        proc = LogitsProcessor(grammar, B, device=device)       # tables built once, outside the timed steps
        setup = time.perf_counter() - t

        def again(proc=proc):
            proc.reset()
            return proc
        ours, ours_in, ours_steps = run_arm(model, ids, mask, again, new_tokens, pad, device, repeats)
        row = {"batch": B, "generate_ms": base * 1e3, "steps": steps, "batchmask_ms": ours * 1e3,
               "batchmask_in_processor_ms": ours_in * 1e3, "batchmask_steps": ours_steps,
               "batchmask_setup_ms": setup * 1e3}
        if xgr:
            xg, xg_in, xg_steps = run_arm(model, ids, mask, lambda: xgr[0].contrib.hf.LogitsProcessor(xgr[1]),
                                          new_tokens, pad, device, repeats)
            row.update(xgrammar_ms=xg * 1e3, xgrammar_in_processor_ms=xg_in * 1e3, xgrammar_steps=xg_steps)
        results.append(row)
        xg_text = f"{row['xgrammar_ms']:8.2f} ({row['xgrammar_in_processor_ms']:7.2f})" if xgr else f"{'-':>20}"
        print(f"{B:>4} {steps:>5} {base * 1e3:10.2f} {ours * 1e3:8.2f} ({ours_in * 1e3:7.2f}) {xg_text} "
              f"{setup * 1e3:9.0f}", flush=True)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": platform.machine(),
            "processor": platform.processor(), "cpus": os.cpu_count(), "load": os.getloadavg()[0],
            "device": str(device), "threads": args.threads, "torch": torch.__version__,
            "new_tokens": new_tokens, "repeats": repeats, "compile_ms": {"batchmask": ours_compile * 1e3,
                                                                         "xgrammar": xgr[2] * 1e3 if xgr else None}}
    if args.json:
        Path(args.json).write_text(json.dumps(dict(meta=meta, results=results), indent=1))
        print(f"# wrote {args.json}")
    finish_plot(args, draw, dict(meta=meta, results=results), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
