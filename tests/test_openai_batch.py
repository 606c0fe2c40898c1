"""OpenAI Batch API files in and out (issue 25): batchmask/run/openai_batch.py through the command line.

Each output line is checked against the Batch API's documented output object and chat.completion object, written
here as JSON Schemas from OpenAI's API reference (not from our code); tool-call arguments are validated with
jsonschema against the request's own tool parameters; usage.prompt_tokens is compared with the length of
transformers' own apply_chat_template(messages, tools=<the request's tools>); a bad request is answered with
status 400 naming its field while the others run.
"""
from __future__ import annotations

import json

import jsonschema
import pytest
from batchmask.models.checkpoint import ModelConfig, random_weights, write_checkpoint
from chat_fixtures import HERMES_STYLE, tokenizer_dir

from batchmask.run.cli import main

# The Batch API's output line and the chat.completion it carries (OpenAI API reference: "The request output
# object", "The chat completion object"), the fields a client reads.
OUTPUT_LINE = {
    "type": "object", "required": ["id", "custom_id", "response", "error"],
    "properties": {"id": {"type": "string"}, "custom_id": {"type": "string"}, "error": {"type": "null"},
                   "response": {"type": "object", "required": ["status_code", "request_id", "body"],
                                "properties": {"status_code": {"type": "integer"}, "request_id": {"type": "string"},
                                               "body": {"type": "object"}}}}}
COMPLETION = {
    "type": "object", "required": ["id", "object", "created", "model", "choices", "usage"],
    "properties": {
        "id": {"type": "string"}, "object": {"const": "chat.completion"}, "created": {"type": "integer"},
        "model": {"type": "string"},
        "choices": {"type": "array", "minItems": 1, "maxItems": 1, "items": {
            "type": "object", "required": ["index", "message", "finish_reason"],
            "properties": {
                "index": {"const": 0}, "finish_reason": {"enum": ["stop", "length", "tool_calls"]},
                "message": {"type": "object", "required": ["role", "content"], "properties": {
                    "role": {"const": "assistant"}, "content": {"type": ["string", "null"]},
                    "tool_calls": {"type": "array", "minItems": 1, "items": {
                        "type": "object", "required": ["id", "type", "function"],
                        "properties": {"id": {"type": "string"}, "type": {"const": "function"},
                                       "function": {"type": "object", "required": ["name", "arguments"],
                                                    "properties": {"name": {"type": "string"},
                                                                   "arguments": {"type": "string"}}}}}}}}}}},
        "usage": {"type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
                  "properties": {k: {"type": "integer", "minimum": 0}
                                 for k in ("prompt_tokens", "completion_tokens", "total_tokens")}}}}
ERROR_BODY = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "param", "code"],
    "properties": {"message": {"type": "string"}, "type": {"const": "invalid_request_error"},
                   "param": {"type": "string"}}}}}

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 8},
                                     "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"],
    "additionalProperties": False}}}
ADD = {"type": "function", "function": {"name": "add", "description": "Add two numbers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                     "b": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["a", "b"],
    "additionalProperties": False}}}
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                         "temp": {"type": "integer", "minimum": -50, "maximum": 60}},
        "required": ["city", "temp"], "additionalProperties": False}


def req(cid, content, **body):
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "test-model", "messages": [{"role": "user", "content": content}], **body}}


# (request, the field a 400 names, or None: it runs)
REQUESTS = [
    (req("auto", "weather in Oslo?", tools=[WEATHER, ADD]), None),
    (req("required", "add 2 and 3", tools=[WEATHER, ADD], tool_choice="required", max_completion_tokens=40), None),
    (req("named", "weather", tools=[WEATHER, ADD], tool_choice={"type": "function", "function": {"name": "add"}},
         parallel_tool_calls=False), None),
    (req("none", "just talk", tools=[WEATHER], tool_choice="none", stop=["e"]), None),
    (req("schema", "a city record", response_format={"type": "json_schema",
                                                     "json_schema": {"name": "city", "schema": CITY}}), None),
    (req("hot", "weather in Rome", tools=[WEATHER], temperature=1.0, top_p=0.9, seed=7), None),
    (req("bad-temperature", "x", tools=[WEATHER], temperature=5), "temperature"),
    (req("bad-n", "x", tools=[WEATHER], n=3), "n"),
    (req("bad-choice", "x", tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}),
     "tool_choice"),
    (req("bad-schema", "x", tools=[{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "minLength": -1}}}}}]), "tools"),
    (req("bad-format", "x", response_format={"type": "json_object"}), "response_format"),
    ({**req("bad-url", "x"), "url": "/v1/embeddings"}, "url"),
    (req("hot-again", "weather in Rome", tools=[WEATHER], temperature=1.0, top_p=0.9, seed=7), None),
    (req("bad-tokens", "x", max_tokens=0), "max_tokens"),
]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("batch")
    tok_dir = tokenizer_dir(d / "tok", "gpt2", HERMES_STYLE, pad_token="<|endoftext|>")
    config = ModelConfig(dim=16, hidden_dim=32, n_layers=1, n_heads=2, n_kv_heads=2, vocab_size=50257, seq_len=1024)
    write_checkpoint(d / "model.bin", config, random_weights(config, seed=5, std=0.8))
    (d / "batch.jsonl").write_text("".join(json.dumps(r) + "\n" for r, _ in REQUESTS))
    return d, tok_dir


