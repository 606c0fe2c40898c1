"""
Byte-level vocabularies: Hugging Face tokenizer.json (GPT-2, Qwen2, SentencePiece-style), raw-byte
tokenizer.bin (llama3.c's layout), their end tokens, and one-line errors for bad files.

References: token bytes decoded here from the file format (GPT-2's byte alphabet written out from its
definition, not taken from the code under test), the `tokenizers` library (encode, and decode of
whole-character tokens), and sentencepiece for the SentencePiece-style file.
"""

import json
import shutil
import struct
from pathlib import Path

import pytest
from batchmask.models import TokenizerError, load_tokenizer
from data_paths import data_dir
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_tokenizer import varied_strings

tokenizers = pytest.importorskip("tokenizers")

GPT2, QWEN2, LLAMA2 = data_dir("gpt2"), data_dir("qwen2"), data_dir("llama2")

# text the tokenizers differ on: unicode, whitespace runs, emoji, code, specials spelled out
EXTRA = ["  two   three    four\t\t\n\n\n  x", "🎉👩‍💻🇫🇷 ❤️", "def f(x):\n\treturn {'a': [1, 2]}  # ok\n",
         "<|endoftext|>", "a<|im_end|>b", "<|im_start|>user\nhi<|im_end|>", "x" * 300, "1234567890123",
         "ﬁ ｆｕｌｌ Å Å", "\u00a0\u2009\u3000", "\r\n\r\n", "'s 're 'LL", "naïve café 日本語"]
STRINGS = varied_strings(500, seed=11) + EXTRA


def gpt2_byte(ch: str) -> int:
    """GPT-2's byte-to-unicode alphabet read backwards: printable Latin-1 stands for itself, and the n-th
    byte outside ! .. ~, ¡ .. ¬, ® .. ÿ is written U+0100 + n."""
    printable = lambda b: 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or 0xAE <= b <= 0xFF
    o = ord(ch)
    return o if o < 256 and printable(o) else [b for b in range(256) if not printable(b)][o - 256]


def expected_bytes(path: Path) -> list[bytes]:
    """token bytes straight from a byte-level tokenizer.json: vocab pieces through the alphabet, added
    tokens special -> b"", others their UTF-8 content."""
    spec = json.loads(path.read_text(encoding="utf-8"))
    table = {ch: gpt2_byte(ch) for ch in set("".join(spec["model"]["vocab"]))}
    added = {t["id"]: t for t in spec["added_tokens"]}
    size = max([*spec["model"]["vocab"].values(), *added]) + 1
    out = [b""] * size
    for piece, i in spec["model"]["vocab"].items():
        out[i] = bytes(table[ch] for ch in piece)
    for i, t in added.items():
        out[i] = b"" if t["special"] else t["content"].encode()
    return out


def one_line_error(path, **kw) -> str:
    with pytest.raises(TokenizerError) as err:
        load_tokenizer(path, **kw)
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg, msg
    return msg


# -----------------------------------------------------------------------------
# tokenizer.json: token bytes, encode, end tokens

@pytest.fixture(scope="module", params=[GPT2, QWEN2], ids=["gpt2", "qwen2"])
def hf(request):
    return request.param, load_tokenizer(request.param), tokenizers.Tokenizer.from_file(
        str(request.param / "tokenizer.json"))


def test_token_bytes_match_the_file_format(hf):
    d, tok, ref = hf
    want = expected_bytes(d / "tokenizer.json")
    assert tok.vocab_size == len(want) == ref.get_vocab_size(with_added_tokens=True)
    assert tok.token_bytes == want
    # and tokenizers' own decoding agrees wherever a token is whole UTF-8 text
    for i in range(0, tok.vocab_size, 97):
        b = tok.token_bytes[i]
        try:
            text = b.decode("utf-8")
        except UnicodeDecodeError:
            continue
        assert ref.decode([i], skip_special_tokens=True) == text, i
    assert sum(len(b) == 1 for b in tok.token_bytes) >= 256
    assert {b for b in tok.token_bytes if len(b) == 1} == {bytes([v]) for v in range(256)}


