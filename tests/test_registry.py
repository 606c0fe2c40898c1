"""The tool registry and the prompt protocol's parse."""
import json

import pytest
from data_paths import data_dir

from batchmask.tools.prompt import SCAFFOLD, parse_call, render_call, render_prompt
from batchmask.tools.registry import RegistryError, Tool, ToolArg, ToolRegistry


def test_defaults_have_answer_first_and_the_five_tools():
    reg = ToolRegistry.defaults()
    assert reg.names == ["answer", "calc", "read_file", "list_dir", "write_file"]
    assert [a.name for a in reg["write_file"].required_args] == ["path", "text"]


def test_native_json_form(tmp_path):
    p = tmp_path / "tools.json"
    p.write_text(json.dumps({"tools": [
        {"name": "search", "description": "Search\n the web.", "args": [
            {"name": "query", "type": "string", "required": True},
            {"name": "limit", "type": "number", "required": False}]}]}))
    reg = ToolRegistry.from_json(p)
    assert reg.names == ["answer", "search"]                       # answer always present, first
    assert [a.name for a in reg["search"].required_args] == ["query"]   # only required args
    assert reg["search"].description == "Search the web."          # one line


def test_function_calling_form(tmp_path):
    p = tmp_path / "fns.json"
    p.write_text(json.dumps({"tools": [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {
            "unit": {"type": "string"}, "city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city", "days"]}}}]}))
    reg = ToolRegistry.from_json(p)
    # declaration order of the properties, required ones only
    assert [a.name for a in reg["get_weather"].required_args] == ["city", "days"]
    assert reg["get_weather"].args[2].type == "integer"          # the schema's type, as written


def test_answer_is_moved_first():
    reg = ToolRegistry([Tool("calc", "", (ToolArg("expr"),)), Tool("answer", "hi", (ToolArg("text"),))])
    assert reg.names == ["answer", "calc"] and reg["answer"].description == "hi"


@pytest.mark.parametrize("tools,match", [
    ([{"name": "", "args": []}], "name is empty"),
    ([{"name": "a", "args": []}, {"name": "a", "args": []}], "duplicate tool name"),
    ([{"name": "a", "args": [{"name": "x"}, {"name": "x"}]}], "duplicate arg name 'x'"),
    ([{"name": 'a"b', "args": []}], "holds '\"'"),
    ([{"name": "a\\b", "args": []}], "holds"),
    ([{"name": "a", "args": [{"name": "x\ny"}]}], "'a'.*holds"),
    ([{"name": "a", "args": [{"name": "x", "type": "object"}]}], "'a'.*arg 'x' has unknown type 'object'"),
    ([], "defines no tools"),
])
def test_bad_registries_are_refused_with_names(tmp_path, tools, match):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"tools": tools}))
    with pytest.raises(RegistryError, match=match):
        ToolRegistry.from_json(p)


def test_bad_files(tmp_path):
    with pytest.raises(RegistryError, match="not found"):
        ToolRegistry.from_json(tmp_path / "nope.json")
    p = tmp_path / "bad.json"
    p.write_text('{"tools": [')
    with pytest.raises(RegistryError, match=r"bad.json: not valid JSON at line 1"):
        ToolRegistry.from_json(p)


def test_prompt_and_parse():
    reg = ToolRegistry.defaults()
    prompt = render_prompt(reg, "what is\n 2+2?")
    assert prompt.endswith("TASK: what is 2+2?" + SCAFFOLD)
    assert "write_file(path, text): " in prompt
    call = render_call("calc", {"expr": "2+2"})
    assert call == '{"tool":"calc","args":{"expr":"2+2"}}'
    assert parse_call(call, reg) == ({"tool": "calc", "args": {"expr": "2+2"}}, None)
    for bad in ['{"tool":"calc","args":{"expr":""}}', '{"tool":"nope","args":{}}',
                '{"tool":"calc","args":{"x":"1"}}', '{"tool":"calc"', "hello"]:
        call, err = parse_call(bad, reg)
        assert call is None and err


# --- from_json's argument, and how long an error line may get ------------------------------------


def test_from_json_given_text_or_a_missing_path_says_so_briefly(tmp_path):
    text = (data_dir("tools") / "agent_tools.json").read_text()     # kilobytes of JSON, not a path
    with pytest.raises(RegistryError) as e:
        ToolRegistry.from_json(text)
    msg = str(e.value)
    assert "takes a path" in msg and "ToolRegistry.from_obj" in msg and len(msg) < 200, msg
    assert ToolRegistry.from_obj(json.loads(text)).names == ToolRegistry.from_json(data_dir("tools") /
                                                                                   "agent_tools.json").names
    missing = tmp_path / "nope.json"
    with pytest.raises(RegistryError) as e:
        ToolRegistry.from_json(missing)
    assert str(e.value) == f"tools file not found: {missing}"
    with pytest.raises(RegistryError, match="takes a path, got a dict"):
        ToolRegistry.from_json({"tools": []})
    with pytest.raises(RegistryError) as e:                          # too long a name for the file system
        ToolRegistry.from_json("t" * 5000)
    assert "cannot read tools file" in str(e.value) and len(str(e.value)) < 250
    odd = tmp_path / "[draft] tools.json"                            # a real file whose name starts with "["
    odd.write_text(json.dumps({"tools": [{"name": "a", "args": []}]}))
    assert ToolRegistry.from_json(str(odd)).names == ["answer", "a"]


@pytest.mark.parametrize("entry", [
    {"name": "n" * 5000, "args": []},                                # a name that holds a quote, far out
    {"name": "a" * 3000 + '"', "args": []},
    {"name": "a", "args": [{"name": "x", "type": "t" * 4000}]},
    {"type": "x" * 4000, "name": "a"},
    {"name": "a", "args": [{"name": "x" * 4000, "required": "yes"}]},
])
def test_registry_errors_cut_long_values(tmp_path, entry):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"tools": [entry, entry]}))
    with pytest.raises(RegistryError) as e:
        ToolRegistry.from_json(p)
    msg = str(e.value)
    assert len(msg) < 300 and "..." in msg, msg
