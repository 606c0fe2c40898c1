"""Compile-time and size benchmark for the token table, beside xgrammar's and llguidance's compile times.

    python benchmarks/compile.py [--json out.json] [--quick] [--no-peers] [--plot out.png]
    python benchmarks/compile.py --plot-from out.json [--plot out.png]      (redraw the plot, no run)

Each case runs in a fresh process (median of 3; --quick: 1): states, rows, token classes, device
bytes, cold compile (the first compile in the process, tokenizer already loaded), warm compile
(median of 3 more in the same process) and cache load. Cases:

    default registry (seed format) on Llama 2: max_string 256 (utf8 and --bytes), 4096; on a synthetic
        128K vocabulary; on Qwen2 (152K ids)
    the shared 12-tool catalogue (../shared/tools/agent_tools.json, format json) on Llama 2, and on Qwen2
    one tool with one string argument of maxLength 40, and of maxLength 4000 (format json) on Llama 2
    peers, same process protocol: xgrammar (compile_json_schema of the call's JSON Schema, compact) and
        llguidance (matcher built, first mask computed) on the catalogue (both vocabularies) and the two
        string tools; a peer that is not installed is skipped with a one-line note

Then the targets (issue 13): catalogue <= 300 ms and <= 4 MB (aim 50 ms, 1 MB); maxLength 4000 costs
<= 2x maxLength 40; Qwen2 cold <= 4x Llama 2's cold compile and <= 4x its bytes. Prints a table and
writes JSON, and the plot beside it (or at --plot): cold and warm compile ms per case, ours beside the peers'.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # runnable as a script from anywhere (last: see tests/conftest.py)

from benchmarks.common import add_plot_options, finish_plot, optional_import, replot, shared_or_vendored  # noqa: E402

LLAMA = shared_or_vendored("llama2/tokenizer.model")
QWEN = ROOT.parent / "shared" / "qwen2" / "tokenizer.json"        # vendored only xz-packed (tests/data_paths.py)
CATALOGUE = shared_or_vendored("tools/agent_tools.json")
PEERS = ("xgrammar", "llguidance")     # each engine is the module of its name


# --- inputs -------------------------------------------------------------------------------------------
def synthetic_vocab(size: int, seed: int = 0):
    """A 128K-style vocabulary: Llama 2's pieces, then pairs of them and multilingual pieces."""
    import random
    from types import SimpleNamespace

    from batchmask.models.tokenizer import load_tokenizer

    base = load_tokenizer(LLAMA).token_bytes
    rng = random.Random(seed)
    scripts = [(0x0400, 0x04FF), (0x0600, 0x06FF), (0x0900, 0x097F), (0x3040, 0x30FF), (0x4E00, 0x9FFF),
               (0xAC00, 0xD7A3), (0x1F300, 0x1F64F)]
    seen = set(base)
    out = list(base)
    while len(out) < size:
        r = rng.random()
        if r < 0.5:
            t = rng.choice(base[259:]) + rng.choice(base[259:]).lstrip(b" ")
        else:
            lo, hi = rng.choice(scripts)
            t = (" " * rng.randint(0, 1) + "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 3)))).encode()
        if t not in seen and len(t) <= 48:
            seen.add(t)
            out.append(t)
    return SimpleNamespace(token_bytes=out, eos_id=2, stop_ids=(2,))


def load_vocab(name: str):
    from batchmask.models.tokenizer import load_tokenizer
    if name == "llama2":
        return load_tokenizer(LLAMA)
    if name == "qwen2":
        return load_tokenizer(QWEN)
    return synthetic_vocab(int(name.removeprefix("synthetic")))


def string_tool(n: int) -> dict:
    return {"tools": [{"type": "function", "function": {
        "name": "echo", "description": "Repeat a text.",
        "parameters": {"type": "object", "properties": {"text": {"type": "string", "maxLength": n}},
                       "required": ["text"]}}}]}


def load_registry(name: str):
    from batchmask.tools.registry import ToolRegistry
    if name == "default":
        return ToolRegistry.defaults()
    if name == "catalogue":
        return ToolRegistry.from_json(CATALOGUE)
    return ToolRegistry.from_obj(string_tool(int(name.removeprefix("string"))), source=name)


# --- one case, inside a fresh process ---------------------------------------------------------------
def run_ours(case: dict) -> dict:
    import torch

    from batchmask import compile_grammar
    from batchmask.api import load_grammar

    t = time.perf_counter()
    vocab = load_vocab(case["vocab"])
    tokenizer_s = time.perf_counter() - t
    reg = load_registry(case["registry"])
    kw = dict(format=case["format"], max_string=case["max_string"], utf8=case["utf8"], device=case["device"])
    t = time.perf_counter()
    g = compile_grammar(reg, vocab, **kw)
    if g.device.type == "cuda":
        torch.cuda.synchronize()
    cold = time.perf_counter() - t
    warm = []
    for _ in range(3):
        t = time.perf_counter()
        compile_grammar(reg, vocab, **kw)
        warm.append(time.perf_counter() - t)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "g.pt"
        g.save(path)
        loads = []
        for _ in range(3):
            t = time.perf_counter()
            load_grammar(path, reg, vocab, **kw)
            loads.append(time.perf_counter() - t)
        file_bytes = path.stat().st_size
    return {"states": g.num_states, "classes": g.num_classes, "vocab_size": g.vocab_size, "device_bytes": g.nbytes,
            "rows": g.num_rows, "table_dtype": str(g.row_next.dtype).removeprefix("torch."), "cold_s": cold,
            "warm_s": statistics.median(warm), "load_s": statistics.median(loads), "file_bytes": file_bytes,
            "tokenizer_s": tokenizer_s}


def run_peer(case: dict) -> dict:
    from batchmask.tools.envelope import call_schema

    vocab = load_vocab(case["vocab"])
    reg = load_registry(case["registry"])
    schema = call_schema(reg, case["format"], case["max_string"])
    stops = list(getattr(vocab, "stop_ids", (vocab.eos_id,)))
    if case["engine"] == "xgrammar":
        import xgrammar as xgr
        t = time.perf_counter()
        info = xgr.TokenizerInfo(list(vocab.token_bytes), vocab_type=xgr.VocabType.RAW,
                                 vocab_size=len(vocab.token_bytes), stop_token_ids=stops)
        tokenizer_s = time.perf_counter() - t

        def build():
            compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
            return compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":"),
                                                strict_mode=True)
        t = time.perf_counter()
        compiled = build()
        cold = time.perf_counter() - t
        warm = []
        for _ in range(2):
            t = time.perf_counter()
            build()
            warm.append(time.perf_counter() - t)
        return {"cold_s": cold, "warm_s": statistics.median(warm), "tokenizer_s": tokenizer_s,
                "device_bytes": int(compiled.memory_size_bytes) if hasattr(compiled, "memory_size_bytes") else None}
    import llguidance as llg
    import numpy as np
    t = time.perf_counter()
    from benchmarks.common import LLGuidanceTokens
    lt = llg.LLTokenizer(LLGuidanceTokens(vocab), eos_token=stops)
    tokenizer_s = time.perf_counter() - t
    grammar = llg.LLMatcher.grammar_from_json_schema(
        schema, defaults={"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"})

    def build():
        m = llg.LLMatcher(lt, grammar, log_level=0)
        np.frombuffer(m.compute_bitmask(), dtype=np.uint8)       # its lexer is built lazily: one mask
        if m.is_error():
            raise SystemExit(f"llguidance: {m.get_error()}")
    t = time.perf_counter()
    build()
    cold = time.perf_counter() - t
    warm = []
    for _ in range(3):
        t = time.perf_counter()
        build()
        warm.append(time.perf_counter() - t)
    return {"cold_s": cold, "warm_s": statistics.median(warm), "tokenizer_s": tokenizer_s}


