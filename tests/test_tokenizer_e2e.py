"""
Byte-level vocabularies end to end: the seed-oracle walks of the default registry on GPT-2's and
Qwen2's vocabularies (both UTF-8 modes), and `batchmask generate` with random llama2.c checkpoints
whose vocabulary is the model's: Qwen2's 151936 ids (151646.. are [PAD] specials) and GPT-2's 50257
tokens in a 50304-id embedding (ids past the tokenizer are padding).
"""

import json
import random
from types import SimpleNamespace

import pytest
import torch
from batchmask.models import load_tokenizer
from batchmask.models.checkpoint import ModelConfig, random_weights, write_checkpoint
from data_paths import data_dir
from test_compiler import oracle_for, walk_and_compare

from batchmask.compiler.compiled import compile_grammar
from batchmask.run.cli import main
from batchmask.tools.registry import ToolRegistry

GPT2, QWEN2 = data_dir("gpt2"), data_dir("qwen2")
NAMES = ["gpt2", "qwen2"]
MAX_STRING = 8  # short values: the walks reach the end of a call in a few dozen steps


@pytest.fixture(scope="module")
def vocabs():
    class Lazy(dict):   # each vocabulary is read once, on first use
        def __missing__(self, name):
            self[name] = load_tokenizer({"gpt2": GPT2, "qwen2": QWEN2}[name])
            return self[name]
    return Lazy()


@pytest.mark.parametrize("utf8", [True, False], ids=["utf8", "bytes"])
@pytest.mark.parametrize("name", NAMES)
def test_default_registry_walks_match_oracle(vocabs, name, utf8):
    # the oracle knows one end token: the walk's grammar is built with eos_id as the only stop id
    # (the stop ids are checked on their own below)
    tok = vocabs[name]
    one_stop = SimpleNamespace(token_bytes=tok.token_bytes, eos_id=tok.eos_id, stop_ids=(tok.eos_id,))
    g = compile_grammar(ToolRegistry.defaults(), one_stop, max_string=MAX_STRING, utf8=utf8)
    oracle = oracle_for(ToolRegistry.defaults(), MAX_STRING, utf8)
    for seed in range(2):
        # stay_bias 0: values end by chance within MAX_STRING bytes (and the helper's stay list is O(V^2))
        walk_and_compare(g, oracle, tok.token_bytes, tok.eos_id, random.Random(seed), stay_bias=0.0)


def _never_legal(g, ids) -> bool:
    """No state of the table allows any of `ids` (checked on the row x class table, not per state)."""
    classes = g.token_class[torch.as_tensor(ids)].long().unique()
    return bool((g.row_next[:, classes] == -1).all())


@pytest.mark.parametrize("name,model_vocab", [("qwen2", 151936), ("gpt2", 50304)])
def test_specials_and_padding_are_never_legal(name, model_vocab):
    tok = load_tokenizer(data_dir(name)).pad_to(model_vocab)
    assert tok.vocab_size == model_vocab and tok.token_bytes[-1] == b""
    g = compile_grammar(ToolRegistry.defaults(), tok, max_string=MAX_STRING)
    no_text = [i for i, b in enumerate(tok.token_bytes) if not b and i not in tok.stop_ids]
    assert len(no_text) >= 47 and _never_legal(g, no_text)


@pytest.mark.parametrize("name", NAMES)
def test_after_a_complete_call_exactly_the_stop_ids_are_legal(vocabs, name):
    tok = vocabs[name]
    g = compile_grammar(ToolRegistry.defaults(), tok, max_string=MAX_STRING)
    finals = [s for s in g.final.nonzero().flatten().tolist() if s != g.done_state]
    assert finals
    legal = g.allowed(finals)  # [n, V]
    for row in legal:
        assert set(row.nonzero().flatten().tolist()) == set(tok.stop_ids)


# -----------------------------------------------------------------------------
# batchmask generate with a model vocabulary padded past the tokenizer's

@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("padded")
    for name, vocab in (("qwen2", 151936), ("gpt2", 50304), ("small", 50000)):
        config = ModelConfig(dim=16, hidden_dim=32, n_layers=1, n_heads=2, n_kv_heads=2, vocab_size=vocab,
                             seq_len=1024)
        write_checkpoint(d / f"{name}.bin", config, random_weights(config, seed=1, std=0.5))
    (d / "tasks.txt").write_text("read the file notes.txt\nwhat is 2 plus 2\nsearch for cats\n")
    return d


def _generate(run_dir, checkpoint, tokenizer, *extra):
    out = run_dir / f"{checkpoint}{'-'.join(extra)}.jsonl"
    rc = main(["generate", "--tasks", str(run_dir / "tasks.txt"), "--checkpoint", str(run_dir / f"{checkpoint}.bin"),
               "--tokenizer", str(tokenizer), "--batch-size", "3", "--max-new-tokens", "24", "--quiet", "--force",
               "--out", str(out), *extra])
    return rc, [json.loads(x) for x in out.read_text().splitlines()] if out.exists() else []


@pytest.mark.parametrize("checkpoint,tokenizer", [("qwen2", QWEN2), ("gpt2", GPT2 / "tokenizer.json")])
def test_generate_with_a_padded_model_vocabulary(run_dir, checkpoint, tokenizer):
    rc, rows = _generate(run_dir, checkpoint, tokenizer)
    assert rc == 0 and len(rows) == 3
    for r in rows:
        assert r["call"] is not None and json.loads(r["text"]) == r["call"], r  # every call parses
        assert r["call"]["tool"] in ToolRegistry.defaults().names


def test_generate_free_arm_with_padding_and_a_model_smaller_than_the_tokenizer(run_dir, capsys):
    rc, rows = _generate(run_dir, "gpt2", GPT2, "--no-constrain")
    assert rc == 0 and len(rows) == 3  # padded ids decode to nothing
    rc, _ = _generate(run_dir, "small", GPT2)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "vocab_size" in err[0], err


def test_cli_eos_id_names_the_end_token_of_a_vocabulary_without_one(tmp_path, capsys):
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").symlink_to(GPT2 / "tokenizer.json")  # no tokenizer_config.json beside it
    args = ["compile", "--tokenizer", str(tmp_path / "tok"), "--max-string", str(MAX_STRING)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no end-of-sequence token" in err[0] and "--eos-id" in err[0], err
    assert main([*args, "--eos-id", "50256", "--out", str(tmp_path / "g.pt")]) == 0
    assert (tmp_path / "g.pt").is_file()
