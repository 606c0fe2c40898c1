"""The official JSON Schema Test Suite (draft 2020-12) as conformance tests (issue 24).

tests/data/json-schema-test-suite/ holds the suite's draft2020-12/*.json and, since batchmask asserts formats, its
optional/format/ files for the eight formats it writes (tests/data/README.md: upstream commit, licence). Each
file's top-level entries are groups: a schema and instances marked valid or invalid. A group whose schema
batchmask refuses in its strict reading (SchemaOptions(mode="strict") where that option exists, else the default
SchemaOptions(), which refuses every keyword it cannot write exactly) is skipped, with its reason: the
SchemaError's keyword (`refusal`). Every other group is compiled with `compile_json_schema` on the vendored
Llama 2 vocabulary, and each instance, serialised compactly (`serialised`: json.dumps with ensure_ascii=False
and "," ":", U+007F written \\u007f as every string body writes it), is tokenised by that vocabulary and walked
token by token on the CPU (`walk`): in every state the next token must be in the mask (`allowed`) and
`next_state` must take it; at the end the state must be final and the EOS token legal.

  valid instances    must be accepted. Object keys are first put in the order the schema declares them
                     (`in_declared_order`: the grammar writes declared order only). A valid instance the
                     grammar refuses is skipped only when a documented narrowing (docs/json-schema.md) explains
                     it (`narrowing`, each reason named and counted); one it cannot explain fails the test.
  invalid instances  must be refused, in every spelling tried (as given, keys in declared order, integral
                     numbers as 1 and as 1.0): a token out of the mask, or an end that is not final.

The token walk is the check; the byte language is checked beside it (`node_accepts` on the grammar's tree must
give the same verdict; it cannot read the formats' Word nodes, so for groups with a hostname, email or uri the
walk stands alone), so a refusal does not come from how the vocabulary splits the text.

Real bugs the suite found are KNOWN_BUGS: recorded, not failures, and `test_known_bugs` is an expected failure
(strict) until they are fixed.

What is skipped, group by group and instance by instance, is pinned in tests/data/json-schema-test-suite/SKIPPED.md
(`test_skips_are_as_recorded`): a newly supported keyword, or a new refusal, changes it and fails until the file
is rewritten (`python tests/test_schema_suite.py` writes it, batchmask importable) and docs/json-schema.md's
Conformance section is brought along (`test_docs_state_the_counts`).
"""
from __future__ import annotations

import json
import re
from collections import Counter
from functools import cache
from pathlib import Path

import jsonschema
import pytest
from data_paths import SCHEMA_SUITE, data_dir

from batchmask.api import compile_json_schema
from batchmask.automaton.nfa import GrammarBuildError
from batchmask.errors import SchemaError
from batchmask.schema.build import SchemaOptions, schema_node
from batchmask.schema.nodes import node_accepts

SUITE = SCHEMA_SUITE / "draft2020-12"
SKIPPED = SCHEMA_SUITE / "SKIPPED.md"
FILES = sorted(p.relative_to(SUITE).as_posix() for p in SUITE.rglob("*.json"))   # optional/format/: 8 formats

# Valid instances refused for a documented narrowing that no general rule of `narrowing` names.
TYPE_INFERRED = "type inferred from the keywords"
CLOSED = "closed objects: no property beyond `properties`"
EXPLAINED = {
    ("anyOf.json", "anyOf complex types", "both anyOf valid (complex)"): CLOSED,      # each branch declares one
    ("ref.json", "root pointer ref", "match"): TYPE_INFERRED,                         # {"foo": false}: "#" is
    ("ref.json", "root pointer ref", "recursive match"): TYPE_INFERRED,               # an object (properties)
    ("uniqueItems.json", "uniqueItems=false validation", "unique array of nested objects is valid"):
        "any_depth: a value of any type nests 1 level",
    ("uniqueItems.json", "uniqueItems=false validation", "non-unique array of nested objects is valid"):
        "any_depth: a value of any type nests 1 level",
    ("vocabulary.json", "schema that uses custom metaschema with with no validation vocabulary",
     "no validation: invalid number, but it still validates"): "$schema not read: validation keywords asserted",
}

# Real bugs the suite found: in these groups a misjudged instance (or a failed compile) is recorded, not a failure,
# and `test_known_bugs` (xfail, strict) fails until it is fixed.
KNOWN_BUGS = {
    ("optional/format/hostname.json", "validation of A-label (punycode) host names"):
        "hostname writes labels with '--' at positions 3-4 ('xn--X'), which are not valid A-labels (RFC 5890, "
        "RFC 5891 4.2.3.1); jsonschema's checker (fqdn) accepts them",
}


def options() -> SchemaOptions:
    if "mode" in SchemaOptions.__dataclass_fields__:
        return SchemaOptions(mode="strict")
    return SchemaOptions()


