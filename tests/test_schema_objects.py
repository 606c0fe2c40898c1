"""Object keywords beyond properties/required (issue 24): patternProperties, propertyNames, minProperties /
maxProperties, dependentRequired and draft 7's `dependencies` lists.

Each schema is walked token by token against llguidance (test_schema_oracle.walks_agree: propertyNames written as
the keys' pattern, counted objects of declared properties as one branch per set of present properties), every
finished value validated with jsonschema; then random values are checked both ways, for those schemas and for
random ones (hypothesis): a value is in the language exactly when jsonschema accepts it (within the caps, keys in
the written order); refusals name the keyword; and overlap.disjoint's proofs hold on every short string.
"""
from __future__ import annotations

import itertools
import json
import re

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_schema_oracle import walks_agree

from batchmask.schema.build import SchemaError, SchemaOptions, schema_node
from batchmask.schema.nodes import lit, node_accepts, seq
from batchmask.schema.overlap import disjoint
from batchmask.schema.regex import pattern_node

OPTIONS = SchemaOptions(max_items=3, max_string_length=6, mode="strict")
I = {"type": "integer", "minimum": 0, "maximum": 9}
B = {"type": "boolean"}
S = {"type": "string", "maxLength": 2}

CASES = [
    {"type": "object", "patternProperties": {"^S_": I, "^x-": S}, "additionalProperties": False},
    {"type": "object", "patternProperties": {"^[a-z]+$": I, "^[0-9]+$": B}},
    {"type": "object", "patternProperties": {"^a": I, "^ab": I}, "maxProperties": 2},          # equal schemas
    {"type": "object", "patternProperties": {"^n[0-9]$": I}, "minProperties": 1},
    {"type": "object", "propertyNames": {"pattern": "^[a-c]+$"}, "additionalProperties": I},
    {"type": "object", "propertyNames": {"enum": ["red", "green"]}, "additionalProperties": B, "maxProperties": 2},
    {"type": "object", "propertyNames": {"maxLength": 2}, "additionalProperties": I, "minProperties": 1,
     "maxProperties": 2},
    {"type": "object", "properties": {"a": I, "b": B, "c": S}, "minProperties": 2},
    {"type": "object", "properties": {"a": I, "b": B, "c": S, "d": I}, "required": ["a"], "maxProperties": 2},
    {"type": "object", "properties": {"a": I, "b": B, "c": S}, "minProperties": 1, "maxProperties": 1},
    {"type": "object", "properties": {"a": I, "b": B, "c": S}, "dependentRequired": {"c": ["a"], "a": ["b"]}},
    {"type": "object", "properties": {"a": I, "b": B, "c": S}, "dependencies": {"b": ["c"]}, "minProperties": 1},
    {"type": "object", "properties": {"id": I, "name": S}, "required": ["id"],
     "patternProperties": {"^x-": B}, "maxProperties": 3},
]


@pytest.mark.parametrize("schema", CASES, ids=range(len(CASES)))
def test_object_keywords_match_llguidance_and_validate(schema):
    walks_agree(schema, OPTIONS, seed=5, max_finish=12)


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"a": I, "b": B}, "additionalProperties": S},
    {"type": "object", "properties": {"id": I, "name": S}, "required": ["id"], "additionalProperties": True}])
def test_keys_beside_declared_properties_match_llguidance(schema):
    """additionalProperties beside declared properties, told to llguidance as the narrowing writes it (a
    patternProperties of keys whose first character starts no declared name: test_schema_oracle.explicit); other
    keys without a count cap, as llguidance has none."""
    walks_agree(schema, SchemaOptions(max_string_length=6, mode="strict"), seed=3, max_finish=12)


@pytest.mark.parametrize("case", [0, 5, 8, 12])
def test_object_keywords_match_llguidance_on_llama2(case):
    walks_agree(CASES[case], OPTIONS, name="llama2", seed=7, walks=4, max_finish=12)


# --- both ways: in the language exactly when valid ----------------------------------------------------
KEYS = ["a", "b", "c", "d", "id", "name", "S_1", "x-y", "ab", "n1", "red", "green", "7", "abc", "A", "x", "x5", "z",
        "42", "S_"]
