"""
Hugging Face `tokenizer.json` vocabularies, encoded by the `tokenizers` library itself.

Two kinds of model are read (others are refused naming the model type):
- byte-level BPE (GPT-2, Llama 3, Qwen2, SmolLM2, ...): a piece is written in GPT-2's byte-to-unicode
  alphabet, one printable character per raw byte ("Ġ" = 0x20); its bytes are its characters mapped
  back, often part of a UTF-8 character;
- SentencePiece-style BPE or Unigram with byte fallback (Llama 2, Mistral, Phi-3, Gemma): a piece is
  text with U+2581 (or the model's replacement character) for a space, and "<0xNN>" is the byte NN.
Added tokens marked special, and the model's unk token, carry no bytes; added tokens not marked
special carry their content as text.

The files beside tokenizer.json name the end tokens (nothing is assumed): eos/bos from
tokenizer_config.json (eos_token, bos_token), generation_config.json and config.json (eos_token_id,
bos_token_id: an id or a list of ids), and the token the chat template puts right after an
assistant's message (Qwen's <|im_end|>, Llama 3's <|eot_id|>). The chat template (tokenizer_config.json's
chat_template, or chat_template.jinja) and the bos/eos strings are kept for the chat-format helpers.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .tokenizer_base import BaseTokenizer, TokenizerError

SIDE_FILES = ("tokenizer_config.json", "generation_config.json", "config.json")


def byte_alphabet() -> list[str]:
    """GPT-2's byte-to-unicode table: byte b is written as chr(alphabet[b]).

    Printable Latin-1 bytes stand for themselves; the other 68 bytes (controls, space, 0x7F-0xA0, 0xAD)
    take the code points from U+0100 up, in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


ALPHABET = byte_alphabet()
TO_LATIN1 = {ord(c): b for b, c in enumerate(ALPHABET)}  # str.translate: alphabet char -> code point = byte
FROM_LATIN1 = {b: ord(c) for b, c in enumerate(ALPHABET)}  # the reverse


def pieces_to_bytes(pieces: list[str], source: str) -> list[bytes]:
    """Byte-level pieces -> their bytes: one translate and one encode of all pieces joined, then slices."""
    lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))  # [V] one char = one byte
    ends = np.cumsum(lengths)
    try:
        blob = "".join(pieces).translate(TO_LATIN1).encode("latin-1")
    except UnicodeEncodeError as e:
        i = int(np.searchsorted(ends, e.start, side="right"))
        raise TokenizerError(f"{source}: model.vocab piece {pieces[i]!r} (id {i}) has {e.object[e.start]!r}, "
                             f"which is not in the byte-level alphabet") from None
    starts = (ends - lengths).tolist()
    return [blob[a:b] for a, b in zip(starts, ends.tolist())]


def bytes_to_pieces(records: list[bytes]) -> list[str]:
    """Raw bytes per token -> byte-level pieces (the inverse of pieces_to_bytes), in one pass."""
    lengths = np.fromiter(map(len, records), dtype=np.int64, count=len(records))
    ends = np.cumsum(lengths).tolist()
    text = b"".join(records).decode("latin-1").translate(FROM_LATIN1)
    return [text[a:b] for a, b in zip([0, *ends[:-1]], ends)]


# -----------------------------------------------------------------------------
# the tokenizer

