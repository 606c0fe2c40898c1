"""
Rotary position embeddings: frequencies (base theta, linear or Llama 3 scaling), tables, rotation.

The model rotates the pairs (2j, 2j+1) of every head (run.c's layout). Hugging Face checkpoints rotate
(j, j + head_dim/2) instead; models/hf.py permutes their q/k projection rows into pair order on load, so one
rotation serves both (the permutation is applied to q and k alike, so every q.k product is unchanged).
"""
from __future__ import annotations

import math

import torch

from .config import ModelConfig, RopeConfig


def inv_frequencies(head_dim: int, rope: RopeConfig) -> torch.Tensor:
    """float64 [head_dim/2]: the angle per position of pair j, after the scaling rule of `rope`."""
    inv = 1.0 / rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # [hd/2]
    if rope.kind == "linear":
        return inv / rope.factor
    if rope.kind == "llama3":
        wavelength = 2 * math.pi / inv  # [hd/2]
        old = rope.original_context
        lo, hi = rope.low_freq_factor, rope.high_freq_factor
        # blend weight: 0 at wavelength old/lo (fully scaled), 1 at old/hi (unscaled), clamped outside
        blend = ((old / wavelength - lo) / (hi - lo)).clamp(0.0, 1.0)
        return (1 - blend) * inv / rope.factor + blend * inv
    return inv


def rope_tables(config: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) float32 [seq_len, head_dim/2]: angle pos * inv_freq[j] for pair j (computed in float64)."""
    inv = inv_frequencies(config.head_dim, config.rope)  # [hd/2]
    angles = torch.outer(torch.arange(config.seq_len, dtype=torch.float64), inv)  # [seq_len, hd/2]
    return torch.cos(angles).float(), torch.sin(angles).float()


def rope_multipliers(config: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Full-width RoPE tables (cos, sin) [seq_len, head_dim] for `apply_rope`.

    For pair j at position p with angle a: cos[p, 2j] = cos[p, 2j+1] = cos(a); sin[p, 2j] = -sin(a),
    sin[p, 2j+1] = +sin(a).
    """
    cos, sin = rope_tables(config)  # [seq_len, hd/2]
    return cos.repeat_interleave(2, dim=-1), torch.stack((-sin, sin), dim=-1).flatten(-2)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the pairs (2j, 2j+1) of x [..., head_dim]; cos/sin [..., head_dim] from rope_multipliers.

    (x0, x1) -> (x0 cos - x1 sin, x1 cos + x0 sin) == x * cos + swap_pairs(x) * sin, which is three
    elementwise ops instead of splitting and restacking the pairs.
    """
    swapped = x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)  # (x1, x0) in every pair
    return (x * cos + swapped * sin).type_as(x)


def half_to_pairs(n_heads: int, head_dim: int) -> torch.Tensor:
    """int64 [n_heads * head_dim]: row order that turns a HF q/k projection (pair j = dims j, j + hd/2 of a
    head) into pair order (dims 2j, 2j+1): new row h*hd + 2j <- old h*hd + j, h*hd + 2j+1 <- old h*hd + j + hd/2."""
    half = head_dim // 2
    within = torch.stack((torch.arange(half), torch.arange(half) + half), dim=-1).flatten()  # [hd]
    return (torch.arange(n_heads)[:, None] * head_dim + within).flatten()