VALUES = [0, 5, True, "", "zz", "long!"]


def _objects(schema: dict, rng_seed: int, n: int):
    """Random objects over the schema's declared names and a few others."""
    import random
    rng = random.Random(rng_seed)
    for _ in range(n):
        pool = list(schema.get("properties", {})) + rng.sample(KEYS, 3)
        keys = list(dict.fromkeys(rng.sample(pool, rng.randint(0, min(4, len(pool))))))
        yield {k: rng.choice(VALUES) for k in keys}


def _written_order(schema: dict, value: dict) -> bool:
    """Declared properties first, in declared order (the only order written)."""
    declared = list(schema.get("properties", {}))
    keys = list(value)
    head = [k for k in keys if k in declared]
    return keys[:len(head)] == head and head == [k for k in declared if k in value]


BOTH_WAYS = CASES + [      # beyond what the walks' llguidance reference can state
    {"type": "object", "properties": {"a": I, "bb": I}, "propertyNames": {"maxLength": 1}},
    {"type": "object", "properties": {"a": I}, "patternProperties": {"^x[0-9]?$": I, "^7$": B},
     "propertyNames": {"maxLength": 2}, "maxProperties": 2},
    {"type": "object", "properties": {"a": I, "b": B}, "dependentRequired": {"a": ["c"], "b": ["a"]},
     "patternProperties": {"^n": S}},
]


@pytest.mark.parametrize("schema", BOTH_WAYS, ids=range(len(BOTH_WAYS)))
def test_in_the_language_exactly_when_valid(schema):
    node = schema_node(schema, OPTIONS)
    judged = {("dependentRequired" if k == "dependencies" else k): v for k, v in schema.items()}   # 2020-12's name
    if "patternProperties" in schema or "properties" in schema:
        judged.setdefault("additionalProperties", False)            # batchmask's objects are closed
    validator = jsonschema.Draft202012Validator(judged)
    seen = 0
    for value in itertools.chain(_objects(schema, 1, 3000), [{}]):
        if not _written_order(schema, value) or len(set(value) - set(schema.get("properties", {}))) > 3:
            continue                  # another order, or more free keys than max_items
        text = json.dumps(value, separators=(",", ":")).encode()
        valid = validator.is_valid(value)
        assert node_accepts(node, text) == valid, (value, valid)
        seen += valid
    assert seen >= 3                  # the sample reaches the language


OTHER_KEYS = [{"type": "object", "properties": {"a": I, "b": B}, "additionalProperties": S},
              {"type": "object", "properties": {"a": I, "x5": S}, "required": ["a"], "additionalProperties": {}},
              {"type": "object", "properties": {"": I, "z": B}, "additionalProperties": True, "maxProperties": 2}]


@pytest.mark.parametrize("schema", OTHER_KEYS, ids=range(len(OTHER_KEYS)))
def test_keys_beside_declared_properties_are_written(schema):
    """additionalProperties `true` or a schema beside `properties` is honoured (schema/objects.py _other_keys): a
    value is in the language exactly when jsonschema accepts it (the schema as given: open), its declared
    properties come first in declared order, and each other key starts with a character no declared name starts
    with (the narrowing that keeps them apart)."""
    node = schema_node(schema, OPTIONS)
    validator = jsonschema.Draft202012Validator(schema)
    firsts = {n[:1] for n in schema["properties"] if n}
    seen_other = 0
    for value in itertools.chain(_objects(schema, 2, 3000), [{}, {"": 1}, {"a": 1, "": "x"}]):
        others = [k for k in value if k not in schema["properties"]]
        if not _written_order(schema, value) or len(others) > 3:
            continue
        text = json.dumps(value, separators=(",", ":")).encode()
        written = validator.is_valid(value) and not any(k[:1] in firsts for k in others if k) \
            and ("" not in schema["properties"] or "" not in others)
        assert node_accepts(node, text) == written, (value, written)
        seen_other += written and bool(others)
    assert seen_other >= 3


