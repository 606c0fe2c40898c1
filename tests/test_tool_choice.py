"""tool_choice and parallel_tool_calls (batchmask/tools/choice.py), OpenAI-shaped records, and the tools a chat
template is shown.

Every reply is read back by a reader written here, apart from batchmask.tools.calls (json.loads of the text, a
regular expression for hermes blocks), and judged against OpenAI's meaning of the choice: auto = text or calls,
required = at least one call, a named function = calls to it only, none = text; parallel false = one call.
Arguments are validated with jsonschema against the tools' own schemas; records against OpenAI's assistant
message shape. Prompts are compared with transformers' own apply_chat_template(messages, tools=<the user's tools>).
"""
from __future__ import annotations

import json
import re
import shutil

import jsonschema
import pytest
from batchmask.models.checkpoint import ModelConfig, random_weights, write_checkpoint
from chat_fixtures import HERMES_STYLE, LLAMA31_STYLE
from data_paths import GPT2
from test_generation import random_model, small_tokenizer

from batchmask import compile_grammar
from batchmask.errors import RegistryError
from batchmask.run.cli import main
from batchmask.run.generation import BatchGenerator, GenerationConfig
from batchmask.tools.choice import ToolChoice, check_choice, parse_tool_choice, resolve_choice
from batchmask.tools.envelope import FORMATS
from batchmask.tools.prompt import render_prompt
from batchmask.tools.registry import ToolRegistry

MAX_STRING = 6
CEILING = 48


def fn(name, props=None, required=()):
    entry = {"type": "function", "function": {"name": name, "description": f"does {name}"}}
    if props is not None:
        entry["function"]["parameters"] = {"type": "object", "properties": props, "required": list(required),
                                           "additionalProperties": False}
    return entry


ENTRIES = [
    fn("get_weather", {"city": {"type": "string", "minLength": 1, "maxLength": 5}, "unit": {"enum": ["c", "f"]}},
       ["city", "unit"]),
    fn("add", {"a": {"type": "integer", "minimum": 0, "maximum": 99}, "b": {"type": "boolean"}}, ["a", "b"]),
    fn("ping"),
    {"name": "read_file", "description": "Read a file.", "args": [{"name": "path"}]},
]
KEYS = {"seed": ("tool", "args"), "json": ("name", "arguments"), "llama3": ("name", "parameters"),
        "hermes": ("name", "arguments")}
CHOICES = {
    "auto": ToolChoice("auto"),
    "auto-one": ToolChoice("auto", parallel=False),
    "required": ToolChoice("required", max_calls=3),
    "required-one": ToolChoice("required", parallel=False),
    "named": ToolChoice("function", "get_weather"),
    "none": ToolChoice("none"),
}

# OpenAI's assistant message, as a chat completion's choices[i].message holds it, and finish_reason
TOOL_CALL = {"type": "object", "required": ["id", "type", "function"], "additionalProperties": False,
             "properties": {"id": {"type": "string", "pattern": "^call_[0-9a-f]{24}$"}, "type": {"const": "function"},
                            "function": {"type": "object", "required": ["name", "arguments"],
                                         "additionalProperties": False,
                                         "properties": {"name": {"type": "string"},
                                                        "arguments": {"type": "string"}}}}}
RECORD = {"type": "object", "required": ["content", "tool_calls", "finish_reason", "index", "task", "text", "call",
                                         "error", "tokens", "cut"],
          "properties": {"content": {"type": ["string", "null"]}, "tool_calls": {"type": "array", "items": TOOL_CALL},
                         "finish_reason": {"enum": ["tool_calls", "stop", "length"]}}}


