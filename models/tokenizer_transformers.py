"""A transformers tokenizer object (PreTrainedTokenizerFast, what AutoTokenizer gives) -> batchmask's HFTokenizer.

    tok = from_transformers(hf_tokenizer, vocab_size=model.config.vocab_size)

The vocabulary is the object's own `tokenizers` tokenizer (backend_tokenizer.to_str(): its tokenizer.json, added
tokens included, read by tokenizer_hf.py as a file would be), so tokens added after loading count too. The end
tokens come from the object: its eos_token_id, the token its chat template writes after an assistant's message
(Qwen's <|im_end|>, Llama 3's <|eot_id|>), and any `stop_ids` the caller adds (a model's
generation_config.eos_token_id); its bos, chat template and bos/eos strings are kept for the chat helpers.

vocab_size is the model's (its lm_head's rows): ids from the tokenizer's size up to it become padding, never
legal (tokenizer_base.pad_to). A model with fewer ids than the tokenizer is refused: the grammar could allow an id
the model has no logit for.

Only fast tokenizers: a slow (Python) one has no tokenizer.json, and is refused naming how to load a fast one.
Nothing here imports transformers (the object is read through its attributes).
"""
from __future__ import annotations

from pathlib import Path

from .tokenizer_base import TokenizerError
from .tokenizer_hf import HFTokenizer, _template_end_tokens, load_tokenizer_json


def _int_ids(value, what: str) -> list[int]:
    values = value if isinstance(value, (list, tuple)) else [] if value is None else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise TokenizerError(f"{what} must be a token id or a list of ids, got {value!r}")
    return list(values)


def from_transformers(hf_tokenizer, vocab_size: int | None = None, stop_ids=None) -> HFTokenizer:
    """batchmask's tokenizer for `hf_tokenizer` (see the module docstring)."""
    kind = type(hf_tokenizer).__name__
    backend = getattr(hf_tokenizer, "backend_tokenizer", None)
    if backend is None or not hasattr(backend, "to_str"):
        raise TokenizerError(f"{kind} is not a fast tokenizer (it has no backend_tokenizer): load it with "
                             f"AutoTokenizer.from_pretrained(..., use_fast=True); batchmask reads the tokenizers "
                             f"library's vocabulary")
    name = f"{kind}({getattr(hf_tokenizer, 'name_or_path', '') or '?'})"
    extra = _int_ids(stop_ids, f"{name}: stop_ids")
    eos = getattr(hf_tokenizer, "eos_token_id", None)
    eos_ids = _int_ids(eos, f"{name}: eos_token_id")
    if not eos_ids and not extra:
        raise TokenizerError(f"{name}: the tokenizer names no eos_token; pass stop_ids=[ID, ...] (the ids that end "
                             f"a reply)")
    first = (eos_ids or extra)[0]
    tok = load_tokenizer_json(Path(name), backend.to_str(), None, eos_id=first)
    V = tok.vocab_size
    held = len(hf_tokenizer) if hasattr(hf_tokenizer, "__len__") else V
    if held > V:
        raise TokenizerError(f"{name}: holds {held} tokens but its backend tokenizer only {V}: tokens were added "
                             f"that the tokenizers library does not know")
    tok.bos_token = _text(getattr(hf_tokenizer, "bos_token", None))
    tok.eos_token = _text(getattr(hf_tokenizer, "eos_token", None))
    bos = _int_ids(getattr(hf_tokenizer, "bos_token_id", None), f"{name}: bos_token_id")
    tok.bos_id = bos[0] if bos else None
    template = getattr(hf_tokenizer, "chat_template", None)
    tok.chat_templates = {}
    if isinstance(template, dict):              # several named templates: the default one, else the first
        tok.chat_templates = {k: v for k, v in template.items() if isinstance(k, str) and isinstance(v, str)}
        template = tok.chat_templates.get("default", next(iter(tok.chat_templates.values()), None))
    tok.chat_template = template if isinstance(template, str) else None
    ends = []
    if tok.chat_template:
        decoder = getattr(hf_tokenizer, "added_tokens_decoder", None) or {}
        specials = {str(t): i for i, t in decoder.items() if getattr(t, "special", False)}
        ends = _template_end_tokens(tok.chat_template, specials, tok.bos_token, tok.eos_token)
    for i in [*eos_ids, *ends, *extra, *bos]:
        if not 0 <= i < V:
            raise TokenizerError(f"{name}: token id {i} (an end or begin token) is outside the vocabulary [0, {V})")
    tok.set_end_tokens(first, [*eos_ids, *ends, *extra])
    if vocab_size is not None:
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
            raise TokenizerError(f"{name}: vocab_size must be a positive integer (the model's logits), got "
                                 f"{vocab_size!r}")
        if vocab_size < V:
            raise TokenizerError(f"{name}: the model has {vocab_size} ids (vocab_size) but the tokenizer {V}: the "
                                 f"grammar could allow ids {vocab_size}..{V - 1}, which the model cannot score")
        tok.pad_to(vocab_size)
    return tok


def _text(value):
    """An eos/bos token as a string (transformers may hold an AddedToken)."""
    return None if value is None else str(value)
