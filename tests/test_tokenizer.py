"""
models/tokenizer.py against sentencepiece itself, the shipped Llama 2 files, a small
BPE model trained here, and a plainly written llama2.c-style merge loop.
"""

import functools
import random
import struct

import pytest
from batchmask.models.tokenizer import BYTE, CONTROL, NORMAL, UNKNOWN, Tokenizer, TokenizerError, load_tokenizer
from data_paths import data_dir
from hypothesis import given, settings
from hypothesis import strategies as st

spm = pytest.importorskip("sentencepiece")

LLAMA_DIR = data_dir("llama2")
LLAMA_BIN = LLAMA_DIR / "tokenizer.bin"
LLAMA_MODEL = LLAMA_DIR / "tokenizer.model"
needs_llama = pytest.mark.skipif(not (LLAMA_BIN.is_file() and LLAMA_MODEL.is_file()),
                                 reason=f"Llama 2 tokenizer files not found in {LLAMA_DIR}")

# -----------------------------------------------------------------------------
# a deterministic pile of varied strings

WORDS = ("the quick brown fox jumps over lazy dog tool call weather Paris London function name "
         "arguments temperature celsius fahrenheit search query results user assistant system "
         "hello world once upon a time there was little girl named Lily she loved play outside "
         "json schema string integer number boolean null array object required properties "
         "don't can't it's we're they'll I'm isn't Hello WORLD Mr. Dr. e.g. i.e. etc.").split()
PUNCT = list(".,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`")
WHITESPACE = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \t ", "\t\t", "        ", " \n "]
ACCENTED = ["café", "naïve", "Ångström", "façade", "résumé", "über", "niño", "e\u0301", "Zoë", "crème brûlée"]
SCRIPTS = ["日本語のテキスト", "中文字符", "한국어", "Привет мир", "Γειά σου", "مرحبا", "שלום",
           "नमस्ते", "สวัสดี", "ქართული", "Ꭰꭰ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢"]
EMOJI = ["🎉", "👩‍💻", "🇫🇷", "❤️", "😀😃😄", "🤖", "✓", "★"]
CONTROL_CHARS = [chr(c) for c in list(range(0, 32)) + [127]]
DIGITS = ["0", "42", "3.14159", "1,000,000", "2023-10-05", "-17", "1e-9", "0x1F", "12345678901234567890"]
SNIPPETS = ['{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
            "<tool_call>", "def f(x):\n    return x * 2\n", "<s>", "</s>", "<unk>", "<0x0A>", "▁", "▁▁x",
            "a" * 40, " " * 33, "\n" * 9, "ab" * 30]


def varied_strings(n, seed):
    """n strings mixing every family above, plus each family member on its own."""
    rng = random.Random(seed)
    families = [WORDS, PUNCT, WHITESPACE, ACCENTED, SCRIPTS, EMOJI, CONTROL_CHARS, DIGITS, SNIPPETS]
    out = [""] + [s for fam in families for s in fam]
    while len(out) < n:
        kind = rng.random()
        if kind < 0.35:  # an English-ish sentence
            words = rng.choices(WORDS, k=rng.randint(1, 14))
            s = " ".join(words) + rng.choice([".", "!", "?", "", ",", "..."])
            out.append(s.capitalize() if rng.random() < 0.5 else s)
        else:  # a mixture of fragments with random separators
            parts = [rng.choice(rng.choice(families)) for _ in range(rng.randint(1, 6))]
            seps = [rng.choice(["", " ", "", rng.choice(WHITESPACE)]) for _ in parts]
            s = "".join(p + sep for p, sep in zip(parts, seps))
            out.append(s if rng.random() < 0.8 else rng.choice(WHITESPACE) + s)
    return out[:n]


STRINGS = varied_strings(1200, seed=0)
hyp_text = st.text(max_size=120) | st.text(alphabet=" \t\nabcde.▁é日🎉", max_size=60)