def test_encode_equals_tokenizers(hf):
    _, tok, ref = hf
    normalize = ref.normalizer.normalize_str if ref.normalizer else (lambda s: s)  # Qwen2: NFC
    for s in STRINGS:
        want = ref.encode(s, add_special_tokens=False).ids
        assert tok.encode(s) == want, s
        assert tok.encode(s, bos=True) == [tok.bos_id, *want]
        if "<|" not in s:  # the tokens spell the (normalised) text, byte for byte
            assert tok.decode_bytes(want) == normalize(s).encode("utf-8"), s


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=80) | st.text(alphabet=" \t\n\r\u00a0aZ9'.日é🎉\u200d<|>", max_size=40))
def test_encode_equals_tokenizers_on_any_text(hf, text):
    _, tok, ref = hf
    assert tok.encode(text) == ref.encode(text, add_special_tokens=False).ids


def test_gpt2_end_tokens():
    tok = load_tokenizer(GPT2 / "tokenizer.json")
    assert (tok.bos_id, tok.eos_id, tok.stop_ids) == (50256, 50256, (50256,))
    assert (tok.bos_token, tok.eos_token, tok.chat_template) == ("<|endoftext|>", "<|endoftext|>", None)
    assert tok.directory == GPT2 and tok.token_bytes[50256] == b""


def test_qwen2_end_tokens_padding_ids_and_template():
    tok = load_tokenizer(QWEN2)
    ref = tokenizers.Tokenizer.from_file(str(QWEN2 / "tokenizer.json"))
    im_end, endoftext = ref.token_to_id("<|im_end|>"), ref.token_to_id("<|endoftext|>")
    assert tok.eos_id == endoftext and set(tok.stop_ids) == {endoftext, im_end}  # the template ends turns with im_end
    assert tok.vocab_size == 151936 and tok.token_bytes[151646:] == [b""] * 290  # [PAD...] specials
    assert "<|im_start|>" in tok.chat_template and tok.eos_token == "<|endoftext|>"


def _model_dir(tmp_path, src: Path, **files) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    (d / "tokenizer.json").symlink_to(src / "tokenizer.json")
    for name, obj in files.items():
        (d / name.replace("__", ".")).write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return d


def test_end_tokens_from_generation_config_and_config(tmp_path):
    d = _model_dir(tmp_path, QWEN2, tokenizer_config__json={"eos_token": {"content": "<|im_end|>"}, "bos_token": None},
                   generation_config__json={"eos_token_id": [151645, 151643], "bos_token_id": 151643},
                   config__json={"eos_token_id": 151644})
    tok = load_tokenizer(d)
    assert tok.eos_id == 151645 and tok.stop_ids == (151645, 151643, 151644) and tok.bos_id == 151643
    assert tok.chat_template is None  # none in these files


def test_no_end_token_is_refused_and_eos_id_names_one(tmp_path):
    d = _model_dir(tmp_path, GPT2)
    msg = one_line_error(d / "tokenizer.json")
    assert "no end-of-sequence token" in msg and "--eos-id" in msg
    tok = load_tokenizer(d, eos_id=50256)
    assert tok.eos_id == 50256 and tok.stop_ids == (50256,) and tok.bos_id is None
    assert "outside the vocabulary" in one_line_error(d, eos_id=60000)
    (d / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}<|endoftext|>{% endfor %}")
    tok = load_tokenizer(d)  # the template's end-of-turn token is an end token
    assert tok.stop_ids == (50256,) and tok.chat_template.startswith("{% for")


def test_vocab_hash_sees_stop_ids(tmp_path):
    a = load_tokenizer(GPT2)
    d = _model_dir(tmp_path, GPT2, tokenizer_config__json={"eos_token": "<|endoftext|>"},
                   generation_config__json={"eos_token_id": [50256, 198]})
    b = load_tokenizer(d)
    assert b.stop_ids == (50256, 198) and a.token_bytes == b.token_bytes and a.vocab_hash() != b.vocab_hash()


# -----------------------------------------------------------------------------
# SentencePiece-style tokenizer.json (Metaspace, <0xNN> byte fallback), built from Llama 2's pieces

