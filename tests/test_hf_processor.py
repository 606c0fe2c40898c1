"""batchmask.hf.LogitsProcessor inside transformers' model.generate, cross-checked against batchmask's own loop:
on a random LlamaForCausalLM (GPT-2 vocabulary, padded), left-padded batches, greedy tokens equal
`BatchGenerator`'s for the same checkpoint and prompts; sampled sequences are all valid calls; beam search is
refused in one line."""
import json

import jsonschema
import pytest
import torch
from batchmask.models.llama import load_checkpoint
from batchmask.models.tokenizer import load_tokenizer
from chat_fixtures import LLAMA31_STYLE, tokenizer_dir
from hf_fixtures import hf_model, save
from test_chat_formats import MAX_STRING, TASKS, registry

from batchmask import compile_grammar
from batchmask.hf import LogitsProcessor
from batchmask.run.generation import BatchGenerator, GenerationConfig
from batchmask.tools.envelope import get_envelope
from batchmask.tools.prompt import encode_prompt, parse_call

PAD = 50256
FMT = "llama3"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    base = tmp_path_factory.mktemp("proc")
    model = hf_model("llama", seed=11, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                     num_attention_heads=2, num_key_value_heads=1, vocab_size=50304, max_position_embeddings=2048,
                     bos_token_id=50256, eos_token_id=50256, pad_token_id=PAD)
    ckpt = save(model, base / "model")
    tok = load_tokenizer(tokenizer_dir(base / "tok", "gpt2", LLAMA31_STYLE))
    tok.pad_to(50304)
    reg = registry()
    grammar = compile_grammar(reg, tok, format=FMT, max_string=MAX_STRING)
    return model, ckpt, tok, reg, grammar


def left_padded(prompts):
    T = max(map(len, prompts))
    ids = torch.full((len(prompts), T), PAD)
    mask = torch.zeros(len(prompts), T, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, T - len(p):] = torch.tensor(p)
        mask[i, T - len(p):] = 1
    return ids, mask


def generate(model, tok, grammar, prompts, **kw):
    ids, mask = left_padded(prompts)
    proc = LogitsProcessor(grammar, len(prompts))
    out = model.generate(input_ids=ids, attention_mask=mask, logits_processor=[proc], max_new_tokens=80,
                         eos_token_id=list(tok.stop_ids), pad_token_id=PAD, **kw)
    proc.check()
    return [row[ids.shape[1]:].tolist() for row in out], proc


def call_text(tok, new_ids):
    """The call a generate() row holds: its tokens up to the first stop id (pads after it)."""
    stop = next((k for k, t in enumerate(new_ids) if t in tok.stop_ids), None)
    assert stop is not None, "the row did not finish its call"
    return tok.decode(new_ids[:stop])


def test_greedy_tokens_equal_batchmask_generate(setup):
    model, ckpt, tok, reg, grammar = setup
    tasks = TASKS[:4]
    prompts = [encode_prompt(reg, t, tok) for t in tasks]
    assert len(set(map(len, prompts))) > 1                    # really left-padded
    rows, _ = generate(model, tok, grammar, prompts, do_sample=False)
    ours = []
    config = GenerationConfig(batch_size=2, max_new_tokens=80, format=FMT)
    BatchGenerator(load_checkpoint(ckpt), tok, reg, grammar, config).run(tasks, on_result=ours.append)
    compared = 0
    for row, res in zip(rows, ours):
        assert row[:len(res.token_ids)] == res.token_ids
        compared += len(res.token_ids)
        if not res.cut:                                     # generate pads the row once it has finished
            assert set(row[len(res.token_ids):]) <= {PAD}
    assert compared >= 4 * 20


def test_sampled_sequences_are_valid_calls(setup):
    model, _, tok, reg, grammar = setup
    prompts = [encode_prompt(reg, t, tok) for t in TASKS]
    torch.manual_seed(0)
    rows, proc = generate(model, tok, grammar, prompts, do_sample=True, temperature=1.0, top_k=0)
    env = get_envelope(FMT)
    for row in rows:
        text = call_text(tok, row)
        call, error = parse_call(text, reg, format=FMT)
        assert call is not None, f"{text!r}: {error}"
        tool = reg[call["name"]]
        if tool.typed:
            jsonschema.validate(call[env.args_key], tool.parameters)
        assert text == json.dumps(call, ensure_ascii=False)
    # the processor is for one generate() call: a second one without reset() is refused, with reset() it runs
    ids, mask = left_padded(prompts)
    with pytest.raises(ValueError, match="reset"):
        model.generate(input_ids=ids, attention_mask=mask, logits_processor=[proc], max_new_tokens=2,
                       pad_token_id=PAD, do_sample=False)
    proc.reset()
    model.generate(input_ids=ids, attention_mask=mask, logits_processor=[proc], max_new_tokens=2, pad_token_id=PAD,
                   do_sample=False)