@cache
def tokenizer():
    from batchmask.models.tokenizer import load_tokenizer
    return load_tokenizer(data_dir("llama2") / "tokenizer.model")


@cache
def groups(name: str) -> list:
    return json.loads((SUITE / name).read_text(encoding="utf-8"))


# --- refusals -----------------------------------------------------------------------------------------
_REASONS = [   # (message pattern, reason): the first match names a SchemaError
    (r"keyword '([^']+)' is not supported", r"\1"),
    (r"format '([^']+)' is not supported", r"format \1"),
    (r"'([^']+)' beside '([^']+)' is not supported", r"\1 beside \2"),
    (r"only local \$refs", "$ref: not local"),
    (r"not anchors", "$ref: an anchor"),
    (r"oneOf is supported only when|oneOf branches \d+ and \d+ may both match", "oneOf: branches not disjoint"),
    (r"'allOf' is supported only with one branch|allOf branch \d+ cannot be merged", "allOf: branches not merged"),
    (r"'uniqueItems': true is not supported", "uniqueItems: true"),
    (r"only 'unevaluatedProperties': false", "unevaluatedProperties: not false"),
    (r"required property .* is not among 'properties'", "required: not among properties"),
    (r"pattern .* escape \\(\w) is not supported", r"pattern: \\\1"),
    (r"'enum' must be a non-empty list", "enum: empty"),
    (r"no value satisfies the schema", "no value satisfies the schema"),
]


def refusal(message: str) -> str:
    """The reason a SchemaError names: its keyword (the whole message where no rule reads it)."""
    for pattern, reason in _REASONS:
        m = re.search(pattern, message)
        if m:
            return m.expand(reason)
    return message


def group_skip(name: str, group: dict) -> str | None:
    """Why a group is not compiled, or None."""
    try:
        schema_node(group["schema"], options())
    except SchemaError as e:
        return refusal(str(e))
    return None


# --- serialising and walking ----------------------------------------------------------------------------
def serialised(data) -> str:
    # U+007F only occurs inside strings, where the grammar writes it \u007f (docs/json-schema.md)
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False).replace("\x7f", "\\u007f")


def key_orders(schema) -> list[list[str]]:
    """Every key order the schema declares: each `properties`, each object in an enum or const; last, every
    declared property in document order (allOf's branches, and the keywords beside them, make one object)."""
    out = []

    def visit(s, literal=False):
        if isinstance(s, dict):
            if literal:
                out.append(list(s))
            elif isinstance(s.get("properties"), dict):
                out.append(list(s["properties"]))
            for k, v in s.items():
                visit(v, literal or k in ("const", "enum"))
        elif isinstance(s, list):
            for v in s:
                visit(v, literal)
    visit(schema)
    return out + [list(dict.fromkeys(k for order in out for k in order))]


def in_declared_order(data, orders):
    """`data` with each object's keys in the first declared order that holds them all (else as given)."""
    if isinstance(data, list):
        return [in_declared_order(v, orders) for v in data]
    if not isinstance(data, dict):
        return data
    data = {k: in_declared_order(v, orders) for k, v in data.items()}
    for order in orders:
        if set(data) <= set(order):
            return {k: data[k] for k in sorted(data, key=order.index)}
    return data


def respelled(data, as_float: bool):
    """Integral numbers written 1.0 (as_float) or 1: the same JSON value, another spelling."""
    if isinstance(data, list):
        return [respelled(v, as_float) for v in data]
    if isinstance(data, dict):
        return {k: respelled(v, as_float) for k, v in data.items()}
    if isinstance(data, bool):
        return data
    if as_float and isinstance(data, int) and abs(data) < 2 ** 53:
        return float(data)
    if not as_float and isinstance(data, float) and data.is_integer():
        return int(data)
    return data


def walk(g, text: str) -> tuple[str | None, int]:
    """Why the grammar refuses `text` token by token (None: accepted), and where (the bytes taken)."""
    tok = tokenizer()
    data = text.encode("utf-8")
    ids = tok.encode(text, bos=False, prefix_space=False)
    assert b"".join(tok.token_bytes[i] for i in ids) == data, f"{text!r} does not tokenise back to itself"
    state, done = g.start, 0
    for i in ids:
        legal = bool(g.allowed([state])[0, i])
        nxt = int(g.next_state([state], [i])[0])
        assert legal == (nxt >= 0), f"mask and next_state disagree on token {i} after {data[:done]!r}"
        if not legal:
            return f"token {tok.token_bytes[i]!r} refused after {data[:done]!r}", done
        state, done = nxt, done + len(tok.token_bytes[i])
    if not bool(g.is_final([state])[0]):
        return "ends in a state that is not final", done
    if int(g.next_state([state], [tok.eos_id])[0]) < 0:
        return "EOS refused at the end", done
    return None, done