def run(files, out, *extra, tasks=None):
    d, tok_dir = files
    return main(["generate", "--tasks", str(tasks or d / "batch.jsonl"), "--checkpoint", str(d / "model.bin"),
                 "--tokenizer", str(tok_dir / "tokenizer.json"), "--format", "hermes", "--max-new-tokens", "48",
                 "--max-string", "8", "--grammar-cache", "none", "--quiet", "--out", str(out), *extra])


def lines(path):
    return [json.loads(x) for x in path.read_text().split("\n") if x]


def stable(line):
    """An output line without its timestamp (`created` is when the line was written)."""
    line = json.loads(json.dumps(line))
    if line["response"]["status_code"] == 200:
        line["response"]["body"].pop("created")
    return line


@pytest.fixture(scope="module")
def answered(files, tmp_path_factory):
    out = tmp_path_factory.mktemp("batch-out") / "out.jsonl"
    assert run(files, out) == 0
    return out, lines(out)


def test_every_request_answered_in_order_with_the_documented_shapes(answered):
    _, got = answered
    assert [x["custom_id"] for x in got] == [r["custom_id"] for r, _ in REQUESTS]
    assert len({x["id"] for x in got}) == len(got)
    for line, (request, bad_field) in zip(got, REQUESTS):
        jsonschema.validate(line, OUTPUT_LINE)
        body = line["response"]["body"]
        if bad_field is not None:                      # refused, naming the field; the others still ran
            assert line["response"]["status_code"] == 400, line
            jsonschema.validate(body, ERROR_BODY)
            assert body["error"]["param"] == bad_field, body
            continue
        assert line["response"]["status_code"] == 200, line
        jsonschema.validate(body, COMPLETION)
        usage = body["usage"]
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        limit = request["body"].get("max_completion_tokens", 48)
        assert 1 <= usage["completion_tokens"] <= limit
        assert body["model"] == "test-model"


def test_replies_hold_each_requests_tool_choice_and_schema(answered):
    _, got = answered
    for line, (request, bad_field) in zip(got, REQUESTS):
        if bad_field is not None:
            continue
        b = request["body"]
        choice = line["response"]["body"]["choices"][0]
        message, finish = choice["message"], choice["finish_reason"]
        tools = {t["function"]["name"]: t["function"]["parameters"] for t in b.get("tools", [])}
        calls = message.get("tool_calls", [])
        if "response_format" in b:                      # one JSON value of the schema
            assert not calls
            if finish != "length":
                jsonschema.validate(json.loads(message["content"]), b["response_format"]["json_schema"]["schema"])
            continue
        for call in calls:                              # arguments: the request's own tool parameters
            assert call["function"]["name"] in tools
            jsonschema.validate(json.loads(call["function"]["arguments"]), tools[call["function"]["name"]])
        tc = b.get("tool_choice", "auto")
        if tc == "none":
            assert not calls and isinstance(message["content"], str) and "e" not in message["content"]
        if tc == "required":
            assert calls or finish == "length"
        if isinstance(tc, dict):
            assert all(c["function"]["name"] == tc["function"]["name"] for c in calls) and len(calls) <= 1
        if calls:
            assert message["content"] is None and finish in ("tool_calls", "length")


def test_equal_requests_with_equal_seeds_draw_alike(answered):
    _, got = answered
    by_id = {x["custom_id"]: x["response"]["body"] for x in got}
    a, b = (by_id[k]["choices"][0]["message"] for k in ("hot", "hot-again"))
    assert a["content"] == b["content"] and by_id["hot"]["usage"] == by_id["hot-again"]["usage"]
    assert [c["function"] for c in a.get("tool_calls", [])] == [c["function"] for c in b.get("tool_calls", [])]
    ids = [c["id"] for c in a.get("tool_calls", []) + b.get("tool_calls", [])]
    assert len(set(ids)) == len(ids)                      # each call its own id all the same