def one_run(case: dict) -> dict:
    return run_ours(case) if case["engine"] == "batchmask" else run_peer(case)


def cold_median(case: dict, repeats: int) -> dict:
    runs = []
    for _ in range(repeats):
        cmd = [sys.executable, __file__, "--child", json.dumps(case)]
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
        if out.returncode != 0:
            raise SystemExit(f"child run failed ({case}):\n{out.stderr[-3000:]}")
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    res = dict(runs[0])
    for k in ("cold_s", "warm_s", "load_s", "tokenizer_s"):
        if k in res:
            res[k] = statistics.median(r[k] for r in runs)
    return {**case, **res}


def peers(wanted: bool = True) -> tuple[list[str], list[str]]:
    """(engines to run, notes): each peer that imports here; one note per peer skipped (before any case runs,
    instead of a child's ModuleNotFoundError)."""
    if not wanted:
        return [], ["xgrammar, llguidance: skipped (--no-peers)"]
    engines, notes = [], []
    for engine in PEERS:
        module, note = optional_import(engine, "its cases are")
        if module is None:
            notes.append(note)
        else:
            engines.append(engine)
    return engines, notes


# --- the table ------------------------------------------------------------------------------------------
def _case(vocab, registry, fmt="seed", max_string=256, utf8=True, engine="batchmask", device="cpu"):
    return {"vocab": vocab, "registry": registry, "format": fmt, "max_string": max_string, "utf8": utf8,
            "engine": engine, "device": device}


