"""Every keyword outside the subset is refused in strict mode with one error naming the tool and the JSON pointer;
lenient mode (the default) compiles the ones RELAXED names and reports each; a schema that is wrong is refused in
both; annotations are ignored; the registry reads OpenAI, MCP and Anthropic tool lists and keeps each entry."""
import json
import re
import warnings

import pytest

from batchmask.schema.base import NARROWED, SUPERSET, SUPPORTED
from batchmask.schema.build import ANNOTATIONS, SchemaError, SchemaOptions, schema_node
from batchmask.tools.registry import RegistryError, ToolRegistry

S = {"type": "string", "maxLength": 4}
STRICT = SchemaOptions(mode="strict")
REFUSED = [   # (schema of the property "p", pointer under #/properties/p, what the message says)
    ({"type": "string", "format": "idn-email"}, "/format", "format 'idn-email' is not supported"),
    ({"type": "string", "format": "uri", "maxLength": 20}, "/maxLength", "format 'uri' cannot be written within"),
    ({"type": "string", "pattern": "(?=a)b"}, "/pattern", "only (?:...) groups"),
    ({"type": "string", "pattern": "(a)\\1"}, "/pattern", "escape \\1 is not supported"),
    ({"type": "string", "pattern": "a\\bc"}, "/pattern", "escape \\b is not supported"),
    ({"type": "string", "pattern": "\\Z"}, "/pattern", "escape \\Z is not supported"),
    ({"type": "string", "pattern": "a^b"}, "/pattern", "anchor '^'"),
    ({"type": "string", "pattern": "(?i)a"}, "/pattern", "only (?:...) groups"),
    ({"type": "string", "pattern": "a{2"}, "/pattern", "'{' must start a quantifier"),
    ({"type": "string", "pattern": "a**"}, "/pattern", "a quantifier cannot follow"),
    ({"type": "string", "pattern": "\\uD83D\\uDE00"}, "/pattern", "is a surrogate"),
    ({"type": "string", "pattern": "^[a-z]+[0-9]+$", "maxLength": 5}, "/maxLength", "matches 2..10 characters"),
    ({"type": "string", "format": "date", "pattern": "^2"}, "/pattern", "together with 'format'"),
    ({"type": "string", "format": "date", "maxLength": 8}, "/maxLength", "format 'date' matches 10..10"),
    ({"type": "integer", "multipleOf": 5}, "/multipleOf", "'multipleOf' is not supported"),
    ({"type": "number", "multipleOf": 0}, "/multipleOf", "must be greater than 0"),
    ({"type": "string", "multipleOf": "x"}, "/multipleOf", "must be a number"),
    ({"type": "integer", "minimum": "1"}, "/minimum", "must be a number"),
    ({"type": "number", "maximum": True}, "/maximum", "must be a number"),
    ({"not": {"type": "string"}}, "/not", "'not' is not supported"),
    ({"if": S, "then": S}, "/if", "'if' is not supported"),
    ({"type": "object", "properties": {"a": S}, "dependentSchemas": {"a": S}}, "/dependentSchemas", "not supported"),
    ({"type": "object", "patternProperties": {"^a": S, "b": {"type": "integer"}}}, "/patternProperties/b",
     "may also match pattern 'b'"),      # more in test_schema_objects.py
    ({"type": "object", "properties": {"a": S}, "dependencies": {"a": S}}, "/dependencies/a", "dependentSchemas"),
    ({"type": "object", "properties": {"a": S}, "unevaluatedProperties": S}, "/unevaluatedProperties",
     "only 'unevaluatedProperties': false"),
    ({"type": "array", "items": S, "uniqueItems": True}, "/uniqueItems", "'uniqueItems': true"),
    ({"type": "array", "items": S, "contains": S}, "/contains", "'contains' is not supported"),
    ({"type": "array", "items": S, "unevaluatedItems": False}, "/unevaluatedItems", "not supported"),
    ({"type": ["string", "strin"]}, "/type/1", "unknown type 'strin'"),
    ({"type": ["string", "string"]}, "/type", "lists a type twice"),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "/oneOf/1", "branches 0 and 1 may both match"),
    ({"oneOf": [{"enum": ["a", 1]}, {"type": "integer"}]}, "/oneOf/1", "both admit 1"),
    ({"oneOf": [{"type": "string"}, {"maxLength": 3}]}, "/oneOf/1", "no 'type', enum or const"),
    ({"allOf": [S, {"type": "string", "pattern": "^a"}, {"type": "string", "pattern": "b$"}]}, "/allOf/2",
     "cannot be merged"),
    ({"anyOf": [{"type": "string", "pattern": "^a"}], "pattern": "b$"}, "/pattern", "'pattern' beside 'anyOf'"),
    ({"$ref": "#/$defs/missing"}, "/$ref", "points at nothing"),
    ({"$ref": "other.json#/a"}, "/$ref", "only local $refs"),
    ({"$dynamicRef": "#x"}, "/$dynamicRef", "not supported"),
    ({"type": "string", "nullable": True}, "/nullable", "'nullable' is not supported"),
    ({"enum": []}, "/enum", "non-empty list"),
    ({"enum": [[1], "a"], "maxItems": 2}, "/maxItems", "an enum/const array beside array keywords"),
    ({"type": "string", "pattern": "\\d-", "minLength": 3}, "/minLength", "the pattern matches 2..inf characters"),
    ({"enum": [float("nan")]}, "/enum/0", "not a JSON number"),
    ({"type": "string", "minLength": -1}, "/minLength", "non-negative integer"),
]


