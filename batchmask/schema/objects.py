"""The `object` type's builder: declared properties, entries of free keys, and the keywords that count or relate keys.

An object is written `{`, its declared `properties` in declared order (each optional one present or absent),
then entries of free keys:
    patternProperties     a key of pattern P (a JSON string its `pattern` generates, schema/regex.py) and a value
                          of P's schema; patterns whose keys may match another pattern of a different schema are
                          refused (schema/overlap.py proves disjointness), as is a declared name one matches
                          (unless the schemas are equal and no pattern key can repeat it), and an
                          `additionalProperties` schema beside them (its keys would be the patterns' complement)
    additionalProperties  `true` or a schema, no `patternProperties`: without `properties` a map, keys any JSON
                          string (or `propertyNames`'); beside them, keys whose first character starts no declared
                          name (narrowed, `_other_keys`; with `propertyNames` too: none); absent or false: none
    propertyNames         the keys' string schema (met with each pattern; declared names it refuses never written)
Free keys are not kept distinct (duplicate names are JSON; a reader takes the last), so they count towards
`minProperties` at most once: a minimum that needs two free keys is refused. `minProperties` / `maxProperties`
count declared and free keys; `dependentRequired` (and draft 7's `dependencies` with lists) make a declared
property's presence require others'. Counts and dependencies are written as a chain over the declared properties
whose state is (properties so far, properties owed, properties barred), at most MAX_STATES states, else refused.
"""
from __future__ import annotations

import re

from ..grammar.nodes import JsonStr, Node, Repeat
from .base import ITEMS_CEILING, Ctx, Empty, count, is_annotation
from .base import ptr as jp
from .json_values import json_equal, json_literal
from .nodes import alt, lit, node_accepts, opt, seq
from .overlap import disjoint
from .regex import PatternError, pattern_node
from .siblings import merge
from .strings import char_node, complement

MAX_STATES = 4096                 # chain states of one object's counts and dependencies
_PLAIN_NAMES = {"type", "pattern", "minLength", "maxLength", "enum", "const"}


def object_node(schema: dict, ptr: str, ctx: Ctx, inner: Ctx) -> Node:
    props = schema.get("properties", {})
    if not isinstance(props, dict):
        ctx.fail(jp(ptr, "properties"), "'properties' must be an object")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        ctx.fail(jp(ptr, "required"), "'required' must be a list of property names")
    for i, r in enumerate(required):
        if r not in props:
            ctx.fail(jp(ptr, "required", i), f"required property {r!r} is not among 'properties' "
                                               "(its value would be unconstrained)")
        if required.index(r) != i:
            ctx.fail(jp(ptr, "required", i), f"required property {r!r} is listed twice")
    extra = schema.get("additionalProperties")
    if extra is not None and not isinstance(extra, (bool, dict)):
        ctx.fail(jp(ptr, "additionalProperties"), "'additionalProperties' must be a boolean or a schema")
    if extra is None and ctx.options.open_objects:
        extra = True                                      # the specification's reading (SchemaOptions.open_objects)
    patterns = schema.get("patternProperties", {})
    if not isinstance(patterns, dict):
        ctx.fail(jp(ptr, "patternProperties"), "'patternProperties' must be an object of schemas")
    if not (isinstance(extra, dict) and not props and not patterns) \
            and schema.get("unevaluatedProperties", False) is not False:
        ctx.unwritten(jp(ptr, "unevaluatedProperties"), "unevaluatedProperties",
                      "only 'unevaluatedProperties': false is supported")
    lo = count(schema, "minProperties", ptr, ctx) or 0
    hi = count(schema, "maxProperties", ptr, ctx)
    if hi is not None and lo > hi:
        raise Empty(jp(ptr, "minProperties"), f"minProperties {lo} > maxProperties {hi}")
    names = _names_schema(schema, ptr, ctx)
    deps = _dependencies(schema, ptr, ctx)
    free = _free_entries(schema, patterns, extra, props, names, ptr, ctx, inner)
    members = []                                          # (name, required, key+value node), declared order
    for name, sub in props.items():
        need = name in required
        _check_declared(name, sub, patterns, free, ptr, ctx)     # before its value: one never written counts too
        ok = names is not False and _name_ok(name, names, ptr, ctx)
        try:
            if not ok:
                raise Empty(jp(ptr, "propertyNames"), f"property name {name!r} does not meet 'propertyNames'")
            value = ctx.build(sub, jp(ptr, "properties", name), inner)
        except Empty:
            if need:
                raise
            continue                                      # an optional property no value fits: never present
        members.append((name, need, seq(lit(json_literal(name) + ctx.key_sep), value)))
    if not (lo or hi is not None or deps or free):
        return _plain(members, ctx)
    return _chain(members, free, lo, hi, deps, schema, ptr, ctx)


