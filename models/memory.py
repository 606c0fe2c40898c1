"""
Memory the model needs against memory the device has: the static KV cache (`kv_cache_bytes`, which the CLI also
uses to bound --batch-size) and the weights are checked before they are allocated, so an impossible size is one
clear line, not an allocator error or the machine swapping.
"""
from __future__ import annotations

import os

import torch

from .config import ModelConfig


def kv_cache_bytes(config: ModelConfig, batch_size: int, context: int, dtype: torch.dtype | str = torch.float32) -> int:
    """Bytes of the static K and V caches for `batch_size` rows of `context` positions in `dtype`
    (2 x n_layers x batch x n_kv_heads x context x head_dim elements)."""
    if isinstance(dtype, str):  # "bfloat16", "torch.float16"
        dtype = getattr(torch, dtype.removeprefix("torch."))
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * config.n_layers * int(batch_size) * config.n_kv_heads * int(context) * config.head_dim * elem


def available_bytes(device) -> int | None:
    """Free memory on `device`: CUDA's free bytes, or the host's MemAvailable; None when unknown."""
    device = torch.device(device)
    if device.type == "cuda":  # free, plus what torch's caching allocator holds but does not use
        reserved = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(torch.cuda.mem_get_info(device)[0]) + reserved
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


class OutOfMemoryError(ValueError):
    """An allocation the device cannot hold, refused before it is attempted."""


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def check_fits(what: str, nbytes: int, device, hint: str) -> None:
    """Raise OutOfMemoryError (one line) if `nbytes` exceed what `device` has free."""
    free = available_bytes(device)
    if free is not None and nbytes > free:
        raise OutOfMemoryError(f"{what} needs {_gib(nbytes)} but {torch.device(device)} has {_gib(free)} free; {hint}")
