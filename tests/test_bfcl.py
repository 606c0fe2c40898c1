"""BFCL data (batchmask/tools/bfcl.py) on a vendored sample of BFCL v4 (tests/data/bfcl/).

The conversion is checked against a reference written here from BFCL's own table (GORILLA_TO_OPENAPI in
bfcl_eval/constants/type_mappings.py) by a walk of its own; every tool set of the sample loads, compiles, and
the calls a random walk through its compiled table writes have arguments jsonschema accepts against the
converted parameters. The sample's two data errors (BFCL's own) are refused in one line naming the question.
"""
from __future__ import annotations

import json
import random

import jsonschema
import pytest
import torch
from batchmask.models.tokenizer import load_tokenizer
from data_paths import BFCL, LLAMA2

from batchmask import compile_grammar
from batchmask.errors import RegistryError
from batchmask.tools.bfcl import is_question, openai_tool, question_task
from batchmask.tools.registry import ANSWER, ToolRegistry

# GORILLA_TO_OPENAPI as BFCL writes it (type_mappings.py), restated; a name not in it reads as "string".
GORILLA_TO_OPENAPI = {
    "integer": "integer", "number": "number", "float": "number", "string": "string", "boolean": "boolean",
    "bool": "boolean", "array": "array", "list": "array", "dict": "object", "object": "object", "tuple": "array",
    "any": "string", "byte": "integer", "short": "integer", "long": "integer", "double": "number", "char": "string",
    "ArrayList": "array", "Array": "array", "HashMap": "object", "Hashtable": "object", "Queue": "array",
    "Stack": "array", "Any": "string", "String": "string", "Bigint": "integer",
}
JSON_TYPES = {"object", "array", "string", "number", "integer", "boolean"}
# (parallel_29 requires 'adults', which its properties do not declare: JSON Schema gives it any value, and so does
# the compile now.)
DATA_ERRORS = {"live_simple_71-35-0": "no value of 'enum' satisfies"}


