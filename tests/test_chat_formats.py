"""Instruct models in their own words (issue 15): chat-template prompts against transformers' apply_chat_template,
the llama3 / hermes call formats (Qwen2.5's added <tool_call> token included) on random HF checkpoints checked by
jsonschema, generation ending on any stop id, and the CLI's --system / --show / JSONL messages."""
import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import torch
from batchmask.models.llama import load_checkpoint
from batchmask.models.tokenizer import load_tokenizer
from chat_fixtures import HERMES_STYLE, LLAMA31_STYLE, qwen25_tool_tokens, tokenizer_dir
from data_paths import data_dir
from hf_fixtures import hf_model, save

from batchmask import ToolRegistry, compile_grammar
from batchmask.run.generation import BatchGenerator, GenerationConfig
from batchmask.tools.chat_template import ChatTemplateError
from batchmask.tools.envelope import get_envelope
from batchmask.tools.prompt import TOOLS_MESSAGE, catalogue, chat_messages, encode_prompt, render_prompt, tool_schemas

# Typed tools whose every value is short (bounded strings, enums, small integers, booleans), so that random
# models finish their calls within the token budget; `answer` (native) is added first by the registry.
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.", "parameters": {
        "type": "object", "properties": {
            "city": {"type": "string", "description": "city name", "minLength": 1, "maxLength": 10},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "unit", "days"]}}},
    {"type": "function", "function": {"name": "set_alarm", "description": "Set an alarm.", "parameters": {
        "type": "object", "properties": {
            "hour": {"type": "integer", "minimum": 0, "maximum": 23},
            "repeat": {"type": "boolean"},
            "days": {"type": "array", "items": {"type": "string", "enum": ["mon", "tue", "sun"]}, "maxItems": 2},
            "label": {"type": ["string", "null"], "maxLength": 6}},
        "required": ["hour", "repeat", "days", "label"]}}},
]
TASKS = ["What is the weather in Paris?", "wake me at 7", "  two  spaces\nand a newline ", "Ünïcödé ✓ task",
         "set an alarm for monday", "tell me a joke"]
MAX_STRING = 12           # the native `answer` text


def registry() -> ToolRegistry:
    return ToolRegistry.from_obj({"tools": TOOLS}, source="<test tools>")


def hf_tokenizer(path):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(path))


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    base = tmp_path_factory.mktemp("chat")
    return {"qwen2-shared": data_dir("qwen2"),
            "llama31-style": tokenizer_dir(base / "llama31", "gpt2", LLAMA31_STYLE),
            "hermes-style": tokenizer_dir(base / "hermes", "gpt2", HERMES_STYLE, pad_token="<|endoftext|>"),
            "qwen25-tool-tokens": qwen25_tool_tokens(base / "qwen25"),
            "gpt2-no-template": tokenizer_dir(base / "gpt2", "gpt2", None)}


# --- prompts: the chat template as transformers renders it -----------------------------------------------------
@pytest.mark.parametrize("name", ["qwen2-shared", "llama31-style", "hermes-style", "qwen25-tool-tokens"])
def test_rendered_prompt_and_ids_equal_apply_chat_template(dirs, name):
    ours, theirs = load_tokenizer(dirs[name]), hf_tokenizer(dirs[name])
    reg = ToolRegistry.from_json(data_dir("tools") / "agent_tools.json")
    tools = tool_schemas(reg)
    convo = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello!", "tool_calls": None},
             {"role": "user", "content": "read a.txt"}]
    probe = [{"role": "user", "content": "hi"}]
    ignores = (theirs.apply_chat_template(probe, tools=tools, tokenize=False)
               == theirs.apply_chat_template(probe, tokenize=False))           # transformers' word on the template
    assert ignores == (name == "qwen2-shared")
    for task, system in [(TASKS[0], None), (TASKS[2], "Be brief.\n"), (TASKS[3], None), (convo, "sys")]:
        text = render_prompt(reg, task, ours, system=system)
        messages, given = chat_messages(task, system), tools
        if ignores:           # the documented fallback: the tools as lines of JSON in the system message
            listed = TOOLS_MESSAGE.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
            if messages[0]["role"] == "system":
                messages = [{**messages[0], "content": messages[0]["content"] + "\n\n" + listed}, *messages[1:]]
            else:
                messages = [{"role": "system", "content": listed}, *messages]
            given = None
        want = theirs.apply_chat_template(messages, tools=given, add_generation_prompt=True, tokenize=False)
        assert text == want
        ids = theirs.apply_chat_template(messages, tools=given, add_generation_prompt=True, tokenize=True,
                                         return_dict=False)
        assert encode_prompt(reg, task, ours, system=system) == ids
    if name == "llama31-style":        # BOS written once, by the template, as its id
        ids = encode_prompt(reg, TASKS[0], ours)
        assert ids[0] == ours.bos_id and ids.count(ours.bos_id) == 1