def test_sentencepiece_style_json_matches_the_sentencepiece_loader(tmp_path):
    from tokenizers import AddedToken, decoders, models, pre_tokenizers

    sp_tok = load_tokenizer(LLAMA2 / "tokenizer.model")
    vocab = {p: i for i, p in enumerate(sp_tok.pieces)}
    merges = sorted((-sp_tok.scores[vocab[p]], vocab[p[:k]], vocab[p[k:]], p[:k], p[k:])
                    for p in sp_tok.pieces if sp_tok.kinds[vocab[p]] == 1
                    for k in range(1, len(p)) if p[:k] in vocab and p[k:] in vocab)
    backend = tokenizers.Tokenizer(models.BPE(vocab, [(a, b) for *_, a, b in merges], unk_token="<unk>",
                                              byte_fallback=True, fuse_unk=True))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<unk>", "<s>", "</s>")])
    d = tmp_path / "llama2"
    d.mkdir()
    backend.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    tok = load_tokenizer(d)
    assert tok.token_bytes == sp_tok.token_bytes  # ▁ -> space, <0x0A> -> b"\n", <unk>/<s>/</s> -> b""
    assert (tok.bos_id, tok.eos_id, tok.stop_ids) == (1, 2, (2,))
    for s in STRINGS[::5]:
        want = backend.encode(s, add_special_tokens=False).ids
        assert tok.encode(s) == want and tok.encode(s, bos=True) == [1, *want], s


def test_unigram_with_byte_fallback_reads_and_without_is_refused(tmp_path):
    from tokenizers import AddedToken, models, pre_tokenizers

    pieces = [("<unk>", 0.0), ("</s>", 0.0)] + [(f"<0x{b:02X}>", -20.0) for b in range(256)]
    pieces += [("▁", -2.0), ("a", -3.0), ("b", -3.0), ("▁ab", -1.0), ("é", -4.0)]
    for fallback in (True, False):
        backend = tokenizers.Tokenizer(models.Unigram(pieces, unk_id=0, byte_fallback=fallback))
        backend.pre_tokenizer = pre_tokenizers.Metaspace()
        backend.add_special_tokens([AddedToken("</s>", special=True)])
        path = tmp_path / f"uni{fallback}.json"
        backend.save(str(path))
        if not fallback:
            assert "model type Unigram without byte_fallback" in one_line_error(path)
            continue
        tok = load_tokenizer(path, eos_id=1)
        assert tok.token_bytes[:2] == [b"", b""] and tok.token_bytes[2 + 0x41] == b"A"
        assert tok.token_bytes[258:] == [b" ", b"a", b"b", b" ab", "é".encode()]
        assert tok.encode("ab 中") == backend.encode("ab 中", add_special_tokens=False).ids


# -----------------------------------------------------------------------------
# raw-byte tokenizer.bin (llama3.c): written here

LLAMA31_SPECIALS = (["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                     "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
                     "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
                    + [f"<|reserved_special_token_{i}|>" for i in range(3, 248)])


def write_raw_bin(path: Path, records: list[bytes]) -> None:
    """llama3.c's export: int32 max length, then per id float32 score (= id), int32 length, raw bytes."""
    out = [struct.pack("<i", max(map(len, records)))]
    for i, r in enumerate(records):
        out += [struct.pack("<fi", float(i), len(r)), r]
    path.write_bytes(b"".join(out))


@pytest.fixture(scope="module")
def gpt2_bytes():
    if not GPT2.is_dir():
        pytest.skip(f"{GPT2} not found")
    return expected_bytes(GPT2 / "tokenizer.json")


def test_raw_byte_bin_of_gpt2_encodes_as_gpt2(tmp_path, gpt2_bytes):
    path = tmp_path / "tokenizer.bin"
    write_raw_bin(path, gpt2_bytes[:50256] + [b"<|endoftext|>"])
    tok, ref = load_tokenizer(path), tokenizers.Tokenizer.from_file(str(GPT2 / "tokenizer.json"))
    assert tok.token_bytes == gpt2_bytes and (tok.eos_id, tok.stop_ids, tok.bos_id) == (50256, (50256,), None)
    for s in STRINGS[::3]:
        assert tok.encode(s) == ref.encode(s, add_special_tokens=False).ids, s


def test_llama3c_layout_bin(tmp_path, gpt2_bytes):
    # 128000 byte pieces (GPT-2's, then fillers starting with 0xF8, which no UTF-8 text contains) + 256 specials
    fillers = [b"\xf8" + i.to_bytes(3, "big") for i in range(50256, 128000)]
    records = gpt2_bytes[:50256] + fillers + [t.encode() for t in LLAMA31_SPECIALS]
    assert len(records) == 128256
    path = tmp_path / "llama3.bin"
    write_raw_bin(path, records)
    tok = load_tokenizer(path)
    assert tok.vocab_size == 128256 and tok.token_bytes[:128000] == records[:128000]
    assert tok.token_bytes[128000:] == [b""] * 256
    assert (tok.bos_id, tok.eos_id) == (128000, 128001) and set(tok.stop_ids) == {128001, 128008, 128009}
    # encode: GPT-2's merges and Llama 3's split regex, as a tokenizers pipeline built from the JSON file
    spec = json.loads((GPT2 / "tokenizer.json").read_text())
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
                                               "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
                                               "\\s+(?!\\S)|\\s+"},
         "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}
    spec["added_tokens"] = []
    ref = tokenizers.Tokenizer.from_str(json.dumps(spec))
    for s in STRINGS[::4]:
        if "<|" not in s:
            assert tok.encode(s) == ref.encode(s, add_special_tokens=False).ids, s
    assert tok.encode("hi<|eot_id|>", bos=True) == [128000, *ref.encode("hi").ids, 128009]


