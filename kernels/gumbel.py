"""
The random draw every backend makes at temperature > 0: the maximum of one Gumbel process over the whole
vocabulary, taken over the tokens a row may emit.

Gumbel-max: give every token v an independent z_v ~ Gumbel(y_v), y = logits / T; the argmax of z over any set
S of tokens is then a draw from softmax(y) restricted to S. Because the process z depends on the logits and
the keys only, never on S, draws over nested sets are coupled: where the argmax over all tokens (the free arm
of the ablation) lies in S (the grammar's legal tokens), the argmax over S is that same token.

Hashing a uniform for each of the V tokens per row and step is what made sampling slow on the CPU; the process
is therefore generated top-down, in blocks of K = NOISE_BLOCK consecutive ids (Maddison et al. 2014, "A*
sampling"; the truncation of Kool et al. 2019, "Stochastic Beams"):

  block level   G_b = logsumexp_{v in b} y_v + Gumbel(uniform(block key, b))    the maximum of z over block b
  token level   h_v = y_v + Gumbel(uniform(token key, v)),   Z_b = max_{v in b} h_v
                z_v = truncate(G_b, Z_b, h_v) = -log(exp(-G_b) - exp(-Z_b) + exp(-h_v))

z is then exactly a Gumbel process with locations y (the h of a block, shifted so that their maximum is G_b;
the map keeps their order). Since z_v <= G_b inside block b, a search need only look at the blocks whose G_b
beats the best candidate found so far: one block for almost every row, so a draw costs one logsumexp pass over
the logits plus O(K + V / K) hashed uniforms, not V. The keys are those of rng.py: the token key is
rng.row_keys(seed, row key, step), the block key rng.block_keys(token key).

Potentials: NaN logits count as -inf; +inf ones never enter the process (the callers' rules pick such tokens,
kernels/mask_torch.py); so y is finite or -inf here. All backends compute the same expressions in float32.
"""
from __future__ import annotations

import torch
from batchmask.kernels import rng

NOISE_BLOCK = 128  # K: ids per block (a power of two, so the Triton kernels tile V by it)
NEG_INF = float("-inf")
LSE_ROWS = 4  # rows per logsumexp call in block_lse


def num_blocks(vocab_size: int) -> int:
    return -(-vocab_size // NOISE_BLOCK)


def potentials(y: torch.Tensor) -> torch.Tensor:
    """The process locations: y where finite, -inf elsewhere (NaN and +inf). float32 [..]."""
    return torch.where(torch.isfinite(y), y, NEG_INF)


def block_lse(p: torch.Tensor) -> torch.Tensor:
    """float32 [n, V] potentials -> [n, nb] logsumexp of each block (-inf for an all -inf block).

    The full blocks on a [n, V // K, K] view, the short last block on its own: the same ops on the same values
    whichever rows a caller passes, so the dense reference and the fast paths get the same bits."""
    n, V = p.shape
    K = NOISE_BLOCK
    full = V // K
    parts = []
    if full:  # a few rows at a time: logsumexp's temporaries then stay in the cache (1.4x faster on a CPU)
        blocks = p[:, :full * K].unflatten(1, (full, K))
        parts.append(torch.cat([torch.logsumexp(blocks[r:r + LSE_ROWS], dim=2) for r in range(0, n, LSE_ROWS)]))
    if V > full * K:
        parts.append(torch.logsumexp(p[:, full * K:], dim=1, keepdim=True))
    return torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]


def block_scores(lse: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """G: lse float32 [n, nb], keys int64 [n] (token keys) -> float32 [n, nb], the maximum of z in each block."""
    return lse + rng.gumbel(rng.uniforms(rng.block_keys(keys), lse.shape[1]))


def token_scores(p: torch.Tensor, keys: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """h: potentials p float32 [n, k] of token ids [n, k], keys int64 [n] -> float32 [n, k]."""
    return p + rng.gumbel(rng.uniforms_at(keys[:, None], ids))


def truncate(G: torch.Tensor, Z: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """z = -log(exp(-G) - exp(-Z) + exp(-h)) in a form that neither overflows nor loses the maximum:
    with v = G - h + log(1 - exp(h - Z)),  z = G - softplus(v)  (z = G exactly where h = Z).
    -inf where h is -inf. Plain exp / log only, so that every backend can write the same expression."""
    a = h - Z  # <= 0
    v = G - h + torch.log(1 - torch.exp(a))
    z = G - (v.clamp(min=0) + torch.log(1 + torch.exp(-v.abs())))
    return torch.where(h == NEG_INF, NEG_INF, z)