def _fmt(v, scale=1e3, width=8, prec=1):
    return f"{'-':>{width}}" if v is None else f"{v * scale:>{width}.{prec}f}"


def targets(rows: list[dict]) -> list[str]:
    def find(**kw):
        for r in rows:
            if all(r.get(k) == v for k, v in kw.items()):
                return r
        return None
    out = []
    cat = find(registry="catalogue", engine="batchmask")
    if cat:
        out.append(f"catalogue x Llama 2: cold {cat['cold_s'] * 1e3:.1f} ms (target <= 300, aim 50), "
                   f"{cat['device_bytes'] / 2**20:.2f} MB (target <= 4, aim 1)")
    s40, s4k = find(registry="string40", engine="batchmask"), find(registry="string4000", engine="batchmask")
    if s40 and s4k:
        out.append(f"maxLength 4000 / 40: cold {s4k['cold_s'] / s40['cold_s']:.2f}x, warm "
                   f"{s4k['warm_s'] / s40['warm_s']:.2f}x, bytes {s4k['device_bytes'] / s40['device_bytes']:.2f}x "
                   "(target <= 2x)")
    q, ll = find(vocab="qwen2", registry="default"), find(vocab="llama2", registry="default", max_string=256,
                                                          utf8=True, engine="batchmask")
    if q and ll:
        out.append(f"Qwen2 / Llama 2, default registry: cold {q['cold_s'] / ll['cold_s']:.2f}x, bytes "
                   f"{q['device_bytes'] / ll['device_bytes']:.2f}x (targets <= 4x)")
    return out


def _label(r: dict) -> str:
    """A case's name on the plot: what differs from the default case."""
    parts = [r["vocab"].replace("synthetic128000", "synth 128K"), r["registry"]]
    if r["max_string"] != 256:
        parts.append(f"max {r['max_string']}")
    if not r["utf8"]:
        parts.append("bytes")
    return " ".join(parts)


COLOURS = {"batchmask": "C0", "xgrammar": "C2", "llguidance": "C3"}