def read_reply(text: str, fmt: str):
    """("text", content) or ("calls", [(name, args), ...]), read without batchmask's parser."""
    name_key, args_key = KEYS[fmt]
    if fmt == "hermes":
        if not text.startswith("<tool_call>"):
            assert text.endswith("\n") and "\n" not in text[:-1], repr(text)
            return "text", text[:-1]
        bodies = re.findall(r"<tool_call>\n(.*?)\n</tool_call>", text, re.S)
        assert "\n".join(f"<tool_call>\n{b}\n</tool_call>" for b in bodies) == text, repr(text)
        objs = [json.loads(b) for b in bodies]
    elif text[:1] in "{[":
        obj = json.loads(text)
        objs = obj if isinstance(obj, list) else [obj]
        assert objs, text
    else:
        assert fmt != "seed" and text.endswith("\n") and "\n" not in text[:-1], repr(text)
        return "text", text[:-1]
    for o in objs:
        assert isinstance(o, dict) and set(o) == {name_key, args_key}, text
    calls = [(o[name_key], o[args_key]) for o in objs]
    if fmt == "seed" and len(calls) == 1 and calls[0][0] == "answer":
        return "text", calls[0][1]["text"]
    return "calls", calls


def check_args(registry: ToolRegistry, name: str, args) -> None:
    tool = registry[name]
    if tool.parameters is not None:
        jsonschema.validate(args, tool.parameters)
    else:
        assert list(args) == [a.name for a in tool.required_args]
        assert all(isinstance(v, str) and 1 <= len(v.encode()) <= MAX_STRING for v in args.values())


def check_record(rec: dict, registry: ToolRegistry, fmt: str, choice: ToolChoice) -> str:
    """The record holds what `choice` allows; returns "text" or "calls"."""
    jsonschema.validate(rec, RECORD)
    kind, got = read_reply(rec["text"], fmt)
    assert rec["error"] is None, rec
    if kind == "text":
        assert choice.mode in ("auto", "none"), (choice, rec["text"])
        assert rec["content"] == got and rec["tool_calls"] == []
        assert rec["finish_reason"] in ("stop", "length")
        return kind
    assert choice.mode != "none", rec["text"]
    assert 1 <= len(got) <= (choice.max_calls if choice.parallel else 1), (choice, rec["text"])
    users = [t.name for t in registry if t.name != "answer"]
    for name, args in got:
        assert name in users and (choice.mode != "function" or name == choice.name), (choice, name)
        check_args(registry, name, args)
    assert rec["content"] is None
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in rec["tool_calls"]] == got
    assert len({c["id"] for c in rec["tool_calls"]}) == len(got)
    assert rec["finish_reason"] in ("tool_calls", "length")
    return kind


@pytest.fixture(scope="module")
def tok():
    return small_tokenizer()


@pytest.fixture(scope="module")
def registry():
    return ToolRegistry.from_obj(ENTRIES, source="test tools")


# --- each choice holds on every format, over many sampled replies -------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
def test_each_tool_choice_holds_on_every_format(fmt, tok, registry):
    seen = {}
    for c, (label, choice) in enumerate(CHOICES.items()):
        reg = registry.with_choice(choice)
        grammar = compile_grammar(reg, tok, format=fmt, max_string=MAX_STRING)
        kinds, most = set(), 0
        for seed in range(3):
            model = random_model(tok.vocab_size, seed=10 * FORMATS.index(fmt) + seed, std=0.8)
            config = GenerationConfig(batch_size=16, max_new_tokens=CEILING, temperature=1.0, seed=seed + 7 * c,
                                      format=fmt)
            out = []
            BatchGenerator(model, tok, reg, grammar, config).run([f"task {i}" for i in range(32)],
                                                                 on_result=out.append)
            assert len(out) == 32
            for r in out:
                rec = r.record()
                kinds.add(check_record(rec, reg, fmt, choice))
                most = max(most, len(rec["tool_calls"]))
                if rec["finish_reason"] == "length":        # the ceiling ended it: no end token was written
                    assert r.tokens == CEILING and r.token_ids[-1] not in tok.stop_ids
                else:
                    assert r.token_ids[-1] in tok.stop_ids
        seen[label] = (kinds, most)
    # what the choices allow (both kinds under auto, several calls) is shown reachable by the grammar walks below
    assert seen["none"][0] == {"text"} and seen["required"][0] == {"calls"} and seen["named"][0] == {"calls"}
    assert seen["auto-one"][1] <= 1 and seen["required-one"][1] == 1, seen


