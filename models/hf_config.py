"""
A Hugging Face `config.json` -> ModelConfig, for the Llama-family architectures the batched model runs:

    LlamaForCausalLM    Llama 2/3.x, SmolLM, TinyLlama (no attention/MLP biases)
    MistralForCausalLM  when it has no sliding window shorter than the context
    Qwen2ForCausalLM    q/k/v biases; its sliding window only when shorter than the context

Both spellings of RoPE and dtype are read: the classic top-level `rope_theta`, `rope_scaling`,
`torch_dtype`, and `rope_parameters` / `dtype` that transformers >= 5 writes. RoPE types default, linear
and llama3 are computed (models/rope.py); anything else (yarn, dynamic, longrope, ...), other
architectures, MoE fields, quantised checkpoints, activations other than SiLU and sliding windows are
refused with one line naming the field and its value. Defaults for absent optional fields are those of
the transformers config class of each architecture.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .config import ROPE_KINDS, CheckpointError, ModelConfig, RopeConfig

ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
# transformers' defaults for the optional fields (LlamaConfig, MistralConfig, Qwen2Config)
MAX_POSITIONS_DEFAULT = {"LlamaForCausalLM": 2048, "MistralForCausalLM": 4096 * 32, "Qwen2ForCausalLM": 32768}
EPS_DEFAULT = 1e-6
THETA_DEFAULT = 10000.0
# fields that only mixture-of-experts configs carry
MOE_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size")


# ModelConfig field -> the config.json field it comes from (for messages)
HF_NAMES = {"dim": "hidden_size", "hidden_dim": "intermediate_size", "n_layers": "num_hidden_layers",
            "n_heads": "num_attention_heads", "n_kv_heads": "num_key_value_heads", "vocab_size": "vocab_size",
            "seq_len": "max_position_embeddings", "norm_eps": "rms_norm_eps", "head_size": "head_dim"}


@dataclass(frozen=True)
class HFInfo:
    """What config.json says beyond the shapes: for messages and the KV cache report."""

    architecture: str
    max_positions: int  # max_position_embeddings (the context is this, capped by max_context)
    dtype: str | None  # the config's dtype (transformers >= 5) or torch_dtype (classic)


def _get(cfg: dict, path, field: str, kind, default=None, required: bool = False):
    """cfg[field] checked against `kind` (int: a positive int; float: a number; bool; str), or default."""
    if field not in cfg or cfg[field] is None:
        if required:
            raise CheckpointError(path, field, f"{'an integer' if kind is int else 'a ' + kind.__name__} (the field is "
                                  "required)", "no such field")
        return default
    value = cfg[field]
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise CheckpointError(path, field, "a positive integer", repr(value))
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CheckpointError(path, field, "a number", repr(value))
        value = float(value)
    elif not isinstance(value, kind):
        raise CheckpointError(path, field, f"a {kind.__name__}", repr(value))
    return value


def read_config_json(path) -> dict:
    path = Path(path)
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(path, "file", "a Hugging Face config.json", "nothing at this path") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(path, "file", "a JSON object", f"unreadable JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise CheckpointError(path, "file", "a JSON object", type(cfg).__name__)
    return cfg


def _architecture(cfg: dict, path) -> str:
    archs = cfg.get("architectures")
    if archs is None and cfg.get("model_type") in MODEL_TYPES:
        return MODEL_TYPES[cfg["model_type"]]
    if not isinstance(archs, list) or len(archs) != 1 or archs[0] not in ARCHITECTURES:
        raise CheckpointError(path, "architectures", f"one of {', '.join(ARCHITECTURES)}",
                              repr(archs) if archs is not None else
                              f"no such field (and model_type {cfg.get('model_type')!r} names none of them)")
    return archs[0]


def _rope(cfg: dict, path) -> RopeConfig:
    """RopeConfig from rope_parameters (transformers >= 5) or rope_theta + rope_scaling (classic)."""
    params, field = cfg.get("rope_parameters"), "rope_parameters"
    if params is None:
        params, field = cfg.get("rope_scaling") or {}, "rope_scaling"
    if not isinstance(params, dict):
        raise CheckpointError(path, field, "an object or null", repr(params))
    if params and all(isinstance(v, dict) for v in params.values()):
        raise CheckpointError(path, field, "one set of RoPE parameters", f"one per layer type ({sorted(params)})")
    kind = params.get("rope_type", params.get("type")) or "default"
    if kind not in ROPE_KINDS:
        raise CheckpointError(path, f"{field}.rope_type", f"one of {', '.join(ROPE_KINDS)}", repr(kind))
    theta_src = params if "rope_theta" in params else cfg
    theta = _get(theta_src, path, "rope_theta", float, THETA_DEFAULT)
    partial = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        raise CheckpointError(path, "partial_rotary_factor", "1 (RoPE over the whole head)", repr(partial))
    if kind == "default":
        return RopeConfig(theta=theta).validate(path, field)
    factor = _get(params, f"{path} {field}", "factor", float, required=True)
    if kind == "linear":
        return RopeConfig(theta=theta, kind="linear", factor=factor).validate(path, field)
    where = f"{path} {field}"
    return RopeConfig(theta=theta, kind="llama3", factor=factor,
                      low_freq_factor=_get(params, where, "low_freq_factor", float, required=True),
                      high_freq_factor=_get(params, where, "high_freq_factor", float, required=True),
                      original_context=_get(params, where, "original_max_position_embeddings", int, required=True),
                      ).validate(path, field)


def _check_sliding_window(cfg: dict, path, arch: str, context: int, n_layers: int) -> None:
    """Refuse a sliding window shorter than the context (a row attending further than it would be wrong)."""
    window = cfg.get("sliding_window")
    if arch == "Qwen2ForCausalLM" and not cfg.get("use_sliding_window", False):
        window = None  # Qwen2 ignores sliding_window unless use_sliding_window is set
    layer_types = cfg.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != n_layers:
            raise CheckpointError(path, "layer_types", f"a list of {n_layers} attention types", repr(layer_types))
        odd = sorted({t for t in layer_types if t not in ("full_attention", "sliding_attention")}, key=str)
        if odd:
            raise CheckpointError(path, "layer_types", "full_attention or sliding_attention", repr(odd[0]))
        if "sliding_attention" not in layer_types:
            window = None
    elif arch == "Qwen2ForCausalLM" and window is not None:
        if _get(cfg, path, "max_window_layers", int, 28) >= n_layers:
            window = None  # no layer at or past max_window_layers: every layer attends in full
    if window is None:
        return
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise CheckpointError(path, "sliding_window", "a positive integer or null", repr(window))
    if window < context:
        raise CheckpointError(path, "sliding_window", f"null or at least the context ({context} positions)", window,
                              f"sliding-window attention is not supported; --max-context {window} fits the window")


def parse_hf_config(cfg: dict, path, max_context: int | None = None) -> tuple[ModelConfig, HFInfo]:
    """The ModelConfig of config.json `cfg` (read from `path`, named in every error)."""
    arch = _architecture(cfg, path)
    if cfg.get("quantization_config") is not None:
        method = cfg["quantization_config"].get("quant_method") if isinstance(cfg["quantization_config"], dict) \
            else cfg["quantization_config"]
        raise CheckpointError(path, "quantization_config", "none (float32/bfloat16/float16 weights)",
                              f"quant_method {method!r}")
    for field in MOE_FIELDS:
        if cfg.get(field):
            raise CheckpointError(path, field, "absent (mixture-of-experts models are not supported)", cfg[field])
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(path, "hidden_act", "'silu' (SwiGLU)", repr(act))
    for field in ("attention_bias", "mlp_bias"):
        if arch != "Qwen2ForCausalLM" and cfg.get(field):
            raise CheckpointError(path, field, f"false for {arch} (only Qwen2's q/k/v biases are supported)",
                                  cfg[field])
    dim = _get(cfg, path, "hidden_size", int, required=True)
    n_heads = _get(cfg, path, "num_attention_heads", int, required=True)
    n_layers = _get(cfg, path, "num_hidden_layers", int, required=True)
    max_positions = _get(cfg, path, "max_position_embeddings", int, MAX_POSITIONS_DEFAULT[arch])
    if max_context is not None and (isinstance(max_context, bool) or not isinstance(max_context, int)
                                    or max_context <= 0):
        raise CheckpointError(path, "max_context", "a positive integer", repr(max_context))
    context = min(max_positions, max_context) if max_context else max_positions
    # informational: the tensors' own dtypes (checked per tensor in models/hf.py) are what is read
    dtype = cfg.get("dtype", cfg.get("torch_dtype"))
    _check_sliding_window(cfg, path, arch, context, n_layers)
    head_dim = _get(cfg, path, "head_dim", int, 0)
    config = ModelConfig(
        dim=dim, hidden_dim=_get(cfg, path, "intermediate_size", int, required=True), n_layers=n_layers,
        n_heads=n_heads, n_kv_heads=_get(cfg, path, "num_key_value_heads", int, n_heads),
        vocab_size=_get(cfg, path, "vocab_size", int, required=True), seq_len=context,
        shared_classifier=_get(cfg, path, "tie_word_embeddings", bool, False), rope=_rope(cfg, path),
        norm_eps=_get(cfg, path, "rms_norm_eps", float, EPS_DEFAULT), qkv_bias=arch == "Qwen2ForCausalLM",
        head_size=0 if head_dim == dim // n_heads and dim % n_heads == 0 else head_dim)
    try:
        config.validate(path)
    except CheckpointError as e:  # say it in config.json's words
        raise CheckpointError(path, HF_NAMES.get(e.field, e.field), e.expected, e.found) from None
    return config, HFInfo(arch, max_positions, dtype)