def reference(schema: dict) -> dict:
    """BFCL's reading of one property schema, walked here apart: the type through the table (absent or unknown:
    string), `optional` dropped, the same for every schema under properties / items / additionalProperties."""
    out = {}
    for key, value in schema.items():
        if key == "optional":
            continue
        if key == "properties":
            value = {name: reference(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            value = reference(value)
        out[key] = value
    out["type"] = GORILLA_TO_OPENAPI.get(schema.get("type"), "string")
    return out


def questions():
    """(where, question) for every question line of the sample."""
    for path in sorted(BFCL.glob("BFCL_v4_*.json")):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            yield f"{path.name}:{n}", json.loads(line)


def single_turn():
    return [(w, q) for w, q in questions() if "function" in q]


def bfcl_types(schema, out: set) -> set:
    out.add(schema.get("type"))
    for sub in (schema.get("properties") or {}).values():
        bfcl_types(sub, out)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            bfcl_types(schema[key], out)
    return out


def schemas(schema):
    """Every schema of a converted tree (the walk the reading promises to have mapped)."""
    yield schema
    for sub in (schema.get("properties") or {}).values():
        yield from schemas(sub)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from schemas(schema[key])


# --- the sample covers what the reading has to handle ---------------------------------------------------------
def test_sample_covers_bfcl_dialect():
    fns = [fn for _, q in single_turn() for fn in q["function"]]
    seen = set().union(*(bfcl_types(fn["parameters"], set()) for fn in fns))
    assert {"dict", "float", "tuple", "any", "HashMap", "ArrayList", "Array", "long", "double", "char", "String",
            "Boolean", "", "array", "integer", "boolean", "string"} <= seen
    text = json.dumps(fns)
    assert '"optional"' in text
    assert any("." in fn["name"] for fn in fns)
    cats = {q["id"].rsplit("_", 1)[0] for _, q in single_turn()}
    assert {"simple_python", "simple_java", "simple_javascript", "multiple", "parallel", "parallel_multiple",
            "live_simple", "live_multiple", "live_irrelevance"} <= cats
    assert any(len(q["function"]) > 1 for _, q in single_turn())                       # several tools
    assert any(sub.get("type") == "dict" and "properties" in sub
               for fn in fns for sub in fn["parameters"]["properties"].values())       # a nested object
    assert any(isinstance(sub.get("items"), dict) and sub["items"].get("type") == "dict"
               for fn in fns for sub in fn["parameters"]["properties"].values())       # an array of objects


# --- the conversion is BFCL's reading ---------------------------------------------------------------------------
@pytest.mark.parametrize("where,q", single_turn(), ids=lambda x: x["id"] if isinstance(x, dict) else "")
def test_conversion_matches_reference(where, q):
    task = question_task(q, where)
    assert task["id"] == q["id"] and task["messages"] == q["question"][0]
    if not q["function"]:                                         # irrelevance with no function: answer alone
        assert ToolRegistry.from_obj(task["tools"]).tools == (ANSWER,)
        return
    assert len(task["tools"]) == len(q["function"])
    for fn, tool in zip(q["function"], task["tools"]):
        assert tool["type"] == "function" and set(tool["function"]) == {"name", "description", "parameters"}
        got = tool["function"]
        assert got["name"] == fn["name"].replace(".", "_") and got["description"] == fn["description"]
        want = reference(fn["parameters"])
        want["type"] = "object"
        assert got["parameters"] == want
        for s in schemas(got["parameters"]):
            assert s["type"] in JSON_TYPES and "optional" not in s
        assert fn == json.loads(json.dumps(fn))                   # the doc itself is left as read


def test_is_question():
    kinds = {q["id"]: is_question(q) for _, q in questions()}
    assert all(kinds.values())
    assert not is_question({"name": "f", "parameters": {"type": "dict", "properties": {}}})
    assert not is_question({"prompt": "hi"}) and not is_question([1])


def test_multi_turn_refused():
    (where, q), = [(w, q) for w, q in questions() if q["id"] == "multi_turn_base_0"]
    with pytest.raises(RegistryError, match=r"\(multi_turn_base_0\): functions given by class .* not read"):
        question_task(q, where)
    two = {"id": "x_1", "question": [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]],
           "function": q.get("function", [])}
    with pytest.raises(RegistryError, match=r"\(x_1\): a multi-turn question \(2 turns\) is not read"):
        question_task(two, "f.json:3")


# --- every set loads, compiles, and writes calls whose arguments validate ----------------------------------------
@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(str(LLAMA2 / "tokenizer.model"))


def random_call(g, tokenizer, rng: random.Random, gen: torch.Generator, max_steps: int = 4000) -> dict:
    """A call from a random model: each step a random legal token (the mask over the whole vocabulary in one
    tensor op), or, half the time, the byte token of what the grammar still owes (so values end)."""
    state, out = g.start, b""
    for _ in range(max_steps):
        if bool(g.is_final([state])[0]):
            return json.loads(out.decode("utf-8"))
        owed = g.finish_bytes(state)
        tok = 3 + owed[0] if owed and rng.random() < 0.5 else None        # Llama 2: <0xXX> is id 3 + XX
        if tok is None or int(g.next_state([state], [tok])[0]) < 0:
            allowed = g.allowed([state])[0].clone()
            allowed[list(g.stop_ids)] = False
            tok = int(torch.multinomial(allowed.float(), 1, generator=gen)[0])
        state = int(g.next_state([state], [tok])[0])
        assert state >= 0
        out += tokenizer.token_bytes[tok]
    raise AssertionError(f"no call within {max_steps} tokens: {out[:200]!r}")


@pytest.mark.parametrize("where,q", [(w, q) for w, q in single_turn() if q["id"] not in DATA_ERRORS],
                         ids=lambda x: x["id"] if isinstance(x, dict) else "")
def test_sets_compile_and_calls_validate(where, q, tokenizer):
    task = question_task(q, where)
    registry = ToolRegistry.from_obj(task["tools"], source=f"{where} ({q['id']})")
    g = compile_grammar(registry, tokenizer, format="json")
    params = {t["function"]["name"]: t["function"]["parameters"] for t in task["tools"] if "function" in t}
    rng, gen = random.Random(q["id"]), torch.Generator().manual_seed(len(q["id"]))
    validated = 0
    for _ in range(2 * len(params) + 3):
        call = random_call(g, tokenizer, rng, gen)
        assert set(call) == {"name", "arguments"}
        if call["name"] == "answer":
            assert set(call["arguments"]) == {"text"}
            continue
        jsonschema.validate(call["arguments"], params[call["name"]])
        validated += 1
    assert validated or not params, "no walk called one of the set's own tools"


@pytest.mark.parametrize("qid", sorted(DATA_ERRORS))
def test_data_errors_one_line(qid):
    (where, q), = [(w, q) for w, q in single_turn() if q["id"] == qid]
    task = question_task(q, where)                      # the conversion reads it; the schema is what is wrong
    with pytest.raises(RegistryError) as e:
        ToolRegistry.from_obj(task["tools"], source=f"{where} ({qid})")
    assert "\n" not in str(e.value) and qid in str(e.value) and DATA_ERRORS[qid] in str(e.value)


@pytest.mark.parametrize("fn,match", [
    ({"name": "f", "description": "", "parameters": {"type": "dict", "properties": {"a": {"type": ["string"]}}}},
     r"function 'f' parameters: #/properties/a/type: type must be a type name"),
    ({"name": "f", "description": "", "parameters": {"type": "dict", "properties": {"a": "string"}}},
     r"#/properties/a: a parameter schema must be an object"),
    ({"name": "f", "description": "", "parameters": {"type": "dict", "properties": {}, "required": ["a"]}},
     r"'required' names 'a', which is not among its properties"),
    ({"name": "f", "description": "", "parameters": {"type": "string", "properties": {}}},
     r"parameters type must be \"dict\""),
    ({"name": "", "parameters": {"type": "dict", "properties": {}}}, r"'name' must be a non-empty string"),
    ({"name": "f", "description": 3, "parameters": {"type": "dict", "properties": {}}}, r"'description' must be"),
    ({"name": "f", "description": "", "parameters": {"type": "dict", "properties": [1]}}, r"must be an object of"),
])
def test_bad_docs_one_line(fn, match):
    with pytest.raises(RegistryError, match=match) as e:
        openai_tool(fn, "BFCL_v4_x.json:7 (x_6)")
    assert str(e.value).startswith("BFCL_v4_x.json:7 (x_6): ") and "\n" not in str(e.value)


def test_dotted_names_that_meet_refused():
    q = {"id": "x_0", "question": [[{"role": "user", "content": "hi"}]],
         "function": [{"name": n, "description": "", "parameters": {"type": "dict", "properties": {}}}
                      for n in ("math.gcd", "math_gcd")]}
    with pytest.raises(RegistryError, match=r"\(x_0\): function\[1\] 'math_gcd' reads as 'math_gcd', the name of "
                                            r"function\[0\]"):
        question_task(q, "f.json:1")


# --- --tools FILE reads BFCL's function docs ----------------------------------------------------------------
def test_tools_file_jsonl_of_docs():
    reg = ToolRegistry.from_json(BFCL / "math_api.json")           # data/multi_turn_func_doc/, JSON Lines
    docs = [json.loads(line) for line in (BFCL / "math_api.json").read_text().splitlines()]
    assert reg.names == ["answer"] + [d["name"] for d in docs]
    for d in docs:
        want = reference(d["parameters"])
        want["type"] = "object"
        assert reg[d["name"]].parameters == want


def test_tools_file_list_of_docs(tmp_path):
    (_, q), = [(w, q) for w, q in single_turn() if q["id"] == "simple_java_22"]
    path = tmp_path / "docs.json"
    path.write_text(json.dumps(q["function"]))
    reg = ToolRegistry.from_json(path)
    assert reg.names == ["answer"] + [f["name"].replace(".", "_") for f in q["function"]]
    assert reg.canonical_json() == ToolRegistry.from_obj(question_task(q, "x")["tools"]).canonical_json()


def test_tools_file_of_questions_refused(tmp_path):
    path = tmp_path / "q.json"
    path.write_text((BFCL / "BFCL_v4_parallel.json").read_text())
    with pytest.raises(RegistryError, match=r"q.json:1: a BFCL question file holds a tool set per question"):
        ToolRegistry.from_json(path)
    broken = tmp_path / "broken.json"
    broken.write_text('{"a": 1}\n{"b": 2}\n')                      # JSON Lines, but not BFCL's: JSON's error
    with pytest.raises(RegistryError, match=r"not valid JSON at line 2 column 1: Extra data"):
        ToolRegistry.from_json(broken)


def test_deep_doc_one_line():
    deep = {"type": "dict", "properties": {}}
    inner = deep
    for _ in range(5000):
        inner["properties"]["a"] = {"type": "dict", "properties": {}}
        inner = inner["properties"]["a"]
    with pytest.raises(RegistryError, match=r"x.json:1: function 'f': parameters nested too deeply to read"):
        openai_tool({"name": "f", "parameters": deep}, "x.json:1")


# --- BFCL question files as task files, through the command line ------------------------------------------
def test_question_files_run_as_task_files_and_calls_validate_against_bfcls_reading(tmp_path):
    """A BFCL question file is read as tasks (detected by content): each question's first turn is the prompt and
    its functions the task's tools; every call names one of them and its arguments pass jsonschema against the
    reference reading of the function's parameters above (not batchmask's conversion)."""
    import jsonschema
    from batchmask.models.checkpoint import ModelConfig, random_weights, write_checkpoint
    from chat_fixtures import HERMES_STYLE, tokenizer_dir

    from batchmask.run.cli import main
    lines = [q for name in ("BFCL_v4_simple_python.json", "BFCL_v4_parallel.json", "BFCL_v4_multiple.json")
             for q in map(json.loads, (BFCL / name).read_text(encoding="utf-8").splitlines())
             if q["id"] not in DATA_ERRORS][:12]
    tasks = tmp_path / "questions.json"
    tasks.write_text("".join(json.dumps(q) + "\n" for q in lines))
    tok = tokenizer_dir(tmp_path / "tok", "gpt2", HERMES_STYLE, pad_token="<|endoftext|>")
    config = ModelConfig(dim=16, hidden_dim=32, n_layers=1, n_heads=2, n_kv_heads=2, vocab_size=50257, seq_len=2048)
    write_checkpoint(tmp_path / "m.bin", config, random_weights(config, seed=2, std=0.8))
    out = tmp_path / "out.jsonl"
    assert main(["generate", "--tasks", str(tasks), "--checkpoint", str(tmp_path / "m.bin"), "--tokenizer",
                 str(tok / "tokenizer.json"), "--format", "hermes", "--tool-choice", "required", "--max-new-tokens",
                 "96", "--max-string", "8", "--grammar-cache", "none", "--quiet", "--out", str(out)]) == 0
    records = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["index"] for r in records] == list(range(len(lines)))
    checked = 0
    for rec, q in zip(records, lines):
        params = {fn["name"].replace(".", "_"): reference(fn["parameters"]) for fn in q["function"]}
        assert rec["task"] == q["question"][0][-1]["content"]
        for call in rec["tool_calls"]:
            assert call["function"]["name"] in params, (q["id"], call)
            jsonschema.validate(json.loads(call["function"]["arguments"]), params[call["function"]["name"]])
            checked += 1
        assert rec["tool_calls"] or rec["finish_reason"] == "length", rec
    assert checked >= len(lines) // 2
