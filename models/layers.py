"""
The Transformer's layers: RMSNorm, grouped-query attention with RoPE (whole sequences, and one cached
token per row, or a ragged few per row), the SwiGLU feed-forward, and the block that chains them (pre-norm, residuals).

Shapes: B rows, T positions, H query heads, KV key/value heads (H % KV == 0), hd head size.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import LLAMA2C_EPS, ModelConfig
from .rope import apply_rope


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = LLAMA2C_EPS) -> torch.Tensor:
    """x [..., dim] -> x / sqrt(mean(x^2) + eps) * weight (run.c's rmsnorm)."""
    if hasattr(F, "rms_norm"):  # torch >= 2.4: one fused op instead of six
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * weight


class Linear(nn.Linear):
    """nn.Linear that skips its random init on the meta device: torch computes even a meta tensor's init through
    Python reference ops that import torch._dynamo (1.4 s of start-up), for values a checkpoint replaces."""

    def reset_parameters(self) -> None:
        if not self.weight.is_meta:
            super().reset_parameters()


class Embedding(nn.Embedding):
    """nn.Embedding that skips its random init on the meta device (see Linear)."""

    def reset_parameters(self) -> None:
        if not self.weight.is_meta:
            super().reset_parameters()


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = LLAMA2C_EPS, device=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device))

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, device=None):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = config.n_heads, config.n_kv_heads, config.head_dim
        # fused wq, wk, wv (and their biases for Qwen2)
        self.wqkv = Linear(config.dim, config.q_dim + 2 * config.kv_dim, bias=config.qkv_bias, device=device)
        self.wo = Linear(config.q_dim, config.dim, bias=False, device=device)

    def _qkv(self, x, cos, sin):
        """x [..., dim] -> q [..., H, hd], k [..., KV, hd] (both rotated), v [..., KV, hd]."""
        H, KV, hd = self.n_heads, self.n_kv_heads, self.head_dim
        qkv = self.wqkv(x)  # [..., (H + 2KV) hd]
        qk, v = qkv.split([(H + KV) * hd, KV * hd], dim=-1)
        qk = apply_rope(qk.unflatten(-1, (H + KV, hd)), cos, sin)  # rotate q and k in one go
        q, k = qk.split([H, KV], dim=-2)
        return q, k, v.unflatten(-1, (KV, hd))

    def forward(self, x, cos, sin):
        """Causal self-attention over a whole sequence, positions 0..T-1, no cache.

        x [B, T, dim], cos/sin [T, hd] -> (out [B, T, dim], k [B, KV, T, hd], v [B, KV, T, hd])
        """
        q, k, v = self._qkv(x, cos[:, None, :], sin[:, None, :])  # [B, T, H|KV, hd]
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H|KV, T, hd]
        group = self.n_heads // self.n_kv_heads
        # each kv head serves `group` consecutive query heads (run.c: h / kv_mul)
        k_all = k.repeat_interleave(group, dim=1) if group > 1 else k  # [B, H, T, hd]
        v_all = v.repeat_interleave(group, dim=1) if group > 1 else v
        out = F.scaled_dot_product_attention(q, k_all, v_all, is_causal=True)  # [B, H, T, hd]
        return self.wo(out.transpose(1, 2).flatten(2)), k, v

    def decode(self, x, cos, sin, k_cache, v_cache, slots, pos, mask):
        """One new token per row, each at its own position, attending to its cache.

        x [B, dim]; cos/sin [B, hd]; k_cache/v_cache [B, KV, S, hd] (this layer's, written in place);
        slots [B] = arange(B); pos [B] (already clamped); mask [B, 1, 1, W] additive (0 or -inf)
        over the first W <= S cache positions.  The cache may have its own dtype (setup_cache).
        """
        B = x.shape[0]
        H, KV, hd = self.n_heads, self.n_kv_heads, self.head_dim
        q, k, v = self._qkv(x, cos[:, None, :], sin[:, None, :])  # [B, H|KV, hd]
        k_cache[slots, :, pos] = k.to(k_cache.dtype)  # row b writes its own position pos[b]
        v_cache[slots, :, pos] = v.to(v_cache.dtype)
        W = mask.shape[-1]
        # grouped-query attention without copying the cache: the `group` query heads sharing a kv
        # head act as `group` queries against that head's keys
        q = q.reshape(B, KV, H // KV, hd).to(k_cache.dtype)  # [B, KV, group, hd]
        out = F.scaled_dot_product_attention(q, k_cache[:, :, :W], v_cache[:, :, :W],
                                             attn_mask=mask.to(k_cache.dtype))  # [B, KV, group, hd]
        return self.wo(out.reshape(B, H * hd).to(x.dtype))  # [B, dim]


    def extend(self, x, cos, sin, k_cache, v_cache, slots, at, keep, mask):
        """T new tokens per row (a ragged batch padded to T), each row's at its own positions.

        x [B, T, dim]; cos/sin [B, T, hd]; slots [B]; at [B, T] the cache position each entry writes; keep [B, T]
        the real entries (padding rewrites what its position holds, so it must not share a position with a real
        entry of its row); mask [B, 1, T, W] additive over the first W cache positions, causal by position.
        Returns out [B, T, dim]. Real entries give what decode gives fed one at a time (the same cache writes).
        """
        B, T = x.shape[:2]
        H, KV, hd = self.n_heads, self.n_kv_heads, self.head_dim
        group = H // KV
        q, k, v = self._qkv(x, cos[:, :, None, :], sin[:, :, None, :])  # [B, T, H|KV, hd]
        rows = slots[:, None].expand(B, T)
        for cache, new in ((k_cache, k), (v_cache, v)):
            old = cache[rows, :, at]  # [B, T, KV, hd]
            cache[rows, :, at] = torch.where(keep[:, :, None, None], new.to(cache.dtype), old)
        W = mask.shape[-1]
        # as decode: the `group` query heads of a kv head, and now the T positions too, are queries against its keys
        q = q.reshape(B, T, KV, group, hd).permute(0, 2, 3, 1, 4).reshape(B, KV, group * T, hd).to(k_cache.dtype)
        m = mask[:, :, None].expand(B, 1, group, T, W).reshape(B, 1, group * T, W).to(k_cache.dtype)
        out = F.scaled_dot_product_attention(q, k_cache[:, :, :W], v_cache[:, :, :W], attn_mask=m)
        out = out.reshape(B, KV, group, T, hd).permute(0, 3, 1, 2, 4).reshape(B, T, H * hd)
        return self.wo(out.to(x.dtype))  # [B, T, dim]


class FeedForward(nn.Module):
    def __init__(self, config: ModelConfig, device=None):
        super().__init__()
        self.hidden_dim = config.hidden_dim
        self.w13 = Linear(config.dim, 2 * config.hidden_dim, bias=False, device=device)  # fused gate (w1), up (w3)
        self.w2 = Linear(config.hidden_dim, config.dim, bias=False, device=device)

    def forward(self, x):
        gate, up = self.w13(x).split(self.hidden_dim, dim=-1)  # [..., hidden] each
        return self.w2(F.silu(gate) * up)


class TransformerBlock(nn.Module):
    def __init__(self, config: ModelConfig, device=None):
        super().__init__()
        self.attention_norm = RMSNorm(config.dim, config.norm_eps, device)
        self.attention = Attention(config, device)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps, device)
        self.feed_forward = FeedForward(config, device)

    def forward(self, x, cos, sin):
        """x [B, T, dim] -> (x [B, T, dim], k, v [B, KV, T, hd])."""
        attn, k, v = self.attention(self.attention_norm(x), cos, sin)
        x = x + attn
        return x + self.feed_forward(self.ffn_norm(x)), k, v

    def decode(self, x, cos, sin, k_cache, v_cache, slots, pos, mask):
        """x [B, dim] -> [B, dim]."""
        x = x + self.attention.decode(self.attention_norm(x), cos, sin, k_cache, v_cache, slots, pos, mask)
        return x + self.feed_forward(self.ffn_norm(x))

    def extend(self, x, cos, sin, k_cache, v_cache, slots, at, keep, mask):
        """x [B, T, dim] -> [B, T, dim] (Attention.extend)."""
        x = x + self.attention.extend(self.attention_norm(x), cos, sin, k_cache, v_cache, slots, at, keep, mask)
        return x + self.feed_forward(self.ffn_norm(x))
