"""The short transformers path (batchmask.hf): a Hugging Face tokenizer and the tools in, OpenAI-shaped calls out.

Checked against independent references: the README's snippet runs as written on a tiny random LlamaForCausalLM
(GPT-2's vocabulary, padded to 50,304 ids, a Hermes-style chat template) and every call it yields validates with
jsonschema against its tool's parameters; batchmask's tokenizer built from the transformers object equals the one
load_tokenizer reads from the same files, and its bytes equal what transformers decodes; chat_inputs equals
transformers' own batched apply_chat_template (left padding); a row cut by max_new_tokens is completed by the
fewest tokens (then bytes) a plain Dijkstra over the unfactored table finds, and the completed ids walk the table
to its end.
"""
import heapq
import json
import re
import shutil

import jsonschema
import pytest
import torch
from batchmask.models.tokenizer import load_tokenizer
from batchmask.models.tokenizer_base import TokenizerError
from batchmask.models.tokenizer_transformers import from_transformers
from chat_fixtures import HERMES_STYLE
from data_paths import GPT2, QWEN2, ROOT, needs_qwen2
from hf_fixtures import hf_model, save

from batchmask import compile_grammar
from batchmask.compiler.shortest import Completer
from batchmask.hf import LogitsProcessor, Reply, chat_inputs, parse_calls
from batchmask.tools import calls as calls_module
from batchmask.tools.prompt import tool_schemas
from batchmask.tools.registry import ToolRegistry

transformers = pytest.importorskip("transformers")

