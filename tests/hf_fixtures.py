"""Small random Hugging Face checkpoints written by transformers itself (save_pretrained), for the HF tests."""
from __future__ import annotations

import json
from pathlib import Path

import torch

ARCH = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "mistral": ("MistralConfig", "MistralForCausalLM"),
        "qwen2": ("Qwen2Config", "Qwen2ForCausalLM")}
BASE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=120, max_position_embeddings=160, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def hf_model(arch: str, seed: int = 0, **overrides):
    """A transformers model of `arch` with random weights large enough that attention is not uniform."""
    import transformers
    config_cls, model_cls = (getattr(transformers, n) for n in ARCH[arch])
    model = model_cls(config_cls(**{**BASE, **overrides})).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=g))
    return model


def save(model, path: Path, dtype=None, max_shard_size=None) -> Path:
    """save_pretrained into `path` (in `dtype` if given, which converts `model` too; sharded if max_shard_size)."""
    if dtype is not None:
        model = model.to(dtype)
    from transformers.utils import logging
    logging.disable_progress_bar()  # keeps stderr for the messages the tests read
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(path, **kwargs)
    return path


def to_classic_spelling(path: Path) -> dict:
    """Rewrite config.json the way transformers < 5 wrote it: rope_theta / rope_scaling / torch_dtype."""
    cfg = json.loads((path / "config.json").read_text())
    rope = dict(cfg.pop("rope_parameters"))
    cfg["rope_theta"] = rope.pop("rope_theta")
    kind = rope.pop("rope_type")
    # the oldest spelling names the kind "type"; llama3 configs use "rope_type"
    cfg["rope_scaling"] = None if kind == "default" else {("type" if kind == "linear" else "rope_type"): kind, **rope}
    cfg["torch_dtype"] = cfg.pop("dtype")
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    return cfg


def edit_config(path: Path, **changes) -> None:
    cfg = json.loads((path / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (path / "config.json").write_text(json.dumps(cfg, indent=2))


def greedy_ours(model, prompts: list[list[int]], n_new: int) -> list[list[int]]:
    """All prompts in one batch, right-padded, prefill then cached decode steps."""
    model.setup_cache(len(prompts))
    lengths = [len(p) for p in prompts]
    padded = torch.zeros(len(prompts), max(lengths), dtype=torch.long)
    for i, p in enumerate(prompts):
        padded[i, :len(p)] = torch.tensor(p)
    nxt = model.prefill(torch.arange(len(prompts)), padded, torch.tensor(lengths)).argmax(-1)
    out = [nxt]
    for _ in range(n_new - 1):
        nxt = model.decode(nxt).argmax(-1)
        out.append(nxt)
    return torch.stack(out, 1).tolist()


def greedy_transformers(model, prompt: list[int], n_new: int) -> list[int]:
    """transformers' greedy continuation: n_new tokens, or fewer ending with EOS (where generate stops)."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=n_new, do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()
