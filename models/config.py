"""
The hyperparameters of the batched Llama-family Transformer, whatever file they came from.

A llama2.c header holds 7 integers and a classifier flag; a Hugging Face `config.json` adds the RoPE base
and scaling, the RMSNorm epsilon, q/k/v biases (Qwen2) and an explicit head size. `ModelConfig` holds all
of them, with llama2.c's values as defaults, so a llama2.c checkpoint is simply a config whose extra fields
are at their defaults (`llama2c_incompatibilities` says which are not, for the writer and the converter).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

PARAM_FIELDS = ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len")
ROPE_KINDS = ("default", "linear", "llama3")
LLAMA2C_THETA = 10000.0  # run.c's RoPE base
LLAMA2C_EPS = 1e-5  # run.c's RMSNorm epsilon


class CheckpointError(ValueError):
    """A checkpoint file (or a config / weights set about to be written) is unusable.

    The message names the file, the field, what was expected and what was found; the same facts
    are kept as attributes for callers that want to react programmatically.
    """

    def __init__(self, path, field: str, expected, found, detail: str = ""):
        self.path, self.field, self.expected, self.found = str(path), field, expected, found
        msg = f"{path}: field '{field}': expected {expected}, found {found}"
        super().__init__(msg + (f" ({detail})" if detail else ""))


@dataclass(frozen=True)
class RopeConfig:
    """RoPE frequencies: pair j of a head turns by pos * inv_freq[j], inv_freq[j] = theta^(-2j/head_dim),
    then rescaled by `kind`:

    default  unchanged
    linear   inv_freq / factor (positions interpolated `factor` times)
    llama3   Llama 3.1's per-frequency rule: wavelengths above original_context / low_freq_factor are
             divided by factor, those below original_context / high_freq_factor kept, the band between
             blended linearly in original_context / wavelength
    """

    theta: float = LLAMA2C_THETA
    kind: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_context: int = 0

    def validate(self, path="<config>", field: str = "rope") -> RopeConfig:
        if self.kind not in ROPE_KINDS:
            raise CheckpointError(path, f"{field}.rope_type", f"one of {', '.join(ROPE_KINDS)}", repr(self.kind))
        if not (math.isfinite(self.theta) and self.theta > 1):
            raise CheckpointError(path, f"{field}.rope_theta", "a finite number > 1", self.theta)
        if self.kind != "default" and not (math.isfinite(self.factor) and self.factor >= 1):
            raise CheckpointError(path, f"{field}.factor", "a finite number >= 1", self.factor)
        if self.kind == "llama3":
            if not (0 < self.low_freq_factor < self.high_freq_factor) or not math.isfinite(self.high_freq_factor):
                raise CheckpointError(path, f"{field}.low_freq_factor/high_freq_factor", "0 < low < high (finite)",
                                      f"{self.low_freq_factor}/{self.high_freq_factor}")
            if not self.original_context > 0:
                raise CheckpointError(path, f"{field}.original_max_position_embeddings", "a positive integer",
                                      self.original_context)
        return self


@dataclass(frozen=True)
class ModelConfig:
    """The hyperparameters of a Transformer: llama2.c's 7 header ints and classifier flag, then the
    fields Hugging Face configs add (their defaults are what run.c hard-codes).

    seq_len is the context the model is built for: llama2.c's header value, or a HF config's
    max_position_embeddings capped by the caller's max_context.
    """

    dim: int
    hidden_dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    seq_len: int
    shared_classifier: bool = True
    rope: RopeConfig = RopeConfig()
    norm_eps: float = LLAMA2C_EPS
    qkv_bias: bool = False  # Qwen2: biases on the q, k and v projections
    head_size: int = 0  # 0: dim // n_heads (llama2.c); a HF config's explicit head_dim otherwise

    @property
    def head_dim(self) -> int:
        return self.head_size or self.dim // self.n_heads

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    def validate(self, path="<config>") -> ModelConfig:
        """Raise CheckpointError unless the shape parameters describe a buildable model."""
        for field in PARAM_FIELDS:
            value = getattr(self, field)
            if not isinstance(value, (int, np.integer)) or value <= 0:
                raise CheckpointError(path, field, "a positive integer", value)
        if not self.head_size and self.dim % self.n_heads:
            raise CheckpointError(path, "dim", f"a multiple of n_heads={self.n_heads}", self.dim)
        if self.n_kv_heads > self.n_heads or self.n_heads % self.n_kv_heads:
            raise CheckpointError(path, "n_kv_heads", f"a divisor of n_heads={self.n_heads}", self.n_kv_heads)
        if self.head_dim <= 0 or self.head_dim % 2:
            # RoPE rotates (even, odd) pairs inside each head
            explicit = bool(self.head_size)      # HF's head_dim, given beside hidden_size
            raise CheckpointError(path, "head_size" if explicit else "dim",
                                  f"{'head_dim' if explicit else 'dim / n_heads'} to be even (RoPE rotates pairs)",
                                  f"dim={self.dim}, n_heads={self.n_heads}, head_dim={self.head_dim}")
        if not (math.isfinite(self.norm_eps) and self.norm_eps > 0):
            raise CheckpointError(path, "norm_eps", "a positive finite number", self.norm_eps)
        self.rope.validate(path)
        return self

    def llama2c_incompatibilities(self) -> list[str]:
        """What llama2.c's file formats (7 ints + a flag; run.c fixes RoPE and RMSNorm) cannot hold."""
        out = []
        if self.rope.kind != "default":
            out.append(f"rope scaling '{self.rope.kind}' (llama2.c has no rope scaling)")
        if self.rope.theta != LLAMA2C_THETA:
            out.append(f"rope_theta {self.rope.theta:g} (run.c fixes {LLAMA2C_THETA:g})")
        if self.norm_eps != LLAMA2C_EPS:
            out.append(f"rms_norm_eps {self.norm_eps:g} (run.c fixes {LLAMA2C_EPS:g})")
        if self.qkv_bias:
            out.append("q/k/v biases (llama2.c's layers have none)")
        if self.head_size and self.head_size * self.n_heads != self.dim:
            out.append(f"head_dim {self.head_size} with dim {self.dim} / {self.n_heads} heads "
                       "(llama2.c derives head_dim = dim / n_heads)")
        return out


def weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every weight tensor of `config` (the single source of truth for layouts)."""
    c, L = config, config.n_layers
    shapes = {
        "token_embedding": (c.vocab_size, c.dim),
        "rms_att": (L, c.dim),
        "wq": (L, c.q_dim, c.dim),
        "wk": (L, c.kv_dim, c.dim),
        "wv": (L, c.kv_dim, c.dim),
        "wo": (L, c.dim, c.q_dim),
        "rms_ffn": (L, c.dim),
        "w1": (L, c.hidden_dim, c.dim),
        "w2": (L, c.dim, c.hidden_dim),
        "w3": (L, c.hidden_dim, c.dim),
        "rms_final": (c.dim,),
    }
    if c.qkv_bias:
        shapes.update(bq=(L, c.q_dim), bk=(L, c.kv_dim), bv=(L, c.kv_dim))
    if not c.shared_classifier:
        shapes["wcls"] = (c.vocab_size, c.dim)
    return shapes