def test_tools_reach_the_template_as_the_file_gives_them():
    entries = json.loads((data_dir("tools") / "agent_tools.json").read_text())["tools"]
    schemas = tool_schemas(ToolRegistry.from_json(data_dir("tools") / "agent_tools.json"))
    assert schemas == entries              # verbatim, in order; the built-in answer is not shown (issue 25)


def test_template_variables_and_helpers_match_transformers(tmp_path):
    """pad_token / unk_token from tokenizer_config.json, tojson options, namespace, loop controls, generation."""
    template = ("{{ pad_token }}|{{ unk_token }}|{% set ns = namespace(n=0) %}{% for m in messages %}"
                "{% if loop.index > 2 %}{% break %}{% endif %}{% set ns.n = ns.n + 1 %}{% generation %}"
                "{{ m | tojson(indent=2, sort_keys=true) }}{% endgeneration %}{% endfor %}{{ ns.n }}"
                "{{ tools | tojson(separators=(',', ':')) }}{{ dict(a=1) | tojson }}")
    d = tokenizer_dir(tmp_path / "t", "gpt2", template, pad_token="<|endoftext|>", unk_token="!")
    ours, theirs = load_tokenizer(d), hf_tokenizer(d)
    reg = registry()
    convo = [{"role": "user", "content": "é<>&"}, {"role": "assistant", "content": "b"},
             {"role": "user", "content": "c"}]
    want = theirs.apply_chat_template(convo, tools=tool_schemas(reg), add_generation_prompt=True, tokenize=False)
    assert render_prompt(reg, convo, ours) == want and want.startswith("<|endoftext|>|!|")
    bad = tokenizer_dir(tmp_path / "bad", "gpt2", "{{ raise_exception('no tools here') }}")
    with pytest.raises(ChatTemplateError, match="no tools here"):
        render_prompt(reg, "x", load_tokenizer(bad))
    evil = tokenizer_dir(tmp_path / "evil", "gpt2", "{% set ns = namespace(_x=1) %}")
    with pytest.raises(Exception, match="underscore"):
        render_prompt(reg, "x", load_tokenizer(evil))


def test_without_a_template_the_catalogue_prompt(dirs):
    tok = load_tokenizer(dirs["gpt2-no-template"])
    reg = registry()
    text = render_prompt(reg, TASKS[2], tok)
    assert text == f"{catalogue(reg)}\nTASK: two spaces and a newline\nCALL: " == render_prompt(reg, TASKS[2])
    assert tok.bos_id == 50256 and encode_prompt(reg, TASKS[2], tok) == [tok.bos_id, *tok.encode(text)]
    with pytest.raises(ValueError, match="needs a chat template"):
        render_prompt(reg, [{"role": "user", "content": "x"}], tok)
    with pytest.raises(ValueError, match="--system needs a chat template"):
        render_prompt(reg, "x", tok, system="s")


# --- formats ---------------------------------------------------------------------------------------------------
def test_added_tool_call_token_writes_the_prefix(dirs):
    """Qwen2.5's <tool_call> is one added, non-special token: its bytes are its text, and the hermes grammar
    lets it (or the plain pieces spelling it) open the call; a walk through it ends in the stop ids only."""
    tok = load_tokenizer(dirs["qwen25-tool-tokens"])
    tc, end = tok.encode("<tool_call>"), tok.encode("</tool_call>")
    assert tc == [151657] and end == [151658] and tok.token_bytes[151657] == b"<tool_call>"
    g = compile_grammar(registry(), tok, format="hermes", max_string=MAX_STRING)
    allowed = g.allowed(torch.tensor([g.start]))[0]
    assert allowed[151657] and allowed[tok.encode("<")[0]] and allowed.sum() >= 2
    text = get_envelope("hermes").render("get_weather", {"city": "Oslo", "unit": "celsius", "days": 3})
    ids = tok.encode(text)
    assert ids[0] == 151657 and ids[-1] == 151658
    state = torch.tensor([g.start])
    for t in ids:
        assert bool(g.allowed(state)[0, t]), f"token {t} {tok.token_bytes[t]!r} refused"
        state = g.next_state(state, torch.tensor([t]))
    legal = g.allowed(state)[0].nonzero().flatten().tolist()
    assert sorted(legal) == sorted(tok.stop_ids)