def mismatches(tok, strings, reference):
    """The strings where tok.encode disagrees with reference(s) (both with BOS)."""
    return [(s, tok.encode(s), reference(s)) for s in strings if tok.encode(s) != reference(s)]


# -----------------------------------------------------------------------------
# the real Llama 2 vocabulary

@pytest.fixture(scope="module")
def sp():
    return spm.SentencePieceProcessor(model_file=str(LLAMA_MODEL))


@pytest.fixture(scope="module")
def tok_bin():
    return load_tokenizer(LLAMA_BIN)


@pytest.fixture(scope="module")
def tok_model():
    return load_tokenizer(LLAMA_MODEL)


@pytest.fixture(scope="module", params=["bin", "model"])
def tok(request, tok_bin, tok_model):
    return tok_bin if request.param == "bin" else tok_model


@needs_llama
def test_encode_matches_sentencepiece(tok, sp):
    assert len(STRINGS) >= 1000
    bad = mismatches(tok, STRINGS, lambda s: [1] + sp.encode(s))
    assert not bad, f"{len(bad)} mismatches, first: {bad[:3]}"


@needs_llama
@settings(max_examples=150, deadline=None)
@given(text=hyp_text)
def test_encode_matches_sentencepiece_hypothesis(tok_bin, tok_model, sp, text):
    want = [1] + sp.encode(text)
    assert tok_bin.encode(text) == want
    assert tok_model.encode(text) == want


@needs_llama
def test_encode_flags(tok_bin, sp):
    s = "Call the tool now."
    assert tok_bin.encode(s, bos=False) == sp.encode(s)
    assert tok_bin.encode(s, bos=True, eos=True) == [1] + sp.encode(s) + [2]
    assert tok_bin.encode("") == [1] and tok_bin.encode("", bos=False) == []


@needs_llama
def test_prefix_space_false_matches_sentencepiece_without_dummy_prefix(tok_bin, sp):
    # reference: the same model proto with normalizer_spec.add_dummy_prefix (field 3) flipped to false
    proto = LLAMA_MODEL.read_bytes()
    spec_on = b"\n\x08identity\x12\x00\x18\x01"  # name="identity", precompiled_charsmap="", add_dummy_prefix=1
    assert proto.count(spec_on) == 1, "normalizer_spec layout changed; update the patch"
    sp_plain = spm.SentencePieceProcessor(model_proto=proto.replace(spec_on, spec_on[:-1] + b"\x00"))
    assert sp_plain.encode("Hello") != sp.encode("Hello")  # the patch took effect
    bad = [s for s in STRINGS if tok_bin.encode(s, bos=False, prefix_space=False) != sp_plain.encode(s)]
    assert not bad, f"{len(bad)} mismatches, first: {bad[:3]}"


@needs_llama
def test_decode_round_trips(tok_bin, sp):
    # a literal U+2581 in the input is indistinguishable from a space once encoded (as in sentencepiece)
    for s in (s for s in STRINGS if "\u2581" not in s):
        ids = tok_bin.encode(s)
        assert tok_bin.decode(ids) == s
        assert tok_bin.decode(ids) == sp.decode(ids[1:])  # sentencepiece drops the dummy prefix too
        no_bos = tok_bin.encode(s, bos=False)
        assert tok_bin.decode(no_bos) == (" " + s if s else "")  # llama2.c strips only after BOS
        assert tok_bin.decode_bytes(ids) == (" " + s if s else "").encode("utf-8")