def verdict(g, text: str) -> tuple[str | None, int]:
    """`walk`, checked against the byte language of the grammar's tree."""
    why, done = walk(g, text)
    try:
        by_bytes = node_accepts(g.node, text.encode("utf-8"))
    except TypeError:               # node_accepts does not read every node (formats' Word): the walk alone
        return why, done
    assert (why is None) == by_bytes, f"token walk and bytes disagree: {text!r}"
    return why, done


# --- narrowings --------------------------------------------------------------------------------------
def _keys(data) -> set:
    if isinstance(data, list):
        return set().union(*map(_keys, data)) if data else set()
    if isinstance(data, dict):
        return set(data).union(*map(_keys, data.values()))
    return set()


def _has_maps(schema) -> bool:
    """Does the schema hold an object of free keys (additionalProperties a schema, no properties)?"""
    if isinstance(schema, list):
        return any(map(_has_maps, schema))
    if not isinstance(schema, dict):
        return False
    if "additionalProperties" in schema and schema["additionalProperties"] is not False and "properties" not in schema:
        return True
    return any(map(_has_maps, schema.values()))


_TYPE_WORDS = {"type", "enum", "const", "$ref", "anyOf", "oneOf", "allOf"}    # a schema with none infers its type
_FIRST = {dict: "{", list: "[", str: '"', bool: "t", type(None): "n", int: "1", float: "1"}


def _starts_with(g, char: str) -> bool:
    """May a value of the grammar start with `char`?"""
    tok = tokenizer()
    state = g.start
    for i in tok.encode(char, bos=False, prefix_space=False):
        state = int(g.next_state([state], [i])[0])
        if state < 0:
            return False
    return True


def narrowing(key: tuple, schema, data, g, done: int) -> str | None:
    """The documented narrowing (docs/json-schema.md) that explains why the grammar refuses a valid `data`, or None.
    Each rule holds only where it alone explains the refusal (the value's type cannot start at all; a key the schema
    declares nowhere and no map; a string jsonschema's format checker refuses)."""
    orders = key_orders(schema)
    for as_float in (False, True):
        other = respelled(data, as_float)
        text = serialised(in_declared_order(other, orders))
        if serialised(other) != serialised(data) and verdict(g, text)[0] is None:
            return "number spelling: the other spelling (1 / 1.0) is accepted"
    if key in EXPLAINED:
        return EXPLAINED[key]
    declares = not isinstance(schema, dict) or _TYPE_WORDS & set(schema)
    if done == 0 and not declares and not _starts_with(g, _FIRST[type(data)]):
        return TYPE_INFERRED
    if _keys(data) - {k for order in orders for k in order} and not _has_maps(schema):
        return CLOSED
    fmt = schema.get("format") if isinstance(schema, dict) and isinstance(data, str) else None
    if fmt and not key[0].startswith("optional/"):
        if not jsonschema.Draft202012Validator.FORMAT_CHECKER.conforms(data, fmt):
            return "format asserted (2020-12 reads it as an annotation)"
    elif fmt in ("time", "date-time") and re.search(r":60(?:[.Zz+-]|$)", data):
        return "time: no leap second"
    elif fmt in ("hostname", "email", "uri"):
        return f"format {fmt} narrowed (a practical subset)"
    if isinstance(schema, dict) and "prefixItems" in schema and "items" not in schema and isinstance(data, list) \
            and len(data) > len(schema["prefixItems"]):
        return "prefixItems without items: no further item"
    pattern = schema.get("pattern") if isinstance(schema, dict) and isinstance(data, str) else None
    if pattern and not pattern.startswith("^") and re.search(pattern, data) and not re.match(pattern, data):
        return "pattern without ^: the value starts with the match"
    return None