def tool_file(tmp_path, prop_schema, name="t"):
    p = tmp_path / "tools.json"
    p.write_text(json.dumps({"tools": [{"type": "function", "function": {
        "name": name, "parameters": {"type": "object", "properties": {"p": prop_schema}, "required": ["p"]}}}]},
        allow_nan=True))
    return p


@pytest.mark.parametrize("schema,pointer,says", REFUSED, ids=lambda x: json.dumps(x)[:50] if isinstance(x, dict)
                         else None)
def test_refused_keyword_names_tool_and_pointer(tmp_path, schema, pointer, says):
    p = tool_file(tmp_path, schema, name="search")
    with pytest.raises(SchemaError) as e:
        ToolRegistry.from_json(p, options=STRICT)
    msg = str(e.value)
    assert msg.startswith(f"{p}: tool 'search' parameters: #/properties/p{pointer}: "), msg
    assert says in msg and "\n" not in msg
    assert isinstance(e.value, RegistryError)


# Refused in both modes: the schema is wrong (lenient mode relaxes what cannot be written, not mistakes).
WRONG = ("must be a number", "is not among", "unknown type", "lists a type twice", "points at nothing",
         "non-empty list", "not a JSON number", "non-negative integer", "an enum/const array beside",
         "must be greater than 0")


def lenient_report(schema: dict, pointer: str, says: str) -> tuple[str | None, str]:
    """(the RELAXED keyword lenient mode reports for a REFUSED case, at which pointer); None where both refuse."""
    if any(w in says for w in WRONG):
        return None, pointer
    if "beside" in says:
        return "siblings", pointer
    head = pointer.split("/")[1]
    if head in ("maxLength", "minLength"):          # a pattern or format that does not fit the lengths: not written
        head = "pattern" if "pattern" in schema else "format"
        return head, "/" + head
    return head, pointer


LENIENT = [(s, *lenient_report(s, p, says)[::-1]) for s, p, says in REFUSED]


@pytest.mark.parametrize("schema,pointer,keyword", LENIENT, ids=lambda x: json.dumps(x)[:50]
                         if isinstance(x, dict) else None)
