"""Compile time of each JSON Schema string `format`: the figures docs/json-schema.md quotes (tests/test_doc_figures.py
checks the doc against the JSON this writes).

    python benchmarks/formats.py [--tokenizer PATH ...] [--json benchmarks/results/formats.json] [--plot PNG]
    python benchmarks/formats.py --plot-from benchmarks/results/formats.json      (redraw the plot, no run)

Each format is one required string property of an object schema, compiled with `compile_json_schema` once, after
a warm-up compile on the same tokenizer (its preparation, shared by every grammar, is not counted). One compile
each: the figures give the scale (tens of milliseconds or most of a second), not a precise timing; the JSON
records the machine and its load average. The plot (beside the JSON, or --plot): compile ms per format, a bar per
tokenizer.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # runnable as a script from anywhere (last: see tests/conftest.py)

from batchmask.models.tokenizer import load_tokenizer  # noqa: E402

from batchmask import compile_json_schema  # noqa: E402
from benchmarks.common import add_plot_options, finish_plot, replot  # noqa: E402

FORMATS = ("date", "time", "date-time", "uuid", "ipv4", "hostname", "email", "uri")
# the vendored Llama 2 vocabulary (docs/json-schema.md's figures) and the embedded model's own small one
TOKENIZERS = (ROOT / "tests" / "data" / "llama2" / "tokenizer.model", ROOT / "models" / "default" / "tokenizer.model")


def schema_of(fmt: str) -> dict:
    return {"type": "object", "properties": {"v": {"type": "string", "format": fmt}}, "required": ["v"]}


def measure(path: Path) -> dict:
    tok = load_tokenizer(path)
    compile_json_schema({"type": "object", "properties": {"v": {"type": "string"}}, "required": ["v"]}, tok)
    rows = {}
    for fmt in FORMATS:
        t = time.perf_counter()
        g = compile_json_schema(schema_of(fmt), tok)
        ms = (time.perf_counter() - t) * 1e3
        rows[fmt] = {"ms": round(ms), "states": g.num_states, "device_bytes": g.nbytes}
        print(f"{path.parent.name + '/' + path.name:32} {fmt:10} {ms:8.0f} ms  {g.num_states:7} states", flush=True)
    return {"tokenizer": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path),
            "vocab_size": tok.vocab_size, "formats": rows}


def draw(plt, out: dict):
    """Compile ms per format, a bar per tokenizer (its vocabulary size in the legend)."""
    runs = out["runs"]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    formats = list(runs[0]["formats"]) if runs else []
    w = 0.8 / max(len(runs), 1)
    for i, run in enumerate(runs):
        ax.bar([j + (i - (len(runs) - 1) / 2) * w for j in range(len(formats))],
               [run["formats"].get(f, {}).get("ms", 0) for f in formats], w,
               label=f"{run['tokenizer']} ({run['vocab_size']:,} ids)")
    ax.set_xticks(range(len(formats)), formats)
    ax.set(yscale="log", ylabel="compile ms (one compile each)",
           title=f"JSON Schema string formats, {out['cpus']} CPUs, load {out['load_average_1min']}")
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", action="append", type=Path, help="tokenizer file (repeatable; default: "
                    "the vendored Llama 2 vocabulary and the embedded model's)")
    ap.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "formats.json",
                    help="where to write the figures (default: %(default)s)")
    add_plot_options(ap)
    args = ap.parse_args(argv)
    if args.plot_from:
        return replot(args, draw)
    load = os.getloadavg()[0]
    print(f"# format compile times -- {platform.machine()}, {os.cpu_count()} CPUs, load average {load:.2f}")
    out = {"benchmark": "formats", "date": time.strftime("%Y-%m-%d"), "machine": platform.machine(),
           "cpus": os.cpu_count(), "load_average_1min": round(load, 2), "repeats": 1,
           "runs": [measure(p) for p in (args.tokenizer or TOKENIZERS)]}
    args.json.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.json}")
    finish_plot(args, draw, out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
