"""
The Llama-family Transformer in PyTorch, batched, with a static KV cache (gpt-fast style), for llama2.c
checkpoints and Hugging Face Llama / Mistral / Qwen2 directories alike (`load_checkpoint`, by content):

    model = load_checkpoint("stories15M.bin")               # llama2.c (karpathy/tinyllamas), float32
    model = load_checkpoint("SmolLM2-135M-Instruct/", max_context=4096)   # HF: config.json + safetensors
    logits = model.logits(torch.tensor([[1, 403, 2462]]))   # [1, 3, vocab_size]

Architecture: RMSNorm -> attention with RoPE and grouped-query heads (q/k/v biases for Qwen2) -> residual ->
RMSNorm -> SwiGLU FFN -> residual, final RMSNorm, classifier (tied to the token embedding unless the
checkpoint has its own). The layers are in models/layers.py, RoPE (theta, linear / llama3 scaling) in
models/rope.py, the hyperparameters in models/config.py, CUDA-graph decode in models/graphs.py.

Parameters (state_dict names), llama2.c names with two fusions for speed:
    tok_embeddings.weight                  [vocab_size, dim]
    layers.{l}.attention_norm.weight       [dim]
    layers.{l}.attention.wqkv.weight       [(n_heads + 2 n_kv_heads) * head_dim, dim]  = cat(wq, wk, wv)
    layers.{l}.attention.wqkv.bias         [(n_heads + 2 n_kv_heads) * head_dim]       only with qkv_bias
    layers.{l}.attention.wo.weight         [dim, n_heads * head_dim]
    layers.{l}.ffn_norm.weight             [dim]
    layers.{l}.feed_forward.w13.weight     [2 hidden_dim, dim]                         = cat(w1, w3)
    layers.{l}.feed_forward.w2.weight      [dim, hidden_dim]
    norm.weight                            [dim]
    output.weight                          [vocab_size, dim]  (the same Parameter as tok_embeddings.weight
                                           when the classifier is shared)
`load_weights` / `checkpoint_weights` convert from / to the unfused naming of models/checkpoint.py.

Inference state (buffers, not in the state_dict), all fixed-shape after `setup_cache(B)` (which refuses,
before allocating, a cache the device cannot hold: models/memory.py):
    k_cache, v_cache  [n_layers, B, n_kv_heads, seq_len, head_dim]
    pos               [B] int64: next position of each row (= tokens already in its cache)
    active            [B] int64: 1 for rows holding a sequence; only active rows advance
Row b of the batch is "cache slot" b: `prefill` fills slots, `decode` advances all of them by one token,
`extend` by a few tokens each (jump-forward: a ragged [B, T] batch in one pass), `reset` frees slots for reuse
(continuous batching).

Context overflow: prompts longer than seq_len and decoding an active row at position seq_len raise
ContextOverflowError. The decode check reads a host-side copy of the positions (`host_pos`, kept in step by
prefill/decode/reset), so it never synchronises with the GPU and works unchanged in CUDA-graph mode. As a
second line of defence the device-side position is clamped to seq_len - 1 before indexing.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
import torch.nn as nn

from .checkpoint import read_checkpoint
from .config import ModelConfig, weight_shapes
from .graphs import CudaGraphDecode
from .layers import Attention, Embedding, FeedForward, Linear, RMSNorm, TransformerBlock, rms_norm  # noqa: F401
from .memory import OutOfMemoryError, available_bytes, check_fits, kv_cache_bytes  # noqa: F401
from .ragged import RaggedDecode
from .rope import apply_rope, rope_multipliers  # noqa: F401 (re-exported)

# the per-layer entries of the checkpoint weight naming (models/config.py weight_shapes)
LAYER_WEIGHTS = ("rms_att", "wq", "wk", "wv", "wo", "rms_ffn", "w1", "w2", "w3", "bq", "bk", "bv")


class ContextOverflowError(ValueError):
    """A row would hold more than seq_len tokens."""

    def __init__(self, row: int, length: int, seq_len: int, what: str):
        self.row, self.length, self.seq_len = row, length, seq_len
        super().__init__(f"row {row}: {what} needs {length} positions but the model's context is seq_len={seq_len}")


class Transformer(CudaGraphDecode, RaggedDecode, nn.Module):
    def __init__(self, config: ModelConfig, device=None):
        """device="meta": every parameter without storage or values (a checkpoint fills them: _empty_model)."""
        super().__init__()
        self.config = config.validate()
        self.tok_embeddings = Embedding(config.vocab_size, config.dim, device=device)
        self.layers = nn.ModuleList(TransformerBlock(config, device) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.dim, config.norm_eps, device)
        self.output = Linear(config.dim, config.vocab_size, bias=False, device=device)
        if config.shared_classifier:
            self.output.weight = self.tok_embeddings.weight
        if torch.device(device or "cpu").type != "meta":
            self._init_weights()
        cos, sin = rope_multipliers(config)
        self.register_buffer("rope_cos", cos.to(device), persistent=False)  # [seq_len, hd]
        self.register_buffer("rope_sin", sin.to(device), persistent=False)
        self.register_buffer("positions", torch.arange(config.seq_len).to(device), persistent=False)  # [seq_len]
        # the inference cache: empty until setup_cache
        self.k_cache: torch.Tensor | None = None
        self.v_cache: torch.Tensor | None = None
        self.pos: torch.Tensor | None = None
        self.slots: torch.Tensor | None = None
        self.active: torch.Tensor | None = None
        self.host_pos = np.zeros(0, dtype=np.int64)  # host copy of pos
        self.host_active = np.zeros(0, dtype=bool)  # host copy of active
        self._graph = None

    def _init_weights(self):
        """llama2.c's training init: N(0, 0.02), output projections scaled down by sqrt(2 n_layers)."""
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / (2 * self.config.n_layers) ** 0.5 if name.endswith(("wo.weight", "w2.weight")) else 0.02
                nn.init.normal_(p, mean=0.0, std=std)

    # ------------------------------------------------------------------ weights

    @torch.no_grad()
    def load_weights(self, weights: dict[str, torch.Tensor]) -> Transformer:
        """Copy checkpoint-named weights (models/checkpoint.py, stacked over layers) into the parameters."""
        expected = weight_shapes(self.config)
        if set(weights) != set(expected) or any(tuple(weights[n].shape) != s for n, s in expected.items()):
            got = {n: tuple(t.shape) for n, t in weights.items()}
            raise ValueError(f"weights do not match {self.config}: expected {expected}, got {got}")
        self.load_outer(weights)
        for l in range(self.config.n_layers):
            self.load_layer(l, {name: weights[name][l] for name in LAYER_WEIGHTS if name in weights})
        return self

    @torch.no_grad()
    def load_outer(self, weights: dict[str, torch.Tensor]) -> None:
        """The weights outside the layers: token_embedding, rms_final, and wcls when unshared."""
        self.tok_embeddings.weight.copy_(weights["token_embedding"])
        self.norm.weight.copy_(weights["rms_final"])
        if not self.config.shared_classifier:
            self.output.weight.copy_(weights["wcls"])

    @torch.no_grad()
    def load_layer(self, l: int, w: dict[str, torch.Tensor]) -> None:
        """Layer l's weights, checkpoint-named and unstacked (wq [q_dim, dim], ..., bq [q_dim] with biases):
        one layer at a time, so a loader never holds more than one layer beyond the model itself."""
        layer = self.layers[l]
        layer.attention_norm.weight.copy_(w["rms_att"])
        layer.attention.wqkv.weight.copy_(torch.cat([w["wq"], w["wk"], w["wv"]]))
        if self.config.qkv_bias:
            layer.attention.wqkv.bias.copy_(torch.cat([w["bq"], w["bk"], w["bv"]]))
        layer.attention.wo.weight.copy_(w["wo"])
        layer.ffn_norm.weight.copy_(w["rms_ffn"])
        layer.feed_forward.w13.weight.copy_(torch.cat([w["w1"], w["w3"]]))
        layer.feed_forward.w2.weight.copy_(w["w2"])

    @torch.no_grad()
    def checkpoint_weights(self) -> dict[str, torch.Tensor]:
        """The parameters in checkpoint naming (unfused, stacked over layers), float32 on the CPU."""
        c = self.config
        q_dim = c.q_dim

        def stack(fn):
            return torch.stack([fn(layer).detach().float().cpu() for layer in self.layers])

        wqkv = stack(lambda b: b.attention.wqkv.weight)  # [L, q_dim + 2 kv_dim, dim]
        w13 = stack(lambda b: b.feed_forward.w13.weight)  # [L, 2 hidden, dim]
        weights = {
            "token_embedding": self.tok_embeddings.weight.detach().float().cpu(),
            "rms_att": stack(lambda b: b.attention_norm.weight),
            "wq": wqkv[:, :q_dim],
            "wk": wqkv[:, q_dim:q_dim + c.kv_dim],
            "wv": wqkv[:, q_dim + c.kv_dim:],
            "wo": stack(lambda b: b.attention.wo.weight),
            "rms_ffn": stack(lambda b: b.ffn_norm.weight),
            "w1": w13[:, :c.hidden_dim],
            "w2": stack(lambda b: b.feed_forward.w2.weight),
            "w3": w13[:, c.hidden_dim:],
            "rms_final": self.norm.weight.detach().float().cpu(),
        }
        if c.qkv_bias:
            bqkv = stack(lambda b: b.attention.wqkv.bias)  # [L, q_dim + 2 kv_dim]
            weights.update(bq=bqkv[:, :q_dim], bk=bqkv[:, q_dim:q_dim + c.kv_dim], bv=bqkv[:, q_dim + c.kv_dim:])
        if not c.shared_classifier:
            weights["wcls"] = self.output.weight.detach().float().cpu()
        return {name: t.contiguous() for name, t in weights.items()}

    # ------------------------------------------------------------------ no-cache path

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, T] (positions 0..T-1) -> logits [B, T, vocab_size].  No cache; used for training."""
        x = self._hidden_states(tokens)[0]
        return self.output(self.norm(x))

    @torch.no_grad()
    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """Inference-mode forward: tokens [B, T] -> float32 logits [B, T, vocab_size]."""
        return self.forward(tokens).float()

    def _hidden_states(self, tokens):
        """tokens [B, T] -> (x [B, T, dim] before the final norm, [(k, v) [B, KV, T, hd] per layer])."""
        T = tokens.shape[1]
        if T > self.config.seq_len:
            raise ContextOverflowError(0, T, self.config.seq_len, f"a [{tokens.shape[0]}, {T}] token batch")
        x = self.tok_embeddings(tokens)  # [B, T, dim]
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]  # [T, hd]
        kvs = []
        for layer in self.layers:
            x, k, v = layer(x, cos, sin)
            kvs.append((k, v))
        return x, kvs

    # ------------------------------------------------------------------ cached inference

    def setup_cache(self, batch_size: int, device=None, dtype=None) -> None:
        """Allocate the static KV cache for `batch_size` slots (all empty) on device/dtype (default: the model's)."""
        c = self.config
        ref = self.tok_embeddings.weight
        device, dtype = device or ref.device, dtype or ref.dtype
        shape = (c.n_layers, batch_size, c.n_kv_heads, c.seq_len, c.head_dim)
        self.k_cache = self.v_cache = self._graph = None  # the old cache's memory counts as free
        need = kv_cache_bytes(c, batch_size, c.seq_len, dtype)
        check_fits(f"the KV cache for batch {batch_size} x context {c.seq_len} ({c.n_layers} layers x {c.n_kv_heads} "
                   f"kv heads x {c.head_dim}, {str(dtype).removeprefix('torch.')})", need, device,
                   "lower the batch size or the context (--batch-size, --max-context)")
        self.cache_bytes = need  # for reports: K and V together
        self.k_cache = torch.zeros(shape, device=device, dtype=dtype)
        self.v_cache = torch.zeros(shape, device=device, dtype=dtype)
        self.pos = torch.zeros(batch_size, dtype=torch.long, device=device)  # [B]
        self.slots = torch.arange(batch_size, device=device)  # [B] row b is cache slot b
        self.active = torch.zeros(batch_size, dtype=torch.long, device=device)  # [B]
        self.host_pos = np.zeros(batch_size, dtype=np.int64)
        self.host_active = np.zeros(batch_size, dtype=bool)
        self._graph = None  # a captured graph refers to the old buffers
        # On the CPU, x @ W^T with W [vocab, dim] runs the largest matmul of a step along the wrong axis
        # for the BLAS (measured here: 1.2x slower at B=64, 2.2x at B=1 than x @ Wt with Wt contiguous).
        # Inference keeps a transposed copy of the classifier [dim, vocab], taken now: weights changed
        # after setup_cache need another setup_cache.
        w = self.output.weight
        self.classifier_t = w.detach().t().contiguous() if w.device.type == "cpu" else None  # [dim, V]

    @property
    def batch_size(self) -> int:
        return 0 if self.pos is None else self.pos.shape[0]

    def _require_cache(self):
        if self.k_cache is None:
            raise RuntimeError("call setup_cache(batch_size) before prefill/decode")

    @torch.no_grad()
    def prefill(self, rows, tokens: torch.Tensor, lengths) -> torch.Tensor:
        """Start sequences in cache slots `rows` from position 0.

        rows [n] slot indices; tokens [n, T] right-padded prompts; lengths [n] real prompt lengths.
        Fills the slots' KV cache, sets their positions to their lengths, marks them active and
        returns float32 logits [n, vocab_size] of each row's LAST real token.
        """
        self._require_cache()
        rows_host = [int(r) for r in torch.as_tensor(rows).tolist()]
        lengths_host = [int(n) for n in torch.as_tensor(lengths).tolist()]
        n = len(rows_host)
        if tokens.dim() != 2 or tokens.shape[0] != n or len(lengths_host) != n:
            raise ValueError(f"prefill: expected rows [n], tokens [n, T], lengths [n]; got {n} rows, "
                             f"tokens {tuple(tokens.shape)}, {len(lengths_host)} lengths")
        if len(set(rows_host)) != n or any(not 0 <= r < self.batch_size for r in rows_host):
            raise ValueError(f"prefill: rows must be distinct slots in [0, {self.batch_size}), got {rows_host}")
        for r, length in zip(rows_host, lengths_host):
            if length > self.config.seq_len:
                raise ContextOverflowError(r, length, self.config.seq_len, "a prompt")
            if not 1 <= length <= tokens.shape[1]:
                raise ValueError(f"prefill: row {r} has length {length}, expected 1..{tokens.shape[1]} (tokens width)")
        device = self.k_cache.device
        T = max(lengths_host)
        rows_t = torch.tensor(rows_host, device=device)  # [n]
        lengths_t = torch.tensor(lengths_host, device=device)  # [n]
        x, kvs = self._hidden_states(tokens[:, :T].to(device))  # x [n, T, dim]
        for l, (k, v) in enumerate(kvs):
            # positions past a row's length hold padding; they are masked until decode overwrites them
            self.k_cache[l, rows_t, :, :T] = k.to(self.k_cache.dtype)  # [n, KV, T, hd]
            self.v_cache[l, rows_t, :, :T] = v.to(self.v_cache.dtype)
        last = x[torch.arange(n, device=device), lengths_t - 1]  # [n, dim]
        self.pos[rows_t] = lengths_t
        self.active[rows_t] = 1
        self.host_pos[rows_host] = lengths_host
        self.host_active[rows_host] = True
        return self._classify(self.norm(last)).float()

    @torch.no_grad()
    def reset(self, rows) -> None:
        """Free slots `rows` for reuse: position 0, inactive.  Other rows are untouched."""
        self._require_cache()
        rows_host = [int(r) for r in torch.as_tensor(rows).reshape(-1).tolist()]
        rows_t = torch.tensor(rows_host, dtype=torch.long, device=self.pos.device)
        self.pos[rows_t] = 0
        self.active[rows_t] = 0
        self.host_pos[rows_host] = 0
        self.host_active[rows_host] = False

    def _check_room(self, n=1) -> None:
        """Raise ContextOverflowError if an active row has no room for n more tokens (an int, or one per row;
        host data only)."""
        n = np.broadcast_to(np.asarray(n, dtype=np.int64), self.host_pos.shape)
        full = np.flatnonzero(self.host_active & (self.host_pos + n > self.config.seq_len))
        if full.size:
            row = int(full[0])
            what = "decoding one more token" if n[row] == 1 else f"decoding {int(n[row])} more tokens"
            raise ContextOverflowError(row, int(self.host_pos[row] + n[row]), self.config.seq_len, what)

    def _decode_step(self, tokens: torch.Tensor, window: int) -> torch.Tensor:
        """The device work of one decode step; static shapes, no host sync.

        tokens [B] -> float32 logits [B, V].  Attention looks at cache positions [0, window).
        """
        pos = self.pos.clamp(max=self.config.seq_len - 1)  # [B]; clamp = defence against misuse
        x = self.tok_embeddings(tokens)  # [B, dim]
        cos, sin = self.rope_cos[pos], self.rope_sin[pos]  # [B, hd]
        # additive mask, built once per step (a boolean one is converted inside every SDPA call)
        visible = self.positions[:window][None, :] <= pos[:, None]  # [B, W]
        mask = torch.zeros(visible.shape, dtype=x.dtype, device=x.device).masked_fill_(~visible, float("-inf"))
        mask = mask[:, None, None, :]  # [B, 1, 1, W]
        for l, layer in enumerate(self.layers):
            x = layer.decode(x, cos, sin, self.k_cache[l], self.v_cache[l], self.slots, pos, mask)
        self.pos += self.active  # inactive slots stay at position 0
        return self._classify(self.norm(x)).float()

    def _classify(self, x: torch.Tensor) -> torch.Tensor:
        """x [n, dim] -> logits [n, V] (the inference cache's transposed classifier on the CPU)."""
        if getattr(self, "classifier_t", None) is not None:
            return x @ self.classifier_t
        return self.output(x)

    @torch.no_grad()
    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """One token for every slot: tokens [B] -> float32 logits [B, vocab_size]; active rows' pos += 1.

        Inactive slots compute garbage at position 0 (static shapes) and are ignored.  Eager mode:
        attention only spans up to the longest active row (known on the host), rounded up to 32.
        """
        self._require_cache()
        if tokens.shape != (self.batch_size,):
            raise ValueError(f"decode: expected tokens of shape ({self.batch_size},), got {tuple(tokens.shape)}")
        self._check_room()
        longest = int(self.host_pos[self.host_active].max(initial=0)) + 1
        window = min(self.config.seq_len, -(-longest // 32) * 32)
        logits = self._decode_step(tokens.to(self.pos.device), window)
        self.host_pos += self.host_active
        return logits


# -----------------------------------------------------------------------------
# loading


def _empty_model(config: ModelConfig, device, dtype) -> Transformer:
    """A Transformer with uninitialised parameters on device/dtype (built on the meta device: no init cost)."""
    n = sum(math.prod(s) for s in weight_shapes(config).values())
    check_fits(f"the weights ({n:,} values in {dtype})", n * torch.empty((), dtype=dtype).element_size(), device,
               "use a smaller model or dtype")
    # the meta device as the layers' factory argument; their random init is skipped there (layers.Linear)
    model = Transformer(config, device="meta")
    # storage for each parameter by torch.empty on the device (Module.to_empty copies meta tensors through
    # torch's Python reference ops, which import sympy: 0.6 s of start-up)
    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None:
                module._parameters[name] = nn.Parameter(torch.empty(p.shape, device=device, dtype=dtype),
                                                        requires_grad=p.requires_grad)
    if config.shared_classifier:  # one tensor for both, as the checkpoint has
        model.output.weight = model.tok_embeddings.weight
    # buffers were created on the meta device: rebuild them
    cos, sin = rope_multipliers(config)
    model.rope_cos, model.rope_sin = cos.to(device), sin.to(device)
    model.positions = torch.arange(config.seq_len, device=device)
    return model


def load_checkpoint(path, device="cpu", dtype=None, max_context: int | None = None) -> Transformer:
    """Build a Transformer from a llama2.c checkpoint (v0/v1/v2, models/checkpoint.py) or a Hugging Face model
    directory (config.json + safetensors, models/hf.py), told apart by content; an ORG/NAME hub id is resolved
    through huggingface_hub when it is not a local path.

    The context (seq_len) is the checkpoint's (llama2.c's header, HF's max_position_embeddings), capped by
    max_context. float32 by default; bfloat16/float16 only on CUDA (CPU half-precision matmuls are slow and
    lose accuracy). Raises CheckpointError for a malformed checkpoint or NaN/Inf weights (naming the tensor),
    OutOfMemoryError for weights the device cannot hold.
    """
    from .hf import HFCheckpoint, hf_directory, resolve_checkpoint

    device = torch.device(device)
    dtype = dtype or torch.float32
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating point type, got {dtype}")
    if dtype in (torch.float16, torch.bfloat16) and device.type != "cuda":
        raise ValueError(f"dtype {dtype} is only supported on CUDA; use float32 on {device}")
    if max_context is not None and (isinstance(max_context, bool) or not isinstance(max_context, int)
                                    or max_context <= 0):
        raise ValueError(f"max_context must be a positive integer, got {max_context!r}")
    path = resolve_checkpoint(path)
    if hf_directory(path) is not None:
        ckpt = HFCheckpoint(path, max_context=max_context)
        model = _empty_model(ckpt.config, device, dtype)
        with torch.no_grad():
            model.load_outer(ckpt.outer_weights())
            for l in range(ckpt.config.n_layers):  # one layer of file tensors at a time
                model.load_layer(l, ckpt.layer_weights(l))
        model.hf_info = ckpt.info
        return model.eval()
    config, weights = read_checkpoint(path)
    if max_context is not None and max_context < config.seq_len:
        config = dataclasses.replace(config, seq_len=max_context)
    model = _empty_model(config, device, dtype)
    model.load_weights(weights)
    return model.eval()
