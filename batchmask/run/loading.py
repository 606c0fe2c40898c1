"""What a command loads: the device and dtype it runs in, the model and tokenizer files, the tool registry.

Every failure is a ValueError (or the loader's own error) with one line naming the flag or file; the CLI
prints it. Nothing here imports torch at module level, so `batchmask --help` stays quick.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

DEFAULT_MAX_NEW_TOKENS = 160
# The embedded model ships inside batchmask.models (the repository's models/default/): found through the
# package, so an installed wheel and an editable install both find it (without importing torch here).
DEFAULT_DIR = Path(importlib.util.find_spec("batchmask.models").submodule_search_locations[0]) / "default"
DEFAULT_MAX_CONTEXT = 4096  # --max-context: positions per row of the KV cache, at most


def _device(name: str | None):
    import torch
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):  # torch knows meta, mps, xla...: none runs this model here
        raise ValueError(f"--device {name}: expected auto, cpu, cuda or cuda:N")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: CUDA is not available on this machine")
    return dev


# --dtype's names (the CLI's argparse choices, with "auto") -> torch's
DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16",
          "fp16": "float16"}


def _dtype(name: str | None, device):
    import torch
    if name in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in DTYPES:
        raise ValueError(f"--dtype {name}: expected one of float32, bfloat16, float16")
    return getattr(torch, DTYPES[name])


def resolve_model_paths(checkpoint, tokenizer_path) -> tuple[Path, Path]:
    """The checkpoint and tokenizer files a run uses (default: the embedded model; the tokenizer beside it)."""
    if checkpoint is None:
        checkpoint = DEFAULT_DIR / "model.bin"
        if tokenizer_path is None:
            tokenizer_path = DEFAULT_DIR / "tokenizer.model"
        if not Path(checkpoint).exists():
            raise ValueError(f"the embedded default model is missing ({checkpoint}); pass --checkpoint")
    from batchmask.models.hf import hf_directory, resolve_checkpoint
    checkpoint = resolve_checkpoint(checkpoint)  # a hub id ORG/NAME -> its local snapshot directory
    if not Path(checkpoint).exists():                # before looking for a tokenizer beside it
        raise ValueError(f"checkpoint not found: {checkpoint}")
    if tokenizer_path is None and hf_directory(checkpoint) is not None:
        tokenizer_path = hf_directory(checkpoint)  # a HF model directory holds its own tokenizer files
    if tokenizer_path is None:
        # llama2.c's convention: the tokenizer sits beside the checkpoint
        for name in ("tokenizer.model", "tokenizer.bin"):
            if (Path(checkpoint).parent / name).exists():
                tokenizer_path = Path(checkpoint).parent / name
                break
        else:
            raise ValueError(f"no --tokenizer given and no tokenizer.model/.bin beside {checkpoint}")
    for what, p in (("checkpoint", checkpoint), ("tokenizer", tokenizer_path)):
        if not Path(p).exists():
            raise ValueError(f"{what} not found: {p}")
    return Path(checkpoint), Path(tokenizer_path)


def load_model_and_tokenizer(checkpoint, tokenizer_path, device, dtype, max_context=None, eos_id=None):
    """The checkpoint and tokenizer (default: the embedded model), checked against each other."""
    from batchmask.models.checkpoint import check_vocab
    from batchmask.models.llama import load_checkpoint
    from batchmask.models.tokenizer import load_tokenizer

    checkpoint, tokenizer_path = resolve_model_paths(checkpoint, tokenizer_path)
    tokenizer = load_tokenizer(tokenizer_path, eos_id=eos_id)
    model = load_checkpoint(checkpoint, device=device, dtype=dtype, max_context=max_context)
    if model.config.vocab_size > tokenizer.vocab_size:       # padding, but only as much as a model carries
        from batchmask.checks import padding_fits
        padding_fits(tokenizer.vocab_size, model.config.vocab_size, f"tokenizer {tokenizer_path}",
                     f"checkpoint {checkpoint}")
    tokenizer.pad_to(model.config.vocab_size)  # an embedding padded past a HF/raw-byte vocabulary: never legal
    check_vocab(model.config, tokenizer.vocab_size, checkpoint, tokenizer_path)
    return model, tokenizer


def schema_options(args):
    """The schema options of a command's flags: --schema-mode (lenient, the default, or strict), --open-objects."""
    from ..schema.base import SchemaOptions
    return SchemaOptions(mode=getattr(args, "schema_mode", None) or "lenient",
                         open_objects=bool(getattr(args, "open_objects", False)))


def load_registry(path, options=None):
    """--tools: the built-in tools (None), else the tools file at `path` (JSON text given instead is refused);
    typed tools' schemas are checked under `options` (schema_options)."""
    from ..tools.registry import RegistryError, ToolRegistry
    if path is None:
        return ToolRegistry.defaults()
    if str(path).lstrip()[:1] in ("{", "[") and not _is_file(path):
        from ..text import short
        raise RegistryError(f"--tools takes the path of a tools file, got JSON text {short(str(path))}; "
                            "save it to a file and pass that")
    return ToolRegistry.from_json(path, options=options)


def _is_file(path) -> bool:
    try:
        return Path(path).is_file()
    except (OSError, ValueError):               # a name too long for the file system, a NUL in it
        return False


def _max_new_tokens(value: int | None, context: int) -> int:
    """--max-new-tokens as given (refused above the model's context), or the default capped by the context."""
    if value is None:
        return min(DEFAULT_MAX_NEW_TOKENS, context)
    if value > context:
        raise ValueError(f"--max-new-tokens {value}: above the model's context (seq_len {context})")
    return value
