"""
load_tokenizer: every vocabulary format we read, told apart by content (never by file name).

- a JSON object with a "model": a Hugging Face tokenizer.json, with tokenizer_config.json,
  generation_config.json and config.json beside it (tokenizer_hf.py);
- tokenizer.bin records that tile the file: llama2.c's SentencePiece pieces when they show its marks
  (tokenizer_spm.py), raw bytes per token otherwise, as llama3.c writes them (tokenizer_bin.py);
- anything else: a SentencePiece ModelProto, tokenizer.model (tokenizer_spm.py).

A directory is read through the tokenizer file it holds (tokenizer.json first, then tokenizer.model,
tokenizer.bin), with the files beside it. The common interface (token_bytes, bos_id, eos_id,
stop_ids, vocab_hash, encode, decode, pad_to) is tokenizer_base.BaseTokenizer.
"""

from __future__ import annotations

from pathlib import Path

from .tokenizer_base import BaseTokenizer, TokenizerError
from .tokenizer_bin import BinLayoutError, tokenizer_from_records, walk_records
from .tokenizer_spm import BYTE, CONTROL, NORMAL, UNKNOWN, NotAModel, Tokenizer, read_model

__all__ = ["BYTE", "CONTROL", "NORMAL", "UNKNOWN", "BaseTokenizer", "Tokenizer", "TokenizerError", "load_tokenizer"]

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer.bin")  # what a model directory holds


def load_tokenizer(path, vocab_size: int | None = None, *, eos_id: int | None = None) -> BaseTokenizer:
    """Read a tokenizer file or a model directory holding one (see the module docstring).

    vocab_size: the exact size the caller expects (an error if the file holds another);
    eos_id: the end-of-sequence id to use, for vocabularies whose files name none (--eos-id)."""
    if eos_id is not None and (isinstance(eos_id, bool) or not isinstance(eos_id, int)):
        raise TokenizerError(f"{path}: eos_id must be an integer token id, got {eos_id!r}")
    path = Path(path)
    if path.is_dir():
        found = next((path / f for f in TOKENIZER_FILES if (path / f).is_file()), None)
        if found is None:
            raise TokenizerError(f"{path}: no tokenizer in this directory (looked for {', '.join(TOKENIZER_FILES)})")
        path = found
    name = str(path)
    if not path.is_file():
        raise TokenizerError(f"{name}: tokenizer file not found" if not path.exists()
                             else f"{name}: not a regular file")
    data = path.read_bytes()
    if not data:
        raise TokenizerError(f"{name}: tokenizer file is empty (0 bytes)")
    if _looks_like_json(data):
        from .tokenizer_hf import load_tokenizer_json

        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise TokenizerError(f"{name}: a JSON file, but byte offset {e.start} is not valid UTF-8") from None
        tok = load_tokenizer_json(path, text, path.parent, eos_id=eos_id)
    else:
        tok = _load_binary(data, name, eos_id)
    if tok.directory is None:
        tok.directory = path.parent  # where the chat-format helpers look for the files beside it
    if vocab_size is not None and tok.vocab_size != vocab_size:
        raise TokenizerError(f"{name}: holds {tok.vocab_size} tokens but vocab_size={vocab_size} was expected "
                             f"(checkpoint and tokenizer do not match, or the file is truncated)")
    return tok


def _looks_like_json(data: bytes) -> bool:
    """A JSON object: "{" then a key or "}" (a tokenizer.bin may start with the byte "{", then NULs)."""
    head = data[:4096].removeprefix(b"\xef\xbb\xbf").lstrip()
    return head[:1] == b"{" and head[1:].lstrip()[:1] in (b'"', b"}")


def _load_binary(data: bytes, name: str, eos_id: int | None) -> BaseTokenizer:
    """tokenizer.bin (either kind) or a SentencePiece ModelProto."""
    try:
        records, scores, offsets = walk_records(data, name)
    except BinLayoutError as bin_err:
        if bin_err.records_read >= 3:
            # it walked like a tokenizer.bin for a while: report where it broke
            raise TokenizerError(str(bin_err)) from None
        try:
            pieces, scores, kinds = read_model(data, name)
        except NotAModel as model_err:
            as_bin = str(bin_err).removeprefix(f"{name}: ")
            raise TokenizerError(f"{name}: neither a llama2.c tokenizer.bin ({as_bin}) nor a "
                                 f"SentencePiece model ({model_err}) nor a tokenizer.json") from None
        tok = Tokenizer(pieces, scores, kinds, source=name)
        if eos_id is not None:
            tok.set_end_tokens(eos_id, tok.stop_ids)
        return tok
    return tokenizer_from_records(records, scores, offsets, name, eos_id=eos_id)