def test_keys_beside_declared_properties_give_way_when_the_automaton_is_too_large(monkeypatch):
    """A grammar whose other keys pass the walk's budget is compiled again without them (api.narrower_if_too_large):
    closed objects, each reported as a narrowing (in strict mode too), under the caller's key."""
    from test_schema_unbounded import accepted, tokenizer

    import batchmask.api as api
    schema = {"type": "object", "properties": {"a": I}, "additionalProperties": B}
    assert accepted(schema, '{"a":1,"zz":true}')
    monkeypatch.setattr(api, "OTHER_KEYS_PAIRS", 10)
    for mode in ("lenient", "strict"):
        g = api.compile_json_schema(schema, tokenizer(), options=SchemaOptions(mode=mode))
        assert [(r["keyword"], r["pointer"], r["kind"]) for r in g.relaxations] == \
            [("additionalProperties", "#/additionalProperties", "narrowed")]
        assert g.meta["key"] == api.schema_grammar_key(schema, SchemaOptions(mode=mode))
        ids = tokenizer().encode('{"a":1,"zz":true}', bos=False, prefix_space=False)
        state = g.start
        for i in ids:
            state = int(g.next_state([state], [i])[0])
            if state < 0:
                break
        assert state < 0                                           # the other key is refused


def test_a_refused_first_attempt_stops_before_the_value_rows(monkeypatch):
    """The explicit states' edges no block cell takes over are walked first (table/build.py), so a first attempt past
    the walk's budget is refused before any value row is worked out: the value rows are built once, for the
    compile that is kept."""
    from test_schema_unbounded import tokenizer

    import batchmask.api as api
    import batchmask.table.build as build
    calls = []
    real = build.value_rows
    monkeypatch.setattr(build, "value_rows", lambda *a, **k: calls.append(1) or real(*a, **k))
    schema = {"type": "object", "properties": {"a": I, "b": {"type": "string"}}, "additionalProperties": B}
    api.compile_json_schema(schema, tokenizer())
    assert len(calls) == 1                                         # within the budget: one attempt
    monkeypatch.setattr(api, "OTHER_KEYS_PAIRS", 10)
    calls.clear()
    g = api.compile_json_schema(schema, tokenizer())
    assert [r["kind"] for r in g.relaxations] == ["narrowed"]      # the first attempt was refused ...
    assert len(calls) == 1                                         # ... before its value rows


# --- refusals -------------------------------------------------------------------------------------------
REFUSALS = [
    ({"type": "object", "patternProperties": {"^a": I, "b": B}}, "#/patternProperties/b",
     "keys of pattern '^a' may also match pattern 'b'"),
    ({"type": "object", "patternProperties": {"^[a-z]+$": I, "^x": B}}, "#/patternProperties/^x", "may also match"),
    ({"type": "object", "patternProperties": {"^a": I}, "additionalProperties": B}, "#/additionalProperties",
     "beside 'patternProperties' is not supported"),
    ({"type": "object", "properties": {"ab": I}, "patternProperties": {"^a": B}}, "#/patternProperties/^a",
     "property 'ab' matches pattern '^a'"),
    ({"type": "object", "properties": {"ab": I}, "patternProperties": {"^a": I}}, "#/patternProperties/^a",
     "a pattern key could repeat it"),
    ({"type": "object", "properties": {"xa": False}, "patternProperties": {"^x": I}}, "#/patternProperties/^x",
     "property 'xa' matches pattern '^x'"),                        # a pattern key must not write it either
    ({"type": "object", "patternProperties": {"(?=a)": I}}, "#/patternProperties/(?=a)", "only (?:...) groups"),
    ({"type": "object", "additionalProperties": I, "minProperties": 2}, "#/minProperties",
     "cannot be kept distinct"),
    ({"type": "object", "properties": {"a": I}, "patternProperties": {"^x": I}, "minProperties": 3},
     "#/minProperties", "needs at least 3 free keys"),
    ({"type": "object", "propertyNames": {"pattern": "^a"}, "patternProperties": {"^b": I}}, "#/propertyNames",
     "with a pattern of its own"),
    ({"type": "object", "properties": {"a": I}, "dependencies": {"a": {"required": ["b"]}}}, "#/dependencies/a",
     "'dependencies' with a schema (dependentSchemas) is not supported"),
    ({"type": "object", "properties": {"a": I}, "dependentRequired": {"a": "b"}}, "#/dependentRequired/a",
     "must be lists of property names"),
    ({"type": "object", "patternProperties": {"^x": I}, "dependentRequired": {"xy": ["z"]}}, "#/dependentRequired",
     "'xy', which a free key may be"),
    ({"type": "object", "properties": {"a": I}, "dependentSchemas": {"a": I}}, "#/dependentSchemas",
     "keyword 'dependentSchemas' is not supported"),
]