def test_beam_search_and_wrong_batch_are_refused(setup):
    model, _, tok, reg, grammar = setup
    ids, mask = left_padded([encode_prompt(reg, t, tok) for t in TASKS[:2]])
    with pytest.raises(ValueError, match=r"beam search \(num_beams > 1\) is not supported"):
        model.generate(input_ids=ids, attention_mask=mask, logits_processor=[LogitsProcessor(grammar, 2)],
                       num_beams=2, max_new_tokens=3, pad_token_id=PAD)
    with pytest.raises(ValueError, match="got a batch of 2 sequences; pass batch_size=2"):
        model.generate(input_ids=ids, attention_mask=mask, logits_processor=[LogitsProcessor(grammar, 3)],
                       max_new_tokens=3, pad_token_id=PAD)


def test_a_finished_row_allows_only_the_end_token(setup):
    """generate told to stop on an id the grammar never allows keeps every row running to the token ceiling:
    after its call (the first stop id) a row holds nothing but the end token."""
    model, _, tok, reg, grammar = setup
    prompts = [encode_prompt(reg, t, tok) for t in TASKS[:3]]
    ids, mask = left_padded(prompts)
    never = 50300                                             # a padded id: no bytes, never legal
    proc = LogitsProcessor(grammar, 3, device="cpu")
    out = model.generate(input_ids=ids, attention_mask=mask, logits_processor=[proc], max_new_tokens=100,
                         eos_token_id=[never], pad_token_id=PAD, do_sample=True, temperature=1.0, top_k=0)
    proc.check()
    finished = 0
    for row in out[:, ids.shape[1]:].tolist():
        assert never not in row and len(row) == 100
        stop = next((k for k, t in enumerate(row) if t in tok.stop_ids), None)
        if stop is not None:
            finished += 1
            assert set(row[stop:]) == {grammar.eos_id}
            assert parse_call(tok.decode(row[:stop]), reg, format=FMT)[0] is not None
    assert finished >= 2


def test_each_sequence_in_its_own_tool_set(setup):
    """Tool sets compiled together, one per sequence (`sets`): every sampled call names a tool of its own set and
    validates against it."""
    from batchmask import compile_grammars
    from batchmask.tools.registry import ToolRegistry
    model, _, tok, reg, _ = setup
    regs = [ToolRegistry(list(reg)[:2], source="<two tools>"), ToolRegistry(list(reg)[2:], source="<the others>")]
    assert set(regs[0].names) != set(regs[1].names)
    grammar = compile_grammars(regs, tok, format=FMT, max_string=MAX_STRING)
    sets = [0, 1, 0, 1]
    prompts = [encode_prompt(regs[k], t, tok) for k, t in zip(sets, TASKS[:4])]
    ids, mask = left_padded(prompts)
    torch.manual_seed(1)
    proc = LogitsProcessor(grammar, 4, sets=sets)
    out = model.generate(input_ids=ids, attention_mask=mask, logits_processor=[proc], max_new_tokens=80,
                         eos_token_id=list(tok.stop_ids), pad_token_id=PAD, do_sample=True, temperature=1.0, top_k=0)
    proc.check()
    env = get_envelope(FMT)
    for k, row in zip(sets, out):
        text = call_text(tok, row[ids.shape[1]:].tolist())
        call, error = parse_call(text, regs[k], format=FMT)
        assert call is not None, f"{text!r}: {error}"
        tool = regs[k][call["name"]]
        if tool.typed:
            jsonschema.validate(call[env.args_key], tool.parameters)
    # the first step masks each sequence by its own set's start state
    first = LogitsProcessor(grammar, 4, sets=sets)
    scores = first(ids, torch.randn(4, model.config.vocab_size))
    for r, k in enumerate(sets):
        legal = torch.zeros(model.config.vocab_size, dtype=torch.bool)
        legal[:grammar.vocab_size] = grammar.allowed([grammar.starts[k]])[0]
        assert torch.equal(scores[r] > float("-inf"), legal)
    assert first.masker.states.tolist() == [grammar.starts[k] for k in sets] and len(set(grammar.starts)) == 2
    with pytest.raises(ValueError, match="sets: 2 is not a grammar of this table"):
        LogitsProcessor(grammar, 2, sets=[0, 2])
