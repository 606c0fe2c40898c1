"""
Hugging Face model directories: `config.json` + `model.safetensors`, or shards listed by
`model.safetensors.index.json`, read through the safetensors library (memory-mapped, one tensor at a time).

    ckpt = HFCheckpoint("SmolLM2-135M-Instruct/", max_context=4096)
    ckpt.config                  # models/config.py ModelConfig (see models/hf_config.py)
    ckpt.outer_weights()         # token_embedding, rms_final (and wcls when untied)
    ckpt.layer_weights(l)        # rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3 (and bq, bk, bv): one layer
    ckpt.weights()               # all of it, stacked over layers (checkpoint naming, float32): the converter

Names: model.embed_tokens -> token_embedding; model.layers.{l}.input_layernorm -> rms_att,
self_attn.{q,k,v,o}_proj -> wq, wk, wv, wo (q/k/v biases -> bq, bk, bv), post_attention_layernorm -> rms_ffn,
mlp.gate_proj / up_proj / down_proj -> w1 / w3 / w2; model.norm -> rms_final; lm_head -> wcls.
q/k rows (and biases) are permuted from HF's half-split RoPE layout into pair order (models/rope.py).

Everything that can be checked without reading weights is checked when the checkpoint is opened (every
tensor present in the file the index names, no unknown tensor, shapes, dtypes float32/bfloat16/float16);
each tensor is checked for NaN/Inf as it is read. Every failure is one CheckpointError line naming the file
and the tensor. `resolve_checkpoint("ORG/NAME")` finds a hub id through huggingface_hub (local cache and
HF_HUB_OFFLINE respected).
"""
from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import torch

from .checkpoint import check_finite
from .config import CheckpointError, ModelConfig, weight_shapes
from .hf_config import HFInfo, parse_hf_config, read_config_json
from .rope import half_to_pairs

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
FILE_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
OUTER = {"token_embedding": "model.embed_tokens.weight", "rms_final": "model.norm.weight", "wcls": "lm_head.weight"}
LAYER = {"rms_att": "input_layernorm.weight", "wq": "self_attn.q_proj.weight", "wk": "self_attn.k_proj.weight",
         "wv": "self_attn.v_proj.weight", "wo": "self_attn.o_proj.weight", "rms_ffn": "post_attention_layernorm.weight",
         "w1": "mlp.gate_proj.weight", "w2": "mlp.down_proj.weight", "w3": "mlp.up_proj.weight",
         "bq": "self_attn.q_proj.bias", "bk": "self_attn.k_proj.bias", "bv": "self_attn.v_proj.bias"}
# stored by some exporters and not weights: skipped
IGNORED = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
HUB_FILES = ["config.json", "generation_config.json", "*.safetensors", INDEX, "tokenizer*", "special_tokens_map.json",
             "*.model"]


# -----------------------------------------------------------------------------
# what a path is


