"""Compiled JSON-Schema grammars against llguidance (the oracle) and jsonschema (the validator).

A walk feeds tokens chosen among our legal ones (strings pushed towards their caps, digits run
on towards the bounds) to both our table and an llguidance matcher of the same schema; at every
step our legal-token set must equal llguidance's, and never hold a token llguidance forbids.

The reference schema handed to llguidance states batchmask's documented semantics explicitly, so
that the two languages are the same: every object `additionalProperties: false`, the default caps
(SchemaOptions.max_string_length, max_items) written as maxLength/maxItems, pattern repetitions capped
at SchemaOptions.repeat_cap (docs/json-schema.md), and each `format`
written as the exact RFC 3339 / RFC 4122 regex that jsonschema's format checker accepts (leap
years, no second 60, no year 0; time fractions of any length, or up to SchemaOptions.fraction_digits digits):
llguidance's own format regexes are looser than jsonschema's.

Exceptions, each in a number state and each named where it is checked:
  NUMBER_CAPS        a token llguidance allows whose number runs past a digit cap the options set
                     (integer, fraction and exponent digits; none by default), or spells an exponent
                     in a bounded number (which has none);
  NEGATIVE_ZERO      a token llguidance allows that spells -0, -0.0, ... (docs/json-schema.md: bounded
                     numbers never write negative zero);
  LLG_NUMBER_RANGES  a token we allow that llguidance 1.9.1's bounded-number regexes refuse although the
                     value is in range (2.7 under maximum 2.75, 2.750, -0.186630): accepted only if
                     jsonschema validates our finish() completion after it.
No other difference is tolerated. llguidance runs with `no_forcing` (its default
narrows masks in forced stretches to one canonical tokenisation, which is not the language).

Every completed walk, and the finish() completion of a walk's prefix at each of its first 64 steps
and every 16th after, is validated by jsonschema with the format checker (and by batchmask.schema.validate).
"""
from __future__ import annotations

import json
import random
import re
import time
from functools import cache
from types import SimpleNamespace

import jsonschema
import numpy as np
import pytest
import torch
from data_paths import data_dir
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schema_strategies import closed, object_schemas, schemas

from batchmask.schema.validate import check, loads

llg = pytest.importorskip("llguidance")
CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER
WALK_SECONDS = 1.0