def test_parallel_false_gives_exactly_one_call(tok, registry):
    reg = registry.with_choice(ToolChoice("required", parallel=False))
    for fmt in ("json", "hermes"):
        grammar = compile_grammar(reg, tok, format=fmt, max_string=MAX_STRING)
        for seed in range(4):
            out = []
            config = GenerationConfig(batch_size=16, max_new_tokens=CEILING, temperature=1.0, seed=seed, format=fmt)
            BatchGenerator(random_model(tok.vocab_size, seed=seed), tok, reg, grammar, config).run(
                [f"t{i}" for i in range(24)], on_result=out.append)
            assert all(len(r.tool_calls) == 1 and read_reply(r.text, fmt)[0] == "calls" for r in out)


def grammar_accepts(grammar, tok, text: str) -> bool:
    """`text` then the end token is a path through the compiled table, fed one byte token at a time."""
    byte_id = {b: i for i, b in enumerate(tok.token_bytes) if len(b) == 1}
    state = grammar.start
    for b in text.encode():
        state = int(grammar.next_state([state], [byte_id[bytes([b])]])[0])
        if state < 0:
            return False
    return int(grammar.next_state([state], [tok.eos_id])[0]) >= 0


PING = '{"name":"ping","arguments":{}}'
JUDGED = [(ToolChoice("required", parallel=False), f"[{PING},{PING}]", False),
          (ToolChoice("required", parallel=False), f"[{PING}]", False),
          (ToolChoice("required", max_calls=2), f"[{PING},{PING}]", True),
          (ToolChoice("required", max_calls=2), f"[{PING},{PING},{PING}]", False),
          (ToolChoice("none"), PING, False),
          (ToolChoice("function", "add"), PING, False),
          (ToolChoice("function", "ping"), PING, True),
          (ToolChoice("required"), "hello there\n", False),
          (ToolChoice("required"), '{"name":"answer","arguments":{"text":"hi"}}', False),
          (ToolChoice("auto"), "hello there\n", True),
          (ToolChoice("none"), "hello there\n", True)]


HPING = '<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>'
JUDGED_HERMES = [(ToolChoice("required", max_calls=2), f"{HPING}\n{HPING}", True),
                 (ToolChoice("required", parallel=False), f"{HPING}\n{HPING}", False),
                 (ToolChoice("required", parallel=False), HPING, True),
                 (ToolChoice("auto"), "I think so.\n", True),
                 (ToolChoice("auto"), "<b>hi</b>\n", False),
                 (ToolChoice("none"), HPING, False)]


@pytest.mark.parametrize("fmt, choice, text, ok",
                         [("json", *j) for j in JUDGED] + [("hermes", *j) for j in JUDGED_HERMES])
def test_grammar_and_parser_refuse_what_the_choice_does_not_allow(tok, registry, fmt, choice, text, ok):
    """Texts the choice forbids are neither in its grammar (walked through the compiled table) nor read as a
    reply by parse_reply (the free arm's judge); texts it allows are both."""
    from batchmask.tools.calls import parse_reply
    reg = registry.with_choice(choice)
    g = compile_grammar(reg, tok, format=fmt, max_string=MAX_STRING)
    if not text.startswith("[") or choice.parallel:          # an array of one is not how one call is written
        assert grammar_accepts(g, tok, text) == ok, (choice, text)
    else:
        assert not grammar_accepts(g, tok, text)
    if text != f"[{PING}]":                                   # the parser reads an array of one as one call
        assert (parse_reply(text, reg, fmt)[2] is None) == ok, (choice, text)