def hf_directory(path) -> Path | None:
    """The model directory `path` names (the directory, or its config.json / *.safetensors / index file, told
    apart by content), or None when it is not a HF checkpoint (a llama2.c file)."""
    p = Path(path)
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise CheckpointError(p, "config.json", "a Hugging Face model directory (config.json + model.safetensors)",
                                  "a directory without config.json")
        return p
    if not p.is_file():
        return None
    with open(p, "rb") as f:
        head = f.read(9)
    if head[:1] == b"{" and p.stat().st_size < 64 << 20:  # config.json / the index: small JSON files
        try:
            doc = json.loads(p.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            return None
        if not (p.parent / "config.json").is_file():  # a JSON file of some other kind, alone
            tokenizer = isinstance(doc, dict) and isinstance(doc.get("model"), dict) and "added_tokens" in doc
            raise CheckpointError(p, "file", "a llama2.c checkpoint or a Hugging Face model directory (or its "
                                  "config.json)", "a tokenizer.json (pass it as --tokenizer)" if tokenizer
                                  else "a JSON file with no config.json beside it")
        return p.parent  # config.json or the shard index
    if len(head) == 9 and head[8:9] == b"{" and struct.unpack("<Q", head[:8])[0] < p.stat().st_size:
        return p.parent  # a safetensors file: 8-byte header length, then the JSON header
    return None


def resolve_checkpoint(spec) -> Path:
    """A local path as given; otherwise an ORG/NAME hub id through huggingface_hub's snapshot_download (the
    config, safetensors and tokenizer files only; the local cache and HF_HUB_OFFLINE respected)."""
    p = Path(spec)
    # a path whose folder exists here is a local path with a typo, not a hub id
    if p.exists() or not HUB_ID.fullmatch(str(spec)) or p.parent.is_dir():
        return p
    try:
        import huggingface_hub
        from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError
    except ImportError:
        raise CheckpointError(spec, "checkpoint", "an existing file or directory, or a hub id with huggingface_hub "
                              "installed (pip install 'batchmask[hf]')", "no such path") from None
    try:
        return Path(huggingface_hub.snapshot_download(repo_id=str(spec), allow_patterns=HUB_FILES))
    except LocalEntryNotFoundError:
        from huggingface_hub import constants
        why = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else "the hub could not be reached"
        raise CheckpointError(spec, "checkpoint", "a local path or a hub model id",
                              f"no such path, no snapshot in the cache {constants.HF_HUB_CACHE}, and {why}") from None
    except RepositoryNotFoundError:
        raise CheckpointError(spec, "checkpoint", "a model repository on the Hugging Face hub",
                              "no such repository (or it is gated/private)") from None
    except Exception as e:  # noqa: BLE001 -- any other failure of the hub client (network, proxy) is one line
        raise CheckpointError(spec, "checkpoint", "a downloadable hub model",
                              str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__) from None


# -----------------------------------------------------------------------------
# the checkpoint


class HFCheckpoint:
    """An opened, checked HF model directory (see the module doc)."""

    def __init__(self, path, max_context: int | None = None):
        self.dir = hf_directory(path)
        if self.dir is None:
            raise CheckpointError(path, "file", "a Hugging Face model directory", "not one")
        cfg_path = self.dir / "config.json"
        self.config, self.info = parse_hf_config(read_config_json(cfg_path), cfg_path, max_context)
        self.config: ModelConfig
        self.info: HFInfo
        self._handles: dict[Path, object] = {}  # file -> open safetensors handle (memory-mapped)
        self._files = self._tensor_files()  # HF tensor name -> file
        self._check_headers()

    # ------------------------------------------------------------- layout

    def expected(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """HF tensor name -> (checkpoint name, shape of one layer's / the outer tensor)."""
        c = self.config
        shapes = weight_shapes(c)
        out = {}
        for name, hf in OUTER.items():
            if name in shapes:
                out[hf] = (name, shapes[name])
        for l in range(c.n_layers):
            for name, hf in LAYER.items():
                if name in shapes:
                    out[f"model.layers.{l}.{hf}"] = (name, shapes[name][1:])
        return out

    def _tensor_files(self) -> dict[str, Path]:
        index = self.dir / INDEX
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
            except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as e:
                raise CheckpointError(index, "file", "a JSON object with a weight_map", f"unreadable ({e})") from None
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise CheckpointError(index, "weight_map", "an object of tensor name -> shard file",
                                      repr(weight_map)[:80])
            root = self.dir.resolve()
            for name, shard in weight_map.items():
                # a shard is a file of this directory: an index must not read `../../etc/...` or an absolute path
                if Path(shard).is_absolute() or not (self.dir / shard).resolve().is_relative_to(root):
                    raise CheckpointError(index, "weight_map", f"a shard file inside {self.dir} (for {name})",
                                          repr(shard)[:120])
                if not (self.dir / shard).is_file():
                    raise CheckpointError(index, "weight_map", f"shard file {shard} (it holds {name})",
                                          "no such file in " + str(self.dir))
            return {name: self.dir / shard for name, shard in weight_map.items()}
        single = self.dir / SINGLE
        if not single.is_file():
            raise CheckpointError(self.dir, "weights", f"{SINGLE} or {INDEX} (safetensors weights)",
                                  "neither file" + (" (PyTorch .bin weights are not read: convert them to "
                                                    "safetensors)" if any(self.dir.glob("*.bin")) else ""))
        return {name: single for name in self._handle(single).keys()}

    def _handle(self, file: Path):
        if file not in self._handles:
            from safetensors import SafetensorError, safe_open
            try:
                self._handles[file] = safe_open(str(file), framework="pt", device="cpu")
            except (SafetensorError, OSError) as e:
                raise CheckpointError(file, "file", "a safetensors file", f"unreadable ({e})") from None
        return self._handles[file]

    def _check_headers(self) -> None:
        """Names, shapes and dtypes of every tensor, from the safetensors headers (no weight is read)."""
        expected = self.expected()
        tied = self.config.shared_classifier
        for name, file in self._files.items():
            if name not in expected and not IGNORED.fullmatch(name) and not (tied and name == OUTER["wcls"]):
                raise CheckpointError(file, f"tensor {name}", f"only the tensors of a {self.info.architecture} "
                                      "with this config.json", "an unexpected tensor",
                                      "a config.json that does not describe these weights?")
        files = set(self._files.values())
        keys = {file: set(self._handle(file).keys()) for file in files}
        for name, (_, shape) in expected.items():
            file = self._files.get(name)
            if file is None:
                where = self.dir / (INDEX if (self.dir / INDEX).is_file() else SINGLE)
                raise CheckpointError(where, f"tensor {name}", f"a tensor of shape {list(shape)}", "no such tensor")
            if name not in keys[file]:
                raise CheckpointError(file, f"tensor {name}", f"the tensor {INDEX} places in this file",
                                      "no such tensor in the file")
            sl = self._handle(file).get_slice(name)
            if tuple(sl.get_shape()) != tuple(shape):
                raise CheckpointError(file, f"tensor {name}", f"shape {list(shape)} (from config.json)",
                                      list(sl.get_shape()))
            if sl.get_dtype() not in FILE_DTYPES:
                raise CheckpointError(file, f"tensor {name}", "dtype F32, BF16 or F16", sl.get_dtype())

    # ------------------------------------------------------------- reading

    def tensor(self, hf_name: str) -> torch.Tensor:
        """One tensor in its file's dtype, checked finite."""
        file = self._files[hf_name]
        t = self._handle(file).get_tensor(hf_name)
        check_finite(file, hf_name, t)
        return t

    def _named(self, name: str, hf_name: str) -> torch.Tensor:
        t = self.tensor(hf_name)
        c = self.config
        if name in ("wq", "bq"):
            t = t[half_to_pairs(c.n_heads, c.head_dim)]
        elif name in ("wk", "bk"):
            t = t[half_to_pairs(c.n_kv_heads, c.head_dim)]
        return t

    def outer_weights(self) -> dict[str, torch.Tensor]:
        names = ["token_embedding", "rms_final"] + ([] if self.config.shared_classifier else ["wcls"])
        return {name: self._named(name, OUTER[name]) for name in names}

    def layer_weights(self, l: int) -> dict[str, torch.Tensor]:
        names = [n for n in LAYER if self.config.qkv_bias or not n.startswith("b")]
        return {name: self._named(name, f"model.layers.{l}.{LAYER[name]}") for name in names}

    def weights(self) -> dict[str, torch.Tensor]:
        """Every weight in checkpoint naming, stacked over layers, float32 (what write_checkpoint takes)."""
        out = {k: v.float() for k, v in self.outer_weights().items()}
        layers = [self.layer_weights(l) for l in range(self.config.n_layers)]
        for name in layers[0]:
            out[name] = torch.stack([w[name].float() for w in layers])
        return out