@needs_llama
def test_decode_llama2c_rules(tok_bin, sp):
    hello, space_byte, e6 = sp.piece_to_id("▁Hello"), sp.piece_to_id("<0x20>"), sp.piece_to_id("<0xE6>")
    assert tok_bin.decode([1, hello]) == "Hello"
    assert tok_bin.decode([hello]) == " Hello"
    assert tok_bin.decode([1, space_byte]) == " "  # byte pieces are never stripped
    assert tok_bin.decode([1, e6]) == "\ufffd"  # half a UTF-8 character
    assert tok_bin.decode_bytes([1, e6, 2]) == b"\xe6"
    with pytest.raises(TokenizerError, match="out of range"):
        tok_bin.decode([32000])
    with pytest.raises(TokenizerError, match="out of range"):
        tok_bin.decode([-1])


@needs_llama
@settings(max_examples=100, deadline=None)
@given(text=hyp_text)
def test_decode_round_trip_hypothesis(tok_bin, text):
    text = text.replace("\u2581", "_")  # a literal U+2581 comes back as a space, as in sentencepiece
    assert tok_bin.decode(tok_bin.encode(text)) == text
    assert tok_bin.decode(tok_bin.encode(text, bos=False, prefix_space=False)) == text


@needs_llama
def test_token_bytes_match_sentencepiece_pieces(tok, sp):
    assert tok.vocab_size == sp.vocab_size() == 32000
    assert (tok.unk_id, tok.bos_id, tok.eos_id) == (sp.unk_id(), sp.bos_id(), sp.eos_id()) == (0, 1, 2)
    for i in range(sp.vocab_size()):
        piece = sp.id_to_piece(i)
        if sp.is_control(i) or sp.is_unknown(i):
            want = b""
        elif sp.is_byte(i):
            want = bytes([int(piece[3:5], 16)])
        else:
            want = piece.replace("\u2581", " ").encode("utf-8")
        assert tok.token_bytes[i] == want, (i, piece)
        assert tok.pieces[i] == piece
    assert tok.token_bytes[:3] == [b"", b"", b""]
    assert tok.token_bytes[sp.piece_to_id("<0x0A>")] == b"\n"
    assert tok.token_bytes[sp.piece_to_id("\u2581")] == b" "


@needs_llama
def test_both_formats_agree(tok_bin, tok_model, sp):
    assert tok_bin.pieces == tok_model.pieces
    assert tok_bin.scores == tok_model.scores == [sp.get_score(i) for i in range(sp.vocab_size())]
    assert tok_bin.kinds == tok_model.kinds
    assert tok_bin.token_bytes == tok_model.token_bytes
    assert tok_bin.vocab_hash() == tok_model.vocab_hash()
    assert len(tok_bin.vocab_hash()) == 64


@needs_llama
def test_vocab_hash_sees_token_bytes(tok_bin):
    pieces = list(tok_bin.pieces)
    i = pieces.index("\u2581the")
    pieces[i] = "\u2581the\u2581the\u2581the"  # not otherwise in the vocabulary
    assert Tokenizer.from_pieces(pieces, tok_bin.scores).vocab_hash() != tok_bin.vocab_hash()
    assert Tokenizer.from_pieces(tok_bin.pieces, tok_bin.scores).vocab_hash() == tok_bin.vocab_hash()


@needs_llama
def test_write_bin_is_byte_identical_to_shipped(tok, tmp_path):
    out = tmp_path / "tokenizer.bin"
    tok.write_bin(out)
    assert out.read_bytes() == LLAMA_BIN.read_bytes()


# -----------------------------------------------------------------------------
# bad files

def bin_record_offsets(data):
    """Byte offset of every record in a tokenizer.bin, walked plainly."""
    offsets, off = [], 4
    while off < len(data):
        offsets.append(off)
        off += 8 + struct.unpack_from("<i", data, off + 4)[0]
    return offsets


def load_error(path, **kw):
    with pytest.raises(TokenizerError) as err:
        load_tokenizer(path, **kw)
    msg = str(err.value)
    assert str(path) in msg
    return msg


