"""The default model's vocabulary: SentencePiece BPE learnt on generated training text, space-glued pieces dropped.

Llama conventions (unk/BOS/EOS at 0/1/2, byte fallback, a dummy prefix), one token per digit, and
no piece that glues "▁" to text, so a name is the same tokens in a task and in a call. Writes
tokenizer.model and the same vocabulary as llama2.c's tokenizer.bin.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from batchmask.models.tokenizer import Tokenizer, load_tokenizer

from batchmask.evaluation.taskgen import Example
from batchmask.tools.prompt import render_call, render_prompt
from batchmask.tools.registry import ToolRegistry

from .state import TrainError
from .tasks import make_train_examples

VOCAB_SIZE = 1024
# 0 keeps BPE's pieces (names are a few pieces each). 1 spells everything letter by letter:
# tried, it doubles the sequence and made copying slower to learn in a 30-minute budget.
MAX_PIECE_LEN = 0
TOKENIZER_SEED = 2


def corpus_lines(examples: Iterable[Example], registry: ToolRegistry) -> Iterator[str]:
    """The text SentencePiece learns from, one line at a time: the prompt's lines, then the call.

    Lines, not whole examples: no piece then spans a newline, so "\\n" is always its byte piece
    and the prompt tokenises the same whatever the task is.
    """
    for ex in examples:
        yield from render_prompt(registry, ex.task).split("\n")
        yield render_call(ex.tool, ex.args)


def train_tokenizer(model_path: Path, n_examples: int = 20000, vocab_size: int = VOCAB_SIZE,
                    max_piece_len: int = MAX_PIECE_LEN) -> Tokenizer:
    """Learn a Llama-style BPE vocabulary on generated training text; write tokenizer.model (+ .bin).

    Then drop every piece that glues a space to text ("▁notes"), keeping "▁" alone: a name is
    then the same tokens in the task ("show me notes/x.txt") and in the call ("path":"notes/x.txt"),
    so the model copies tokens instead of learning a ▁-stripped twin of each. The vocabulary
    ends up smaller than `vocab_size`.
    """
    import sentencepiece as spm

    registry = ToolRegistry.defaults()
    lines = list(corpus_lines(make_train_examples(n_examples, TOKENIZER_SEED), registry))
    prefix = str(model_path.with_suffix(""))
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_prefix=prefix, vocab_size=vocab_size, model_type="bpe",
        # llama2.c's conventions: unk/BOS/EOS at 0/1/2, no pad, every byte as a fallback piece.
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, byte_fallback=True,
        # What models/tokenizer.py (and llama2.c) can reproduce: text kept as is, a dummy prefix.
        normalization_rule_name="identity", remove_extra_whitespaces=False, add_dummy_prefix=True,
        # One token per digit: numbers never seen in training are still made of known tokens.
        split_digits=True, character_coverage=1.0, num_threads=1, minloglevel=2)
    Path(prefix + ".vocab").unlink(missing_ok=True)
    proto = Path(prefix + ".model").read_bytes()
    Path(prefix + ".model").unlink()
    model_path.write_bytes(drop_pieces(proto, max_piece_len))
    tok = load_tokenizer(model_path)
    tok.write_bin(model_path.with_name("tokenizer.bin"))
    return tok


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        b = buf[i]
        value |= (b & 0x7F) << shift
        i, shift = i + 1, shift + 7
        if b < 0x80:
            return value, i


def drop_pieces(proto: bytes, max_len: int = 0) -> bytes:
    """A SentencePiece ModelProto without its normal pieces that contain "▁" and something else,
    nor (when max_len > 0) those longer than max_len characters.

    Works on the protobuf wire format (no protobuf package needed): the model's pieces are the
    repeated length-delimited field 1, each a message whose field 1 is the piece text. BPE stays
    consistent: a piece without "▁" is only ever merged from pieces without "▁".
    """
    out, i = bytearray(), 0
    while i < len(proto):
        start = i
        key, i = _varint(proto, i)
        wire = key & 7
        if wire == 0:
            _, i = _varint(proto, i)
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        elif wire == 2:
            n, body = _varint(proto, i)
            i = body + n
            if key >> 3 == 1 and _drops(proto[body:i], max_len):
                continue
        else:
            raise TrainError(f"sentencepiece model: unexpected wire type {wire} at byte offset {start}")
        out += proto[start:i]
    return bytes(out)


def _drops(piece_msg: bytes, max_len: int) -> bool:
    """Is this SentencePiece message a normal piece holding "▁" plus other text, or one longer than
    max_len characters (max_len > 0)?"""
    text, kind, i = None, 1, 0
    while i < len(piece_msg):
        key, i = _varint(piece_msg, i)
        field, wire = key >> 3, key & 7
        if wire == 2:
            n, i = _varint(piece_msg, i)
            if field == 1:
                text = piece_msg[i:i + n].decode("utf-8")
            i += n
        elif wire == 5:
            i += 4
        elif wire == 0:
            value, i = _varint(piece_msg, i)
            if field == 3:
                kind = value
        else:
            i += 8
    if kind != 1 or text is None:
        return False
    return ("\u2581" in text and text != "\u2581") or 0 < max_len < len(text)