def _plain(members, ctx: Ctx) -> Node:
    """Declared properties only, no counts: the first member present has no separator before it (one branch per
    candidate first member, up to the first required one), each followed by the shared pieces of the rest."""
    sep = lit(ctx.item_sep)
    pieces = [seq(sep, kv) if need else opt(seq(sep, kv)) for _, need, kv in members]
    firsts = [lit(b"")] if not any(need for _, need, _ in members) else []
    for j, (_, need, kv) in enumerate(members):
        firsts.append(seq(kv, *pieces[j + 1:]))
        if need:
            break
    return seq(lit(b"{"), alt(*firsts), lit(b"}"))


# --- keys -------------------------------------------------------------------------------------------
def _names_schema(schema: dict, ptr: str, ctx: Ctx):
    """The schema of every key: `propertyNames` met with a string type (False: no key is possible)."""
    given = schema.get("propertyNames", True)
    if not isinstance(given, (bool, dict)):
        ctx.fail(jp(ptr, "propertyNames"), "'propertyNames' must be a schema")
    merged = merge({"type": "string"}, given)
    if merged is None:
        ctx.fail(jp(ptr, "propertyNames"), "'propertyNames' cannot be read as a string schema")
    return merged


def _name_ok(name: str, names: dict, ptr: str, ctx: Ctx) -> bool:
    """Whether a declared name meets `propertyNames`: read directly for its plain keywords (re.search, lengths,
    values), else by the key node (within the caps)."""
    if set(names) <= _PLAIN_NAMES:
        n, at = len(name), jp(ptr, "propertyNames")
        low, high = count(names, "minLength", at, ctx), count(names, "maxLength", at, ctx)
        return ((low is None or n >= low) and (high is None or n <= high)
                and ("pattern" not in names or _search(names["pattern"], name, at, ctx))
                and ("enum" not in names or any(json_equal(name, v) for v in names["enum"]))
                and ("const" not in names or json_equal(name, names["const"])))
    try:
        return node_accepts(ctx.build(names, jp(ptr, "propertyNames"), ctx), json_literal(name))
    except Empty:
        return False


def _search(pattern, name: str, at: str, ctx: Ctx) -> bool:
    try:
        return re.search(pattern, name) is not None
    except (re.error, TypeError) as e:
        ctx.fail(at, f"pattern {pattern!r} is not a regular expression: {e}")


def _free_entries(schema, patterns: dict, extra, props: dict, names, ptr: str, ctx: Ctx, inner: Ctx) -> list:
    """[(pattern or None, key node, value node)]: the kinds of entry with a free key."""
    if names is False:
        return []
    if not patterns:
        if extra is None or extra is False:
            return []                                     # closed (the default reading of an absent one)
        if props and names != {"type": "string"}:
            return []                                     # narrowed: propertyNames beside declared properties
        if props and not ctx.options.other_keys:          # the compile's retry (api.py): noted, in either mode
            ctx.narrow(jp(ptr, "additionalProperties"), "additionalProperties")
            return []
        try:
            key = _other_keys(props, ctx) if props else ctx.build(names, jp(ptr, "propertyNames"), ctx)
            return [] if key is None else [(None, key, ctx.build(extra, jp(ptr, "additionalProperties"), inner))]
        except Empty:
            return []
    if isinstance(extra, dict) and not all(is_annotation(k) for k in extra):
        ctx.unwritten(jp(ptr, "additionalProperties"), "patternProperties",
                      "'additionalProperties' as a schema beside 'patternProperties' "
                      "is not supported (its keys, those no pattern matches, cannot be written exactly)")
    o = ctx.options
    wide = {}                                             # pattern -> the node of every key it matches
    for p, sub in patterns.items():
        at = jp(ptr, "patternProperties", p)
        if not isinstance(sub, (bool, dict)):
            ctx.fail(at, "a patternProperties value must be a schema")
        try:
            wide[p] = seq(lit(b'"'), pattern_node(p, o.repeat_cap, o.max_string_length, search=True)[0], lit(b'"'))
        except PatternError as e:
            ctx.unwritten(at, "patternProperties", f"pattern {p!r} {e}")
    out = []
    for p, sub in patterns.items():
        key_schema = merge(names, {"pattern": p})
        if key_schema is None:
            ctx.unwritten(jp(ptr, "propertyNames"), "propertyNames",
                          f"'propertyNames' with a pattern of its own beside patternProperties "
                          f"{p!r} is not supported")
        try:
            key = ctx.build(key_schema, jp(ptr, "propertyNames" if "propertyNames" in schema else "patternProperties",
                                           *(() if "propertyNames" in schema else (p,))), ctx)
            value = ctx.build(sub, jp(ptr, "patternProperties", p), inner)
        except Empty:
            continue                                      # no key or no value: never written
        for q, other in patterns.items():
            if q != p and not json_equal(sub, other) and disjoint(key, wide[q]) is not True:
                ctx.unwritten(jp(ptr, "patternProperties", q), "patternProperties",
                              f"keys of pattern {p!r} may also match pattern {q!r}, whose "
                              "schema differs (such a key must meet both): not supported")
        out.append((p, key, value))
    return out