V_MODEL = 50304                                        # the model's embedding: 47 ids past GPT-2's 50,257
MODEL_LINE = re.compile(r'^model_dir = "[^"]*"', re.M)
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
     "parameters": {"type": "object", "required": ["city"], "properties": {
         "city": {"type": "string", "minLength": 2, "maxLength": 12},
         "unit": {"enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}}}}},
    {"type": "function", "function": {"name": "add", "description": "Add two numbers",
     "parameters": {"type": "object", "required": ["a", "b"], "properties": {
         "a": {"type": "number"}, "b": {"type": "number"}}, "additionalProperties": False}}},
]
TASKS = ["What is the weather in Paris?", "Add 2 and 40", "Is it cold in Oslo? In fahrenheit.", "hello"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A model directory as save_pretrained writes it, with GPT-2's tokenizer.json and a Hermes chat template."""
    d = tmp_path_factory.mktemp("short") / "model"
    model = hf_model("llama", seed=5, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                     num_key_value_heads=1, vocab_size=V_MODEL, max_position_embeddings=1024, bos_token_id=50256,
                     eos_token_id=50256, pad_token_id=50256)
    save(model, d)
    shutil.copy(GPT2 / "tokenizer.json", d / "tokenizer.json")
    cfg = json.loads((GPT2 / "tokenizer_config.json").read_text())
    cfg["chat_template"] = HERMES_STYLE
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d


@pytest.fixture(scope="module")
def loaded(model_dir):
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    return tokenizer, model


def parameters_of(registry: ToolRegistry, name: str) -> dict:
    """A tool's JSON Schema as the chat template shows it (the built-in `answer` included), found by name."""
    return next(t["function"]["parameters"] for t in tool_schemas(registry) if t["function"]["name"] == name)


def check_calls(calls, registry):
    assert calls and all(len(c) >= 1 for c in calls)
    for reply_calls in calls:
        for call in reply_calls:
            assert call["type"] == "function" and call["id"].startswith("call_")
            jsonschema.validate(json.loads(call["function"]["arguments"]), parameters_of(registry, call["function"]
                                                                                          ["name"]))


def walk(grammar, state, ids):
    """The states `ids` lead through from `state`, read one token at a time from the table (-1 on an illegal one)."""
    out = []
    for t in ids:
        state = int(grammar.next_state([state], [t])[0])
        out.append(state)
        if state < 0:
            break
    return out


# --- the README ---------------------------------------------------------------------------------------------------

def readme_snippet() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("**transformers' `model.generate`.**"):]
    start = section.index("```python\n") + len("```python\n")
    return section[start:section.index("\n```", start)]


def test_the_readme_snippet_runs_and_every_call_validates(model_dir):
    code = readme_snippet()
    assert len(MODEL_LINE.findall(code)) == 1, "the snippet names its model in one `model_dir = \"...\"` line"
    ns = {}
    exec(compile(MODEL_LINE.sub(f"model_dir = {str(model_dir)!r}", code), "README.md", "exec"), ns)
    proc, replies, calls, tools = ns["proc"], ns["replies"], ns["calls"], ns["tools"]
    assert len(replies) == len(calls) == len(ns["tasks"])
    assert proc.tools is tools                                         # the template got the user's tools as given
    check_calls(calls, proc.registry)
    for reply, reply_calls in zip(replies, calls):
        assert reply.ids[-1] in proc.stop_ids
        states = walk(proc.grammar, proc.grammar.start, reply.ids)
        assert states[-1] == proc.grammar.done_state                   # every id legal, the last one ends the call
        # the user's tool names come back with the schema's arguments, or the built-in answer
        assert {c["function"]["name"] for c in reply_calls} <= {"answer", *(t["function"]["name"] for t in tools)}


# --- the tokenizer ------------------------------------------------------------------------------------------------

def test_the_tokenizer_from_transformers_is_the_one_read_from_the_files(loaded, model_dir):
    tokenizer, _ = loaded
    ours = from_transformers(tokenizer, vocab_size=V_MODEL)
    files = load_tokenizer(model_dir).pad_to(V_MODEL)
    assert ours.token_bytes == files.token_bytes and ours.stop_ids == files.stop_ids == (50256,)
    assert ours.vocab_hash() == files.vocab_hash() and ours.bos_id == 50256 and ours.padding == V_MODEL - 50257
    assert ours.chat_template == tokenizer.chat_template
    # transformers' own decoding of single tokens, where a token is whole UTF-8 text
    for i in range(0, 50257, 97):
        try:
            text = ours.token_bytes[i].decode("utf-8")
        except UnicodeDecodeError:                                     # part of a character: decode shows U+FFFD
            continue
        assert text == tokenizer.decode([i], clean_up_tokenization_spaces=False), i
    assert ours.encode("get_weather(Paris)") == tokenizer("get_weather(Paris)", add_special_tokens=False).input_ids


@needs_qwen2
def test_qwen2_from_transformers_is_the_one_read_from_the_files():
    """Qwen2's vocabulary with its many added special tokens: the end of turn <|im_end|> found in the chat template
    beside the eos <|endoftext|>, as when read from the files."""
    ours = from_transformers(transformers.AutoTokenizer.from_pretrained(QWEN2), vocab_size=151936)
    files = load_tokenizer(QWEN2).pad_to(151936)
    assert ours.token_bytes == files.token_bytes and ours.vocab_hash() == files.vocab_hash()
    assert ours.stop_ids == files.stop_ids == (151643, 151645) and ours.vocab_size == 151936


def test_added_tokens_and_the_template_end_token_count(model_dir):
    """A special token added to the loaded object is in the vocabulary (no bytes), and the template's end of turn
    becomes a stop id."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_end|>"]})
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert end == 50257
    ours = from_transformers(tokenizer, vocab_size=V_MODEL)
    assert ours.token_bytes[end] == b"" and ours.vocab_size == V_MODEL and ours.padding == V_MODEL - 50258
    assert ours.stop_ids == (50256, end)
    with pytest.raises(TokenizerError, match=r"token id 50303 \(an end or begin token\) is outside the vocabulary"):
        from_transformers(tokenizer, vocab_size=V_MODEL, stop_ids=[V_MODEL - 1])     # a padding id ends nothing


def test_bad_tokenizers_and_sizes_are_one_line(loaded):
    tokenizer, model = loaded
    with pytest.raises(TokenizerError, match=r"model has 50000 ids \(vocab_size\) but the tokenizer 50257"):
        from_transformers(tokenizer, vocab_size=50000)

    with pytest.raises(TokenizerError, match=r"vocab_size must be a positive integer .*, got 0"):
        from_transformers(tokenizer, vocab_size=0)
    no_end = transformers.AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    no_end.eos_token = None
    with pytest.raises(TokenizerError, match=r"names no eos_token; pass stop_ids="):
        from_transformers(no_end)
    assert from_transformers(no_end, stop_ids=[50256]).stop_ids == (50256,)

    class Slow:
        name_or_path = "slow-one"
    with pytest.raises(TokenizerError, match=r"Slow is not a fast tokenizer.*use_fast=True"):
        from_transformers(Slow())
    with pytest.raises(ValueError, match=r"vocab_size=50400 but the model's config says 50304"):
        LogitsProcessor.from_pretrained(tokenizer, tools=TOOLS, batch_size=1, model=model, vocab_size=50400)
    proc = LogitsProcessor.from_pretrained(tokenizer, tools=TOOLS, batch_size=2, format="json")
    assert proc.grammar.vocab_size == 50257                            # no model: the tokenizer's own size
    with pytest.raises(ValueError, match="chat_inputs: 3 conversations for a processor of batch_size=2"):
        proc.chat_inputs(TASKS[:3])
    bare = LogitsProcessor(proc.grammar, 2)
    with pytest.raises(ValueError, match="needs the processor built by LogitsProcessor.from_pretrained"):
        bare.parse_calls(["{}"])
    with pytest.raises(ValueError, match="the processor has not run"):
        bare.replies(torch.zeros(2, 3, dtype=torch.long))


# --- chat inputs --------------------------------------------------------------------------------------------------

def test_chat_inputs_are_transformers_own_left_padded_batch(loaded):
    tokenizer, _ = loaded
    conversations = [[{"role": "user", "content": t}] for t in TASKS]
    ours = chat_inputs(tokenizer, TASKS, TOOLS)
    ref_tok = transformers.AutoTokenizer.from_pretrained(tokenizer.name_or_path, padding_side="left")
    ref_tok.pad_token = ref_tok.eos_token
    ref = ref_tok.apply_chat_template(conversations, tools=TOOLS, add_generation_prompt=True, padding=True,
                                      return_dict=True, return_tensors="pt")
    assert torch.equal(ours["input_ids"], ref["input_ids"]) and torch.equal(ours["attention_mask"],
                                                                            ref["attention_mask"])
    assert len(set(ours["attention_mask"].sum(1).tolist())) > 1                     # really padded, on the left
    assert bool((ours["attention_mask"][:, -1] == 1).all())
    assert tokenizer.pad_token is None and tokenizer.padding_side == "right"       # the user's tokenizer untouched
    text = tokenizer.decode(ours["input_ids"][0][ours["attention_mask"][0] == 1])
    assert json.dumps(TOOLS[0], ensure_ascii=False) in text                         # the tools exactly as given


# --- cut rows -----------------------------------------------------------------------------------------------------

def reference_bytes(grammar) -> list[int]:
    """Per state, the fewest bytes that complete its value: one Dijkstra backwards from the complete states over the
    plain [S, C] table, a class costing its shortest token with text; written from the unfactored token table, not
    from the automaton the completer reads."""
    class_cost = {}
    for c, data in zip(grammar.token_class.tolist(), grammar.token_bytes):
        if data and (c not in class_cost or len(data) < class_cost[c]):
            class_cost[c] = len(data)
    into = {}
    for s, row in enumerate(grammar.class_next.tolist()):
        for c, nxt in enumerate(row):
            if nxt >= 0 and nxt != grammar.done_state and c in class_cost:
                into.setdefault(nxt, []).append((s, class_cost[c]))
    best = [0 if f else None for f in grammar.final.tolist()]
    heap = [(0, s) for s, b in enumerate(best) if b == 0]
    while heap:
        b, s = heapq.heappop(heap)
        if best[s] != b:
            continue
        for prev, cost in into.get(s, ()):
            if best[prev] is None or b + cost < best[prev]:
                best[prev] = b + cost
                heapq.heappush(heap, (b + cost, prev))
    return best


_BY_FIRST = {}


def fewest_tokens(token_bytes, data: bytes) -> int:
    """How few tokens spell `data`: a breadth-first search over positions, trying every token that starts with the
    byte there (the brute force)."""
    if id(token_bytes) not in _BY_FIRST:
        groups = {}
        for b in token_bytes:
            if b:
                groups.setdefault(b[0], []).append(b)
        _BY_FIRST[id(token_bytes)] = (token_bytes, groups)
    groups = _BY_FIRST[id(token_bytes)][1]
    depth, frontier, seen = 0, {0}, {0}
    while len(data) not in frontier:
        depth += 1
        frontier = {i + len(b) for i in frontier if i < len(data) for b in groups.get(data[i], ())
                    if data.startswith(b, i)} - seen
        seen |= frontier
        assert frontier, data
    return depth


def check_completion(grammar, reference, state, ids):
    """`ids` are legal from `state`, end its value, in the fewest bytes there are and the fewest tokens for them."""
    states = walk(grammar, state, ids)
    assert not states or min(states) >= 0
    assert bool(grammar.final[states[-1] if states else state])
    data = b"".join(grammar.token_bytes[t] for t in ids)
    assert len(data) == reference[state], (state, data)
    assert len(ids) == fewest_tokens(grammar.token_bytes, data), (state, data)


def test_cut_rows_are_completed_into_valid_calls(loaded):
    tokenizer, model = loaded
    proc = LogitsProcessor.from_pretrained(tokenizer, tools=TOOLS, batch_size=len(TASKS), format="hermes",
                                           model=model)
    g = proc.grammar
    assert g.vocab_size == V_MODEL
    assert bool((g.row_next[:, g.token_class[50257:].long()] == -1).all())     # padding: never legal, in any row
    reference = reference_bytes(g)
    inputs = proc.chat_inputs(TASKS)
    rows_by_limit = {}
    for limit in (1, 9, 23):
        proc.reset()
        torch.manual_seed(0)                                           # the same draws: a longer run extends a shorter
        out = model.generate(**inputs, logits_processor=[proc], max_new_tokens=limit, eos_token_id=proc.stop_ids,
                             pad_token_id=proc.pad_id, do_sample=True, top_k=0)
        replies = proc.replies(out)
        assert proc.replies(out) == replies                            # the last token is fed once
        rows_by_limit[limit] = [r.ids[:limit] for r in replies]
        check_calls(proc.parse_calls(r.text for r in replies), proc.registry)
        for reply, row in zip(replies, out[:, inputs["input_ids"].shape[1]:].tolist()):
            assert isinstance(reply, Reply) and reply.completed and reply.added[-1] == proc.grammar.eos_id
            assert reply.ids == row + reply.added and len(row) == limit
            states = walk(proc.grammar, proc.grammar.start, reply.ids)
            assert states[-1] == proc.grammar.done_state and min(states) >= 0
            check_completion(g, reference, states[len(row) - 1], reply.added[:-1])
            assert reply.text == proc.tokenizer.decode(reply.ids)
    for short, long in ((1, 9), (9, 23)):
        assert [row[:short] for row in rows_by_limit[long]] == rows_by_limit[short]


def test_finished_rows_are_read_as_they_are(loaded, model_dir):
    _, model = loaded
    proc = LogitsProcessor.from_pretrained(str(model_dir), tools={"tools": TOOLS}, batch_size=2, format="json",
                                           model=model.config)              # a directory; the config's vocab_size
    assert proc.grammar.vocab_size == V_MODEL and proc.tools == TOOLS
    inputs = proc.chat_inputs(TASKS[:2])
    torch.manual_seed(0)
    out = model.generate(**inputs, logits_processor=[proc], max_new_tokens=120, eos_token_id=proc.stop_ids,
                         pad_token_id=proc.pad_id, do_sample=True, top_k=0)
    replies = proc.replies(out)
    finished = [r for r in replies if not r.completed]
    assert finished, "no row finished in 120 tokens"
    for r, row in zip(replies, out[:, inputs["input_ids"].shape[1]:].tolist()):
        if not r.completed:
            assert r.added is None and r.ids == row[:len(r.ids)] and r.ids[-1] in proc.stop_ids
            assert set(row[len(r.ids):]) <= {proc.pad_id}
    check_calls(parse_calls([r.text for r in replies], proc.registry, "json"), proc.registry)
    with pytest.raises(ValueError, match="not the sequences of this processor's generate"):
        proc.replies(out[:, :-3])


def test_completions_from_states_all_over_are_shortest(loaded):
    """From states all over a small grammar (string cells, number digits, envelope positions), the completer's
    tokens are legal, end the value, in the fewest bytes (the reference's) and the fewest tokens for them."""
    tokenizer, _ = loaded
    tok = from_transformers(tokenizer)
    tools = [{"name": "f", "parameters": {"type": "object", "required": ["s", "n"], "properties": {
        "s": {"type": "string", "minLength": 3, "maxLength": 5}, "n": {"type": "integer", "minimum": -20,
                                                                        "maximum": 300}}}}]
    grammar = compile_grammar(ToolRegistry.from_obj(tools), tok, format="json")
    completer = Completer(grammar)
    reference = reference_bytes(grammar)
    assert None not in reference                                       # every state can finish
    for s in range(0, grammar.num_states, 7):
        check_completion(grammar, reference, s, completer.tokens(s))


def test_parse_calls_is_the_one_parser():
    assert parse_calls is calls_module.parse_calls
    reg = ToolRegistry.from_obj(TOOLS)
    text = '{"name": "add", "arguments": {"a": 1, "b": 2.5}}'
    assert parse_calls([text], reg, "json")[0][0]["function"] == {"name": "add", "arguments": '{"a":1,"b":2.5}'}