# random HF checkpoints with the shared vocabularies (tiny: dim 16, one layer), one per vocabulary
@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    base = tmp_path_factory.mktemp("ckpt")
    out = {}
    for name, vocab in (("gpt2", 50304), ("qwen2", 151936)):
        model = hf_model("llama", seed=3, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, vocab_size=vocab, max_position_embeddings=2048)
        out[name] = save(model, base / name)
    return out


def run_generator(ckpt, tok, reg, fmt, tasks, temperature=1.0, batch=3, max_new=120, seed=7):
    model = load_checkpoint(ckpt)
    tok.pad_to(model.config.vocab_size)
    grammar = compile_grammar(reg, tok, format=fmt, max_string=MAX_STRING)
    config = GenerationConfig(batch_size=batch, max_new_tokens=max_new, temperature=temperature, seed=seed,
                              format=fmt)
    results = []
    BatchGenerator(model, tok, reg, grammar, config).run(tasks, on_result=results.append)
    return results


def assert_valid_calls(results, reg, fmt):
    env = get_envelope(fmt)
    for r in results:
        assert r.call is not None, f"{r.text!r}: {r.error}"
        name, args = r.call["name"], r.call[env.args_key]
        tool = reg[name]
        schema = tool.parameters if tool.typed else {"type": "object", "required": ["text"],
                                                     "properties": {"text": {"type": "string", "minLength": 1}}}
        jsonschema.validate(args, schema)
        # the model's own spacing, exactly: json.dumps' defaults inside the envelope
        body = json.dumps({"name": name, env.args_key: args}, ensure_ascii=False)
        assert r.text == env.prefix + body + env.suffix


@pytest.mark.parametrize("fmt", ["llama3", "hermes"])
@pytest.mark.parametrize("vocab", ["gpt2", "qwen2"])
def test_formats_on_random_checkpoints_all_calls_valid(dirs, checkpoints, fmt, vocab):
    tok_dir = {("gpt2", "llama3"): "llama31-style", ("gpt2", "hermes"): "hermes-style",
               ("qwen2", "llama3"): "qwen2-shared", ("qwen2", "hermes"): "qwen25-tool-tokens"}[vocab, fmt]
    reg = registry()
    tok = load_tokenizer(dirs[tok_dir])
    results = run_generator(checkpoints[vocab], tok, reg, fmt, TASKS)
    assert len(results) == len(TASKS) and [r.task for r in results] == TASKS
    assert_valid_calls(results, reg, fmt)
    assert sum(not r.cut for r in results) >= len(TASKS) // 2       # most end on their own, on a stop id
    for r in results:
        if not r.cut:
            assert r.token_ids[-1] in tok.stop_ids


def test_generation_ends_on_any_stop_id(dirs, checkpoints, tmp_path):
    """Two stop ids with equal logits (their lm_head rows made identical): sampled rows end on either, at once."""
    tok = load_tokenizer(dirs["qwen25-tool-tokens"], eos_id=151643)
    assert tok.stop_ids == (151643, 151645)
    from safetensors.torch import load_file, save_file
    ckpt = tmp_path / "two-stops"
    ckpt.mkdir()
    for f in checkpoints["qwen2"].iterdir():
        (ckpt / f.name).write_bytes(f.read_bytes())
    weights = load_file(ckpt / "model.safetensors")
    head = "lm_head.weight" if "lm_head.weight" in weights else "model.embed_tokens.weight"
    weights[head][151645] = weights[head][151643]
    save_file(weights, ckpt / "model.safetensors", metadata={"format": "pt"})
    results = run_generator(ckpt, tok, registry(), "hermes", TASKS * 2, batch=4)
    ended = [r for r in results if not r.cut]
    assert {r.token_ids[-1] for r in ended} == {151643, 151645}
    for r in ended:                           # one stop id, the last token: the row ended on it
        assert sum(t in tok.stop_ids for t in r.token_ids) == 1


