"""
tokenizer.bin files: llama2.c's (SentencePiece pieces as UTF-8 text) and raw-byte ones (llama3.c's).

The layout is the same: int32 max_token_length, then per id (float32 score, int32 byte length, bytes);
the file stores no vocabulary size, so the records must tile it exactly. What the bytes mean differs:
- llama2.c: pieces are UTF-8 text in SentencePiece notation with spaces for U+2581, BOS/EOS stored as
  "\\n<s>\\n" / "\\n</s>\\n" at ids 1/2 and the byte-fallback pieces "<0x00>".."<0xFF>" at ids 3..258.
  A file showing any of those marks is read as llama2.c's (tokenizer_spm.Tokenizer) and checked strictly.
- raw bytes (llama3.c, or any byte-level vocabulary exported this way): each record is exactly the
  bytes its token stands for, often part of a UTF-8 character; the special tokens are stored as their
  text (Llama 3: "<|begin_of_text|>" ... at ids >= 128000) and the score is the id (the merge rank).
  Nothing in the file marks the specials or the end token, so they are found by their text: the
  trailing run of records that read "<|name|>" are special, and among them the known end-of-turn /
  end-of-text names are the stop ids (Llama 3.1: 128001, 128008, 128009).
Encoding a raw-byte vocabulary goes through the `tokenizers` library (byte-level BPE, the merges
derived from the ranks), built on the first encode: loading stays a walk over the records.
"""

from __future__ import annotations

import math
import re
import struct

from .tokenizer_base import BEGIN_TEXTS, END_TEXTS, BaseTokenizer, TokenizerError, find_by_text
from .tokenizer_spm import BIN_BOS_TEXT, BIN_EOS_TEXT, tokenizer_from_bin

SPECIAL_RECORD = re.compile(rb"<\|[^\s|]{1,96}\|>")  # how llama3.c (and tiktoken) spell a special token
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")  # Llama 3's pre-tokenizer split, as its tokenizer.json states it


class BinLayoutError(TokenizerError):
    """The records do not tile the file; records_read says how far the walk got (for the dispatch)."""

    def __init__(self, msg, records_read):
        super().__init__(msg)
        self.records_read = records_read


# -----------------------------------------------------------------------------
# the record walk

def walk_records(data: bytes, name: str) -> tuple[list[bytes], list[float], list[int]]:
    """Walk tokenizer.bin records; they must tile the file exactly. -> (records, scores, byte offsets)."""
    size = len(data)
    if size < 4:
        raise BinLayoutError(f"{name}: header needs 4 bytes, file is {size} bytes", 0)
    (max_len,) = struct.unpack_from("<i", data, 0)
    if max_len <= 0:
        raise BinLayoutError(f"{name}: byte offset 0: max_token_length {max_len} is not positive", 0)
    unpack_header = struct.Struct("<fi").unpack_from  # (float32 score, int32 length)
    records, scores, offsets = [], [], []
    off = 4
    while off < size:
        if size - off < 8:
            raise BinLayoutError(f"{_where(name, len(records), off)}: record header needs 8 bytes, only "
                                 f"{size - off} left (file is {size} bytes)", len(records))
        score, n = unpack_header(data, off)
        start, off = off, off + 8 + n
        if not 0 < n <= max_len or off > size or not math.isfinite(score):
            raise BinLayoutError(_bad_record(name, len(records), start, score, n, max_len, size), len(records))
        records.append(data[start + 8: off])
        scores.append(score)
        offsets.append(start)
    return records, scores, offsets


def _where(name, rec, off):
    return f"{name}: record {rec} at byte offset {off}"


def _bad_record(name, rec, off, score, n, max_len, size):
    """Say which check a tokenizer.bin record header failed (kept off the per-record fast path)."""
    where = _where(name, rec, off)
    if n <= 0:
        return f"{where}: length {n} is not positive"
    if off + 8 + n > size:
        return f"{where}: length {n} runs past end of file (file is {size} bytes)"
    if n > max_len:
        return f"{where}: length {n} exceeds max_token_length {max_len}"
    return f"{where}: score {score} is not finite"


def tokenizer_from_records(records: list[bytes], scores: list[float], offsets: list[int], name: str,
                           eos_id: int | None = None):
    """llama2.c's tokenizer.bin when it shows any of llama2.c's marks, else a raw-byte vocabulary."""
    marks = (records[1:2] == [BIN_BOS_TEXT.encode()] or records[2:3] == [BIN_EOS_TEXT.encode()]
             or records[3:259] == [b"<0x%02X>" % b for b in range(256)])
    if not marks:
        return RawByteTokenizer(records, scores, name, eos_id=eos_id)
    try:  # one decode for the whole file; only a failure walks the records to name the culprit
        texts = b"\0".join(records).decode("utf-8").split("\0")
    except UnicodeDecodeError:
        for i, r in enumerate(records):
            try:
                r.decode("utf-8")
            except UnicodeDecodeError as e:
                raise TokenizerError(f"{_where(name, i, offsets[i])}: piece bytes are not valid UTF-8 "
                                     f"(at byte offset {offsets[i] + 8 + e.start})") from None
        raise
    if len(texts) != len(records):  # a piece holding NUL itself
        texts = [r.decode("utf-8") for r in records]
    tok = tokenizer_from_bin(texts, scores, name)
    if eos_id is not None:
        tok.set_end_tokens(eos_id, tok.stop_ids)
    return tok