def test_lenient_mode_compiles_what_strict_refuses_and_reports_it(schema, pointer, keyword):
    """Lenient (the default) compiles every case above that strict refuses for a keyword RELAXED names, reporting
    that keyword at that pointer, once; a schema that is wrong (a bad type name, a pointer at nothing, a
    non-number bound) is refused in both modes."""
    from batchmask.schema.base import collect
    root = {"type": "object", "properties": {"p": schema}, "required": ["p"]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with collect() as got:
            if keyword is None:
                with pytest.raises(SchemaError):
                    schema_node(root, where="t")
                return
            schema_node(root, where="t")
    at = f"#/properties/p{pointer}"                     # noted at the keyword (or at the part of it not written)
    assert any(r.keyword == keyword and (at == r.ptr or at.startswith(r.ptr + "/")) for r in got), got
    for r in got:
        assert r.kind in (SUPERSET, NARROWED) and r.effect and r.where == "t"
        assert "lenient mode; strict refuses it" in r.line()


def test_every_refused_keyword_is_neither_supported_nor_an_annotation():
    # keywords of JSON Schema 2020-12 (and older drafts) that the subset refuses: each has a case above
    refused = {"multipleOf", "not", "if", "then", "else", "dependentSchemas", "contains", "minContains",
               "maxContains", "unevaluatedItems", "$dynamicRef", "$recursiveRef"}
    assert not refused & (SUPPORTED | ANNOTATIONS)
    for kw in refused:
        with pytest.raises(SchemaError, match=re.escape(f"#/{kw}: keyword {kw!r} is not supported (strict mode")):
            schema_node({"type": "string", kw: 1}, STRICT)
    # draft 2020-12's content keywords are annotations (not asserted), and anchors name subschemas
    for kw in ("contentEncoding", "contentMediaType", "contentSchema", "$anchor", "$dynamicAnchor", "$vocabulary"):
        assert schema_node({"type": "string", kw: "x"}, STRICT) == schema_node({"type": "string"}, STRICT)


def test_a_required_name_not_declared_is_a_property_of_any_value():
    """JSON Schema: `required` asks for the key; without a schema of its own, `additionalProperties` gives its value
    (absent: any value; false: no object can have it)."""
    got = schema_node({"type": "object", "properties": {"a": S}, "required": ["b"]}, STRICT)
    assert got == schema_node({"type": "object", "properties": {"a": S, "b": True}, "required": ["b"]}, STRICT)
    with pytest.raises(SchemaError, match=r"#/required: no value satisfies the schema: required property 'b'"):
        schema_node({"type": "object", "properties": {"a": S}, "required": ["b"], "additionalProperties": False})


def test_unsatisfiable_schemas_say_so():
    for schema, pointer in [({"type": "string", "minLength": 5, "maxLength": 2}, "#/minLength"),
                            ({"type": "integer", "minimum": 3, "exclusiveMaximum": 3}, "#"),
                            ({"type": "array", "items": S, "minItems": 3, "maxItems": 2}, "#/minItems"),
                            ({"type": "string", "enum": [1, 2]}, "#/enum"),
                            ({"$defs": {"n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}},
                                              "required": ["c"]}}, "$ref": "#/$defs/n"},
                             "#/$defs/n/properties/c/$ref")]:
        with pytest.raises(SchemaError, match=re.escape(f"<schema>: {pointer}: no value satisfies")):
            schema_node(schema)


@pytest.mark.parametrize("schema,says", [
    ({"type": "number", "minimum": 1e-8, "maximum": 2e-8}, "no number of at most 15 integer and 6 fraction digits "
                                                            "lies within [1e-08, 2e-08]"),
    ({"type": "number", "exclusiveMinimum": 0.5, "exclusiveMaximum": 0.5000001}, "raise SchemaOptions.fraction"),
    ({"type": "number", "minimum": 2, "maximum": 1}, "no number lies within [2, 1]"),
    ({"type": "number", "minimum": 1, "exclusiveMaximum": 1}, "no number lies within [1, 1)"),
    ({"type": "integer", "exclusiveMinimum": 1, "exclusiveMaximum": 2}, "no integer lies within (1, 2)"),
])
def test_an_empty_number_range_says_whether_the_digit_caps_or_the_bounds_empty_it(schema, says):
    capped = SchemaOptions(int_digits=15, fraction_digits=6)
    with pytest.raises(SchemaError, match=re.escape(says)):
        schema_node(schema, capped if "fraction" in says else SchemaOptions())
    if "fraction" in says:                              # the advice works: more digits reach into the range
        assert schema_node(schema, SchemaOptions(int_digits=15, fraction_digits=9)) is not None
        assert schema_node(schema) is not None          # and no cap (the default) reaches every range


def test_annotations_are_ignored():
    bare = {"type": "object", "properties": {"a": {"type": "integer", "maximum": 3}}, "required": ["a"]}
    noted = {k: "x" for k in ANNOTATIONS} | {"type": "object", "required": ["a"],
                                            "properties": {"a": {"type": "integer", "maximum": 3,
                                                                 "description": "d", "default": 1,
                                                                 "examples": [1]}}}
    assert schema_node(noted) == schema_node(bare)


def test_depth_cap():
    deep = {"type": "string"}
    for _ in range(3):
        deep = {"type": "array", "items": deep}
    schema_node(deep, SchemaOptions(max_depth=3))
    with pytest.raises(SchemaError, match="#/items/items: nesting deeper than max_depth=2"):
        schema_node(deep, SchemaOptions(max_depth=2))
    with pytest.raises(ValueError, match="SchemaOptions.max_items must be an integer >= 0"):
        SchemaOptions(max_items=-1)


