"""The vendored test data is what its README says it is: the published Llama 2 files byte for byte, a GPT-2
vocabulary the tokenizers library reads as 50257 ids, and (when ../shared is beside the checkout) the same bytes
as the shared copies CI keeps."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from data_paths import CATALOGUE, DATA, GPT2, LLAMA2, QWEN2, QWEN2_MD5, SHARED

# The published md5 of Meta's tokenizer.model and of llama2.c's tokenizer.bin (also in tests/data/README.md).
PUBLISHED_MD5 = {"tokenizer.model": "eeec4125e9c7560836b4873b6f8e3025",
                 "tokenizer.bin": "c5a4f2f24b728689a3c4f9e4f79d5112"}


def md5(path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("name", sorted(PUBLISHED_MD5))
def test_llama2_files_are_the_published_ones(name):
    assert md5(LLAMA2 / name) == PUBLISHED_MD5[name]


def test_llama2_model_reads_as_32000_pieces():
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=str(LLAMA2 / "tokenizer.model"))
    assert sp.get_piece_size() == 32000
    assert [sp.id_to_piece(i) for i in (0, 1, 2, 3, 258)] == ["<unk>", "<s>", "</s>", "<0x00>", "<0xFF>"]


def test_gpt2_reads_as_50257_ids():
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(GPT2 / "tokenizer.json"))
    assert tok.get_vocab_size(with_added_tokens=True) == 50257
    assert tok.token_to_id("<|endoftext|>") == 50256
    assert tok.decode(tok.encode("Hello world").ids) == "Hello world"


def test_qwen2_unpacks_to_the_shared_vocabulary():
    from tokenizers import Tokenizer
    assert md5(QWEN2 / "tokenizer.json") == QWEN2_MD5
    tok = Tokenizer.from_file(str(QWEN2 / "tokenizer.json"))
    assert tok.get_vocab_size(with_added_tokens=True) == 151936
    assert [tok.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == [151643, 151644, 151645]


def test_catalogue_is_twelve_openai_tools():
    tools = json.loads(CATALOGUE.read_text())["tools"]
    assert len(tools) == 12 and all(t["type"] == "function" and "parameters" in t["function"] for t in tools)


def test_every_vendored_folder_has_a_licence():
    for folder in ("llama2", "gpt2", "qwen2", "bfcl", "json-schema-test-suite"):
        assert (DATA / folder / "LICENSE").stat().st_size > 500


@pytest.mark.parametrize("rel", ["llama2/tokenizer.model", "llama2/tokenizer.bin", "gpt2/tokenizer.json",
                                 "gpt2/tokenizer_config.json", "tools/agent_tools.json", "qwen2/tokenizer.json",
                                 "qwen2/tokenizer_config.json"])
def test_vendored_copy_equals_shared(rel):
    shared = SHARED / rel
    if not shared.exists():
        pytest.skip(f"no {shared} to compare with (a bare clone)")
    ours = QWEN2 / Path(rel).name if rel.startswith("qwen2/") else DATA / rel
    assert ours.read_bytes() == shared.read_bytes()
