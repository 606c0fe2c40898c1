"""
Llama 2 style SentencePiece BPE tokenizer: encode, decode, export, and reading its two file formats.

Two on-disk formats carry the same vocabulary:
- llama2.c `tokenizer.bin`: int32 max_token_length, then per id
  (float32 score, int32 byte length, bytes). BOS/EOS are stored as "\\n<s>\\n"
  and "\\n</s>\\n", the SentencePiece space mark U+2581 is already a plain space,
  and byte-fallback pieces are the literal text "<0x0A>".
- SentencePiece `tokenizer.model`: a ModelProto (protobuf), read with the
  `sentencepiece` package.
The format is told apart by content, never by file name.

Encoding is SentencePiece's BPE, implemented here from pieces + scores so that
both formats run the exact same code: dummy-prefix space, " " -> U+2581, then
repeatedly merge the adjacent pair whose merged piece has the highest score
(leftmost on ties), and finally spell any piece missing from the vocabulary as
its UTF-8 bytes via the <0xNN> pieces.

We only support what llama2.c can express: BPE, identity normalisation
(no NFKC rewrite), a dummy prefix, spaces kept as they are, <unk>/<s>/</s> at
ids 0/1/2 and all 256 byte pieces. Models outside that are rejected up front
with an error naming the field, rather than encoded subtly wrong.
"""

from __future__ import annotations

import heapq
import math
import re
import struct
from pathlib import Path

from .tokenizer_base import BaseTokenizer, TokenizerError

SPACE_MARK = "\u2581"  # "▁": how SentencePiece spells a space inside a piece
BIN_BOS_TEXT = "\n<s>\n"  # how llama2.c's export stores the BOS / EOS pieces
BIN_EOS_TEXT = "\n</s>\n"
BYTE_PIECE = re.compile(r"<0x([0-9A-F]{2})>")

# piece kinds: the values of SentencePiece's ModelProto.SentencePiece.Type enum
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
KIND_NAMES = {NORMAL: "normal", UNKNOWN: "unknown", CONTROL: "control",
              USER_DEFINED: "user-defined", UNUSED: "unused", BYTE: "byte"}

UNK_ID, BOS_ID, EOS_ID = 0, 1, 2  # fixed by llama2.c (run.c hard-codes BOS=1, EOS=2)


__all__ = ["BYTE", "CONTROL", "NORMAL", "UNKNOWN", "NotAModel", "Tokenizer", "TokenizerError", "read_model",
           "tokenizer_from_bin"]

# -----------------------------------------------------------------------------
# the tokenizer