def test_import_batchmask_does_not_import_transformers():
    code = ("import sys, batchmask, batchmask.api, batchmask.masker, batchmask.run.generation, batchmask.tools.prompt, "
            "batchmask.run.cli, batchmask.tools.chat_template; from batchmask import compile_grammar, BatchMasker; "
            "assert 'transformers' not in sys.modules, 'transformers imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# --- the command line ------------------------------------------------------------------------------------------
def test_cli_messages_system_and_show(dirs, checkpoints, tmp_path, capsys):
    from batchmask.run.cli import main
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    for f in list(checkpoints["qwen2"].iterdir()) + list(Path(dirs["qwen25-tool-tokens"]).iterdir()):
        (model_dir / f.name).write_bytes(f.read_bytes())
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps({"tools": TOOLS}))
    convo = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
             {"role": "user", "content": "weather in Rome?"}]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"task": "wake me at 6"}) + "\n" + json.dumps({"messages": convo}) + "\n")
    out = tmp_path / "calls.jsonl"
    argv = ["generate", "--checkpoint", str(model_dir), "--tasks", str(tasks), "--tools", str(tools), "--format",
            "hermes", "--system", "You call tools.", "--max-string", str(MAX_STRING), "--temperature", "1",
            "--max-new-tokens", "120", "--out", str(out), "--quiet"]
    assert main(argv + ["--show"]) == 0
    err = capsys.readouterr().err
    shown = [json.loads(line[len("prompt: "):]) for line in err.splitlines() if line.startswith("prompt: ")]
    tok = load_tokenizer(model_dir)
    reg = ToolRegistry.from_json(tools)
    assert shown == [render_prompt(reg, t, tok, system="You call tools.") for t in ("wake me at 6", convo)]
    assert shown[1] == hf_tokenizer(model_dir).apply_chat_template(
        chat_messages(convo, "You call tools."), tools=tool_schemas(reg), add_generation_prompt=True, tokenize=False)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["task"] for r in records] == ["wake me at 6", "weather in Rome?"]
    assert all(r["call"] is not None for r in records)
    # the messages are part of the run's fingerprint: other messages, same last user turn, are refused
    convo[0]["content"] = "hello there"
    tasks.write_text(json.dumps({"task": "wake me at 6"}) + "\n" + json.dumps({"messages": convo}) + "\n")
    assert main(argv + ["--resume"]) == 2
    assert "other settings" in capsys.readouterr().err


def test_a_template_on_a_sentencepiece_vocabulary_maps_its_bos_text_to_the_id():
    """A vocabulary whose encode does not know added tokens (SentencePiece) given a template: the bos_token text
    the template writes becomes the BOS id once, the rest is encoded as text."""
    tok = load_tokenizer(data_dir("llama2") / "tokenizer.model")
    tok.chat_template = "{{ bos_token }}[INST] {{ messages[-1]['content'] }} [/INST]"
    tok.bos_token = "<s>"
    reg = registry()
    assert render_prompt(reg, "add 2 and 3", tok) == "<s>[INST] add 2 and 3 [/INST]"
    ids = encode_prompt(reg, "add 2 and 3", tok)
    assert ids[0] == tok.bos_id == 1 and ids.count(tok.bos_id) == 1
    assert ids[1:] == tok.encode("[INST] add 2 and 3 [/INST]", bos=False)


def test_cli_ablate_takes_format_and_system_as_generate_does(dirs, checkpoints, tmp_path, capsys, monkeypatch):
    from batchmask.run import generation
    from batchmask.run.cli import main
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    for f in list(checkpoints["gpt2"].iterdir()) + list(Path(dirs["hermes-style"]).iterdir()):
        (model_dir / f.name).write_bytes(f.read_bytes())
    seen = []
    real = generation.encode_prompts

    def spy(tasks, tokenizer, regs, seq_len, system=None):
        ids = real(tasks, tokenizer, regs, seq_len, system)
        seen.append((list(tasks), system, ids))
        return ids
    monkeypatch.setattr(generation, "encode_prompts", spy)
    report = tmp_path / "ablation.json"
    argv = ["ablate", "--checkpoint", str(model_dir), "--n", "2", "--format", "hermes", "--system", "Call tools.",
            "--max-string", "8", "--max-new-tokens", "80", "--json", str(report)]
    assert main(argv) == 0
    capsys.readouterr()
    assert len(seen) == 2 and all(system == "Call tools." for _, system, _ in seen)     # both arms
    hf = hf_tokenizer(model_dir)
    reg = ToolRegistry.defaults()
    for tasks, _, ids in seen:
        for task, got in zip(tasks, ids):
            text = hf.apply_chat_template(chat_messages(task, "Call tools."), tools=tool_schemas(reg),
                                          add_generation_prompt=True, tokenize=False)
            assert got == hf(text, add_special_tokens=False)["input_ids"]
    counts = json.loads(report.read_text())
    assert counts["constrained"]["parsed"] == counts["constrained"]["trials"] == 2    # the grammar wrote hermes calls


def test_a_template_that_ignores_tools_warns_once(dirs, capsys):
    """The shared Qwen2 template renders tools= to nothing: the warning comes once, however many prompts."""
    from batchmask.tools import prompt
    prompt._IGNORES.clear()
    ours, reg = load_tokenizer(dirs["qwen2-shared"]), registry()
    texts = [render_prompt(reg, task, ours) for task in TASKS]
    err = capsys.readouterr().err
    assert err.count("ignores tools=") == 1, err
    assert all(tool_schemas(reg)[0]["function"]["name"] in t for t in texts)   # the model is shown its tools