@pytest.mark.parametrize("schema,pointer,says", REFUSALS, ids=range(len(REFUSALS)))
def test_refusals_name_the_keyword(schema, pointer, says):
    with pytest.raises(SchemaError) as e:
        schema_node(schema, OPTIONS)
    assert str(e.value).startswith(f"<schema>: {pointer}: "), str(e.value)
    assert says in str(e.value)


def test_the_chain_of_many_properties_is_refused_past_its_states():
    props = {f"p{i}": I for i in range(30)}
    deps = {f"p{i}": [f"p{i + 15}"] for i in range(15)}          # 2^15 sets of properties owed
    with pytest.raises(SchemaError, match=re.escape("needs more than 4096 states")):
        schema_node({"type": "object", "properties": props, "dependentRequired": deps}, OPTIONS)


def test_unsatisfiable_counts_and_dependencies_say_so():
    for schema in [{"type": "object", "properties": {"a": I}, "minProperties": 2},
                   {"type": "object", "properties": {"a": I}, "required": ["a"], "dependentRequired": {"a": ["z"]}},
                   {"type": "object", "properties": {"a": I}, "minProperties": 2, "maxProperties": 1}]:
        with pytest.raises(SchemaError, match="no value satisfies"):
            schema_node(schema, OPTIONS)


def test_keywords_that_say_nothing_leave_the_plain_object():
    plain = {"type": "object", "properties": {"a": I, "b": B}, "required": ["b"]}
    same = dict(plain, minProperties=0, dependentRequired={}, dependencies={"a": []}, patternProperties={})
    assert schema_node(same, OPTIONS) == schema_node(plain, OPTIONS)
    assert schema_node(dict(plain, minProperties=1), OPTIONS) != schema_node(plain, OPTIONS)


# --- overlap.disjoint: a proof holds on every short string --------------------------------------------
ATOMS = ["a", "b", "1", "-", "[ab]", "[^a]", "\\d", "\\w", ".", "a*", "b+", "(?:a|1)", "[0-9]?", "\\s"]
ALPHABET = "ab1 é٣\n\u2003"            # Python's \d holds ٣, its \w é, its \s U+2003; $ matches before a last \n


@st.composite
def _patterns(draw):
    body = "".join(draw(st.lists(st.sampled_from(ATOMS), min_size=1, max_size=3)))
    return ("^" if draw(st.booleans()) else "") + body + ("$" if draw(st.booleans()) else "")


STRINGS = ["".join(p) for n in range(5) for p in itertools.product(ALPHABET, repeat=n)]


@settings(max_examples=150, deadline=None)
@given(p=_patterns(), q=_patterns())
def test_disjoint_is_never_wrong(p, q):
    """When disjoint() proves the keys of p apart from every string re.search(q) matches, no short key of p
    matches q (an overlap it reports may be only its widening's)."""
    key = seq(lit(b'"'), pattern_node(p, repeat_cap=3, free_cap=3)[0], lit(b'"'))
    wide = seq(lit(b'"'), pattern_node(q, repeat_cap=3, free_cap=3, search=True)[0], lit(b'"'))
    if disjoint(key, wide) is True:
        for s in STRINGS:
            if node_accepts(key, json.dumps(s, ensure_ascii=False).encode()):
                assert re.search(q, s) is None, (p, q, s)


def test_disjoint_separates_the_usual_patterns():
    def apart(p, q):
        key = seq(lit(b'"'), pattern_node(p, 16, 6)[0], lit(b'"'))
        return disjoint(key, seq(lit(b'"'), pattern_node(q, 16, 6, search=True)[0], lit(b'"')))
    assert apart("^S_", "^x-") and apart("^[a-z]+$", "^[0-9]+$") and apart("^\\d+$", "^[a-z]")
    assert apart("^a.*z$", "^a.*y$") and apart("^[a-z]+$", "\\d")
    assert apart("^foo", "bar") is False and apart("^\\d", "^[^a]") is False and apart("^a", "^\\w") is False


