"""A run's tasks in waves: at most `max_sets` distinct tool sets share one table.

One table for every tool set of a run grows with the number of distinct sets: an evaluation in which
every example brings its own functions (BFCL-style, thousands of them) would need a table of hundreds
of MB on the device and gigabytes of host memory to build it. So `batchmask generate` cuts the run's
tasks, in order, into waves whose tasks use at most `max_sets` distinct tool sets
(`--max-sets-per-table`), and runs the waves one after another, each with its own table:

  * every wave's table is compiled (or read from the grammar cache) before the first token, so a bad
    tool set still ends the run before anything is written;
  * a wave's table is on the device only while the wave runs: with a grammar cache directory the
    later waves are read back from their files when their turn comes; without one (`none`) they
    wait in host memory;
  * a task draws the same tokens in whichever wave, slot or batch it runs (the draws are keyed by
    the task), so cutting a run into waves changes no result; the batch drains at each wave's end.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .grammar_store import TaskPlan, cache_dir_of, run_grammars

DEFAULT_MAX_SETS = 64


@dataclass
class Wave:
    """Positions lo..hi-1 of the run's task list, their table, tool sets and each task's set."""
    lo: int
    hi: int
    table: object | None          # None: read again from the grammar cache when the wave runs
    registries: list
    groups: list[int]             # per task of the wave, an index into registries
    sampling: tuple | None = None  # (temperature, top_p) of every task of the wave, None: the run's

    def config(self, run_config):
        """The run's GenerationConfig with the wave's own sampling, if it has one."""
        if self.sampling is None:
            return run_config
        return replace(run_config, temperature=self.sampling[0], top_p=self.sampling[1])


def cut_waves(groups: list[int], max_sets: int, sampling: list | None = None) -> list[tuple[int, int]]:
    """Consecutive ranges of tasks (lo, hi), each using at most max_sets distinct groups (greedy, in order) and,
    given `sampling` (a value per task), one value of it."""
    if max_sets < 1:
        raise ValueError(f"--max-sets-per-table must be >= 1, got {max_sets}")
    out, lo, seen = [], 0, set()
    for i, g in enumerate(groups):
        new_setting = sampling is not None and i > lo and sampling[i] != sampling[lo]
        if (g not in seen and len(seen) == max_sets) or new_setting:
            out.append((lo, i))
            lo, seen = i, set()
        seen.add(g)
    if lo < len(groups) or not out:
        out.append((lo, len(groups)))
    return out


def prepare_waves(args, plan: TaskPlan, todo: list[int], tokenizer, device, max_sets: int,
                  sampling: list | None = None) -> list[Wave]:
    """Every wave's table compiled or loaded (see the module docstring); the first one kept on the device.
    `sampling`: (temperature, top_p) per task of `todo` (None: the run's), a Batch API file's per request."""
    ranges = cut_waves([plan.groups[i] for i in todo], max_sets, sampling)
    cached = cache_dir_of(getattr(args, "grammar_cache", None)) is not None
    waves = []
    for k, (lo, hi) in enumerate(ranges):
        table, regs, groups = run_grammars(args, plan, todo[lo:hi], tokenizer, device)
        if k > 0 and table is not None:
            table = None if cached else table.to("cpu")                     # read back / moved when it runs
        waves.append(Wave(lo, hi, table, regs, groups, sampling[lo] if sampling else None))
    return waves


def wave_table(wave: Wave, args, plan: TaskPlan, todo: list[int], tokenizer, device):
    """The wave's table on the device (read from the grammar cache, or moved from host memory)."""
    if wave.table is None and not args.no_constrain:
        wave.table = run_grammars(args, plan, todo[wave.lo:wave.hi], tokenizer, device)[0]
    table = wave.table
    if table is not None and table.device != torch.device(device):
        table = table.to(device)
    return table


def run_waves(waves: list[Wave], generator, inputs: list, todo: list[int], limits: list[int], on_result, progress,
              done: list[int], keys: list | None = None) -> None:
    """Each wave through its own generator (generator(wave) -> BatchGenerator), one after another; `done`
    ([tasks, tokens], updated in place) and `progress` count across waves."""
    def on_progress(n: int, tokens: int) -> None:
        progress(done[0] + n, done[1] + tokens)
    for w in waves:
        gen = generator(w)
        stats = gen.run(inputs[w.lo:w.hi], indices=todo[w.lo:w.hi], on_result=on_result, on_progress=on_progress,
                        limits=limits[w.lo:w.hi], groups=w.groups, keys=keys[w.lo:w.hi] if keys else None)
        done[0] += stats.tasks
        done[1] += stats.tokens
        w.table = None                      # its device memory is free before the next wave's table arrives
        del gen
