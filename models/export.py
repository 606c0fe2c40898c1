"""Convert a llama2.c checkpoint between its formats.

    python -m batchmask.models.export IN.bin OUT.bin --version 2 [--group-size 64]

version 0: llama2.c's legacy float32 layout (what stories15M/42M/110M ship as); 1: the `ak42`
float32 layout with a 256-byte header; 2: int8 Q8_0 with per-group float32 scales (runq.c's).
Reading validates IN fully (models/checkpoint.py); writing goes to a temporary file first.
"""
from __future__ import annotations

import argparse
import sys

from .checkpoint import CheckpointError, read_checkpoint, write_checkpoint


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m batchmask.models.export", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", help="checkpoint to read (any version)")
    ap.add_argument("dst", help="checkpoint to write")
    ap.add_argument("--version", type=int, choices=(0, 1, 2), default=0)
    ap.add_argument("--group-size", type=int, default=64, help="version 2: values per quantisation group")
    args = ap.parse_args(argv)
    try:
        config, weights = read_checkpoint(args.src)
        used = write_checkpoint(args.dst, config, weights, version=args.version, group_size=args.group_size)
    except (CheckpointError, OSError, ValueError) as e:
        print(f"export: error: {e}", file=sys.stderr)
        return 2
    extra = f", group size {used}" if used else ""
    print(f"wrote {args.dst}: version {args.version}{extra}, dim {config.dim}, {config.n_layers} layers, "
          f"vocab {config.vocab_size}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