def draw(plt, out: dict):
    """Cold and warm compile ms per case: ours on every case (left), then on the cases the peers also run, each
    engine beside ours (right); log scale (the peers are milliseconds, a 128K vocabulary hundreds)."""
    rows = out["rows"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [3, 2]})
    ours = [r for r in rows if r["engine"] == "batchmask"]
    xs = range(len(ours))
    a.bar([x - 0.2 for x in xs], [r["cold_s"] * 1e3 for r in ours], 0.4, label="cold (fresh process)")
    a.bar([x + 0.2 for x in xs], [r["warm_s"] * 1e3 for r in ours], 0.4, label="warm")
    a.set_xticks(list(xs), [_label(r) for r in ours], rotation=30, ha="right")
    a.set(yscale="log", ylabel="compile ms", title=f"batchmask, {out['device']}, median of {out['repeats']}")
    def case(r):                        # a case the peers run: the registry, with its vocabulary past Llama 2
        return r["registry"] if r["vocab"] == "llama2" else f"{r['vocab']} {r['registry']}"
    shared = list(dict.fromkeys(case(r) for r in rows if r["engine"] != "batchmask"))
    engines = list(dict.fromkeys(r["engine"] for r in rows if case(r) in shared))
    w = 0.8 / max(len(engines), 1)
    for i, engine in enumerate(engines):
        cold = {case(r): r["cold_s"] * 1e3 for r in rows if r["engine"] == engine}
        b.bar([j + (i - (len(engines) - 1) / 2) * w for j in range(len(shared))],
              [cold.get(c, 0) for c in shared], w, label=engine, color=COLOURS.get(engine, f"C{i + 4}"))
    b.set_xticks(range(len(shared)), shared)
    b.set(yscale="log", ylabel="cold compile ms", title="against the peers (json)")
    if not shared:
        b.text(0.5, 0.5, "no peer ran", ha="center", transform=b.transAxes)
    for ax in (a, b) if shared else (a,):
        ax.set_ylim(top=ax.get_ylim()[1] * 4)  # headroom above the tallest bar for the legend
        ax.grid(axis="y", alpha=0.3)
        ax.legend(loc="upper left")
    fig.tight_layout()
    return fig


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default="benchmarks/compile.json")
    ap.add_argument("--quick", action="store_true", help="one fresh process per case instead of three")
    ap.add_argument("--no-peers", action="store_true", help="skip xgrammar and llguidance")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    add_plot_options(ap)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(one_run(json.loads(args.child))))
        return 0
    if args.plot_from:
        return replot(args, draw)
    for p in (LLAMA, CATALOGUE):
        if not p.exists():
            raise SystemExit(f"{p} not found: the benchmark needs ../shared beside the checkout or tests/data")
    repeats = 1 if args.quick else 3
    d = args.device
    engines, peer_notes = peers(not args.no_peers)
    for line in peer_notes:
        print(line, flush=True)
    cases = [_case("llama2", "default", device=d), _case("llama2", "default", utf8=False, device=d),
             _case("llama2", "default", max_string=4096, device=d), _case("synthetic128000", "default", device=d)]
    if QWEN.exists():
        cases.append(_case("qwen2", "default", device=d))
    for reg in ("catalogue", "string40", "string4000"):
        cases.append(_case("llama2", reg, "json", device=d))
        cases += [_case("llama2", reg, "json", engine=e) for e in engines]
    if QWEN.exists():                   # a tool set on a 152K vocabulary: what a server compiles per request today
        cases.append(_case("qwen2", "catalogue", "json", device=d))
        cases += [_case("qwen2", "catalogue", "json", engine=e) for e in engines]
    rows = []
    print(f"{'vocab':>15} {'registry':>10} {'fmt':>4} {'max_str':>7} {'utf8':>5} {'engine':>10} {'states':>7} "
          f"{'rows':>5} {'classes':>7} {'dev bytes':>10} {'cold ms':>8} {'warm ms':>8} {'load ms':>8}")
    for case in cases:
        r = cold_median(case, repeats)
        rows.append(r)
        dev_bytes = f"{r['device_bytes']:>10,}" if r.get("device_bytes") is not None else f"{'-':>10}"
        print(f"{r['vocab']:>15} {r['registry']:>10} {r['format']:>4} {r['max_string']:>7} {str(r['utf8']):>5} "
              f"{r['engine']:>10} {r.get('states', '-'):>7} {r.get('rows', '-'):>5} {r.get('classes', '-'):>7} "
              f"{dev_bytes} {_fmt(r['cold_s'])} {_fmt(r['warm_s'])} {_fmt(r.get('load_s'))}", flush=True)
    notes = targets(rows)
    for line in notes:
        print(line)
    out = {"benchmark": "compile", "date": time.strftime("%Y-%m-%d"), "machine": platform.machine(),
           "cpus": os.cpu_count(), "device": args.device, "repeats": repeats, "rows": rows, "targets": notes,
           "skipped": peer_notes,
           "notes": "cold: the first compile in a fresh process, tokenizer already loaded (tokenizer_s: its load); "
                    "warm: median of the next compiles in that process. xgrammar: compile_json_schema of the "
                    "call's JSON Schema (compact, strict, cache off, 1 thread); llguidance: LLMatcher built and "
                    "its first mask computed (it builds lazily)."}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.json}")
    finish_plot(args, draw, out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