class HFTokenizer(BaseTokenizer):
    """A tokenizer.json vocabulary; encode is the `tokenizers` library's."""

    format = "tokenizer.json"
    can_pad = True  # HF checkpoints often pad the embedding past the tokenizer (Qwen2: 151936 > 151646)

    def __init__(self, backend, token_bytes: list[bytes], source: str, *, model_type: str, byte_level: bool,
                 special_ids: list[int]):
        self.backend = backend  # tokenizers.Tokenizer
        self.token_bytes = token_bytes
        self.source = source
        self.model_type = model_type  # "BPE" / "Unigram"
        self.byte_level = byte_level  # GPT-2 alphabet (else SentencePiece-style pieces)
        self.special_ids = special_ids  # ids with no bytes: special added tokens and unk
        self.bos_id = None

    def encode(self, text: str, bos: bool = False) -> list[int]:
        """`tokenizers`' encode(text, add_special_tokens=False).ids, with BOS first when asked (and one exists)."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects str, got {type(text).__name__}")
        ids = self.backend.encode(text, add_special_tokens=False).ids
        return [self.bos_id, *ids] if bos and self.bos_id is not None else ids


# -----------------------------------------------------------------------------
# loading

def load_tokenizer_json(path: Path, text: str, directory: Path | None, eos_id: int | None = None) -> HFTokenizer:
    """Read a tokenizer.json (its text) and, from `directory`, the files that name its special tokens.

    eos_id: the end token the user names (--eos-id); it comes first, the ones the files name stay stop ids."""
    from tokenizers import Tokenizer as Backend

    name = str(path)
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as e:
        cut = "; the file looks truncated" if e.pos >= len(text) - 1 else ""
        raise TokenizerError(f"{name}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno}, char {e.pos} "
                             f"of {len(text)}{cut})") from None
    model = spec.get("model") if isinstance(spec, dict) else None
    if not isinstance(model, dict):
        raise TokenizerError(f"{name}: no \"model\" object: not a tokenizers tokenizer.json")
    model_type = _model_type(model)
    byte_level = _has_part(spec.get("pre_tokenizer"), "ByteLevel") or _has_part(spec.get("decoder"), "ByteLevel")
    byte_fallback = bool(model.get("byte_fallback"))
    _check_supported(name, model, model_type, byte_level, byte_fallback)
    try:
        backend = Backend.from_str(text)
    except Exception as e:  # tokenizers raises a bare Exception with serde's wording
        raise TokenizerError(_explain_backend_error(name, model, str(e))) from None

    pieces, added = _pieces(name, model, model_type, spec.get("added_tokens") or [])
    if byte_level:
        texts = [p or "" for p in pieces]
        for tok_id, _, _ in added:  # an added token may sit in model.vocab too, spelled as text (DeepSeek's ｜)
            texts[tok_id] = ""
        token_bytes = pieces_to_bytes(texts, name)
    else:
        token_bytes = _spm_bytes(pieces, _space_mark(spec), byte_fallback, model)
    special = []
    for tok_id, content, is_special in added:
        token_bytes[tok_id] = b"" if is_special else content.encode("utf-8")
        if is_special:
            special.append(tok_id)
    unk = _unk_id(model, model_type, backend)
    if unk is not None:
        token_bytes[unk] = b""
        special.append(unk)
    tok = HFTokenizer(backend, token_bytes, name, model_type=model_type, byte_level=byte_level,
                      special_ids=sorted(set(special)))
    tok.directory = directory
    _read_side_files(tok, directory, {content: i for i, content, s in added if s}, eos_id)
    return tok


def _model_type(model: dict) -> str:
    if "type" in model:
        return str(model["type"])
    # files written before tokenizers stored the type: tell it by the fields it has
    if "merges" in model:
        return "BPE"
    if isinstance(model.get("vocab"), list):
        return "Unigram"
    return "WordPiece" if "continuing_subword_prefix" in model else "WordLevel"


def _has_part(node, kind: str) -> bool:
    """Is a `kind` component anywhere in this pre_tokenizer / decoder / normalizer (Sequences included)?"""
    if isinstance(node, dict):
        return node.get("type") == kind or any(_has_part(v, kind) for v in node.values() if isinstance(v, list))
    if isinstance(node, list):
        return any(_has_part(v, kind) for v in node)
    return False


def _check_supported(name, model, model_type, byte_level, byte_fallback):
    where = f"{name}: model type {model_type}"
    if model_type == "BPE":
        for field in ("continuing_subword_prefix", "end_of_word_suffix"):
            if model.get(field):
                raise TokenizerError(f"{where} with {field} {model[field]!r} is not supported (pieces would not "
                                     f"spell their bytes)")
        if not (byte_level or byte_fallback):
            raise TokenizerError(f"{where} is neither byte-level nor byte_fallback: text outside its vocabulary "
                                 f"has no tokens (not supported)")
    elif model_type == "Unigram":
        if not byte_fallback:
            raise TokenizerError(f"{where} without byte_fallback is not supported: text outside its vocabulary "
                                 f"has no tokens")
    else:
        raise TokenizerError(f"{where} is not supported (only byte-level BPE, and BPE or Unigram with "
                             f"byte_fallback)")


def _explain_backend_error(name, model, message):
    """One line naming what tokenizers refused; a merge that names no vocabulary piece is found here."""
    first = message.strip().splitlines()[0] if message.strip() else "unknown error"
    vocab, merges = model.get("vocab"), model.get("merges")
    if "out of vocabulary" in first and isinstance(vocab, dict) and isinstance(merges, list):
        for k, m in enumerate(merges):  # error path only
            a, b = m if isinstance(m, list) else (m.split(" ", 1) + [""])[:2]
            missing = [p for p in (a, b, a + b) if p not in vocab]
            if missing:
                return (f"{name}: vocab and merges disagree: model.merges[{k}] ({a!r}, {b!r}) needs {missing[0]!r}, "
                        f"which is not in model.vocab")
    return f"{name}: the tokenizers library cannot load it: {first}"


def _pieces(name, model, model_type, added_tokens):
    """-> (pieces by id, None for ids only added tokens fill; [(id, content, special)] of added tokens)."""
    if model_type == "Unigram":
        entries = model.get("vocab") or []
        vocab = {e[0]: i for i, e in enumerate(entries)}
    else:
        vocab = model.get("vocab") or {}
    added = []
    for k, t in enumerate(added_tokens):
        if not (isinstance(t, dict) and isinstance(t.get("id"), int) and isinstance(t.get("content"), str)):
            raise TokenizerError(f"{name}: added_tokens[{k}] needs an integer \"id\" and a string \"content\"")
        if isinstance(t["id"], bool) or t["id"] < 0:
            raise TokenizerError(f"{name}: added_tokens[{k}] ({t['content']!r:.40}) has id {t['id']!r}, not a token id")
        added.append((t["id"], t["content"], bool(t.get("special"))))
    ids = np.fromiter(vocab.values(), dtype=np.int64, count=len(vocab))  # [n] in file order
    V = int(max(ids.max(initial=-1), max((i for i, _, _ in added), default=-1))) + 1
    if len(ids) and ids.min() < 0:
        raise TokenizerError(f"{name}: model.vocab has a negative id ({int(ids.min())})")
    defined = len(ids) + len(added)
    if V - defined > max(1024, defined):    # a stray id of 10^8 would size every per-token table by it
        raise TokenizerError(f"{name}: ids run to {V - 1} but only {defined} tokens are defined (in model.vocab "
                             "and added_tokens); the ids between have no token")
    if np.array_equal(ids, np.arange(len(ids))):  # the usual case: the file lists the vocabulary in id order
        pieces = list(vocab) + [None] * (V - len(ids))
    else:
        values, counts = np.unique(ids, return_counts=True)
        if (counts > 1).any():
            raise TokenizerError(f"{name}: model.vocab gives id {int(values[counts > 1][0])} to two pieces")
        pieces = [None] * V
        for p, i in zip(vocab, ids.tolist()):
            pieces[i] = p
    return pieces, added


def _space_mark(spec) -> str:
    """The character SentencePiece-style pieces use for a space (Metaspace's replacement, default U+2581)."""
    for part in ("pre_tokenizer", "decoder", "normalizer"):
        stack = [spec.get(part)]
        while stack:
            node = stack.pop()
            if isinstance(node, list):
                stack.extend(node)
            elif isinstance(node, dict):
                if node.get("type") == "Metaspace" and isinstance(node.get("replacement"), str):
                    return node["replacement"]
                if node.get("type") == "Replace" and node.get("content") == " ":
                    pattern = node.get("pattern") or {}
                    if isinstance(pattern.get("String"), str) and len(pattern["String"]) == 1:
                        return pattern["String"]
                stack.extend(v for v in node.values() if isinstance(v, list))
    return "\u2581"


def _spm_bytes(pieces, mark, byte_fallback, model):
    """SentencePiece-style pieces -> bytes: mark -> space, UTF-8; "<0xNN>" -> byte NN (byte fallback)."""
    texts = [p or "" for p in pieces]
    joined = "\0".join(texts)
    parts = joined.replace(mark, " ").encode("utf-8").split(b"\0")
    if len(parts) != len(texts):  # some piece holds NUL itself
        parts = [t.replace(mark, " ").encode("utf-8") for t in texts]
    if byte_fallback:
        index = {p: i for i, p in enumerate(texts)} if isinstance(model.get("vocab"), list) else model["vocab"]
        for b in range(256):
            i = index.get(f"<0x{b:02X}>")
            if i is not None:
                parts[i] = bytes([b])
    return parts


def _unk_id(model, model_type, backend):
    if model_type == "Unigram":
        return model.get("unk_id")
    unk = model.get("unk_token")
    return backend.token_to_id(unk) if isinstance(unk, str) else None


# -----------------------------------------------------------------------------
# the files beside tokenizer.json: end tokens, BOS, chat template

def _read_json(path: Path):
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise TokenizerError(f"{path}: cannot read: {e}") from None
    except json.JSONDecodeError as e:
        raise TokenizerError(f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    if not isinstance(obj, dict):
        raise TokenizerError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    return obj


def _token_string(path, cfg, field):
    """tokenizer_config.json's bos_token / eos_token: a string, an AddedToken object, or null."""
    value = cfg.get(field)
    if isinstance(value, dict):
        value = value.get("content")
    if value is not None and not isinstance(value, str):
        raise TokenizerError(f"{path}: {field} must be a string or an object with \"content\", got {value!r}")
    return value


def _token_ids(path, cfg, field) -> list[int]:
    """generation_config.json / config.json's eos_token_id / bos_token_id: an id, a list of ids, or null."""
    value = cfg.get(field)
    values = value if isinstance(value, list) else [] if value is None else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise TokenizerError(f"{path}: {field} must be a token id or a list of ids, got {value!r}")
    return values


def _read_side_files(tok: HFTokenizer, directory: Path | None, specials: dict[str, int], eos_id: int | None) -> None:
    cfgs = {}
    for fname in SIDE_FILES:
        p = directory / fname if directory is not None else None
        cfgs[fname] = (p, _read_json(p)) if p is not None and p.is_file() else (p, {})
    tc_path, tc = cfgs["tokenizer_config.json"]

    def token_id(field):
        s = _token_string(tc_path, tc, field)
        if s is None:
            return s, None
        i = tok.backend.token_to_id(s)
        if i is None:
            raise TokenizerError(f"{tc_path}: {field} {s!r} is not a token of {tok.source}")
        return s, i

    tok.bos_token, bos = token_id("bos_token")
    tok.eos_token, eos = token_id("eos_token")
    template = tc.get("chat_template")
    tok.chat_templates = {}
    if isinstance(template, list):  # several named templates: the default one, else the first
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        tok.chat_templates = {k: v for k, v in named.items() if isinstance(k, str) and isinstance(v, str)}
        template = named.get("default", next(iter(named.values()), None))
    jinja = directory / "chat_template.jinja" if directory is not None else None
    if template is None and jinja is not None and jinja.is_file():
        template = jinja.read_text(encoding="utf-8")
    tok.chat_template = template if isinstance(template, str) else None

    stops = [] if eos is None else [eos]
    bos_ids = [] if bos is None else [bos]
    for fname in ("generation_config.json", "config.json"):
        p, cfg = cfgs[fname]
        stops += _token_ids(p, cfg, "eos_token_id")
        bos_ids += _token_ids(p, cfg, "bos_token_id")
    if tok.chat_template:
        stops += _template_end_tokens(tok.chat_template, specials, tok.bos_token, tok.eos_token)
    V = len(tok.token_bytes)
    for i in stops + bos_ids:
        if not 0 <= i < V:
            raise TokenizerError(f"{tok.source}: the end/begin token id {i} named beside it "
                                 f"({', '.join(SIDE_FILES)}) is outside the vocabulary [0, {V})")
    tok.bos_id = bos_ids[0] if bos_ids else None
    tok.set_end_tokens(eos_id, stops, how_to_name=" (no eos_token in a tokenizer_config.json beside it, no "
                       "eos_token_id in generation_config.json or config.json)")


def _template_end_tokens(template: str, specials: dict[str, int], bos_token, eos_token) -> list[int]:
    """The special token the chat template writes right after an assistant message, if any.

    Rendered as transformers renders templates (tools/chat_template.py); a template that needs more
    than a plain two-message conversation yields nothing, not an error."""
    from .chat_template import render

    sentinel = "\x02batchmask-reply\x03"
    messages = [{"role": "user", "content": "\x02batchmask-task\x03"}, {"role": "assistant", "content": sentinel}]
    try:
        out = render(template, messages, add_generation_prompt=False, bos_token=bos_token or "",
                     eos_token=eos_token or "")
    except Exception:  # any template error: this conversation is not one it can render
        return []
    if sentinel not in out:
        return []
    after = out.split(sentinel, 1)[1]
    for content in sorted(specials, key=len, reverse=True):  # longest first: "<|im_end|>" before "<|im"
        if content and after.startswith(content):
            return [specials[content]]
    return []