@needs_llama
def test_truncated_bin_names_record_and_offset(tmp_path):
    data = LLAMA_BIN.read_bytes()
    offsets = bin_record_offsets(data)
    assert len(offsets) == 32000
    for rec, cut in [(1234, 3), (1234, 9), (20000, 8), (31999, 5)]:  # cut bytes into the record
        path = tmp_path / f"cut_{rec}_{cut}.bin"
        path.write_bytes(data[:offsets[rec] + cut])
        msg = load_error(path)
        assert f"record {rec} at byte offset {offsets[rec]}" in msg, msg
        assert f"file is {offsets[rec] + cut} bytes" in msg, msg


@needs_llama
def test_truncated_at_record_boundary_caught_by_vocab_size(tmp_path):
    data = LLAMA_BIN.read_bytes()
    path = tmp_path / "short.bin"
    path.write_bytes(data[:bin_record_offsets(data)[30000]])
    assert load_tokenizer(path).vocab_size == 30000  # tiles exactly: only the checkpoint can tell
    assert "vocab_size=32000" in load_error(path, vocab_size=32000)
    assert load_tokenizer(LLAMA_BIN, vocab_size=32000).vocab_size == 32000


@needs_llama
def test_corrupt_bin_records(tmp_path):
    data = LLAMA_BIN.read_bytes()
    offsets = bin_record_offsets(data)

    def corrupt(name, rec, field_offset, new_bytes):
        b = bytearray(data)
        at = offsets[rec] + field_offset
        b[at:at + len(new_bytes)] = new_bytes
        path = tmp_path / name
        path.write_bytes(bytes(b))
        msg = load_error(path)
        assert f"record {rec} at byte offset {offsets[rec]}" in msg, msg
        return msg

    assert "exceeds max_token_length 27" in corrupt("long.bin", 1234, 4, struct.pack("<i", 4000))
    assert "runs past end of file" in corrupt("huge.bin", 1234, 4, struct.pack("<i", 10**8))
    assert "not positive" in corrupt("neg.bin", 500, 4, struct.pack("<i", -3))
    assert "not finite" in corrupt("nan.bin", 700, 0, struct.pack("<f", float("nan")))
    assert "UTF-8" in corrupt("utf8.bin", 1000, 8, b"\xff")
    # BOS stored some other way than llama2.c's "\n<s>\n" (same length, so the layout still tiles)
    b = bytearray(data)
    b[offsets[1] + 8:offsets[1] + 13] = b"\n<x>\n"
    (tmp_path / "bos.bin").write_bytes(bytes(b))
    assert "record 1" in load_error(tmp_path / "bos.bin")


def test_garbage_empty_missing(tmp_path):
    rng = random.Random(7)
    garbage = tmp_path / "garbage.model"
    garbage.write_bytes(bytes(rng.randrange(256) for _ in range(5000)))
    msg = load_error(garbage)
    assert "byte offset" in msg and "SentencePiece" in msg, msg

    empty = tmp_path / "tokenizer.bin"
    empty.write_bytes(b"")
    assert "empty" in load_error(empty)

    tiny = tmp_path / "tiny.bin"
    tiny.write_bytes(b"\x01\x00")
    load_error(tiny)

    assert "not found" in load_error(tmp_path / "nope.bin")


@needs_llama
def test_truncated_model_file(tmp_path):
    path = tmp_path / "tokenizer.model"
    path.write_bytes(LLAMA_MODEL.read_bytes()[:200_000])
    msg = load_error(path)
    assert "SentencePiece model (protobuf: field 1 at byte offset" in msg, msg  # the piece cut in half


@needs_llama
def test_format_detection_ignores_file_name(tmp_path):
    swapped_model, swapped_bin = tmp_path / "tokenizer.bin", tmp_path / "tokenizer.model"
    swapped_model.write_bytes(LLAMA_MODEL.read_bytes())
    swapped_bin.write_bytes(LLAMA_BIN.read_bytes())
    a, b = load_tokenizer(swapped_model), load_tokenizer(swapped_bin)
    assert a.pieces == b.pieces and a.scores == b.scores