# --- one file ----------------------------------------------------------------------------------------
@cache
def file_results(name: str) -> dict:
    """Group skips, instance skips, failures and counts of one suite file."""
    out = {"group_skips": {}, "instance_skips": {}, "failures": [], "known_bugs": [], "counts": Counter()}
    for group in groups(name):
        gname = group["description"]
        bug = KNOWN_BUGS.get((name, gname))
        failures = out["known_bugs"] if bug else out["failures"]
        out["counts"]["groups"] += 1
        why = group_skip(name, group)
        if why is None:
            try:
                g = compile_json_schema(group["schema"], tokenizer(), options=options())
            except GrammarBuildError as e:
                why = "GrammarBuildError: " + str(e).split(";")[0].removeprefix("grammar: ")
                if bug:
                    out["known_bugs"].append(f"{name} / {gname!r}: does not compile: {why}")
                    out["counts"]["groups: known bug"] += 1
                    continue
        if why is not None:
            out["group_skips"][gname] = why
            out["counts"]["groups skipped"] += 1
            continue
        out["counts"]["groups compiled"] += 1
        orders = key_orders(group["schema"])
        for test in group["tests"]:
            data, key = test["data"], (name, gname, test["description"])
            where = f"{name} / {gname!r} / {test['description']!r}"
            if test["valid"]:
                text = serialised(in_declared_order(data, orders))
                why, done = verdict(g, text)
                if why is None:
                    out["counts"]["valid accepted"] += 1
                    continue
                reason = narrowing(key, group["schema"], data, g, done)
                if reason is None:
                    failures.append(f"{where}: valid {text} refused: {why}")
                else:
                    out["instance_skips"][gname, test["description"]] = reason
                    out["counts"]["valid skipped"] += 1
            else:
                spellings = {serialised(d) for d in (data, in_declared_order(data, orders))
                             for d in (d, respelled(d, False), respelled(d, True))}
                accepted = [t for t in sorted(spellings) if verdict(g, t)[0] is None]
                if accepted:
                    failures.append(f"{where}: invalid {accepted[0]} accepted")
                    out["counts"]["invalid accepted: known bug"] += bool(bug)
                else:
                    out["counts"]["invalid refused"] += 1
    return out


@pytest.mark.parametrize("name", FILES)
def test_suite_file(name):
    failures = file_results(name)["failures"]
    assert not failures, "\n".join(failures)


@pytest.mark.xfail(strict=True, reason="the bugs of KNOWN_BUGS (an XPASS: fixed, take them out)")
def test_known_bugs():
    seen = [bug for name in FILES for bug in file_results(name)["known_bugs"]]
    assert not seen, "\n".join(seen)


# --- the pinned skip list ------------------------------------------------------------------------------------
def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def skip_table() -> str:
    """SKIPPED.md as the code computes it."""
    lines = ["# JSON Schema Test Suite (draft 2020-12): what tests/test_schema_suite.py skips", "",
             "Written by `python tests/test_schema_suite.py`; `test_skips_are_as_recorded` checks it.", "",
             "## Groups not compiled", "", "| file | group | reason |", "|---|---|---|"]
    for name in FILES:
        for gname, why in file_results(name)["group_skips"].items():
            lines.append(f"| {name} | {_cell(gname)} | {_cell(why)} |")
    lines += ["", "## Valid instances refused for a documented narrowing", "",
              "| file | group | instance | reason |", "|---|---|---|---|"]
    for name in FILES:
        for (gname, test), why in file_results(name)["instance_skips"].items():
            lines.append(f"| {name} | {_cell(gname)} | {_cell(test)} | {_cell(why)} |")
    lines += ["", "## Known bugs (`KNOWN_BUGS`, `test_known_bugs`)", "", "| file | group | bug |", "|---|---|---|"]
    lines += [f"| {name} | {_cell(gname)} | {_cell(bug)} |" for (name, gname), bug in KNOWN_BUGS.items()]
    counts = Counter()
    for name in FILES:
        counts.update(file_results(name)["counts"])
    lines += ["", "## Counts", ""] + [f"- {k}: {counts[k]}" for k in
                                        ("groups", "groups compiled", "groups skipped", "groups: known bug",
                                         "valid accepted", "valid skipped", "invalid refused",
                                         "invalid accepted: known bug")]
    return "\n".join(lines) + "\n"


def test_skips_are_as_recorded():
    recorded, computed = SKIPPED.read_text(encoding="utf-8").splitlines(), skip_table().splitlines()
    gone = [line for line in recorded if line not in computed]
    new = [line for line in computed if line not in recorded]
    assert not gone and not new, (
        "the suite's skips changed (rewrite tests/data/json-schema-test-suite/SKIPPED.md with "
        "`python tests/test_schema_suite.py`, and docs/json-schema.md's Conformance section):\n"
        + "\n".join(["recorded, no longer so:"] + gone + ["computed, not recorded:"] + new))


def test_docs_state_the_counts():
    counts = Counter()
    for name in FILES:
        counts.update(file_results(name)["counts"])
    docs = " ".join((Path(__file__).resolve().parents[1] / "docs" / "json-schema.md").read_text().split())
    said = (f"Of {counts['groups']} groups, {counts['groups compiled']} compile: {counts['valid accepted']} valid "
            f"instances are accepted and {counts['invalid refused']} invalid ones refused; "
            f"{counts['valid skipped']} valid")
    assert said in docs, f"docs/json-schema.md's Conformance section should say: {said}"


if __name__ == "__main__":
    SKIPPED.write_text(skip_table(), encoding="utf-8")
    print(f"wrote {SKIPPED}")