# --- vocabularies -------------------------------------------------------------------------------------
def _gpt2_alphabet() -> dict[str, int]:
    """GPT-2's byte-to-unicode table, inverted: printable character -> the byte it stands for."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars = list(keep)
    n = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars)}


@cache
def vocab(name: str):
    if name == "llama2":
        path = data_dir("llama2") / "tokenizer.model"
        if not path.exists():
            pytest.skip("../shared/llama2 not present")
        from batchmask.models.tokenizer import load_tokenizer
        tok = load_tokenizer(path)
        return SimpleNamespace(token_bytes=list(tok.token_bytes), eos_id=int(tok.eos_id),
                               stop_ids=tuple(getattr(tok, "stop_ids", (tok.eos_id,))))
    path = data_dir(name) / "tokenizer.json"
    if not path.exists():
        pytest.skip(f"../shared/{name} not present")
    data = json.loads(path.read_text(encoding="utf-8"))
    inv = _gpt2_alphabet()
    pieces = data["model"]["vocab"]
    V = max([*pieces.values(), *(t["id"] for t in data["added_tokens"])]) + 1
    token_bytes = [b""] * V
    for piece, i in pieces.items():
        token_bytes[i] = bytes(inv[c] for c in piece)
    for t in data["added_tokens"]:
        token_bytes[t["id"]] = b""           # specials carry no text
    eos = next(t["id"] for t in data["added_tokens"] if t["content"] == "<|endoftext|>")
    return SimpleNamespace(token_bytes=token_bytes, eos_id=eos, stop_ids=(eos,))


class _LLGTokens:
    """What llguidance.LLTokenizer reads from a TokenizerWrapper: raw token bytes, EOS, specials."""
    is_tokenizer_wrapper = True

    def __init__(self, v):
        self.tokens = list(v.token_bytes)
        self.eos_token_id = v.eos_id
        self.bos_token_id = None
        self.special_token_ids = [i for i, b in enumerate(v.token_bytes) if not b]

    def __call__(self, s):          # unused with no_forcing; llguidance falls back to greedy tokenisation
        return []


@cache
def llg_tokenizer(name: str):
    v = vocab(name)
    return llg.LLTokenizer(_LLGTokens(v), eos_token=list(v.stop_ids))


@cache
def token_kinds(name: str):
    """bool [V] each: tokens holding JSON structure, and tokens holding a backslash."""
    tb = vocab(name).token_bytes
    structural = np.array([any(c in b for c in b'",}]:{[') for b in tb])
    backslash = np.array([b"\\" in b for b in tb])
    return structural, backslash


# --- the reference schema ---------------------------------------------------------------------------
_YEAR = r"(?:[1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])"
_LEAP = r"(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_DATE = (rf"(?:{_YEAR}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
         rf"|02-(?:0[1-9]|1[0-9]|2[0-8]))|{_LEAP}-02-29)")


def _time(frac: int | None) -> str:
    fraction = r"(?:\.[0-9]+)?" if frac is None else rf"(?:\.[0-9]{{1,{frac}}})?" if frac > 0 else ""
    return rf"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]{fraction}(?:[zZ]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"


def format_patterns(options) -> dict[str, str]:
    t = _time(options.fraction_digits)
    return {"date": f"^{_DATE}$", "time": f"^{t}$", "date-time": f"^{_DATE}[tT]{t}$",
            "uuid": "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"}


TYPE_WORDS = {"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "minLength", "maxLength", "pattern",
              "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "items", "prefixItems",
              "minItems", "maxItems", "uniqueItems", "additionalItems", "properties", "required",
              "additionalProperties", "unevaluatedProperties", "patternProperties", "propertyNames",
              "minProperties", "maxProperties", "dependentRequired", "dependencies"}


def any_schema(options, depth: int) -> dict:
    """Any JSON value as batchmask bounds it (SchemaOptions: strings, items, map entries; any_depth levels of
    arrays and maps), written as an explicit schema for llguidance."""
    string = {"type": "string"}
    _put(string, "maxLength", options.max_string_length)
    branches = [{"type": "null"}, {"type": "boolean"}, {"type": "number"}, string]
    if depth > 0 and options.max_items != 0:
        inner = any_schema(options, depth - 1)
        array = {"type": "array", "items": inner}
        _put(array, "maxItems", options.max_items)
        obj = {"type": "object", "patternProperties": {_chars(0, options.max_string_length): inner},
               "additionalProperties": False}
        _put(obj, "maxProperties", options.max_items)
        branches += [array, obj]
    return {"anyOf": branches}


def _put(schema: dict, key: str, cap) -> None:
    """schema[key] = cap, where SchemaOptions has a cap (None: none, as batchmask writes it)."""
    if cap is not None:
        schema[key] = cap


def _chars(lo: int, hi) -> str:
    """The pattern of a string of lo..hi characters (hi None: no max)."""
    return "^[\\s\\S]{%d,%s}$" % (lo, "" if hi is None else hi)


def explicit(schema, options):
    """The schema with batchmask's implicit semantics written out (module docstring)."""
    if isinstance(schema, list):
        return [explicit(s, options) for s in schema]
    if schema is True or (isinstance(schema, dict) and not TYPE_WORDS & set(schema)):
        return any_schema(options, options.any_depth)
    if not isinstance(schema, dict):
        return schema
    if set(schema) & COUNTING and schema.get("properties") \
            and set(schema["properties"]) != set(schema.get("required", [])):
        return {"anyOf": [explicit(b, options) for b in _subset_branches(schema, options)]}
    out = {}
    for k, v in schema.items():
        if k in ("items", "anyOf", "oneOf", "allOf", "prefixItems", "not", "additionalItems"):
            v = explicit(v, options)
        elif k in ("properties", "$defs", "definitions"):
            v = {p: explicit(s, options) for p, s in v.items()}
        elif k == "patternProperties":         # keys read as a string of that pattern is (capped, anchored)
            v = _joined_patterns(v, options)
        out[k] = v
    types = schema.get("type")
    types = types if isinstance(types, list) else [types]
    out.pop("propertyNames", None)             # llguidance has none: written as the keys' pattern below
    if isinstance(schema.get("additionalProperties"), dict) and "properties" not in schema \
            and "patternProperties" not in schema:                                              # a map
        # keys of at most max_string_length characters, or propertyNames: as a pattern
        out["patternProperties"] = {names_pattern(schema.get("propertyNames", {}), options):
                                    explicit(schema["additionalProperties"], options)}
        out["additionalProperties"] = False
        _cap(out, schema, options, "maxProperties", "minProperties")
    elif "patternProperties" in schema and not schema.get("properties"):                       # a pattern map
        out["additionalProperties"] = False
        _cap(out, schema, options, "maxProperties", "minProperties")
    elif "object" in types or "properties" in schema:
        extra = schema.get("additionalProperties")      # true or a schema beside properties: keys beside them,
        beside = schema.get("properties") and (extra is True or isinstance(extra, dict)) and options.other_keys
        if beside:                                      # those whose first character starts no declared name
            firsts = "".join(sorted({re.escape(n[0]) for n in schema["properties"] if n}))
            rest = "*" if options.max_string_length is None else "{0,%d}" % (options.max_string_length - 1)
            key = ("^(?:[^%s][\\s\\S]%s)?$" % (firsts, rest)) if firsts else "^[\\s\\S]%s$" % rest
            out["patternProperties"] = {key: explicit(extra, options)}
        out["additionalProperties"] = False
    if ("string" in types or "minLength" in schema) and "maxLength" not in schema and "format" not in schema \
            and "pattern" not in schema and "enum" not in schema and "const" not in schema:
        if options.max_string_length is not None:
            out["maxLength"] = max(options.max_string_length, schema.get("minLength", 0))
    if ("array" in types or "items" in schema) and "items" not in schema and "prefixItems" not in schema:
        out["items"] = any_schema(options, options.any_depth)
    if "array" in types or "items" in schema:
        _cap(out, schema, options, "maxItems", "minItems")
    if "format" in schema:
        out.pop("format")
        out["pattern"] = format_patterns(options)[schema["format"]]
    elif "pattern" in schema:
        out["pattern"] = capped_pattern(schema["pattern"], schema.get("maxLength", options.repeat_cap),
                                        schema.get("maxLength", options.max_string_length))
    return out