# -----------------------------------------------------------------------------
# a small BPE model trained here, as the project will ship its own

def train_sp(tmp_path, name, **options):
    rng = random.Random(1)
    lines = [" ".join(rng.choices(WORDS, k=rng.randint(3, 12))) + rng.choice([".", "!", "?", ","])
             for _ in range(300)]
    lines += [rng.choice(DIGITS) + " " + rng.choice(ACCENTED) for _ in range(30)]
    corpus = tmp_path / f"{name}.txt"
    corpus.write_text("\n".join(lines), encoding="utf-8")
    prefix = tmp_path / name
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(prefix), minloglevel=2, **options)
    return prefix.with_suffix(".model")


LLAMA_LIKE = dict(model_type="bpe", vocab_size=400, byte_fallback=True, character_coverage=1.0,
                  normalization_rule_name="identity", remove_extra_whitespaces=False,
                  split_digits=True, allow_whitespace_only_pieces=True)


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    return train_sp(tmp_path_factory.mktemp("spm"), "small", **LLAMA_LIKE)


def test_small_trained_model_matches_sentencepiece(small_model):
    sp = spm.SentencePieceProcessor(model_file=str(small_model))
    tok = load_tokenizer(small_model)
    assert tok.vocab_size == sp.vocab_size() == 400
    assert sum(k == BYTE for k in tok.kinds) == 256
    strings = varied_strings(600, seed=3)
    bad = mismatches(tok, strings, lambda s: [1] + sp.encode(s))
    assert not bad, f"{len(bad)} mismatches, first: {bad[:3]}"
    for s in strings[:200]:
        assert tok.decode(tok.encode(s)) == s.replace("\u2581", " ")


def test_small_trained_model_bin_round_trip(small_model, tmp_path):
    tok = load_tokenizer(small_model)
    path = tmp_path / "small.bin"
    tok.write_bin(path)
    back = load_tokenizer(path, vocab_size=tok.vocab_size)
    assert (back.pieces, back.scores, back.kinds, back.token_bytes) == (tok.pieces, tok.scores, tok.kinds,
                                                                         tok.token_bytes)
    assert back.vocab_hash() == tok.vocab_hash()
    for s in varied_strings(200, seed=4):
        assert back.encode(s) == tok.encode(s)
    again = tmp_path / "again.bin"
    back.write_bin(again)
    assert again.read_bytes() == path.read_bytes()


def test_extra_control_piece_encodes_but_cannot_be_written_as_bin(tmp_path):
    model = train_sp(tmp_path, "ctrl", **{**LLAMA_LIKE, "control_symbols": ["<tool>"]})
    sp, tok = spm.SentencePieceProcessor(model_file=str(model)), load_tokenizer(model)
    tool = sp.piece_to_id("<tool>")
    assert sp.is_control(tool) and tok.kinds[tool] == CONTROL and tok.token_bytes[tool] == b""
    for s in ["<tool>", "call <tool> now", "the dog"]:
        assert tok.encode(s) == [1] + sp.encode(s)
    with pytest.raises(TokenizerError, match="cannot write a tokenizer.bin"):
        tok.write_bin(tmp_path / "ctrl.bin")


def test_rejects_models_llama2c_cannot_express(tmp_path):
    unigram = train_sp(tmp_path, "uni", **{**LLAMA_LIKE, "model_type": "unigram", "vocab_size": 350})
    assert "model_type is UNIGRAM" in load_error(unigram)
    nfkc = train_sp(tmp_path, "nfkc", **{**LLAMA_LIKE, "normalization_rule_name": "nmt_nfkc"})
    assert "normalizer_spec 'nmt_nfkc'" in load_error(nfkc)
    squeeze = train_sp(tmp_path, "squeeze", **{**LLAMA_LIKE, "remove_extra_whitespaces": True})
    assert "remove_extra_whitespaces" in load_error(squeeze)
    user_defined = train_sp(tmp_path, "user", **{**LLAMA_LIKE, "user_defined_symbols": ["<tool>"]})
    assert "user-defined" in load_error(user_defined)
    no_bytes = train_sp(tmp_path, "nobytes", **{**LLAMA_LIKE, "byte_fallback": False, "vocab_size": 150})
    assert "byte-fallback" in load_error(no_bytes)


