"""Compile-time and size benchmark for the token table.

    python benchmarks/compile.py [--json out.json] [--quick]

For the default registry on the Llama 2 vocabulary (../shared/llama2) and on a synthetic
128K-token vocabulary: states, token classes, device bytes, cold compile time (each run in a
fresh process, median of 3), warm compile time, cache load time; plus max_string=4096 and
utf8=False. Prints a table and writes JSON.
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
LLAMA = ROOT.parent / "shared" / "llama2" / "tokenizer.model"


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
    return SimpleNamespace(token_bytes=out, eos_id=2)


def load_vocab(name: str):
    if name == "llama2":
        from batchmask.models.tokenizer import load_tokenizer
        return load_tokenizer(LLAMA)
    return synthetic_vocab(int(name.removeprefix("synthetic")))


def one_run(vocab_name: str, max_string: int, utf8: bool, device: str) -> dict:
    """Runs inside a fresh process: the first compile there is the cold one."""
    import torch

    from batchmask.compiler import CompiledGrammar, compile_grammar
    from batchmask.registry import ToolRegistry

    vocab = load_vocab(vocab_name)
    reg = ToolRegistry.defaults()
    t = time.perf_counter()
    g = compile_grammar(reg, vocab, max_string=max_string, utf8=utf8, device=device)
    if g.device.type == "cuda":
        torch.cuda.synchronize()
    cold = time.perf_counter() - t
    warm = []
    for _ in range(3):
        t = time.perf_counter()
        compile_grammar(reg, vocab, max_string=max_string, utf8=utf8, device=device)
        warm.append(time.perf_counter() - t)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "g.pt"
        g.save(path)
        loads = []
        for _ in range(3):
            t = time.perf_counter()
            CompiledGrammar.load(path, device=device, registry=reg, tokenizer=vocab)
            loads.append(time.perf_counter() - t)
        file_bytes = path.stat().st_size
    return {"states": g.num_states, "classes": g.num_classes, "vocab": g.vocab_size, "device_bytes": g.nbytes,
            "rows": g.num_rows, "table_dtype": str(g.row_next.dtype).removeprefix("torch."), "cold_s": cold,
            "warm_s": statistics.median(warm), "load_s": statistics.median(loads), "file_bytes": file_bytes}


def cold_median(vocab_name, max_string, utf8, device, repeats) -> dict:
    runs = []
    for _ in range(repeats):
        cmd = [sys.executable, __file__, "--child", vocab_name, str(max_string), str(int(utf8)), device]
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
        if out.returncode != 0:
            raise SystemExit(f"child run failed:\n{out.stderr}")
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    res = dict(runs[0])
    for k in ("cold_s", "warm_s", "load_s"):
        res[k] = statistics.median(r[k] for r in runs)
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default="benchmarks/compile.json")
    ap.add_argument("--quick", action="store_true", help="one fresh process per case instead of three")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        v, m, u, d = args.child
        print(json.dumps(one_run(v, int(m), bool(int(u)), d)))
        return
    if not LLAMA.exists():
        raise SystemExit(f"{LLAMA} not found: the benchmark needs ../shared/llama2 beside the checkout")
    repeats = 1 if args.quick else 3
    cases = [("llama2", 256, True), ("llama2", 256, False), ("llama2", 4096, True),
             ("synthetic128000", 256, True)]
    rows = []
    print(f"{'vocab':>16} {'max_str':>7} {'utf8':>5} {'states':>7} {'rows':>5} {'classes':>7} {'dev bytes':>10} "
          f"{'cold ms':>8} {'warm ms':>8} {'load ms':>8}")
    for vocab, max_string, utf8 in cases:
        r = cold_median(vocab, max_string, utf8, args.device, repeats)
        r.update(vocab_name=vocab, max_string=max_string, utf8=utf8)
        rows.append(r)
        print(f"{vocab:>16} {max_string:>7} {str(utf8):>5} {r['states']:>7} {r['rows']:>5} {r['classes']:>7} "
              f"{r['device_bytes']:>10,} {r['cold_s'] * 1e3:>8.1f} {r['warm_s'] * 1e3:>8.1f} {r['load_s'] * 1e3:>8.1f}",
              flush=True)
    out = {"benchmark": "compile", "date": time.strftime("%Y-%m-%d"), "machine": platform.machine(),
           "cpus": os.cpu_count(), "device": args.device, "repeats": repeats, "rows": rows}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
