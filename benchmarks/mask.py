"""
Per-step cost of grammar masking for a whole batch: mask + advance, and the fused mask + sample + advance,
against a per-row Python loop over the vocabulary (B <= 8) and xgrammar (when installed) on the same grammar.

    .venv/bin/python benchmarks/mask.py [--quick] [--device cpu|cuda] [--grammar FILE] [--json out.json]

The grammar is the default tool registry compiled for the Llama 2 tokenizer (../shared/llama2/tokenizer.model)
when the compiler and tokenizer are available, else a synthetic table of realistic size (S=4000, C=200);
--grammar FILE takes a saved CompiledGrammar instead (CompiledGrammar.save, e.g. a catalogue on Qwen2), at its
own vocabulary only. Each batch size also reports the masker's construction and its first step (the CPU
paths' token lists of the rows' states are built on first use).
For V = 128K the grammar's token classes are tiled over the wider vocabulary (same table, 4x the ids).
Rows sit at realistic states, an explicit mix (--value-frac, default 0.8): that fraction of the rows is inside a
string value (states where most tokens are legal: only quotes, backslashes, control bytes... are out), the rest
at states where few tokens are legal (literal text such as key names and punctuation, UTF-8 continuations).
A uniformly random state would be unrealistic: ~90% of the states of the real grammar are of the second kind.
Times are per decoding step: min and median wall time over repeated runs, and the min CPU time of the
benchmarking thread (robust to other jobs preempting it), in ms. The CPU runs one torch thread unless
--threads says otherwise; the 1-minute load average is printed with each row (other jobs share the
cores: compare figures taken under similar load).
On CUDA the table also shows achieved GB/s (logits bytes touched / time) next to the measured copy bandwidth.
The plot (beside the JSON, or --plot; --plot-from JSON redraws it): median ms per step against batch size, a panel
per vocabulary size, a line per method (the one-off construction and first step are in the JSON only).
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # runnable as a script from anywhere (last: see tests/conftest.py)

from batchmask.masker import BatchMasker  # noqa: E402
from benchmarks.common import TOKENIZER, add_plot_options, batch_axis, finish_plot, optional_import, replot  # noqa: E402,I001

BATCHES = [1, 8, 64, 256, 1024]
VOCABS = [32000, 128 * 1024]


# ----------------------------------------------------------------------------------------------------------
# grammars

def load_grammar(device: str, path: str | None = None):
    """(grammar, description, registry or None): a saved grammar file if given, else the real compiled registry
    if possible, else synthetic."""
    if path:
        from batchmask.compiler.compiled import CompiledGrammar
        g = CompiledGrammar.load(path, device=device)
        return g, f"{path} (S={g.num_states}, R={g.num_rows}, C={g.num_classes}, V={g.vocab_size})", None
    try:
        from batchmask.models.tokenizer import load_tokenizer

        from batchmask.compiler.compiled import compile_grammar
        from batchmask.tools.registry import ToolRegistry
        if TOKENIZER.exists():
            reg = ToolRegistry.defaults()
            g = compile_grammar(reg, load_tokenizer(str(TOKENIZER)), device=device)
            return g, f"default registry / Llama 2 tokenizer (S={g.num_states}, C={g.num_classes})", reg
    except ImportError:
        pass
    sys.path.insert(0, str(ROOT / "tests"))
    from grammar_fixtures import make_random_grammar
    g = make_random_grammar(num_states=4000, num_classes=200, vocab_size=32000, hole_frac=0.9, num_final=20,
                            device=device)
    return g, f"synthetic (S={g.num_states}, C={g.num_classes})", None


def widen(g, vocab_size: int):
    """The same grammar over a vocabulary of vocab_size ids: id v behaves like id v % V."""
    if vocab_size == g.vocab_size:
        return g
    reps = -(-vocab_size // g.vocab_size)
    token_class = g.token_class.repeat(reps)[:vocab_size]  # [V']
    class_size = torch.bincount(token_class.long(), minlength=g.num_classes)
    legal_count = ((g.class_next.long() >= 0).long() * class_size).sum(1).int()
    token_bytes = (list(g.token_bytes) * reps)[:vocab_size]
    return SimpleNamespace(token_class=token_class, class_next=g.class_next, legal_count=legal_count,
                           final=g.final, num_states=g.num_states, num_classes=g.num_classes,
                           vocab_size=vocab_size, start=g.start, eos_id=g.eos_id, done_state=g.done_state,
                           token_bytes=token_bytes, finish_text=g.finish_text)


# ----------------------------------------------------------------------------------------------------------
# timing

def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_step(fn, device, budget_s: float, max_iters: int) -> tuple[float, float, float]:
    """(min, median) wall ms of fn over repeated calls, and the min CPU ms of this thread (time.thread_time:
    what the step costs when other jobs preempt it; on a shared machine the honest companion of wall time).
    Warm up, then run until the budget or max_iters."""
    fn()
    sync(device)
    times, cpu = [], []
    start = time.perf_counter()
    while len(times) < max_iters and (len(times) < 3 or time.perf_counter() - start < budget_s):
        t0, c0 = time.perf_counter(), time.thread_time()
        fn()
        sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.thread_time() - c0) * 1e3)
    return min(times), statistics.median(times), min(cpu)


def copy_bandwidth_gbs(device) -> float:
    """Device-to-device copy bandwidth (bytes read + written per second) of a 1 GiB buffer."""
    src = torch.empty(1 << 28, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    best = time_step(lambda: dst.copy_(src), device, 0.5, 20)[0]
    return 2 * src.numel() * 4 / (best * 1e-3) / 1e9


# ----------------------------------------------------------------------------------------------------------
# the contenders

def realistic_states(g, B: int, value_frac: float, gen: torch.Generator) -> torch.Tensor:
    """int32 [B]: round(value_frac * B) rows at value states (most tokens legal), the rest at states where few
    tokens are legal, each drawn uniformly within its kind, in shuffled row order."""
    legal = g.legal_count.cpu().long()  # [S]
    wide = max(1, min(g.vocab_size // 2, int(legal.max())))       # a random grammar may have no half-open state
    value = (legal >= wide).nonzero()[:, 0]
    literal = ((legal < wide) & (legal > 0)).nonzero()[:, 0]
    literal = literal if len(literal) else value
    n_value = round(value_frac * B)
    picks = [value[torch.randint(0, len(value), (n_value,), generator=gen)],
             literal[torch.randint(0, len(literal), (B - n_value,), generator=gen)]]
    return torch.cat(picks)[torch.randperm(B, generator=gen)].int()


def masker_steps(g, B: int, device, backend: str, value_frac: float, gen: torch.Generator):
    """A BatchMasker with rows at realistic states, and the steps to time on it (each restarts from the
    same states): {"mask+advance", "sample greedy", "sample T=1", "sample T=1 top-p 0.9"} -> zero-argument
    callables."""
    m = BatchMasker(g, B, device=device, backend=backend, max_tokens=16)
    init = realistic_states(g, B, value_frac, gen).to(device)  # [B]
    logits = torch.randn(B, g.vocab_size, generator=gen).to(device)  # [B, V]
    work = logits.clone()
    m.rows.state.copy_(init)
    tokens = m.sample(logits, temperature=0.0)  # legal tokens for the initial states

    def restart():  # a few-microsecond [B] copy so every timed step starts from the same states
        m.rows.state.copy_(init)
        m.rows.step.zero_()

    def mask_advance():
        restart()
        m.apply_(work)
        m.advance(tokens, check=False)

    def fused(temperature, top_p=1.0):
        def run():
            restart()
            m.sample(logits, temperature=temperature, top_p=top_p, seed=1)
        return run

    return m, {"mask+advance": mask_advance, "sample greedy": fused(0.0), "sample T=1": fused(1.0),
               "sample T=1 top-p 0.9": fused(1.0, 0.9)}


def bench_setup(g, B, device, backend, args) -> dict:
    """One-off costs, timed once: BatchMasker construction, then its first greedy step from realistic states
    (wall ms as min and median, and this thread's CPU ms)."""
    states = realistic_states(g, B, args.value_frac, torch.Generator().manual_seed(0)).to(device)
    logits = torch.randn(B, g.vocab_size, generator=torch.Generator().manual_seed(0)).to(device)
    sync(device)
    t0, c0 = time.perf_counter(), time.thread_time()
    m = BatchMasker(g, B, device=device, backend=backend, max_tokens=16)
    sync(device)
    t1, c1 = time.perf_counter(), time.thread_time()
    m.rows.state.copy_(states)
    m.sample(logits, temperature=0.0)
    sync(device)
    t2, c2 = time.perf_counter(), time.thread_time()
    return {"construct": ((t1 - t0) * 1e3, (t1 - t0) * 1e3, (c1 - c0) * 1e3),
            "first step greedy": ((t2 - t1) * 1e3, (t2 - t1) * 1e3, (c2 - c1) * 1e3)}


def bench_batchmask(g, B, V, device, backend, args) -> dict:
    out = bench_setup(g, B, device, backend, args)
    m, steps = masker_steps(g, B, device, backend, args.value_frac, torch.Generator().manual_seed(0))
    for name, fn in steps.items():
        if "top-p" in name and device.type == "cpu" and B * V > args.cpu_sample_limit:
            continue  # top-p sorts and hashes [B, V] on the CPU: seconds per step at this size
        out[name] = time_step(fn, device, args.budget, args.max_iters)
    m.reset()
    return out


def bench_naive(g, B, V, device, args):
    """Per row, a Python loop over the vocabulary decides each id (the way a simple engine fills a mask)."""
    table = g.class_next.long().cpu().tolist()
    classes = g.token_class.cpu().tolist()
    states = realistic_states(g, B, args.value_frac, torch.Generator().manual_seed(0)).tolist()
    logits = torch.randn(B, V).to(device)

    def run():
        for r, s in enumerate(states):
            row = table[s]
            illegal = [row[c] < 0 for c in classes]
            logits[r].masked_fill_(torch.tensor(illegal, device=device), float("-inf"))

    return time_step(run, device, args.budget, 5)


def xgrammar_ebnf(registry) -> str:
    """The registry's call language as xgrammar EBNF: {"tool":"NAME","args":{"K":"V",...}} with string values
    of 1..256 characters >= 0x20 other than '"' and '\\' (what batchmask's grammar allows)."""
    def lit(text: str) -> str:
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'

    calls = []
    for tool in registry.tools:
        parts = [lit('{"tool":"%s","args":{' % tool.name)]
        for i, arg in enumerate(tool.required_args):
            parts += [lit((',' if i else '') + '"%s":"' % arg.name), "value", lit('"')]
        parts.append(lit("}}"))
        calls.append("(" + " ".join(parts) + ")")
    return "root ::= " + " | ".join(calls) + '\nvalue ::= [^"\\\\\\x00-\\x1f]{1,256}\n'


def bench_xgrammar(g, registry, B, V, device, args):
    """xgrammar: fill the batch's token bitmask on the CPU (one matcher per row), copy it, apply it."""
    import xgrammar as xgr
    info = xgr.TokenizerInfo(list(g.token_bytes), vocab_type=xgr.VocabType.RAW, vocab_size=V,
                             stop_token_ids=[g.eos_id])
    compiled = xgr.GrammarCompiler(info).compile_grammar(xgrammar_ebnf(registry))
    matchers = [xgr.GrammarMatcher(compiled) for _ in range(B)]
    bitmask = xgr.allocate_token_bitmask(B, V)  # int32 [B, V/32] on the CPU
    logits = torch.randn(B, V).to(device)

    def run():
        for r, matcher in enumerate(matchers):
            matcher.fill_next_token_bitmask(bitmask, r)
        xgr.apply_token_bitmask_inplace(logits, bitmask.to(device, non_blocking=True))

    return time_step(run, device, args.budget, args.max_iters)


ONE_OFF = ("construct", "first step")     # methods timed once per masker, not per step: not plotted


def draw(plt, out: dict):
    """Median ms per step against B, a panel per V, a line per method (per-step ones)."""
    rows = [r for r in out["results"] if not any(k in r["method"] for k in ONE_OFF)]
    vocabs = sorted({r["V"] for r in rows})
    fig, axes = plt.subplots(1, len(vocabs), figsize=(6 * len(vocabs) + 3, 4.5), squeeze=False, layout="constrained")
    methods = list(dict.fromkeys(r["method"] for r in rows))
    for ax, V in zip(axes[0], vocabs):
        for i, method in enumerate(methods):
            pts = sorted((r["B"], r["median_ms"]) for r in rows if r["V"] == V and r["method"] == method)
            if pts:
                ax.plot(*zip(*pts), marker="o", color=f"C{i}", label=method)
        batch_axis(ax, [r["B"] for r in rows])
        ax.set(yscale="log", ylabel="ms per step (median)", title=f"V = {V:,}, {out['meta']['device']}")
    handles = {h.get_label(): h for ax in axes[0] for h in ax.get_lines()}     # every method once
    fig.legend(handles.values(), handles.keys(), loc="outside right upper", fontsize=8)
    return fig


# ----------------------------------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="B in {1, 64}, V = 32000 only, short runs")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--grammar", help="a saved CompiledGrammar file to benchmark (its own vocabulary only)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--value-frac", type=float, default=0.8,
                    help="fraction of rows inside a string value (the rest at literal / few-legal states)")
    ap.add_argument("--batches", type=int, nargs="+", help="override the batch sizes")
    ap.add_argument("--vocabs", type=int, nargs="+", help="override the vocabulary sizes")
    ap.add_argument("--budget", type=float, default=1.0, help="seconds of timed runs per measurement")
    ap.add_argument("--max-iters", type=int, default=200)
    ap.add_argument("--cpu-sample-limit", type=int, default=64 * 32000,
                    help="largest B*V for the CPU top-p measurement")
    add_plot_options(ap)
    args = ap.parse_args(argv)
    if args.plot_from:
        return replot(args, draw)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    batches, vocabs = ([1, 64], [32000]) if args.quick else (BATCHES, VOCABS)
    batches, vocabs = args.batches or batches, args.vocabs or vocabs
    if args.quick:
        args.budget, args.max_iters = min(args.budget, 0.3), min(args.max_iters, 30)

    base, gdesc, registry = load_grammar(str(device), args.grammar)
    if args.grammar:
        vocabs = [base.vocab_size]
    backends = ["triton", "torch"] if device.type == "cuda" else ["torch"]
    xgrammar, xgr_note = optional_import("xgrammar", "its row is")
    have_xgr = xgrammar is not None and registry is not None
    if xgrammar is not None and registry is None:
        xgr_note = "xgrammar: skipped (needs the real registry grammar)"
    xgr_note = xgr_note or ""
    bw = copy_bandwidth_gbs(device) if device.type == "cuda" else None

    print(f"# batchmask masking benchmark -- {device} ({platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} threads), float32 logits")
    print(f"# grammar: {gdesc}; rows: {args.value_frac:.0%} at value states, the rest at few-legal states")
    print(f"# load average (1, 5, 15 min): {os.getloadavg()}")
    if bw:
        print(f"# device copy bandwidth: {bw:.0f} GB/s")
    if xgr_note:
        print(f"# {xgr_note}")
    print(f"{'B':>5} {'V':>7} {'method':<28} {'min ms':>9} {'median ms':>10} {'cpu ms':>8} {'GB/s':>7} {'load':>5}")

    results = []

    def report(B, V, method, t):
        gbs = B * V * 4 / (t[0] * 1e-3) / 1e9 if device.type == "cuda" else None
        load = os.getloadavg()[0]
        print(f"{B:>5} {V:>7} {method:<28} {t[0]:>9.3f} {t[1]:>10.3f} {t[2]:>8.3f} "
              f"{'' if gbs is None else f'{gbs:7.0f}':>7} {load:5.2f}", flush=True)
        results.append(dict(B=B, V=V, method=method, min_ms=t[0], median_ms=t[1], min_cpu_ms=t[2], gbs=gbs,
                            load1=load))

    for V in vocabs:
        g = widen(base, V)
        for B in batches:
            for backend in backends:
                for name, t in bench_batchmask(g, B, V, device, backend, args).items():
                    report(B, V, f"batchmask {backend} {name}", t)
            if B <= 8:
                report(B, V, "python loop mask", bench_naive(g, B, V, device, args))
            if have_xgr and V == base.vocab_size:
                report(B, V, "xgrammar fill+apply", bench_xgrammar(g, registry, B, V, device, args))

    meta = dict(device=str(device), threads=torch.get_num_threads(), grammar=gdesc, copy_gbs=bw,
                value_frac=args.value_frac, torch=torch.__version__, note=xgr_note)
    if args.json:
        Path(args.json).write_text(json.dumps(dict(meta=meta, results=results), indent=1))
        print(f"# wrote {args.json}")
    finish_plot(args, draw, dict(meta=meta, results=results), args.json)


if __name__ == "__main__":
    sys.exit(main())
