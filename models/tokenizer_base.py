"""
What every vocabulary offers the grammar and the generation loop, whatever file it came from.

- `token_bytes[id]`: exactly the bytes the token stands for; b"" for special tokens (BOS/EOS/unk,
  control and added special tokens) and for padding ids, which the grammar never allows inside a call.
- `bos_id` (or None), `eos_id`, `stop_ids` (every id that ends generation; eos_id first).
- `vocab_hash()`: covers the bytes and the end tokens, so a grammar cache built for one vocabulary
  is never used with another.
- `encode(text, bos=...)`, `decode(ids)`, `decode_bytes(ids)`.
- When the files carry them: `chat_template`, `bos_token`, `eos_token` (strings) and `directory`
  (the folder the tokenizer came from), for the chat-format helpers.

A model's embedding is often larger than its tokenizer: `pad_to(n)` gives ids [V, n) no bytes, so
they are never legal (formats where padding is a fact of life only; see `can_pad`).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np


class TokenizerError(ValueError):
    """A tokenizer file or vocabulary that cannot be used; the message names the file/field."""


# the texts that end a turn or a document in the vocabularies we know; used only where a format
# stores no end token of its own (a raw-byte tokenizer.bin: llama3.c writes none)
END_TEXTS = ("<|end_of_text|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>",
             "</s>", "<end_of_turn>", "<|return|>")
BEGIN_TEXTS = ("<|begin_of_text|>", "<|startoftext|>", "<s>", "<bos>")


# -----------------------------------------------------------------------------
# the common class

class BaseTokenizer:
    """Common attributes and methods; subclasses fill the attributes and implement `encode`."""

    format = "?"  # which loader made it, for messages
    can_pad = False  # may ids past the vocabulary be padding (pad_to)?

    source: str  # file name for error messages
    token_bytes: list[bytes]  # (V,) what the grammar sees per id
    bos_id: int | None
    eos_id: int
    stop_ids: tuple[int, ...]
    chat_template: str | None = None
    bos_token: str | None = None
    eos_token: str | None = None
    directory: Path | None = None
    padding: int = 0  # how many ids at the end are padding (pad_to)
    _vocab_hash: str | None = None

    @property
    def vocab_size(self) -> int:
        """Ids the grammar and the model see (the tokenizer's own plus padding)."""
        return len(self.token_bytes)

    def encode(self, text: str, bos: bool = False) -> list[int]:
        raise NotImplementedError

    # -------------------------------------------------------------------------
    # end tokens

    def set_end_tokens(self, eos_id: int | None, stop_ids: Iterable[int] = (), *, how_to_name: str = "") -> None:
        """eos_id (first of stop_ids when None) and the stop ids, checked against the vocabulary.

        A given eos_id (the user's --eos-id) comes first; the end tokens the files name stay stop ids."""
        stops = [int(i) for i in stop_ids]
        if eos_id is None:
            if not stops:
                raise TokenizerError(f"{self.source}: no end-of-sequence token found{how_to_name}; name one with "
                                     f"--eos-id ID (load_tokenizer(..., eos_id=ID))")
            eos_id = stops[0]
        eos_id = int(eos_id)
        V = len(self.token_bytes)
        for i in [eos_id, *stops]:
            if not 0 <= i < V:
                raise TokenizerError(f"{self.source}: end token id {i} is outside the vocabulary [0, {V})")
        self.eos_id = eos_id
        self.stop_ids = tuple(dict.fromkeys([eos_id, *stops]))  # eos first, no repeats, order kept
        self._vocab_hash = None

    # -------------------------------------------------------------------------
    # padding

    def pad_to(self, vocab_size: int) -> BaseTokenizer:
        """Make ids [V, vocab_size) padding (no bytes: never legal) when the format allows it.

        Returns self. Unchanged when vocab_size <= V or the format never pads (llama2.c's
        vocabularies are exact: a mismatch there is a wrong pairing, which check_vocab reports)."""
        extra = int(vocab_size) - len(self.token_bytes)
        if extra > 0 and self.can_pad:
            self.token_bytes = self.token_bytes + [b""] * extra
            self.padding += extra
            self._vocab_hash = None
        return self

    # -------------------------------------------------------------------------
    # decode

    def _check_ids(self, ids: Sequence[int]) -> None:
        V = len(self.token_bytes)
        for i in ids:
            if not 0 <= i < V:
                raise TokenizerError(f"token id {i} out of range [0, {V})")

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        """ids -> the bytes the grammar sees: concatenated token_bytes (specials and padding add none)."""
        self._check_ids(ids)
        return b"".join(self.token_bytes[i] for i in ids)

    def decode(self, ids: Sequence[int]) -> str:
        """ids -> text; a character cut by the end of `ids` shows as U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    # -------------------------------------------------------------------------
    # identity

    def vocab_hash(self) -> str:
        """sha256 hex of the vocabulary as the grammar sees it: token_bytes, bos/eos and the stop ids.

        The digest is the one the first version computed token by token (length-prefixed bytes, so no
        two vocabularies collide by concatenation), built here as one buffer; stop ids other than
        (eos_id,) are appended, so a single-EOS vocabulary keeps its old hash and its cache files."""
        if self._vocab_hash is None:
            h = hashlib.sha256(b"batchmask-vocab-v1")
            bos = -1 if self.bos_id is None else self.bos_id
            h.update(struct.pack("<qqq", len(self.token_bytes), bos, self.eos_id))
            h.update(_length_prefixed(self.token_bytes))
            if self.stop_ids != (self.eos_id,):
                h.update(b"stop-ids")
                h.update(np.asarray(self.stop_ids, dtype="<i8").tobytes())
            self._vocab_hash = h.hexdigest()
        return self._vocab_hash

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size}, source={self.source!r})"


def _length_prefixed(token_bytes: list[bytes]) -> bytes:
    """b"".join(pack("<I", len(b)) + b for b in token_bytes), without a Python step per token."""
    V = len(token_bytes)
    lengths = np.fromiter(map(len, token_bytes), dtype=np.int64, count=V)  # [V]
    flat = np.frombuffer(b"".join(token_bytes), dtype=np.uint8)  # [N]
    out = np.empty(4 * V + len(flat), dtype=np.uint8)
    start = np.cumsum(lengths + 4) - (lengths + 4)  # [V] where each record starts in out
    header = lengths.astype("<u4").view(np.uint8).reshape(V, 4)  # [V, 4] little-endian lengths
    out[start[:, None] + np.arange(4)] = header
    owner = np.repeat(np.arange(V), lengths)  # [N] token of each flat byte
    out[np.arange(len(flat)) + 4 * (owner + 1)] = flat  # byte j of the flat string shifts by 4 per header so far
    return out.tobytes()


def find_by_text(texts: dict[str, int], candidates: Iterable[str]) -> list[int]:
    """Ids of the candidate texts present in `texts` (text -> id), in candidate order."""
    return [texts[t] for t in candidates if t in texts]
