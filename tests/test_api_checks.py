"""The Python API checks its arguments at the door (batchmask/checks.py), and a model, a tokenizer and a grammar pair
only when they agree (issue 27): wrong types are TypeErrors naming the argument, not raw errors from torch or a
silent reading (`rows=[0.5]` as row 0); a grammar compiled for one vocabulary is refused beside another's tokenizer
or logits; a checkpoint whose embedding is another vocabulary's size is refused with the tokenizer that does not
fit it. The references: the vocabularies themselves (the default model's 773 ids, GPT-2's 50,257 read by
transformers), and the sizes published models pad to."""
from __future__ import annotations

import pytest
import torch
from batchmask.models.tokenizer import load_tokenizer
from data_paths import GPT2
from hf_fixtures import hf_model, save

from batchmask import checks, compile_grammar
from batchmask.masker import BatchMasker
from batchmask.run.loading import DEFAULT_DIR, load_model_and_tokenizer
from batchmask.tools.registry import ToolRegistry


@pytest.fixture(scope="module")
def small():
    tok = load_tokenizer(str(DEFAULT_DIR / "tokenizer.model"))
    return tok, compile_grammar(ToolRegistry.defaults(), tok)


@pytest.mark.parametrize("kwargs, error, needle", [
    (dict(batch_size=2.5), TypeError, "batch_size must be an integer, got float"),
    (dict(batch_size=True), TypeError, "batch_size must be an integer, got bool"),
    (dict(batch_size=0), ValueError, "batch_size must be >= 1, got 0"),
    (dict(batch_size=2, max_tokens="9"), TypeError, "max_tokens must be an integer, got str"),
    (dict(batch_size=2, device="nonsense"), ValueError, "device: not a device"),
])
def test_batch_masker_arguments(small, kwargs, error, needle):
    with pytest.raises(error, match=needle):
        BatchMasker(small[1], **kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is here: device='cuda' is valid")
def test_cuda_without_cuda_is_one_clear_error(small):
    with pytest.raises(ValueError, match="device='cuda', but CUDA is not available here"):
        BatchMasker(small[1], 2, device="cuda")


def test_rows_steps_and_logits_are_checked(small):
    tok, g = small
    m = BatchMasker(g, 3)
    for rows in ([0.5], 0.5, torch.tensor([0.5]), [True]):
        with pytest.raises(TypeError, match="rows"):
            m.reset(rows=rows)
    m.reset(rows=[2])                                  # ints, numpy ints and integer tensors stay fine
    m.reset(rows=torch.tensor([0, 1]))
    logits = torch.randn(3, g.vocab_size)
    with pytest.raises(TypeError, match="seed must be an integer, got float"):
        m.sample(logits, seed=1.5)
    with pytest.raises(ValueError, match="temperature must be >= 0.0, got nan"):
        m.sample(logits, temperature=float("nan"))
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\]"):
        m.sample(logits, temperature=1.0, top_p=0.0)
    with pytest.raises(TypeError, match="logits must be a torch.Tensor, got list"):
        m.apply_([[0.0] * g.vocab_size] * 3)
    grad = torch.randn(3, g.vocab_size, requires_grad=True)
    with pytest.raises(ValueError, match="logits require grad"):
        m.apply_(grad)
    assert not grad.isinf().any()                      # refused before a single write
    m.sample(logits, temperature=0.7, top_p=0.9, seed=2**62)


def test_compile_grammar_names_a_tokenizer_it_cannot_read(small):
    with pytest.raises(TypeError, match="compile_grammar: tokenizer must be batchmask's tokenizer.*got NoneType"):
        compile_grammar(ToolRegistry.defaults(), None)
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(GPT2))
    with pytest.raises(TypeError, match="from_transformers"):          # the way to get one is named
        compile_grammar(ToolRegistry.defaults(), hf)
    with pytest.raises(TypeError, match="max_string must be an integer"):
        compile_grammar(ToolRegistry.defaults(), small[0], max_string=2.5)


def test_a_grammar_meets_only_its_own_vocabulary(small):
    tok, g = small
    gpt2 = load_tokenizer(str(GPT2 / "tokenizer.json"))
    BatchMasker(g, 2, tokenizer=tok)                   # its own: fine, and padded to a model's width too
    padded = load_tokenizer(str(DEFAULT_DIR / "tokenizer.model"))
    padded.pad_to(tok.vocab_size + 11)
    BatchMasker(g, 2, tokenizer=padded)
    with pytest.raises(ValueError, match="compiled for another vocabulary than this tokenizer's: id"):
        BatchMasker(g, 2, tokenizer=gpt2)


def test_logits_processor_refuses_another_models_logits(small):
    pytest.importorskip("transformers")
    from batchmask.hf import LogitsProcessor
    tok, g = small
    V = len(g.token_bytes)
    ids = torch.zeros(2, 3, dtype=torch.long)
    LogitsProcessor(g, 2)(ids, torch.randn(2, V + 5))           # a model padded by five rows: fine
    with pytest.raises(ValueError, match=f"the model's logits has 50,257 token ids but the grammar's vocabulary "
                                         f"{V:,}"):
        LogitsProcessor(g, 2)(ids, torch.randn(2, 50257))       # issue 27 (b): GPT-2's logits
    import transformers
    hf = transformers.AutoTokenizer.from_pretrained(str(GPT2))
    with pytest.raises(ValueError, match="compiled for another vocabulary"):
        LogitsProcessor(g, 2, tokenizer=hf)


@pytest.mark.parametrize("tokens, width", [(151665, 151936), (32011, 32064), (50277, 50432), (50257, 50304),
                                           (128256, 128256), (773, 800)])
def test_the_padding_published_models_carry_fits(tokens, width):
    checks.padding_fits(tokens, width, "t", "m")                # Qwen2, Phi-3, GPT-NeoX, GPT-2 (ours), Llama 3


@pytest.mark.parametrize("tokens, width", [(50257, 151936), (773, 50257), (32000, 128256), (773, 700)])
def test_another_vocabularys_size_is_refused(tokens, width):
    with pytest.raises(ValueError, match="not"):
        checks.padding_fits(tokens, width, "t", "m")


def test_a_checkpoint_of_another_vocabulary_size_is_refused_with_the_tokenizer(tmp_path):
    pytest.importorskip("transformers")
    tokenizer = GPT2 / "tokenizer.json"                          # 50,257 ids
    fits = save(hf_model("llama", vocab_size=50304), tmp_path / "fits")     # padded as our fixtures' models are
    model, tok = load_model_and_tokenizer(fits, tokenizer, "cpu", None)
    assert tok.vocab_size == model.config.vocab_size == 50304
    other = save(hf_model("llama", vocab_size=60000), tmp_path / "other")   # issue 27 (a), in small
    with pytest.raises(ValueError) as e:
        load_model_and_tokenizer(other, tokenizer, "cpu", None)
    msg = str(e.value)
    assert "60,000 token ids but tokenizer" in msg and "9,743 ids would be padding" in msg and "\n" not in msg