def writes_other_keys(schema, open_objects: bool = False) -> bool:
    """Whether `schema` (any subschema of it) declares properties beside an `additionalProperties` of `true` or a
    schema (or none, read open): keys beside them are written (SchemaOptions.other_keys), at every place an
    optional property may end."""
    if isinstance(schema, dict):
        extra = schema.get("additionalProperties", True if open_objects else None)
        if isinstance(schema.get("properties"), dict) and schema["properties"] and (extra is True or
                                                                                     isinstance(extra, dict)):
            return True
        return any(writes_other_keys(v, open_objects) for v in schema.values())
    return isinstance(schema, list) and any(writes_other_keys(v, open_objects) for v in schema)


def _other_keys(declared: dict, ctx: Ctx) -> Node | None:
    """The keys of `additionalProperties` beside declared properties, quotes included (None: none), narrowed to
    those whose first character starts no declared name (and the empty key, unless declared). No such key is a
    declared name, in any spelling (char_node writes a character only as itself), and the automaton tells the
    two kinds apart at that first character: an exact "any string but these names" would carry every name's
    spelling through a free string at every key position of the object, thousands of tokens legal in each."""
    firsts = [(ord(n[0]), ord(n[0])) for n in declared if n]
    first = char_node(complement(firsts))
    cap = ctx.options.max_string_length
    body = [] if "" in declared else [lit(b"")]
    if first is not None:
        body.append(seq(first, JsonStr(0, None if cap is None else max(cap - 1, 0))))
    return seq(lit(b'"'), alt(*body), lit(b'"')) if body else None


def _check_declared(name: str, sub, patterns: dict, free: list, ptr: str, ctx: Ctx) -> None:
    """A declared name a pattern matches: its value meets both schemas only if they are equal, and then no
    pattern key may write the name again."""
    for p, other in patterns.items():
        at = jp(ptr, "patternProperties", p)
        if not _search(p, name, at, ctx):
            continue
        repeated = any(node_accepts(key, json_literal(name)) for _, key, _ in free)
        if not json_equal(sub, other) or repeated:
            ctx.unwritten(at, "patternProperties",
                          f"property {name!r} matches pattern {p!r} (its value would have to meet both schemas, "
                          "or a pattern key could repeat it): not supported")


# --- counts and dependencies ------------------------------------------------------------------------
def _dependencies(schema: dict, ptr: str, ctx: Ctx) -> dict[str, list[str]]:
    """name -> the names its presence requires, from `dependentRequired` and draft 7's `dependencies` lists."""
    out: dict[str, list[str]] = {}
    for kw in ("dependentRequired", "dependencies"):
        given = schema.get(kw, {})
        if not isinstance(given, dict):
            ctx.fail(jp(ptr, kw), f"{kw!r} must be an object")
        for name, needs in given.items():
            if kw == "dependencies" and isinstance(needs, (bool, dict)):
                ctx.unwritten(jp(ptr, kw, name), kw, "'dependencies' with a schema (dependentSchemas) is not supported")
            if not isinstance(needs, list) or not all(isinstance(n, str) for n in needs):
                ctx.fail(jp(ptr, kw, name), f"{kw!r} values must be lists of property names")
            out.setdefault(name, []).extend(n for n in needs if n != name and n not in out.get(name, []))
    return {k: v for k, v in out.items() if v}