def _cap(out: dict, schema: dict, options, most: str, least: str) -> None:
    """An array's or map's count as batchmask writes it: the schema's own bound, else SchemaOptions.max_items
    (None: no cap, as the schema says)."""
    if most in schema:
        out[most] = schema[most]
    elif options.max_items is not None:
        out[most] = max(options.max_items, schema.get(least, 0))


def _joined_patterns(patterns: dict, options) -> dict:
    """Patterns of equal schemas as one alternation (llguidance wants patternProperties disjoint)."""
    groups: dict = {}
    for p, sub in patterns.items():
        body = capped_pattern(p, options.repeat_cap, options.max_string_length)[1:-1]    # drop ^ and $
        groups.setdefault(json.dumps(sub, sort_keys=True), (sub, []))[1].append(body)
    return {"^(?:%s)$" % "|".join(bodies): explicit(sub, options) for sub, bodies in groups.values()}


COUNTING = {"minProperties", "maxProperties", "dependentRequired", "dependencies"}


def names_pattern(names: dict, options) -> str:
    """propertyNames as the pattern of its keys, for the forms the tests use: a pattern, an enum, lengths."""
    if "pattern" in names:
        return capped_pattern(names["pattern"], options.repeat_cap, options.max_string_length)
    if "enum" in names:
        return "^(?:%s)$" % "|".join(re.escape(v) for v in names["enum"] if isinstance(v, str))
    return _chars(names.get("minLength", 0), names.get("maxLength", options.max_string_length))


