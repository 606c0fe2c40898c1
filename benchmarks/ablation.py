"""The ablation's plot: the JSON `batchmask ablate --json FILE` writes (constrained vs free on the same model and
held-out tasks), drawn as the share of trials parsed as a call, with the right tool and with the right argument,
per arm.

    python benchmarks/ablation.py --plot-from benchmarks/results/ablation_default.json [--plot PNG]

The ablation itself runs through the CLI (batchmask/evaluation/ablation.py), which does not depend on matplotlib;
this script only draws what it wrote.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # runnable as a script from anywhere (last: see tests/conftest.py)

from benchmarks.common import add_plot_options, replot  # noqa: E402

MEASURES = {"parsed": "parsed as a call", "usable": "right tool", "right_arg": "right argument"}  # JSON key: label


def draw(plt, out: dict):
    """A group of bars per measure (share of trials), a bar per arm; tokens/s per arm in the legend."""
    arms = [a for a in ("constrained", "free") if a in out]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    w = 0.8 / max(len(arms), 1)
    for i, arm in enumerate(arms):
        r = out[arm]
        ax.bar([j + (i - (len(arms) - 1) / 2) * w for j in range(len(MEASURES))],
               [r[m] / r["trials"] for m in MEASURES], w,
               label=f"{arm} ({r['tokens'] / r['seconds']:.0f} tok/s)")
    ax.set_xticks(range(len(MEASURES)), list(MEASURES.values()))
    ax.set(ylim=(0, 1.05), ylabel="share of trials",
           title=f"ablation, {out[arms[0]]['trials']} held-out tasks" if arms else "ablation")
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_plot_options(ap)
    args = ap.parse_args(argv)
    if not args.plot_from:
        ap.error("--plot-from JSON is needed (the ablation runs through `batchmask ablate --json FILE`)")
    return replot(args, draw)


if __name__ == "__main__":
    sys.exit(main())