class Tokenizer(BaseTokenizer):
    """A SentencePiece BPE vocabulary: pieces (SentencePiece notation), scores, kinds."""

    format = "sentencepiece"

    def __init__(self, pieces, scores, kinds, source="<pieces>"):
        if not (len(pieces) == len(scores) == len(kinds)):
            raise TokenizerError(f"{source}: {len(pieces)} pieces, {len(scores)} scores, "
                                 f"{len(kinds)} kinds: the three lists must have equal length")
        self.source = source  # file name (or "<pieces>") for error messages
        self.pieces = list(pieces)  # list[str], SentencePiece notation ("▁the", "<0x0A>", "<s>")
        self.scores = [float(s) for s in scores]  # list[float], float32 values from the file
        self.kinds = list(kinds)  # list[int], NORMAL/UNKNOWN/CONTROL/BYTE per id
        self.unk_id, self.bos_id, self.eos_id, self.stop_ids = UNK_ID, BOS_ID, EOS_ID, (EOS_ID,)
        self._special_ids = {}  # kind -> ids, for the few pieces that are not NORMAL
        for i, k in enumerate(self.kinds):
            if k != NORMAL:
                self._special_ids.setdefault(k, []).append(i)
        self._check_vocab()
        # what the grammar sees per id; (V,) list of bytes. Written as one comprehension plus
        # fix-ups for the few special ids: a function call per piece doubles the load time.
        self.token_bytes = [p.replace(SPACE_MARK, " ").encode("utf-8") for p in self.pieces]
        for i in self._ids_of_kind(UNKNOWN) + self._ids_of_kind(CONTROL):
            self.token_bytes[i] = b""  # BOS/EOS/unk carry no text for the grammar
        for i in self._ids_of_kind(BYTE):
            self.token_bytes[i] = bytes([int(self.pieces[i][3:5], 16)])  # "<0x0A>" -> b"\n"
        # merges may only produce normal pieces (SentencePiece keeps control/byte/unk out of
        # its merge table), but the final piece -> id lookup sees every piece.
        self._piece_ids = {p: i for i, p in enumerate(self.pieces)}
        self._merge_ids = {p: i for p, i in self._piece_ids.items() if self.kinds[i] == NORMAL}
        self._byte_ids = [0] * 256  # (256,) byte value -> id of its <0xNN> piece
        for i in self._ids_of_kind(BYTE):
            self._byte_ids[self.token_bytes[i][0]] = i
        self.bos_token, self.eos_token = self.pieces[BOS_ID], self.pieces[EOS_ID]

    @classmethod
    def from_pieces(cls, pieces, scores, kinds=None, source="<pieces>"):
        """Build from lists; kinds default to: id 0 unknown, ids 1-2 control, <0xNN> byte, rest normal."""
        if kinds is None:
            kinds = _default_kinds(pieces)
        return cls(pieces, scores, kinds, source)

    def _ids_of_kind(self, kind):
        return self._special_ids.get(kind, [])

    def _check_vocab(self):
        """Whole-list checks first (fast on 32k pieces); walk ids only to name the culprit."""
        src, V = self.source, len(self.pieces)
        if V < 3 + 256:
            raise TokenizerError(f"{src}: vocabulary has {V} pieces; need at least 259 "
                                 f"(<unk>, <s>, </s> and the 256 byte-fallback pieces)")
        for i, kind in ((UNK_ID, UNKNOWN), (BOS_ID, CONTROL), (EOS_ID, CONTROL)):
            if self.kinds[i] != kind:
                raise TokenizerError(f"{src}: id {i} ({self.pieces[i]!r}) is a {KIND_NAMES.get(self.kinds[i])} "
                                     f"piece, expected {KIND_NAMES[kind]} (llama2.c fixes unk=0, BOS=1, EOS=2)")
        if not all(isinstance(p, str) and p for p in self.pieces):
            i = next(i for i, p in enumerate(self.pieces) if not (isinstance(p, str) and p))
            raise TokenizerError(f"{src}: id {i}: piece must be a non-empty string, got {self.pieces[i]!r}")
        if len(set(self.pieces)) != V:
            first = {}
            i = next(i for i, p in enumerate(self.pieces) if first.setdefault(p, i) != i)
            raise TokenizerError(f"{src}: id {i}: piece {self.pieces[i]!r} duplicates id {first[self.pieces[i]]}")
        if not all(map(math.isfinite, self.scores)):
            i = next(i for i, s in enumerate(self.scores) if not math.isfinite(s))
            raise TokenizerError(f"{src}: id {i} ({self.pieces[i]!r}): score {self.scores[i]} is not finite")
        bad_kinds = set(self._special_ids) - {UNKNOWN, CONTROL, BYTE}
        if bad_kinds:
            i = next(i for i, k in enumerate(self.kinds) if k in bad_kinds)
            kind = KIND_NAMES.get(self.kinds[i], self.kinds[i])
            raise TokenizerError(f"{src}: id {i} ({self.pieces[i]!r}): {kind} pieces are not supported "
                                 f"(llama2.c has no such piece type)")
        byte_values = set()
        for i in self._ids_of_kind(BYTE):
            m = BYTE_PIECE.fullmatch(self.pieces[i])
            if m is None:
                raise TokenizerError(f"{src}: id {i}: byte piece {self.pieces[i]!r} is not of the form <0xNN>")
            byte_values.add(int(m.group(1), 16))
        if len(byte_values) != 256:
            missing = sorted(set(range(256)) - byte_values)
            raise TokenizerError(f"{src}: {len(missing)} byte-fallback pieces are missing "
                                 f"(e.g. <0x{missing[0]:02X}>); byte_fallback must be on")

    # -------------------------------------------------------------------------
    # encode

    def encode(self, text, bos=True, eos=False, prefix_space=True):
        """text -> ids, as SentencePiece BPE (and llama2.c) do. prefix_space=False for continuations."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects str, got {type(text).__name__}")
        ids = [self.bos_id] if bos else []
        if text:  # SentencePiece adds no dummy prefix to empty input
            normalized = (SPACE_MARK if prefix_space else "") + text.replace(" ", SPACE_MARK)
            ids.extend(self._bpe(normalized))
        if eos:
            ids.append(self.eos_id)
        return ids

    def _bpe(self, text):
        """Merge the characters of `text` by score with a heap: O(n log n) in len(text)."""
        n = len(text)
        sym = list(text)  # sym[i]: the piece starting at char i ("" once merged into its left)
        nxt = list(range(1, n + 1))  # next live symbol, n means none
        prv = list(range(-1, n - 1))  # previous live symbol, -1 means none
        heap = []  # (-score, left, right, merged length): best score first, leftmost on ties

        def push(left, right):
            if left < 0 or right >= n:
                return
            merged = sym[left] + sym[right]
            i = self._merge_ids.get(merged)
            if i is not None:
                heapq.heappush(heap, (-self.scores[i], left, right, len(merged)))

        for i in range(n - 1):
            push(i, i + 1)
        while heap:
            _, left, right, size = heapq.heappop(heap)
            # stale entry: one side was merged away or grew since the pair was pushed
            if not sym[left] or not sym[right] or len(sym[left]) + len(sym[right]) != size:
                continue
            sym[left] += sym[right]
            sym[right] = ""
            nxt[left] = nxt[right]
            if nxt[left] < n:
                prv[nxt[left]] = left
            push(prv[left], left)
            push(left, nxt[left])

        ids = []
        i = 0
        while i < n:
            piece_id = self._piece_ids.get(sym[i])
            if piece_id is not None:
                ids.append(piece_id)
            else:  # byte fallback: a character the vocabulary lacks becomes its UTF-8 bytes
                ids.extend(self._byte_ids[b] for b in sym[i].encode("utf-8"))
            i = nxt[i]
        return ids

    # -------------------------------------------------------------------------
    # decode

    def decode(self, ids):
        """ids -> text with llama2.c's rule: a normal piece right after BOS loses its leading space."""
        self._check_ids(ids)
        parts, prev = [], None
        for i in ids:
            b = self.token_bytes[i]
            if prev == self.bos_id and self.kinds[i] == NORMAL and b.startswith(b" "):
                b = b[1:]
            parts.append(b)
            prev = i
        return b"".join(parts).decode("utf-8", errors="replace")

    # -------------------------------------------------------------------------
    # export

    def bin_texts(self):
        """Per id, the piece text as llama2.c's tokenizer.bin stores it."""
        texts = [p.replace(SPACE_MARK, " ") for p in self.pieces]
        texts[self.bos_id], texts[self.eos_id] = BIN_BOS_TEXT, BIN_EOS_TEXT
        return texts

    def write_bin(self, path):
        """Write a llama2.c tokenizer.bin, byte for byte as llama2.c's tokenizer.py export does."""
        # a .bin stores no piece kinds: on reading, only ids 0-2 are special, so any other
        # control/unknown piece would come back as normal text and change what the grammar sees
        extra = [i for i in self._ids_of_kind(CONTROL) + self._ids_of_kind(UNKNOWN) if i > EOS_ID]
        if extra:
            i = extra[0]
            raise TokenizerError(f"{path}: cannot write a tokenizer.bin: id {i} ({self.pieces[i]!r}) is a "
                                 f"{KIND_NAMES[self.kinds[i]]} piece, which the .bin format cannot mark "
                                 f"(only ids 0-2 are special there)")
        records = [t.encode("utf-8") for t in self.bin_texts()]
        out = [struct.pack("<I", max(len(r) for r in records))]
        for r, score in zip(records, self.scores):
            out.append(struct.pack("<fI", score, len(r)))
            out.append(r)
        Path(path).write_bytes(b"".join(out))