def _subset_branches(schema: dict, options) -> list[dict]:
    """An object of declared properties with counts or dependencies, as one branch per set of present properties
    (each branch's properties all required: llguidance counts properties only so), the free-key keywords kept."""
    props, required = schema["properties"], set(schema.get("required", []))
    deps = {**{k: v for k, v in schema.get("dependencies", {}).items() if isinstance(v, list)},
            **schema.get("dependentRequired", {})}
    optional = [p for p in props if p not in required]
    lo, hi = schema.get("minProperties", 0), schema.get("maxProperties")
    free = bool(schema.get("patternProperties"))
    out = []
    for mask in range(1 << len(optional)):
        present = required | {p for i, p in enumerate(optional) if mask >> i & 1}
        if any(a in present and not set(b) <= present for a, b in deps.items()):
            continue
        n = len(present)
        if (hi is not None and n > hi) or (not free and n < lo):
            continue
        branch = {k: v for k, v in schema.items() if k not in COUNTING | {"properties", "required"}}
        branch.update(type="object", properties={p: s for p, s in props.items() if p in present},
                      required=[p for p in props if p in present], additionalProperties=False)
        if free:
            branch.update(minProperties=lo)
            if hi is not None or options.max_items is not None:
                branch.update(maxProperties=hi if hi is not None else n + options.max_items)
        out.append(branch)
    return out


def _last_at_minimum(pattern: str) -> str:
    """A pattern without `$` whose last quantifier ({m,n} after the rewriting above, or ?) reads its minimum:
    re.search's reading, S{m,n} then anything is S{m} then anything (docs/json-schema.md), written so."""
    m = re.search(r"\{(\d+),(\d*)\}\??$|[?*+]\??$", pattern)
    if m is None:
        return pattern
    if m.group(0)[0] in "?*+":                           # X? or X* at the end: X{0}; X+: X{1}
        low, body = int(m.group(0)[0] == "+"), pattern[:m.start()]
    else:
        low, body = int(m.group(1)), pattern[:m.start()]
    return body + "{%d}" % low if low else _drop_last_atom(body)