# -----------------------------------------------------------------------------
# raw-byte vocabularies

class RawByteTokenizer(BaseTokenizer):
    """A byte-level vocabulary stored as raw bytes per id; specials found by their "<|name|>" text."""

    format = "raw-byte tokenizer.bin"
    can_pad = True

    def __init__(self, records: list[bytes], scores: list[float], source: str = "<records>", *,
                 eos_id: int | None = None):
        self.source = source
        self.scores = list(scores)
        n_special = 0
        while n_special < len(records) and SPECIAL_RECORD.fullmatch(records[-1 - n_special]):
            n_special += 1
        self.num_normal = len(records) - n_special  # ids [0, num_normal) are byte pieces, the rest special
        self.special_texts = {records[i].decode("ascii", "replace"): i for i in range(self.num_normal, len(records))}
        if self.num_normal < 256:
            raise TokenizerError(f"{source}: only {self.num_normal} byte pieces before the special tokens; a "
                                 f"byte-level vocabulary has at least the 256 single bytes")
        self.records = records
        self.token_bytes = records[:self.num_normal] + [b""] * n_special  # specials carry no text
        bos = find_by_text(self.special_texts, BEGIN_TEXTS)
        self.bos_id = bos[0] if bos else None
        self.bos_token = records[self.bos_id].decode() if bos else None
        self.set_end_tokens(eos_id, find_by_text(self.special_texts, END_TEXTS),
                            how_to_name=f" (none of the special tokens at ids >= {self.num_normal} is one of "
                                        f"{', '.join(END_TEXTS)})")
        self.eos_token = records[self.eos_id].decode("utf-8", "replace")
        self._backend = None

    @property
    def is_llama3(self) -> bool:
        """Llama 3's layout: its begin/end-of-text specials right after 128000 byte pieces."""
        return self.num_normal == 128000 and {"<|begin_of_text|>", "<|end_of_text|>"} <= self.special_texts.keys()

    def encode(self, text: str, bos: bool = False) -> list[int]:
        """text -> ids: byte-level BPE by the `tokenizers` library (specials in the text match whole)."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects str, got {type(text).__name__}")
        if self._backend is None:
            self._backend = self._build_backend()
        ids = self._backend.encode(text, add_special_tokens=False).ids
        return [self.bos_id, *ids] if bos and self.bos_id is not None else ids

    def _build_backend(self):
        """A tokenizers BPE over the byte pieces; merge (a, b) ranks as the id of a+b (tiktoken's rule).

        The pre-tokenizer split is not in the file: Llama 3's when the layout is Llama 3's, GPT-2's
        otherwise (the byte-level default)."""
        from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
        from tokenizers import Tokenizer as Backend

        from .tokenizer_hf import bytes_to_pieces

        pieces = bytes_to_pieces(self.records[:self.num_normal])
        vocab = dict(zip(pieces, range(self.num_normal)))
        if len(vocab) != self.num_normal:
            seen: dict[str, int] = {}
            i = next(i for i, p in enumerate(pieces) if seen.setdefault(p, i) != i)
            raise TokenizerError(f"{self.source}: record {i} ({self.records[i]!r}) repeats record {seen[pieces[i]]}")
        backend = Backend(models.BPE(vocab, derive_merges(pieces, vocab), fuse_unk=False, byte_fallback=False))
        if self.is_llama3:
            backend.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        else:
            backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        backend.decoder = decoders.ByteLevel()
        backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in self.special_texts])
        return backend


def derive_merges(pieces: list[str], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """BPE merges of a rank-ordered vocabulary: every split of a piece into two pieces of the vocabulary,
    ordered by the rank (id) of the piece they make, then of their left and right parts.

    Merging the adjacent pair whose result ranks lowest is tiktoken's byte-pair rule; listing every
    split in that order makes the `tokenizers` BPE apply the same rule. One pass over each piece's
    split points (the vocabulary stores no merges; this runs once, on the first encode)."""
    found = []
    for rank, piece in enumerate(pieces):
        for k in range(1, len(piece)):
            left, right = vocab.get(piece[:k]), vocab.get(piece[k:])
            if left is not None and right is not None:
                found.append((rank, left, right))
    found.sort()
    return [(pieces[a], pieces[b]) for _, a, b in found]