# --- records, through the command line, with per-task tool_choice ----------------------------------------
@pytest.fixture(scope="module")
def files(tmp_path_factory, tok):
    d = tmp_path_factory.mktemp("choice")
    tok.write_bin(d / "tokenizer.bin")
    config = ModelConfig(dim=16, hidden_dim=32, n_layers=1, n_heads=2, n_kv_heads=2, vocab_size=tok.vocab_size,
                         seq_len=256)
    write_checkpoint(d / "model.bin", config, random_weights(config, seed=3, std=0.8))
    (d / "tools.json").write_text(json.dumps({"tools": ENTRIES}))
    return d


def cli(files, tasks, out, *extra):
    (files / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return main(["generate", "--tasks", str(files / "tasks.jsonl"), "--checkpoint", str(files / "model.bin"),
                 "--tokenizer", str(files / "tokenizer.bin"), "--tools", str(files / "tools.json"), "--max-string",
                 str(MAX_STRING), "--max-new-tokens", str(CEILING), "--temperature", "1", "--batch-size", "8",
                 "--grammar-cache", "none", "--quiet", "--out", str(out), "--force", *extra])


FORMS = [("auto", ToolChoice("auto")), ("required", ToolChoice("required")), ("none", ToolChoice("none")),
         ({"type": "function", "function": {"name": "add"}}, ToolChoice("function", "add"))]


@pytest.mark.parametrize("fmt", ["json", "hermes"])
def test_records_follow_each_tasks_own_tool_choice(files, tmp_path, fmt, registry):
    tasks = []
    for i in range(40):
        form, _ = FORMS[i % 4]
        task = {"task": f"job {i}", "tool_choice": form}
        if i % 5 == 0:
            task["parallel_tool_calls"] = False
        tasks.append(task)
    out = tmp_path / "out.jsonl"
    assert cli(files, tasks, out, "--format", fmt, "--max-calls", "3") == 0
    rows = [json.loads(line) for line in out.read_text().split("\n") if line]
    assert [r["index"] for r in rows] == list(range(40))
    for i, rec in enumerate(rows):
        form, want = FORMS[i % 4]
        choice = ToolChoice(want.mode, want.name, parallel=i % 5 != 0, max_calls=3)
        check_record(rec, registry, fmt, choice)
    out2 = tmp_path / "again.jsonl"                       # ids and replies are stable across runs
    assert cli(files, tasks, out2, "--format", fmt, "--max-calls", "3") == 0
    again = [json.loads(line) for line in out2.read_text().split("\n") if line]
    assert [{**r, "seconds": 0} for r in again] == [{**r, "seconds": 0} for r in rows]


def test_run_flags_and_bad_task_choices(files, tmp_path, capsys, registry):
    out = tmp_path / "o.jsonl"
    assert cli(files, [{"task": f"x{i}"} for i in range(12)], out, "--format", "llama3", "--tool-choice", "ping",
               "--parallel-tool-calls", "false") == 0
    for line in out.read_text().split("\n"):
        if line:
            check_record(json.loads(line), registry, "llama3", ToolChoice("function", "ping", parallel=False))
    capsys.readouterr()
    for bad, what in [({"type": "function", "function": {"name": "nope"}}, "names function 'nope'"),
                      ("sometimes", "\"tool_choice\" must be"), ({"type": "function"}, "\"tool_choice\" must be")]:
        assert cli(files, [{"task": "a"}, {"task": "b", "tool_choice": bad}], out, "--format", "json") != 0
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and what in err[0] and "line 2" in err[0], err
    assert cli(files, [{"task": "a", "parallel_tool_calls": "yes"}], out, "--format", "json") != 0
    assert "\"parallel_tool_calls\" must be true or false" in capsys.readouterr().err
    assert cli(files, [{"task": "a"}], out, "--tool-choice", "nope") != 0
    assert "names function 'nope'" in capsys.readouterr().err


def test_choice_forms_and_resolution(registry):
    assert parse_tool_choice("auto") == ("auto", None)
    assert parse_tool_choice({"type": "function", "function": {"name": "add"}}) == ("function", "add")
    for bad in ("add", {"type": "function", "function": {}}, {"type": "tool", "function": {"name": "add"}}, 3, None):
        with pytest.raises(RegistryError, match="tool_choice"):
            parse_tool_choice(bad, "t.jsonl line 4")
    run = ToolChoice("required", max_calls=2)
    assert resolve_choice(None, {}) is None and resolve_choice(run, {}) is run
    assert resolve_choice(None, {"parallel_tool_calls": False}) == ToolChoice("auto", parallel=False)
    assert resolve_choice(run, {"tool_choice": "none"}) == ToolChoice("none", max_calls=2)
    with pytest.raises(RegistryError, match="names function 'answer'"):     # the built-in is nobody's function
        check_choice(ToolChoice("function", "answer"), registry, "json", "t")
    check_choice(ToolChoice("function", "add"), registry, "json", "t")


# --- the tools a chat template is shown: exactly the user's --------------------------------------------------
@pytest.mark.parametrize("template", [HERMES_STYLE, LLAMA31_STYLE], ids=["hermes", "llama31"])
def test_prompt_equals_transformers_with_the_users_tools(tmp_path, template):
    transformers = pytest.importorskip("transformers")
    shutil.copy(GPT2 / "tokenizer.json", tmp_path / "tokenizer.json")
    cfg = json.loads((GPT2 / "tokenizer_config.json").read_text())
    cfg["chat_template"] = template
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    from batchmask.models.tokenizer import load_tokenizer
    ours = load_tokenizer(tmp_path)
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    typed = ENTRIES[:3]                                    # tools exactly as the user's file writes them
    reg = ToolRegistry.from_obj(typed)
    for choice in (None, ToolChoice("none"), ToolChoice("function", "add", parallel=False)):
        for task in ("what is the weather in Oslo", [{"role": "system", "content": "Be brief."},
                                                     {"role": "user", "content": "add 2 and 3"}]):
            messages = [{"role": "user", "content": task}] if isinstance(task, str) else task
            want = theirs.apply_chat_template(messages, tools=typed, add_generation_prompt=True, tokenize=False)
            assert render_prompt(reg.with_choice(choice), task, ours) == want


def test_compile_with_a_tool_choice_and_generate_with_its_file(files, tmp_path, capsys, registry):
    """`compile --tool-choice` writes that choice's grammar; `generate --grammar` takes it only under the same."""
    g = tmp_path / "g.pt"
    assert main(["compile", "--tools", str(files / "tools.json"), "--tokenizer", str(files / "tokenizer.bin"),
                 "--format", "json", "--max-string", str(MAX_STRING), "--tool-choice", "required", "--max-calls", "2",
                 "--out", str(g)]) == 0
    out = tmp_path / "o.jsonl"
    tasks = [{"task": f"y{i}"} for i in range(10)]
    capsys.readouterr()
    assert cli(files, tasks, out, "--format", "json", "--grammar", str(g)) != 0
    err = capsys.readouterr().err
    assert "compiled for another --tool-choice" in err and len(err.strip().splitlines()) == 1
    assert cli(files, tasks, out, "--format", "json", "--grammar", str(g), "--tool-choice", "required",
               "--max-calls", "2") == 0
    for line in out.read_text().split("\n"):
        if line:
            check_record(json.loads(line), registry, "json", ToolChoice("required", max_calls=2))


@pytest.mark.parametrize("fmt, label", [("json", "auto"), ("hermes", "required"), ("seed", "named")])
def test_choices_hold_under_jump_forward(tok, registry, fmt, label):
    choice = CHOICES[label]
    reg = registry.with_choice(choice)
    grammar = compile_grammar(reg, tok, format=fmt, max_string=MAX_STRING)
    for seed in range(2):
        out = []
        config = GenerationConfig(batch_size=8, max_new_tokens=CEILING, temperature=1.0, seed=seed, format=fmt,
                                  jump_forward=True)
        BatchGenerator(random_model(tok.vocab_size, seed=seed + 40), tok, reg, grammar, config).run(
            [f"j{i}" for i in range(16)], on_result=out.append)
        for r in out:
            check_record(r.record(), reg, fmt, choice)