def test_prompt_tokens_are_transformers_chat_template_length(files, answered):
    transformers = pytest.importorskip("transformers")
    _, tok_dir = files
    hf = transformers.AutoTokenizer.from_pretrained(str(tok_dir))
    _, got = answered
    for line, (request, bad_field) in zip(got, REQUESTS):
        if bad_field is not None or "tools" not in request["body"]:
            continue
        ids = hf.apply_chat_template(request["body"]["messages"], tools=request["body"]["tools"],
                                     add_generation_prompt=True, tokenize=True, return_dict=False)
        assert line["response"]["body"]["usage"]["prompt_tokens"] == len(ids), request["custom_id"]


def test_resume_of_a_cut_batch_output_writes_the_same_lines(files, answered, tmp_path):
    full, got = answered
    for keep in (0, 3, 7, len(got) - 1):
        out = tmp_path / f"o{keep}.jsonl"
        raw = full.read_bytes().split(b"\n")
        out.write_bytes(b"".join(x + b"\n" for x in raw[:keep]) + raw[keep][:20])      # a torn last line
        (tmp_path / f"o{keep}.jsonl.run.json").write_bytes((full.parent / "out.jsonl.run.json").read_bytes())
        assert run(files, out, "--resume") == 0
        assert [stable(x) for x in lines(out)] == [stable(x) for x in got]


def test_file_level_problems_refuse_the_file_in_one_line(files, tmp_path, capsys):
    d, _ = files
    one = json.dumps(REQUESTS[0][0])
    for text, says in [(one + "\n" + one + "\n", "line 2: custom_id 'auto' is also line 1's"),
                       (one + "\n" + json.dumps({**REQUESTS[1][0], "custom_id": ""}) + "\n",
                        "line 2: \"custom_id\" must be a non-empty string"),
                       (one + "\n{not json\n", "line 2: not valid JSON")]:
        tasks = tmp_path / "t.jsonl"
        tasks.write_text(text)
        out = tmp_path / "o.jsonl"
        assert run(files, out, "--force", tasks=tasks) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], err
        assert not out.exists()
    plain = tmp_path / "plain.jsonl"                      # forced: every line must be a request
    plain.write_text(json.dumps({"task": "hi"}) + "\n")
    assert run(files, tmp_path / "p.jsonl", "--tasks-format", "openai-batch", tasks=plain) == 2
    assert "\"custom_id\" must be a non-empty string" in capsys.readouterr().err


def test_torchrun_writes_the_lines_one_process_writes(files, answered, tmp_path):
    """Two gloo ranks share the requests; rank 0 answers the refused ones; the merged output is in input order and
    equals one process's, line for line (but the timestamps)."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    d, tok_dir = files
    _, got = answered
    out = tmp_path / "multi.jsonl"
    root = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
           str(29900 + os.getpid() % 90), "-m", "batchmask", "generate", "--tasks", str(d / "batch.jsonl"),
           "--checkpoint", str(d / "model.bin"), "--tokenizer", str(tok_dir / "tokenizer.json"), "--format", "hermes",
           "--max-new-tokens", "48", "--max-string", "8", "--grammar-cache", "none", "--quiet", "--device", "cpu",
           "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [stable(x) for x in lines(out)] == [stable(x) for x in got]
    assert not list(tmp_path.glob("multi.jsonl.part*"))


def test_a_request_past_the_context_is_answered_with_a_400_and_the_others_run(files, tmp_path):
    d, _ = files
    tasks = tmp_path / "long.jsonl"
    tasks.write_text(json.dumps(req("short", "hi")) + "\n" + json.dumps(req("long", "word " * 1500)) + "\n"
                     + json.dumps(req("ceiling", "hi", max_tokens=5000)) + "\n")
    out = tmp_path / "o.jsonl"
    assert run(files, out, tasks=tasks) == 0
    got = {x["custom_id"]: x["response"] for x in lines(out)}
    assert got["short"]["status_code"] == 200
    assert got["long"]["status_code"] == 400 and got["long"]["body"]["error"]["param"] == "messages"
    assert got["ceiling"]["status_code"] == 400 and got["ceiling"]["body"]["error"]["param"] == "max_tokens"


def test_a_truncated_request_file_is_refused_not_read_as_text(files, tmp_path, capsys):
    tasks = tmp_path / "cut.jsonl"
    tasks.write_text(json.dumps(REQUESTS[0][0])[:60] + "\n")
    assert run(files, tmp_path / "o.jsonl", tasks=tasks) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "line 1: starts like a JSON object but is not valid JSON" in err[0], err
    assert not (tmp_path / "o.jsonl").exists()
