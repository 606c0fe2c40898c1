"""
Decode by replaying a CUDA graph: one full-window decode step of the Transformer (models/llama.py) recorded once,
then replayed per step with no Python or launch overhead. A mixin, since it only uses the model's own
`_decode_step`, `_check_room`, cache buffers and host positions.
"""
from __future__ import annotations

import torch


class CudaGraphDecode:
    """capture_decode / decode_graphed for models/llama.py's Transformer."""

    @torch.no_grad()
    def capture_decode(self, warmup: int = 2) -> None:
        """Record one full-window decode step as a CUDA graph; `decode_graphed` replays it.

        Needs CUDA and setup_cache; re-capture after setup_cache.  Warm-up steps write only at or
        beyond each row's current position, which is not yet part of any row's context, and the
        positions are restored afterwards.
        """
        self._require_cache()
        if self.pos.device.type != "cuda":
            raise RuntimeError("capture_decode needs the model and cache on a CUDA device")
        self._graph_tokens = torch.zeros_like(self.pos)  # [B] static input
        saved_pos = self.pos.clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                self._decode_step(self._graph_tokens, self.config.seq_len)
        torch.cuda.current_stream().wait_stream(stream)
        self.pos.copy_(saved_pos)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._graph_logits = self._decode_step(self._graph_tokens, self.config.seq_len)  # [B, V] static
        self._graph = graph

    @torch.no_grad()
    def decode_graphed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Same as decode, by replaying the captured graph.  The returned [B, V] logits tensor is a
        static buffer overwritten by the next call: consume or clone it first."""
        if self._graph is None:
            raise RuntimeError("call capture_decode() first (and again after setup_cache)")
        self._check_room()
        self._graph_tokens.copy_(tokens, non_blocking=True)
        self._graph.replay()
        self.host_pos += self.host_active
        return self._graph_logits