def _default_kinds(pieces):
    """Kinds when a format does not store them (tokenizer.bin): fixed specials, <0xNN> bytes, rest normal."""
    kinds = [BYTE if p.startswith("<0x") and BYTE_PIECE.fullmatch(p) else NORMAL for p in pieces]
    kinds[UNK_ID:EOS_ID + 1] = [UNKNOWN, CONTROL, CONTROL][:len(kinds)]
    return kinds


# -----------------------------------------------------------------------------
# reading (tokenizer_bin.py walks the .bin records; tokenizer.py picks the format)

class NotAModel(TokenizerError):
    """The bytes are no SentencePiece ModelProto (the loader then reports every format it tried)."""


def tokenizer_from_bin(texts, scores, name):
    """tokenizer.bin texts -> SentencePiece notation pieces (space -> ▁, "\\n<s>\\n" -> "<s>")."""
    if len(texts) < 3:
        raise TokenizerError(f"{name}: only {len(texts)} records; need <unk>, <s>, </s> first")
    for i, want in ((BOS_ID, BIN_BOS_TEXT), (EOS_ID, BIN_EOS_TEXT)):
        if texts[i] != want:
            raise TokenizerError(f"{name}: record {i} is {texts[i]!r}, expected {want!r} "
                                 f"(llama2.c stores BOS/EOS that way)")
    pieces = [t.replace(" ", SPACE_MARK) for t in texts]
    pieces[BOS_ID], pieces[EOS_ID] = "<s>", "</s>"
    return Tokenizer.from_pieces(pieces, scores, source=name)