# -----------------------------------------------------------------------------
# the merge loop against a plainly written llama2.c-style reference

TOY_MERGES = {"▁a": -1.0, "ab": -1.0, "bc": -2.0, "abc": -0.5, "aa": -1.0, "▁ab": -3.0, "ca": -1.0,
              "▁▁": -4.0, "cab": -0.25, "aab": -1.5}


@functools.cache
def toy_tokenizer():
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["▁", "a", "b", "c"]
    pieces += list(TOY_MERGES)
    scores = [0.0] * 259 + [-10.0, -11.0, -12.0, -13.0] + list(TOY_MERGES.values())
    return Tokenizer.from_pieces(pieces, scores)


def reference_encode(tok, text):
    """llama2.c's encode, written plainly: merge the best-scoring adjacent pair, leftmost first, until none."""
    normal = {p: i for i, (p, k) in enumerate(zip(tok.pieces, tok.kinds)) if k == NORMAL}
    syms = list("▁" + text.replace(" ", "▁")) if text else []
    while True:
        best, at = None, None
        for j in range(len(syms) - 1):
            i = normal.get(syms[j] + syms[j + 1])
            if i is not None and (best is None or tok.scores[i] > best):
                best, at = tok.scores[i], j
        if at is None:
            break
        syms[at:at + 2] = [syms[at] + syms[at + 1]]
    ids = [1]
    for s in syms:
        if s in tok.pieces:
            ids.append(tok.pieces.index(s))
        else:
            ids.extend(tok.pieces.index(f"<0x{b:02X}>") for b in s.encode("utf-8"))
    return ids


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet="abc d▁é", max_size=40))
def test_heap_merge_equals_plain_merge(text):
    tok = toy_tokenizer()
    assert tok.encode(text) == reference_encode(tok, text)


def test_from_pieces_kinds_and_bytes():
    tok = toy_tokenizer()
    assert tok.kinds[:3] == [UNKNOWN, CONTROL, CONTROL]
    assert tok.kinds[3:259] == [BYTE] * 256 and tok.token_bytes[3 + 0x0A] == b"\n"
    assert tok.token_bytes[tok.pieces.index("▁ab")] == b" ab"
    assert tok.encode("é") == [1, tok.pieces.index("▁"), 3 + 0xC3, 3 + 0xA9]  # byte fallback


def test_from_pieces_rejects_bad_vocabularies():
    tok = toy_tokenizer()
    with pytest.raises(TokenizerError, match="duplicates id"):
        Tokenizer.from_pieces(tok.pieces + ["ab"], tok.scores + [0.0])
    no_0x41 = [p if p != "<0x41>" else "zz" for p in tok.pieces]
    with pytest.raises(TokenizerError, match="byte-fallback pieces are missing"):
        Tokenizer.from_pieces(no_0x41, tok.scores)
    with pytest.raises(TokenizerError, match="at least 259"):
        Tokenizer.from_pieces(tok.pieces[:10], tok.scores[:10])
    with pytest.raises(TokenizerError, match="equal length"):
        Tokenizer.from_pieces(tok.pieces, tok.scores[:-1])
    with pytest.raises(TokenizerError, match="not finite"):
        Tokenizer.from_pieces(tok.pieces, tok.scores[:-1] + [float("inf")])
    with pytest.raises(TokenizerError, match="id 1"):
        Tokenizer.from_pieces(tok.pieces, tok.scores, kinds=[UNKNOWN] + [NORMAL] * (tok.vocab_size - 1))