# --- registries -------------------------------------------------------------------------------------
PARAMS = {"type": "object", "properties": {"q": {"type": "string", "maxLength": 9, "description": "query"},
                                           "n": {"type": "integer", "minimum": 1}, "f": {"type": "boolean"}},
          "required": ["q"]}


@pytest.mark.parametrize("entries,key", [
    ([{"type": "function", "function": {"name": "find", "description": "Find.", "parameters": PARAMS}}], "openai"),
    ({"tools": [{"type": "function", "function": {"name": "find", "description": "Find.", "parameters": PARAMS,
                                                  "strict": True}}]}, "openai"),
    ([{"type": "function", "name": "find", "description": "Find.", "parameters": PARAMS}], "flat"),
    ({"tools": [{"name": "find", "description": "Find.", "inputSchema": PARAMS,
                 "annotations": {"readOnlyHint": True}}]}, "mcp"),
    ({"jsonrpc": "2.0", "id": 1, "result": {"tools": [{"name": "find", "description": "Find.",
                                                        "inputSchema": PARAMS}]}}, "mcp-response"),
    ([{"name": "find", "description": "Find.", "input_schema": PARAMS}], "anthropic"),
])
def test_registry_forms_keep_schema_and_source(tmp_path, entries, key):
    p = tmp_path / "tools.json"
    p.write_text(json.dumps(entries))
    reg = ToolRegistry.from_json(p)
    tool = reg["find"]
    assert reg.names == ["answer", "find"] and tool.description == "Find."
    assert tool.parameters == PARAMS and tool.typed
    listed = entries if isinstance(entries, list) else (entries.get("tools") or entries["result"]["tools"])
    assert tool.source == listed[0]                                  # verbatim, wrapper and all
    assert [(a.name, a.type, a.required) for a in tool.args] == [("q", "string", True), ("n", "integer", False),
                                                                 ("f", "boolean", False)]
    assert reg["answer"].parameters is None                         # the native answer tool stays native


def test_typed_tools_without_parameters_take_no_arguments():
    reg = ToolRegistry.from_obj([{"type": "function", "function": {"name": "now"}},
                                 {"name": "ping", "input_schema": {}}])
    for name in ("now", "ping"):
        assert reg[name].parameters == {"type": "object", "properties": {}}
        assert schema_node(reg[name].parameters) == schema_node({"type": "object", "properties": {}})


@pytest.mark.parametrize("entry,says", [
    ({"name": "x", "parameters": {"type": "array", "items": S}}, "must describe the arguments object"),
    ({"name": "x", "parameters": [1]}, "'parameters' must be a JSON Schema object"),
    ({"name": "x", "args": [], "parameters": PARAMS}, "an entry has one of"),
    ({"name": "x", "inputSchema": PARAMS, "input_schema": PARAMS}, "an entry has one of"),
    ({"type": "web_search_20250305", "name": "web_search"}, "tool type 'web_search_20250305' is not supported"),
    ({"type": "function", "function": {"name": 'a"b', "parameters": PARAMS}}, "holds '\"'"),
])
def test_bad_typed_entries(entry, says):
    with pytest.raises(RegistryError, match=re.escape(says)):
        ToolRegistry.from_obj({"tools": [entry]}, source="f.json")


def test_canonical_json_and_fingerprint():
    def reg(params, desc="Find."):
        return ToolRegistry.from_obj([{"type": "function", "function": {"name": "find", "description": desc,
                                                                         "parameters": params}}])
    a = reg(PARAMS)
    # descriptions (of the tool and inside the schema) do not change the grammar, so not the fingerprint
    plain = json.loads(json.dumps(PARAMS))
    del plain["properties"]["q"]["description"]
    assert reg(plain, "Other words.").fingerprint() == a.fingerprint()
    # anything the grammar depends on does: a cap, the property order, required
    for changed in (dict(PARAMS, required=["q", "n"]),
                    dict(PARAMS, properties=dict(reversed(list(PARAMS["properties"].items())))),
                    dict(PARAMS, properties=dict(PARAMS["properties"], q={"type": "string", "maxLength": 8}))):
        assert reg(changed).fingerprint() != a.fingerprint()
    # canonical_json reads back as a registry with the same grammar
    again = ToolRegistry.from_obj(json.loads(a.canonical_json()))
    assert again.canonical_json() == a.canonical_json()
    assert [t.parameters is None for t in again] == [True, False]
    native = ToolRegistry.defaults()
    assert ToolRegistry.from_obj(json.loads(native.canonical_json())).canonical_json() == native.canonical_json()
    assert native.grammar_key()[1] == ["calc", ["expr"]]             # the seed path's key is unchanged


