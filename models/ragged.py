"""
Ragged decode (jump-forward): several new tokens per row in one forward pass of the Transformer (models/llama.py),
each row at its own positions, its static KV cache written by index. A mixin, like models/graphs.py: it uses the
model's layers (TransformerBlock.extend), cache buffers and host positions.
"""
from __future__ import annotations

import numpy as np
import torch


class RaggedDecode:
    """extend for models/llama.py's Transformer."""

    @torch.no_grad()
    def extend(self, tokens: torch.Tensor, lengths: torch.Tensor, host_lengths=None) -> torch.Tensor:
        """Several new tokens per row in one forward pass (jump-forward decoding): tokens [B, T], of which row b's
        first lengths[b] (>= 1, int [B] on the device) are real and the rest padding -> float32 logits [B, V] after
        each row's last real token; active rows' pos += lengths.

        Row b's tokens take positions pos[b] .. pos[b] + lengths[b] - 1, write its KV cache there and attend to
        its cache and, causally, to each other: the cache and logits of lengths[b] decode steps. `host_lengths`
        (the same lengths on the host, for the room check and the attention window) saves reading them back.
        """
        self._require_cache()
        B = self.batch_size
        if tokens.dim() != 2 or tokens.shape[0] != B or lengths.shape != (B,):
            raise ValueError(f"extend: expected tokens [{B}, T] and lengths [{B}], got {tuple(tokens.shape)} and "
                             f"{tuple(lengths.shape)}")
        T, S = tokens.shape[1], self.config.seq_len
        n = np.asarray(lengths.tolist() if host_lengths is None else host_lengths, dtype=np.int64)
        if n.shape != (B,) or n.min(initial=1) < 1 or n.max(initial=1) > T or T > S:
            raise ValueError(f"extend: lengths must be in [1, {T}] (the tokens' width, at most seq_len={S}), "
                             f"got {n.tolist()}")
        self._check_room(n)
        ends = self.host_pos + n
        longest = int(ends[self.host_active].max(initial=1))
        window = min(S, -(-longest // 32) * 32)
        logits = self._extend_step(tokens.to(self.pos.device), lengths.to(self.pos.device).long(), window)
        self.host_pos += self.host_active * n
        return logits

    def _extend_step(self, tokens: torch.Tensor, lengths: torch.Tensor, window: int) -> torch.Tensor:
        """The device work of extend; no host sync."""
        B, T = tokens.shape
        S = self.config.seq_len
        at = self.pos[:, None] + self.positions[:T][None, :]  # [B, T] each entry's position
        keep = self.positions[:T][None, :] < lengths[:, None]  # [B, T] the real entries
        # padding writes (its old value back) at its own position, wrapped into the cache: T <= S positions
        # in a row never meet, so padding never shares a position with a real entry
        write = torch.remainder(at, S)
        x = self.tok_embeddings(tokens)  # [B, T, dim]
        rope_at = at.clamp(max=S - 1)
        cos, sin = self.rope_cos[rope_at], self.rope_sin[rope_at]  # [B, T, hd]
        visible = self.positions[:window][None, None, :] <= at[:, :, None]  # [B, T, W]
        mask = torch.zeros(visible.shape, dtype=x.dtype, device=x.device).masked_fill_(~visible, float("-inf"))
        mask = mask[:, None]  # [B, 1, T, W]
        for l, layer in enumerate(self.layers):
            x = layer.extend(x, cos, sin, self.k_cache[l], self.v_cache[l], self.slots, write, keep, mask)
        last = x[self.slots, lengths - 1]  # [B, dim]
        self.pos += self.active * lengths
        return self._classify(self.norm(last)).float()