def _drop_last_atom(pattern: str) -> str:
    """`pattern` without its last atom (a character, an escape, a [class] or a (group))."""
    if pattern.endswith(")"):
        depth = 0
        for i in range(len(pattern) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(pattern[i], 0)
            if depth == 0:
                return pattern[:i]
    if pattern.endswith("]"):
        return pattern[:pattern.rindex("[")]
    if len(pattern) >= 2 and pattern[-2] == "\\":
        return pattern[:-2]
    return pattern[:-1]


def capped_pattern(pattern: str, cap: int | None, free: int | None) -> str:
    """`*`, `+` and `{m,}` as at most `cap` repetitions (SchemaOptions.repeat_cap, or maxLength when given; None:
    as they are), \\d \\w \\s as ASCII classes, and a side without its anchor as up to `free` free characters
    (None: any number; re.search's reading): docs/json-schema.md.
    Plain text rewriting: enough for the test's patterns, which hold no escaped or bracketed quantifier and no
    top-level alternation."""
    if cap is not None:
        pattern = re.sub(r"\{(\d+),\}", lambda m: "{%s,%d}" % (m.group(1), max(cap, int(m.group(1)))), pattern)
        pattern = pattern.replace("*", "{0,%d}" % cap).replace("+", "{1,%d}" % cap)
    # \d \w \s are ASCII (docs/json-schema.md; Python's and llguidance's are Unicode): the test's patterns
    # use them outside classes only
    for esc, ascii_class in (("\\d", "[0-9]"), ("\\w", "[A-Za-z0-9_]"), ("\\s", "[ \\t\\n\\r\\f\\v]")):
        pattern = pattern.replace(esc, ascii_class)
    any_char = "[\\s\\S]*" if free is None else "[\\s\\S]{0,%d}" % free
    if not pattern.endswith("$"):
        pattern = _last_at_minimum(pattern)
    head = pattern[1:] if pattern.startswith("^") else any_char + pattern
    return "^" + (head[:-1] if head.endswith("$") else head + any_char) + "$"


def matcher(schema, name: str, options):
    """llguidance's matcher for `schema` (its documented JSON options: compact, no whitespace)."""
    grammar = json.loads(llg.LLMatcher.grammar_from_json_schema(
        explicit(schema, options), defaults={"whitespace_flexible": False, "item_separator": ",",
                                             "key_separator": ":"}))
    body = grammar["grammars"][0]["json_schema"]          # the schema with its x-guidance options
    lark = '%llguidance {"no_forcing": true}\nstart: %json ' + json.dumps(body)
    m = llg.LLMatcher(llg_tokenizer(name), lark, log_level=0)
    assert not m.is_error(), m.get_error()
    return m


def llg_allowed(m, V: int) -> np.ndarray:
    bits = np.unpackbits(np.frombuffer(m.compute_bitmask(), dtype=np.uint8), bitorder="little")
    return bits[:V].astype(bool)


# --- the exception ----------------------------------------------------------------------------------
_NUMBER_CHARS = set(b"-+.eE0123456789")
_NUMBER = re.compile(rb"-?([0-9]*)(?:\.([0-9]*))?(?:([eE])[+-]?([0-9]*))?")


def _in_string(text: bytes) -> bool:
    inside = escaped = False
    for c in text:
        if escaped:
            escaped = False
        elif inside and c == 0x5C:
            escaped = True
        elif c == 0x22:
            inside = not inside
    return inside


def number_caps_exceeded(text: bytes, token: bytes, options, exponent_here: bool = True) -> bool:
    """NUMBER_CAPS: `token` extends (or starts) a JSON number past our documented digit caps.

    `exponent_here`: whether we allow an exponent marker right now (a bounded number has none; an
    unbounded one has at most `exponent_digits` exponent digits)."""
    if _in_string(text):
        return False
    i, j = _number_edges(text, token)
    run = text[i:] + token[:j]
    m = _NUMBER.match(run)
    if not j or not m or m.end() < len(run):
        return False
    int_digits, frac, e, exp = m.group(1), m.group(2) or b"", m.group(3), m.group(4) or b""
    if _over(int_digits, options.int_digits) or _over(frac, options.fraction_digits):
        return True
    if e is None:
        return False
    started = bool(_NUMBER.match(text[i:]).group(3))        # the marker was already written (we allowed it)
    return _over(exp, options.exponent_digits) or (not started and not exponent_here)


def _over(digits: bytes, cap: int | None) -> bool:
    """More digits than a cap that is set (None, the default: no cap)."""
    return cap is not None and len(digits) > cap


def _number_run(text: bytes, token: bytes) -> bytes | None:
    """The JSON number `token` continues or starts (its number characters only), None outside a number."""
    if _in_string(text):
        return None
    i, j = _number_edges(text, token)
    run = text[i:] + token[:j]
    return run if run else None


def _number_edges(text: bytes, token: bytes) -> tuple[int, int]:
    """(where the number characters at the end of `text` start, how many `token` starts with)."""
    i = len(text)
    while i > 0 and text[i - 1] in _NUMBER_CHARS:
        i -= 1
    j = 0
    while j < len(token) and token[j] in _NUMBER_CHARS:
        j += 1
    return i, j


def negative_zero(text: bytes, token: bytes) -> bool:
    """NEGATIVE_ZERO (docs/json-schema.md): a bounded number never writes -0, -0.0, ...; llguidance may."""
    run = _number_run(text, token)
    return run is not None and re.fullmatch(rb"-0(\.0*)?", run) is not None


def llg_range_gap(g, state: int, text: bytes, tok: int, token: bytes, schema) -> bool:
    """LLG_NUMBER_RANGES: llguidance 1.9.1's bounded-number regexes refuse some in-range spellings (2.7 under
    maximum 2.75, a fraction ending in 0 such as 2.750 or -0.186630, 1000.0 for const 1000.0). A token we
    allow there is accepted only in a number and only if jsonschema validates its completion by our finish()."""
    if _number_run(text, token) is None and not (text and text[-1] in _NUMBER_CHARS and not _in_string(text)):
        return False
    nxt = int(g.next_state([state], [tok])[0])
    try:
        validate_value(text + token + g.finish_bytes(nxt), schema)
    except (AssertionError, ValueError, jsonschema.ValidationError):
        return False
    return True


# --- the walk -----------------------------------------------------------------------------------------
def walk(*args, **kw):
    """One walk: our set == llguidance's (but for NUMBER_CAPS) at every step. Returns the bytes written."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)         # one small gather per step: a second thread only spins (a shared CPU)
    try:
        return _walk(*args, **kw)
    finally:
        torch.set_num_threads(threads)


def _walk(g, m, name: str, schema, options, rng: random.Random, push: float, steer: bytes = b"",
          finish_at: int | None = None, max_steps: int = 3000, close_after: int = 400):
    v = vocab(name)
    V = len(v.token_bytes)
    structural, backslash = token_kinds(name)
    is_stop = np.isin(np.arange(V), list(v.stop_ids))
    e_ids = [i for i, b in enumerate(v.token_bytes) if b in (b"e", b"E")]
    state, text, t0 = g.start, b"", time.perf_counter()
    for step in range(max_steps):
        ours = g.allowed([state])[0].cpu().numpy()
        theirs = llg_allowed(m, V)
        extra = [t for t in np.flatnonzero(ours & ~theirs).tolist()
                 if not llg_range_gap(g, state, text, t, v.token_bytes[t], schema)]
        assert not extra, (f"step {step} after {text[-60:]!r}: we allow {len(extra)} tokens llguidance "
                           f"forbids, e.g. {[v.token_bytes[t] for t in extra[:6]]}")
        exponent_here = bool(ours[e_ids].any())
        missing = [t for t in np.flatnonzero(theirs & ~ours).tolist()
                   if not number_caps_exceeded(text, v.token_bytes[t], options, exponent_here)
                   and not negative_zero(text, v.token_bytes[t])]
        assert not missing, (f"step {step} after {text[-60:]!r}: llguidance allows {len(missing)} tokens we do not, "
                             f"e.g. {[v.token_bytes[t] for t in missing[:6]]}")
        assert ours.any(), f"step {step}: no legal token after {text!r}"
        if step < 64 or step % 16 == 0 or step == finish_at:    # finish() from (nearly) every prefix
            validate_value(text + g.finish_bytes(state), schema)
        stop_here = np.flatnonzero(ours & theirs & is_stop)
        if len(stop_here) and (len(stop_here) == int((ours & theirs).sum()) or rng.random() < 0.3):
            assert bool(m.consume_token(int(stop_here[0])))
            assert m.is_accepting() or m.is_stopped()
            return text
        pool = ours & theirs & ~is_stop       # bool [V]; both sides must take it (see LLG_NUMBER_RANGES)
        if step >= close_after:               # long enough (values have no cap): towards the shortest completion
            owed = g.finish_bytes(state)
            fit = [t for t in np.flatnonzero(pool).tolist() if v.token_bytes[t] and owed.startswith(v.token_bytes[t])]
            if fit:
                pool = np.isin(np.arange(V), max(fit, key=lambda t: len(v.token_bytes[t])))
        elif steer and len(text) < len(steer):
            fit = [t for t in np.flatnonzero(pool).tolist() if steer.startswith((text + v.token_bytes[t])[:len(steer)])]
            pool = np.isin(np.arange(V), fit) if fit else pool
        elif time.perf_counter() - t0 < WALK_SECONDS and rng.random() < push:
            cont = pool & ~structural
            if cont.any() and rng.random() < 0.1 and (cont & backslash).any():
                cont = cont & backslash
            pool = cont if cont.any() else pool
        pool = np.flatnonzero(pool)
        if not len(pool):                   # only LLG_NUMBER_RANGES tokens left: llguidance cannot follow us
            return text + g.finish_bytes(state)
        tok = int(pool[rng.randrange(len(pool))])
        nxt = int(g.next_state([state], [tok])[0])
        assert nxt >= 0
        assert m.consume_token(tok), f"llguidance refused {v.token_bytes[tok]!r} after {text[-40:]!r}"
        state, text = nxt, text + v.token_bytes[tok]
    raise AssertionError(f"walk did not finish in {max_steps} steps: {text[:80]!r}...")


def validate_value(data: bytes, schema):
    value = json.loads(data.decode("utf-8"))
    jsonschema.Draft202012Validator(closed(schema), format_checker=CHECKER).validate(value)
    assert check(loads(data.decode("utf-8")), schema) is None


def walks_agree(schema, options, name: str = "gpt2", seed: int = 0, walks: int = 6, max_finish: int = 10) -> None:
    """`walks` walks through `schema`'s grammar, token by token against llguidance told the same caps (half of
    them pushed towards the caps), each finished value validated: the check the feature tests share."""
    from batchmask.api import compile_json_schema
    g = compile_json_schema(schema, vocab(name), options=options)
    rng = random.Random(seed)
    for k in range(walks):
        text = walk(g, matcher(schema, name, options), name, schema, options, rng, push=0.9 * (k % 2),
                    finish_at=rng.randint(0, max_finish))
        validate_value(text, schema)


# --- tests ----------------------------------------------------------------------------------------------
def _api():
    api = pytest.importorskip("batchmask.api")
    schema = pytest.importorskip("batchmask.schema.build")
    from batchmask.compiler import compiled as compiler
    if not hasattr(compiler, "compile_node"):
        pytest.skip("compiler.compile_node not available yet")
    return api, schema


@pytest.mark.parametrize("name", ["gpt2", "llama2"])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_schemas_match_llguidance(name, data):
    api, sch = _api()
    schema = data.draw(st.one_of(schemas(), object_schemas()))
    options = sch.SchemaOptions()
    g = api.compile_json_schema(schema, vocab(name), options=options)
    rng = random.Random(data.draw(st.integers(0, 2**32)))
    for push in (0.0, 0.95):           # short values, then values pushed to their caps
        finish_at = rng.randint(0, 12)
        text = walk(g, matcher(schema, name, options), name, schema, options, rng, push, finish_at=finish_at)
        validate_value(text, schema)


def catalogue():
    return json.loads((data_dir("tools") / "agent_tools.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", ["gpt2", "llama2"])
def test_catalogue_calls_match_llguidance(name):
    api, sch = _api()
    from batchmask.tools.envelope import call_schema, get_envelope, is_typed
    from batchmask.tools.registry import ToolRegistry
    registry = ToolRegistry.from_obj(catalogue(), source="agent_tools.json")
    typed = [t for t in registry if is_typed(t)]
    if not typed:
        pytest.skip("typed registries not available yet")
    options = sch.SchemaOptions()
    g = api.compile_grammar(registry, vocab(name), format="json", options=options)
    schema = call_schema(registry, "json")
    env = get_envelope("json")
    rng = random.Random(1 if name == "gpt2" else 2)
    for i, tool in enumerate(typed):
        if i % 2 != (name == "llama2"):          # each vocabulary walks half the tools (both halves are covered)
            continue
        push = 0.95 if i % 4 < 2 else 0.3
        text = walk(g, matcher(schema, name, options), name, schema, options, rng, push,
                    steer=env.head(tool.name), finish_at=rng.randint(10, 40))
        validate_value(text, schema)
        assert json.loads(text)["name"] == tool.name


def test_number_caps_exception_is_narrow():
    """The exception covers digits past the caps, and nothing else."""
    opts = SimpleNamespace(int_digits=3, fraction_digits=2, exponent_digits=1)
    assert number_caps_exceeded(b'{"a":12', b"34", opts)
    assert number_caps_exceeded(b'{"a":1.5', b"55", opts)
    assert not number_caps_exceeded(b'{"a":1.5', b"5", opts)
    assert not number_caps_exceeded(b'{"a":12', b"3", opts)
    assert not number_caps_exceeded(b'{"a":"12', b"34", opts)          # inside a string
    assert not number_caps_exceeded(b'{"a":12', b',"b"', opts)        # not a digit
    assert number_caps_exceeded(b'{"a":1', b"e5", opts, exponent_here=False)     # a bounded number: no exponent
    assert not number_caps_exceeded(b'{"a":1', b"e5", opts, exponent_here=True)
    assert number_caps_exceeded(b'{"a":1e5', b"5", opts)                          # past exponent_digits
    free = SimpleNamespace(int_digits=None, fraction_digits=None, exponent_digits=None)   # the defaults: no cap
    assert not number_caps_exceeded(b'{"a":' + b"1" * 40, b"1234", free)
    assert not number_caps_exceeded(b'{"a":1.' + b"5" * 40, b"55", free)
    assert not number_caps_exceeded(b'{"a":1e' + b"5" * 40, b"5", free)
    assert number_caps_exceeded(b'{"a":1', b"e5", free, exponent_here=False)
