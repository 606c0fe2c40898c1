"""Bounds on every number a user can give: flag parsers, seed reduction, and the batch-memory check.

A number out of range ends as one line naming the flag (or field), the range and the value, before
anything is allocated or written: no integer overflow, no allocator error, no hour-long loop.

    seeds          any integer, reduced to 63 bits (seed mod 2**63); a task's own seed is derived from
                   (seed, task index) in the same 63 bits, so it always fits an int64 tensor
    --max-string   at most MAX_STRING (65536) bytes per argument value (the grammar grows linearly with it:
                   about 4 s and 10 MB to compile at the maximum on a 2-core CPU)
    --batch-size   clamped to the number of tasks, then refused if its KV cache and per-row buffers do not
                   fit the memory the device has free (see check_batch_fits)
"""
from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

SEED_BITS = 63
SEED_MOD = 1 << SEED_BITS
MAX_STRING = 65536                      # bytes of one argument value
MAX_BATCH = 1 << 24                     # parse-time cap; the real one is memory (check_batch_fits)
MAX_TOKENS = (1 << 31) - 1              # parse-time cap; the real one is the model's context
MAX_ABLATE_N = 100_000                  # trials per arm of `batchmask ablate`
MAX_TEMPERATURE = 1000.0


# --- flag parsers (argparse `type=`) --------------------------------------------------------------
def int_arg(lo: int, hi: int):
    """An argparse type: a whole number in [lo, hi] ("1e20", "2.5" and out-of-range values refused cleanly)."""
    def parse(text: str) -> int:
        try:
            value = int(text.strip(), 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number from {lo} to {hi}, got {text[:40]!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"expected a whole number from {lo} to {hi}, got {_short(value)}")
        return value
    parse.__name__ = "int"
    return parse


def float_arg(lo: float, hi: float, lo_open: bool = False):
    """An argparse type: a finite number in [lo, hi] ((lo, hi] with lo_open); nan and inf refused."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text[:40]!r}") from None
        if not math.isfinite(value) or value > hi or value < lo or (lo_open and value == lo):
            span = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
            raise argparse.ArgumentTypeError(f"expected a finite number in {span}, got {text[:40]!r}")
        return value
    parse.__name__ = "float"
    return parse


def seed_arg(text: str) -> int:
    """An argparse type: any integer, reduced to 63 bits."""
    try:
        return reduce_seed(int(text.strip(), 10))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text[:40]!r}") from None


def _short(value: int) -> str:
    s = str(value)
    return s if len(s) <= 24 else f"{s[:8]}...({len(s)} digits)"


# --- seeds ----------------------------------------------------------------------------------------
def reduce_seed(seed: int) -> int:
    """Any integer -> [0, 2**63): seed mod 2**63 (small non-negative seeds are unchanged)."""
    return int(seed) % SEED_MOD


def task_seed(seed: int, index: int) -> int:
    """The seed of task `index` of a run seeded `seed`: keyed by the task, not its slot, in 63 bits."""
    return (reduce_seed(seed) * 1_000_003 + int(index)) % SEED_MOD


# --- memory ---------------------------------------------------------------------------------------
def kv_cache_bytes(config, batch_size: int, context: int, dtype) -> int:
    """Bytes of the static K and V caches for `batch_size` rows of `context` positions (the model's own count)."""
    from batchmask.models.llama import kv_cache_bytes as model_kv_cache_bytes
    return int(model_kv_cache_bytes(config, batch_size, context, dtype))


def generation_bytes(config, batch_size: int, max_new_tokens: int, dtype) -> tuple[int, int]:
    """(total, kv) bytes a BatchGenerator of `batch_size` rows allocates: the KV cache plus, per row, the float32
    logits and the sampler's temporaries over the vocabulary, the attention scores and the token history."""
    kv = kv_cache_bytes(config, batch_size, config.seq_len, dtype)
    per_row = (4 * 4 * config.vocab_size                                 # logits, decode output, 2 sampling temps
               + 2 * 4 * config.n_heads * config.seq_len                 # one step's attention scores (+ softmax)
               + 4 * 4 * max(config.dim, config.hidden_dim)              # activations
               + (max_new_tokens + 1) * (8 + 4 + 8))                     # history, counts, masker's per-row log
    return kv + batch_size * per_row, kv


def available_memory(device) -> int | None:
    """Bytes free for new tensors on `device` (None when unknown: then nothing is refused)."""
    kind = getattr(device, "type", str(device).split(":")[0])
    if kind == "cuda":
        import torch
        free, _ = torch.cuda.mem_get_info(device)
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    if kind != "cpu":
        return None
    found = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    v1 = "/sys/fs/cgroup/memory/memory."
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         (v1 + "limit_in_bytes", v1 + "usage_in_bytes")):
        try:
            cap = Path(limit).read_text().strip()
            if cap != "max" and int(cap) < 1 << 60:
                found.append(int(cap) - int(Path(usage).read_text().strip()))
        except (OSError, ValueError):
            continue
    if not found:
        try:
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (OSError, ValueError):
            return None
    return max(min(found), 0)


def check_batch_fits(config, batch_size: int, max_new_tokens: int, dtype, device, what: str = "batch size") -> None:
    """Raise ValueError (before anything is allocated) if `batch_size` rows do not fit the device's free memory."""
    total, kv = generation_bytes(config, batch_size, max_new_tokens, dtype)
    free = available_memory(device)
    if free is None or total <= free:
        return
    per_row = total / batch_size
    fit = int(free // per_row)
    raise ValueError(f"{what} {batch_size}: needs {_gib(total)} ({_gib(kv)} of KV cache for {config.seq_len} "
                     f"positions per row) but {device} has {_gib(free)} free; "
                     + (f"at most {fit} rows fit" if fit else "not even one row fits"))


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 26 else f"{n / (1 << 20):.1f} MiB"
