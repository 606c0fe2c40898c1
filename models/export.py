"""Convert a checkpoint to llama2.c's formats: a llama2.c file (any version) or a Hugging Face model directory.

    python -m batchmask.models.export IN OUT.bin --version 2 [--group-size 64] [--max-context N]

IN: a llama2.c checkpoint (v0/v1/v2), or a HF directory (config.json + safetensors) whose model llama2.c can
express: run.c fixes RoPE (base 10000, no scaling) and RMSNorm (eps 1e-5), has no biases, and derives
head_dim = dim / n_heads; anything else is refused, saying what llama2.c lacks. HF q/k rows are stored in
llama2.c's RoPE pair order (as llama2.c's own export.py does); the header's seq_len is the HF context
(max_position_embeddings, capped by --max-context).
version 0: llama2.c's legacy float32 layout (what stories15M/42M/110M ship as); 1: the `ak42` float32 layout
with a 256-byte header; 2: int8 Q8_0 with per-group float32 scales (runq.c's).
Reading validates IN fully (NaN/Inf weights included); writing goes to a temporary file first.
"""
from __future__ import annotations

import argparse
import os
import sys

from .checkpoint import CheckpointError, read_checkpoint, write_checkpoint
from .hf import HFCheckpoint, hf_directory, resolve_checkpoint


def read_any(src, max_context: int | None = None):
    """(config, weights) of a llama2.c file or of a HF directory that llama2.c can express."""
    src = resolve_checkpoint(src)
    if hf_directory(src) is None:
        return read_checkpoint(src)
    ckpt = HFCheckpoint(src, max_context=max_context)
    reasons = ckpt.config.llama2c_incompatibilities()
    if reasons:
        raise CheckpointError(ckpt.dir / "config.json", "config", "a model llama2.c's formats can express",
                              "; ".join(reasons))
    return ckpt.config, ckpt.weights()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m batchmask.models.export", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", help="llama2.c checkpoint (any version) or Hugging Face model directory")
    ap.add_argument("dst", help="checkpoint to write")
    ap.add_argument("--version", type=int, choices=(0, 1, 2), default=0)
    ap.add_argument("--group-size", type=int, default=64, help="version 2: values per quantisation group")
    ap.add_argument("--max-context", type=int, default=None, help="HF input: cap on seq_len (default: "
                    "max_position_embeddings)")
    args = ap.parse_args(argv)
    try:
        if args.max_context is not None and args.max_context <= 0:
            raise ValueError(f"--max-context must be a positive integer, got {args.max_context}")
        if os.path.exists(args.dst) and os.path.exists(args.src) and os.path.samefile(args.src, args.dst):
            raise ValueError(f"{args.dst}: the output is the input checkpoint; write the conversion elsewhere")
        config, weights = read_any(args.src, args.max_context)
        used = write_checkpoint(args.dst, config, weights, version=args.version, group_size=args.group_size)
    except (CheckpointError, OSError, ValueError) as e:
        print(f"export: error: {e}", file=sys.stderr)
        return 2
    extra = f", group size {used}" if used else ""
    print(f"wrote {args.dst}: version {args.version}{extra}, dim {config.dim}, {config.n_layers} layers, "
          f"vocab {config.vocab_size}, seq_len {config.seq_len}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
