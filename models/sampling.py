"""
Next-token selection for a batch of logits [B, V], vectorised over the batch: run.c's samplers, for using the
model on its own. (batchmask's generation loop samples through the masker, both arms of the ablation:
batchmask.masker.BatchMasker.sample constrained, batchmask.masker.sample_unmasked free, one random process.)

- `greedy`: the first maximum of each row (run.c's argmax).
- `sample`: temperature, optional top-k, optional top-p with run.c's `sample_topp` semantics, per-row
  parameters, per-row seeding.

Randomness is counter-based: each row's coin is a hash of (seed, step) that the caller supplies
per row (typically one seed per request and the number of tokens it has generated so far).  A
row's draw therefore never depends on which other rows share the batch, on the batch order, or on
any global RNG state, and the whole computation is plain tensor arithmetic (no host sync, usable
inside a CUDA graph).  Two rows with equal (seed, step) get equal coins, so a repeated request
reproduces its output.
"""

from __future__ import annotations

import torch

_MASK32 = 0xFFFFFFFF


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """logits [B, V] -> [B] int64: index of the first maximum of each row."""
    return torch.argmax(logits, dim=-1)  # torch documents ties -> first index, like run.c


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser (xor-shift / multiply rounds) on int64 tensors holding values < 2^32.

    The multiplier is < 2^27, so every product fits in int64 without overflow.
    """
    x = x ^ (x >> 16)
    x = (x * 0x045D9F3B) & _MASK32
    x = x ^ (x >> 16)
    x = (x * 0x045D9F3B) & _MASK32
    return x ^ (x >> 16)


def uniform(seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """Per-row coins in [0, 1): seeds [B], steps [B] (any integers) -> float32 [B].

    24 bits of the hash of (seed, step), like run.c's random_f32 ((u32 >> 8) / 2^24).
    """
    seeds, steps = seeds.long(), steps.long()
    h = _mix32(seeds & _MASK32)
    h = _mix32(h ^ ((seeds >> 32) & _MASK32))  # high seed bits count too
    h = _mix32(h ^ (steps & _MASK32) ^ 0x9E3779B9)
    return (h >> 8).float() / float(1 << 24)


def _per_row(value, B: int, device, dtype) -> torch.Tensor:
    """A scalar or a [B] sequence -> a [B] tensor."""
    t = torch.as_tensor(value, device=device, dtype=dtype)
    return t.expand(B) if t.dim() == 0 else t


def sample(logits: torch.Tensor, seeds, steps, temperature=1.0, top_p=1.0, top_k=0) -> torch.Tensor:
    """Draw one token per row.  logits [B, V] -> [B] int64.

    seeds, steps: [B] integers (or scalars) keying each row's coin (see `uniform`).
    temperature: scalar or [B]; rows with temperature 0 take the greedy token.
    top_k: scalar or [B]; k > 0 keeps the k most probable tokens (0 = all).
    top_p: scalar or [B]; 0 < p < 1 applies run.c's nucleus rule, after top-k, to the renormalised
        distribution: drop tokens below the cutoff (1 - p) / (V - 1), sort by probability, keep
        the smallest prefix whose cumulative probability exceeds p (or all candidates if none
        does), draw coin * (kept mass) along that prefix.  p >= 1 (or <= 0) disables it.
    Ties in probability are ordered by token id.  Illegal tokens (logit -inf) are never drawn as
    long as a row has at least one finite logit.
    """
    if not torch.is_tensor(temperature) and temperature <= 0:
        return greedy(logits)  # all rows greedy: no need to sort the vocabulary
    B, V = logits.shape
    device = logits.device
    temperature = _per_row(temperature, B, device, torch.float32)  # [B]
    top_p = _per_row(top_p, B, device, torch.float32)  # [B]
    top_k = _per_row(top_k, B, device, torch.long)  # [B]
    coin = uniform(_per_row(seeds, B, device, torch.long), _per_row(steps, B, device, torch.long))  # [B]

    safe_t = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    probs = torch.softmax(logits.float() / safe_t[:, None], dim=-1)  # [B, V]
    sorted_probs, sorted_ids = torch.sort(probs, dim=-1, descending=True, stable=True)  # [B, V]
    rank = torch.arange(V, device=device)  # [V]

    # top-k: zero everything past rank k, renormalise
    k = torch.where(top_k > 0, top_k.clamp(max=V), torch.full_like(top_k, V))  # [B]
    sorted_probs = torch.where(rank[None, :] < k[:, None], sorted_probs, torch.zeros_like(sorted_probs))
    sorted_probs = sorted_probs / sorted_probs.sum(-1, keepdim=True)
    cum = torch.cumsum(sorted_probs, dim=-1)  # [B, V]

    # the last kept rank of each row: k - 1 without top-p; with top-p, run.c's rule
    use_p = (top_p > 0) & (top_p < 1)  # [B]
    cutoff = (1.0 - top_p) / max(V - 1, 1)  # [B]
    n_candidates = (sorted_probs >= cutoff[:, None]).sum(-1)  # [B] (sorted, so a prefix)
    first_over = (cum <= top_p[:, None]).sum(-1)  # [B] first rank whose cumulative prob > p
    last_p = torch.minimum(first_over, n_candidates - 1).clamp(min=0)
    last_nonzero = (sorted_probs > 0).sum(-1) - 1  # [B] never land on a zero-probability token
    last = torch.where(use_p, last_p, k - 1).clamp(max=last_nonzero.clamp(min=0))  # [B]

    # inverse-CDF draw over ranks 0..last: first rank whose cumulative prob exceeds coin * kept mass
    kept_mass = cum.gather(1, last[:, None])  # [B, 1]
    target = coin[:, None] * kept_mass  # [B, 1]
    chosen = torch.searchsorted(cum, target.contiguous(), right=True).squeeze(1)  # [B]
    chosen = torch.minimum(chosen, last)
    drawn = sorted_ids.gather(1, chosen[:, None]).squeeze(1)  # [B]
    return torch.where(temperature > 0, drawn, greedy(logits))