def test_registry_options_apply_to_the_check():
    deep = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "array", "items": S}}}}
    entry = [{"name": "x", "input_schema": deep}]
    ToolRegistry.from_obj(entry)
    with pytest.raises(SchemaError, match="tool 'x' parameters: #/properties/a/items: nesting deeper"):
        ToolRegistry.from_obj(entry, options=SchemaOptions(max_depth=2))


def test_a_subschema_met_before_is_reused_only_in_the_same_context(monkeypatch):
    """schema._build keeps the node of a subschema it has built (tool sets repeat parameter schemas); the node of
    the same JSON in another context (options, separators, depth, under a $ref) is built afresh, so a refusal
    there is not hidden by an earlier success, and the reused node is the one built without the memo."""
    from batchmask.schema import build as schema_mod
    sub = {"type": "array", "items": {"type": "integer"}, "maxItems": 2}
    shallow = {"type": "object", "properties": {"a": sub}, "required": ["a"]}
    deep = {"type": "object", "properties": {"a": sub, "b": {"type": "object", "properties": {"c": sub}}}}
    opts = SchemaOptions(max_depth=2)
    schema_node(shallow, opts)                                   # `sub` at depth 1 is fine: kept
    with pytest.raises(SchemaError, match=r"#/properties/b/properties/c: nesting deeper than max_depth=2"):
        schema_node(deep, opts)                                  # at depth 2 it is not, though met before
    with_memo = schema_node(deep, SchemaOptions(max_depth=3))
    monkeypatch.setattr(schema_mod, "BUILT_KEPT", 0)               # nothing kept: every node built afresh
    schema_mod._BUILT.clear()
    assert schema_node(deep, SchemaOptions(max_depth=3)) == with_memo
    assert schema_node(shallow, SchemaOptions(max_string_length=5), separators=(", ", ": ")) != \
        schema_node(shallow, SchemaOptions(max_string_length=5))
    monkeypatch.setattr(schema_mod, "BUILT_KEPT", 4096)
    ref = {"type": "object", "properties": {"a": {"$ref": "#/$defs/x"}}, "required": ["a"]}
    ints = schema_node({**ref, "$defs": {"x": {"type": "integer", "minimum": 0, "maximum": 3}}})
    bools = schema_node({**ref, "$defs": {"x": {"type": "boolean"}}})     # the same text, another root
    assert ints != bools


def test_keywords_json_schema_does_not_define_are_annotations():
    """JSON Schema: an implementation ignores keywords it does not know. Real files carry draft 4's `id`,
    Snowplow's `self`, Kubernetes' `x-kubernetes-*`, `javaType`, typos: each is ignored at every depth, so the
    language is the one of the schema without them (and jsonschema, which ignores them too, agrees on it)."""
    import jsonschema
    noise = {"id": "http://x/y#", "self": {"vendor": "com.x", "name": "y"}, "x-kubernetes-preserve-unknown-fields":
             True, "javaType": "com.x.Y", "decription": "a typo", "markdownDescription": "*md*", "readonly": True}
    bare = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 3},
                                             "b": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9},
                                                             {"type": "null"}]}}, "required": ["a", "b"]}
    noisy = {**noise, "type": "object", "required": ["a", "b"],
             "properties": {"a": {**noise, "type": "string", "maxLength": 3},
                            "b": {**noise, "anyOf": [{"type": "integer", "minimum": 0, "maximum": 9, **noise},
                                                     {"type": "null"}]}}}
    assert schema_node(noisy) == schema_node(bare)
    for value in ({"a": "xyz", "b": 3}, {"a": "", "b": None}):
        jsonschema.validate(value, noisy)
    with pytest.raises(SchemaError, match=re.escape("#/properties/a/not: keyword 'not' is not supported")):
        schema_node({**bare, "properties": {**bare["properties"], "a": {"type": "string", "not": {"const": "x"}}}},
                    STRICT)