# --- random object schemas, both ways ------------------------------------------------------------------
@st.composite
def _counted_objects(draw):
    names = draw(st.lists(st.sampled_from(["a", "b", "c", "d", "id"]), min_size=0, max_size=4, unique=True))
    props = {n: draw(st.sampled_from([I, B, S, False])) for n in names}
    schema = {"type": "object", "properties": props,
              "required": [n for n in names if props[n] is not False and draw(st.booleans())]}
    if draw(st.booleans()):
        schema["minProperties"] = draw(st.integers(0, 3))
    if draw(st.booleans()):
        schema["maxProperties"] = draw(st.integers(0, 4))
    if names and draw(st.booleans()):
        schema["dependentRequired"] = {n: draw(st.lists(st.sampled_from(names + ["z"]), max_size=2, unique=True))
                                       for n in draw(st.lists(st.sampled_from(names), max_size=2, unique=True))}
    if draw(st.booleans()):
        schema["patternProperties"] = dict(draw(st.lists(st.sampled_from([("^S_", I), ("^x-", B), ("^[0-9]+$", S)]),
                                                         max_size=2, unique_by=lambda kv: kv[0])))
    return schema


@settings(max_examples=60, deadline=None)
@given(schema=_counted_objects(), seed=st.integers(0, 1000))
def test_random_counted_objects_are_exact(schema, seed):
    try:
        node = schema_node(schema, OPTIONS)
    except SchemaError as e:
        assert "no value satisfies" in str(e) or "cannot be kept distinct" in str(e), str(e)
        return
    validator = jsonschema.Draft202012Validator(dict(schema, additionalProperties=False))
    for value in itertools.chain(_objects(schema, seed, 300), [{}]):
        if not _written_order(schema, value) or len(set(value) - set(schema["properties"])) > 3:
            continue
        text = json.dumps(value, separators=(",", ":")).encode()
        assert node_accepts(node, text) == validator.is_valid(value), (value, validator.is_valid(value))


OPEN = SchemaOptions(max_items=3, max_string_length=6, mode="strict", open_objects=True)


@pytest.mark.parametrize("schema", [{"type": "object", "properties": {"a": I, "b": B}},
                                    {"type": "object", "properties": {"a": I}, "required": ["a"],
                                     "additionalProperties": False},
                                    {"type": "object"}])
def test_open_objects_read_an_object_as_the_specification_does(schema):
    """SchemaOptions.open_objects: an object that says nothing of additionalProperties takes other keys (as `true`:
    after the declared ones, first character starting no declared name); an explicit false stays closed. Judged by
    jsonschema on the schema as given, and by the validation a run uses (schema.validate.check, closed=False)."""
    from batchmask.schema.validate import check
    node = schema_node(schema, OPEN)
    validator = jsonschema.Draft202012Validator(schema)
    firsts = {n[:1] for n in schema.get("properties", {}) if n}
    seen_other = 0
    for value in itertools.chain(_objects(schema, 4, 2000), [{}, {"zz": [1]}]):
        others = [k for k in value if k not in schema.get("properties", {})]
        if not _written_order(schema, value) or len(others) > 3 or any(isinstance(v, str) and len(v) > 6
                                                                        for v in value.values()):
            continue
        text = json.dumps(value, separators=(",", ":")).encode()
        written = validator.is_valid(value) and not any(k[:1] in firsts for k in others if k)
        assert node_accepts(node, text) == written, (value, written)
        if written:
            assert check(value, schema, closed=False) is None
        seen_other += written and bool(others)
    assert seen_other >= 3 or schema.get("additionalProperties") is False


def test_a_schema_task_validates_open_objects_openly():
    from batchmask.run.schema_task import SchemaTask
    schema = {"type": "object", "properties": {"a": I}}
    assert SchemaTask(schema).parse('{"a":1,"zz":2}')[1] is not None                   # closed by default
    assert SchemaTask(schema, options=SchemaOptions(open_objects=True)).parse('{"a":1,"zz":2}') == \
        ({"a": 1, "zz": 2}, None)