def test_raw_byte_bin_without_end_token_names_eos_id(tmp_path, gpt2_bytes):
    path = tmp_path / "noend.bin"
    write_raw_bin(path, gpt2_bytes[:50256] + [b"<|pad|>"])
    msg = one_line_error(path)
    assert "--eos-id" in msg and "no end-of-sequence token" in msg
    assert load_tokenizer(path, eos_id=50256).stop_ids == (50256,)


# -----------------------------------------------------------------------------
# bad files: one line naming the file and what is wrong

def test_bad_tokenizer_json_files(tmp_path):
    text = (GPT2 / "tokenizer.json").read_text(encoding="utf-8")
    cut = tmp_path / "truncated.json"
    cut.write_text(text[:100_000], encoding="utf-8")
    msg = one_line_error(cut)
    assert "not valid JSON" in msg and "truncated" in msg

    spec = json.loads(text)
    del spec["model"]["vocab"]["Ġthe"]
    (tmp_path / "disagree.json").write_text(json.dumps(spec))
    msg = one_line_error(tmp_path / "disagree.json")
    assert "vocab and merges disagree" in msg and "'Ġthe'" in msg and "model.merges[" in msg

    spec = json.loads(text)
    spec["model"] = {"type": "WordPiece", "unk_token": "[UNK]", "vocab": {"[UNK]": 0, "a": 1},
                     "continuing_subword_prefix": "##", "max_input_chars_per_word": 100}
    (tmp_path / "wordpiece.json").write_text(json.dumps(spec))
    assert "model type WordPiece is not supported" in one_line_error(tmp_path / "wordpiece.json")

    spec = json.loads(text)
    spec["model"]["vocab"]["<｜begin▁of▁sentence｜>"] = 50257  # text, not the byte alphabet: fine as an added token
    (tmp_path / "outside.json").write_text(json.dumps(spec))
    assert "'｜', which is not in the byte-level alphabet" in one_line_error(tmp_path / "outside.json", eos_id=0)
    spec["added_tokens"].append({**spec["added_tokens"][0], "id": 50257, "content": "<｜begin▁of▁sentence｜>"})
    (tmp_path / "outside.json").write_text(json.dumps(spec))
    tok = load_tokenizer(tmp_path / "outside.json", eos_id=50257)
    assert tok.token_bytes[50257] == b"" and tok.encode("a<｜begin▁of▁sentence｜>") == [64, 50257]

    (tmp_path / "nomodel.json").write_text('{"version": "1.0"}')
    assert 'no "model"' in one_line_error(tmp_path / "nomodel.json")

    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    (empty_dir / "config.json").write_text("{}")
    assert "no tokenizer in this directory" in one_line_error(empty_dir)

    d = _model_dir(tmp_path, GPT2, tokenizer_config__json='{"eos_token": "<|endoftext|>",')
    msg = one_line_error(d)
    assert str(d / "tokenizer_config.json") in msg and "not valid JSON" in msg
    shutil.rmtree(d)
    d = _model_dir(tmp_path, GPT2, tokenizer_config__json={"eos_token": "<|no_such|>"})
    assert "eos_token '<|no_such|>' is not a token" in one_line_error(d)
    shutil.rmtree(d)
    d = _model_dir(tmp_path, GPT2, generation_config__json={"eos_token_id": "50256"})
    assert "eos_token_id must be a token id" in one_line_error(d)


def test_content_not_name_decides_the_format(tmp_path):
    odd = tmp_path / "tokenizer.model"  # a tokenizer.json under another name
    shutil.copy(GPT2 / "tokenizer.json", odd)
    assert load_tokenizer(odd, eos_id=50256).token_bytes == load_tokenizer(GPT2).token_bytes