def _chain(members: list, free: list, lo: int, hi, deps: dict, schema: dict, ptr: str, ctx: Ctx) -> Node:
    kw = next((k for k in ("minProperties", "maxProperties", "dependentRequired", "dependencies") if k in schema),
              "patternProperties")
    index = {name: i for i, (name, _, _) in enumerate(members)}
    for name in sorted({n for src, needs in deps.items() for n in (src, *needs)} - set(index)):
        if any(node_accepts(key, json_literal(name)) for _, key, _ in free):
            dkw = next(k for k in ("dependentRequired", "dependencies") if any(
                name == src or name in needs for src, needs in schema.get(k, {}).items()))
            ctx.unwritten(jp(ptr, dkw), dkw, f"{dkw!r} names {name!r}, which a free key may be: not supported")
    barred = {src for src, needs in deps.items() if any(n not in index for n in needs)}   # needs a name never there
    need = {name for name, req, _ in members if req}
    while True:                                           # what required and barred properties imply
        more_need = {n for src in need for n in deps.get(src, [])} - need
        more_barred = {src for src, needs in deps.items() if set(needs) & barred} - barred
        if not more_need and not more_barred:
            break
        need |= more_need
        barred |= more_barred
    if need - set(index) or need & barred:
        dkw = next((k for k in ("dependentRequired", "dependencies") if k in schema), "required")
        raise Empty(jp(ptr, dkw), "a required property (or one its presence requires) can never be present")
    if free and lo - len(need) >= 2:
        ctx.unwritten(jp(ptr, "minProperties"), "minProperties",
                      f"minProperties {lo} needs at least {lo - len(need)} free keys, which "
                      "cannot be kept distinct: only a minimum that one free key reaches is supported")
    o, sep = ctx.options, lit(ctx.item_sep)
    top = hi + 1 if hi is not None else max(lo, 1)        # counts are kept exactly up to here
    entry = alt(*(seq(k, lit(ctx.key_sep), v) for _, k, v in free)) if free else None
    later = {name: {src for src, needs in deps.items() if name in needs and index.get(src, -1) > i}
             for name, i in index.items()}                # absent: these later ones may not come

    def end(c: int) -> Node | None:
        f_lo = max(lo - c, 0)
        f_hi = 0 if entry is None else (min(hi, ITEMS_CEILING) - c if hi is not None else
                                        None if o.max_items is None else max(o.max_items, f_lo))
        if f_hi is not None and f_lo > f_hi:              # f_hi None: free keys without a cap (a loop)
            return None
        if f_hi == 0:
            return lit(b"")
        if c == 0:
            rest = lit(b"") if f_hi == 1 else Repeat(seq(sep, entry), 0, None if f_hi is None else f_hi - 1)
            return alt(*([lit(b"")] if f_lo == 0 else []), seq(entry, rest))
        return Repeat(seq(sep, entry), f_lo, f_hi)

    memo: dict = {}

    def tail(i: int, c: int, owed: frozenset, bars: frozenset) -> Node | None:
        key = (i, c, owed, bars)
        if key in memo:
            return memo[key]
        if len(memo) >= MAX_STATES:
            ctx.unwritten(jp(ptr, kw), kw,
                          f"writing {kw!r} exactly over these {len(members)} properties needs more than "
                          f"{MAX_STATES} states: not supported")
        memo[key] = None
        if i == len(members):
            memo[key] = end(c)
            return memo[key]
        name = members[i][0]
        kv = members[i][2]
        options = []
        if name not in need and name not in owed:             # absent
            r = tail(i + 1, c, owed, (bars | later[name]) - {name})
            if r is not None:
                options.append(r)
        if name not in barred and name not in bars and (hi is None or c < hi):    # present
            mine = frozenset(n for n in deps.get(name, []) if index[n] > i)
            r = tail(i + 1, min(c + 1, top), (owed | mine) - {name}, bars)
            if r is not None:
                options.append(seq(sep if c else lit(b""), kv, r))
        memo[key] = alt(*options) if options else None
        return memo[key]

    body = tail(0, 0, frozenset(), frozenset())
    if body is None:
        said = [k for k in ("minProperties", "maxProperties", "dependentRequired", "dependencies") if k in schema]
        raise Empty(jp(ptr, kw), f"no object of these properties meets {', '.join(said) or kw}")
    return seq(lit(b"{"), body, lit(b"}"))