def read_model(data, name):
    """SentencePiece ModelProto -> (pieces, scores, kinds), after checking it is plain Llama-style BPE."""
    import sentencepiece  # only needed for .model files

    try:
        sp = sentencepiece.SentencePieceProcessor(model_proto=data)
    except Exception as e:  # sentencepiece raises RuntimeError/OSError with its own wording
        # sentencepiece does not say where; our wire-format walk usually can (e.g. a truncated file)
        try:
            _proto_fields(data)
            where = "the protobuf wire format walks cleanly, so a field's content is invalid"
        except (IndexError, ValueError) as walk_err:
            where = f"protobuf: {walk_err}"
        raise NotAModel(f"{where}; sentencepiece: {str(e).strip()}") from None
    _check_model_spec(data, name)
    ids = list(range(sp.vocab_size()))
    for field, got, want in (("unk_id", sp.unk_id(), UNK_ID), ("bos_id", sp.bos_id(), BOS_ID),
                             ("eos_id", sp.eos_id(), EOS_ID)):
        if got != want:
            raise TokenizerError(f"{name}: trainer_spec.{field} is {got}, llama2.c needs {want}")
    # batched sentencepiece calls: one C++ round trip per property instead of one per id
    pieces, scores = sp.id_to_piece(ids), sp.get_score(ids)
    flags = zip(sp.is_unknown(ids), sp.is_control(ids), sp.is_byte(ids), sp.is_unused(ids))
    kinds = [UNKNOWN if unk else CONTROL if ctrl else BYTE if byte else UNUSED if unused else NORMAL
             for unk, ctrl, byte, unused in flags]
    return pieces, scores, kinds


def _check_model_spec(data, name):
    """Reject ModelProto settings whose encoding our BPE (and llama2.c) would not reproduce."""
    try:
        top = _proto_fields(data)  # ModelProto: 1 pieces, 2 trainer_spec, 3 normalizer_spec
        trainer = _proto_fields(_last(top, 2, b""))
        normalizer = _proto_fields(_last(top, 3, b""))
        user_defined = [i for i, piece in enumerate(top.get(1, [])) if _is_user_defined(piece)]
    except (IndexError, ValueError) as e:
        raise TokenizerError(f"{name}: malformed ModelProto: {e}") from None
    model_type = _last(trainer, 3, 1)  # TrainerSpec.ModelType: 1 UNIGRAM, 2 BPE, 3 WORD, 4 CHAR
    if model_type != 2:
        kind = {1: "UNIGRAM", 3: "WORD", 4: "CHAR"}.get(model_type, str(model_type))
        raise TokenizerError(f"{name}: trainer_spec.model_type is {kind}; only BPE is supported")
    if _last(trainer, 24, 0):
        raise TokenizerError(f"{name}: trainer_spec.treat_whitespace_as_suffix is set; llama2.c needs it off")
    charsmap = _last(normalizer, 2, b"")
    if charsmap:
        rule = bytes(_last(normalizer, 1, b"?")).decode("utf-8", "replace")
        raise TokenizerError(f"{name}: normalizer_spec '{rule}' rewrites text (precompiled_charsmap of "
                             f"{len(charsmap)} bytes); only the 'identity' normalizer is supported")
    want = {3: ("add_dummy_prefix", 1), 4: ("remove_extra_whitespaces", 0), 5: ("escape_whitespaces", 1)}
    for field, (fname, value) in want.items():
        got = _last(normalizer, field, 1)  # all three default to true in sentencepiece_model.proto
        if got != value:
            raise TokenizerError(f"{name}: normalizer_spec.{fname} is {bool(got)}; llama2.c needs {bool(value)}")
    if user_defined:
        raise TokenizerError(f"{name}: id {user_defined[0]} is a user-defined piece; SentencePiece matches "
                             f"those whole before BPE, which llama2.c does not do (not supported)")


def _is_user_defined(piece_msg):
    """SentencePiece message (1 piece, 2 score, 3 type): type == USER_DEFINED?"""
    # fields are serialised in order and a NORMAL type is usually omitted, so only a message
    # ending in the bytes of "type = USER_DEFINED" needs a real parse
    if piece_msg[-2:] != bytes([3 << 3, USER_DEFINED]):
        return False
    return _last(_proto_fields(piece_msg), 3, NORMAL) == USER_DEFINED


def _proto_fields(buf):
    """Minimal protobuf wire-format reader: {field number: [values]}.

    Varints come back as int, everything else as zero-copy memoryview slices of `buf`."""
    buf = memoryview(buf)
    fields = {}
    i, end = 0, len(buf)
    while i < end:
        start = i
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        elif wire == 2:
            n, i = _varint(buf, i)
            value, i = buf[i:i + n], i + n
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"field {number} at byte offset {start}: unsupported wire type {wire}")
        if i > end:
            raise ValueError(f"field {number} at byte offset {start} runs past the end "
                             f"({i - end} bytes missing of a {end}-byte message)")
        fields.setdefault(number, []).append(value)
    return fields


def _varint(buf, i):
    value = shift = 0
    while True:
        if i >= len(buf):
            raise ValueError(f"varint at byte offset {i} runs past the end")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, i


def _last(fields, number, default):
    """Protobuf semantics: a repeated scalar field's last value wins; absent -> default."""
    values = fields.get(number)
    return values[-1] if values else default
