"""Envelopes: how a call wraps a tool's name and arguments, as data rather than code paths.

An envelope is one template with separators:

    PREFIX { "NAME_KEY" KSEP "TOOL" ISEP "ARGS_KEY" KSEP ARGUMENTS } SUFFIX

where ISEP/KSEP are the item and key separators (as in `json.dumps(separators=...)`), applied to
the envelope and to the arguments object alike. The formats:

    seed    {"tool":"calc","args":{"expr":"1+2"}}           the seed's protocol
    json    {"name":"calc","arguments":{"expr":"1+2"}}      the OpenAI / Hermes body
    llama3  {"name": "calc", "parameters": {"expr": "1+2"}}     Llama 3.1 / 3.2's JSON tool calls
    hermes  <tool_call>\n{"name": "calc", "arguments": {"expr": "1+2"}}\n</tool_call>   Hermes, Qwen2.5

A later format is one more `Envelope(...)` entry in ENVELOPES. The fixed text (prefix, keys, suffix) may be
written by any tokens whose bytes spell it, a model's own added tokens included (Qwen2.5's `<tool_call>` is
one added, non-special token: its bytes are its text); after the call only the tokenizer's stop ids are legal.

`registry_node` turns a registry into one grammar node (an Alt over its tools, in registry
order: `finish` breaks ties towards the first). Native tools keep the seed's semantics exactly
(required string arguments in declaration order, the seed's byte rule, 1..max_string bytes);
typed tools (`Tool.parameters`, a JSON Schema) get `schema.schema_node` of their parameters.
`Envelope.parse` is the inverse of the template, independent of the grammar.
"""
from __future__ import annotations

import json
import pickle
from collections import OrderedDict
from dataclasses import dataclass, replace

from ..grammar.nodes import Alt, Lit, Seq, Str
from ..schema.json_values import integer_literal
from ..schema.nodes import seq
from .registry import Tool, ToolRegistry


class CallError(ValueError):
    """Text is not a call of this envelope (the message says why)."""


# --- the template ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Envelope:
    format: str                              # the name `--format` takes
    name_key: str                            # key of the tool name
    args_key: str                            # key of the arguments object
    separators: tuple[str, str] = (",", ":")  # (item, key), as json.dumps
    prefix: str = ""                         # text before the JSON body
    suffix: str = ""                         # text after it

    def _key(self, key: str) -> str:
        return json.dumps(key, ensure_ascii=False) + self.separators[1]

    def head(self, tool_name: str) -> bytes:
        """Everything before the arguments object, for one tool."""
        return (self.prefix + "{" + self._key(self.name_key) + json.dumps(tool_name, ensure_ascii=False)
                + self.separators[0] + self._key(self.args_key)).encode("utf-8")

    def tail(self) -> bytes:
        """Everything after the arguments object."""
        return ("}" + self.suffix).encode("utf-8")

    def render(self, tool_name: str, args: dict) -> str:
        """A call in exactly the form the grammar writes (keys in the order given)."""
        body = json.dumps({self.name_key: tool_name, self.args_key: args}, separators=self.separators,
                          ensure_ascii=False)
        return self.prefix + body + self.suffix

    def parse(self, text: str) -> tuple[str, object]:
        """(tool name, arguments) from `text`, or CallError. Strict JSON: no NaN/Infinity, no repeated key."""
        if not text.startswith(self.prefix):
            raise CallError(f"does not start with {self.prefix!r}")
        if not text.endswith(self.suffix) or len(text) < len(self.prefix) + len(self.suffix):
            raise CallError(f"does not end with {self.suffix!r}")
        body = text[len(self.prefix): len(text) - len(self.suffix)]
        try:
            obj = json.loads(body, object_pairs_hook=no_repeated_keys, parse_constant=_no_constant,
                             parse_int=integer_literal)          # 4300+ digits: an integral Decimal
        except (json.JSONDecodeError, TypeError) as e:
            raise CallError(f"not JSON: {e}") from None
        except CallError:
            raise
        if not isinstance(obj, dict) or set(obj) != {self.name_key, self.args_key}:
            raise CallError(f"not an object with exactly the keys {self.name_key!r} and {self.args_key!r}")
        return obj[self.name_key], obj[self.args_key]


def no_repeated_keys(pairs):
    obj = {}
    for k, v in pairs:
        if k in obj:
            raise CallError(f"not JSON: key {k!r} repeated in one object")
        obj[k] = v
    return obj


def _no_constant(name):
    raise CallError(f"not JSON: {name} is not a JSON value")


ENVELOPES: dict[str, Envelope] = {
    "seed": Envelope("seed", "tool", "args"),
    "json": Envelope("json", "name", "arguments"),
    # the formats instruct models were trained on, spaced as json.dumps' defaults (", " and ": ")
    "llama3": Envelope("llama3", "name", "parameters", (", ", ": ")),                     # Llama 3.1 / 3.2
    "hermes": Envelope("hermes", "name", "arguments", (", ", ": "), "<tool_call>\n", "\n</tool_call>"),  # Qwen2.5
}
FORMATS = tuple(ENVELOPES)


def get_envelope(format: str) -> Envelope:
    try:
        return ENVELOPES[format]
    except (KeyError, TypeError):
        raise ValueError(f"unknown call format {format!r} (expected one of {', '.join(ENVELOPES)})") from None


# --- registry -> one grammar node ----------------------------------------------------------------
def is_typed(tool: Tool) -> bool:
    """A tool defined by a JSON Schema (as opposed to the seed's native argument list)."""
    return getattr(tool, "parameters", None) is not None


def native_args_node(tool: Tool, max_string: int, separators: tuple[str, str] = (",", ":")):
    """The seed's arguments object: each required arg a string of 1..max_string body bytes, in order."""
    item, key = separators
    names = [a.name for a in tool.required_args]
    if not names:
        return Lit(b"{}")
    parts: list = []
    for i, name in enumerate(names):
        opener = ("{" if i == 0 else '"' + item) + json.dumps(name, ensure_ascii=False) + key + '"'
        parts += [Lit(opener.encode("utf-8")), Str(1, max_string)]
    parts.append(Lit(b'"}'))
    return Seq(tuple(parts))


# Typed tools' argument nodes, by (parameters, options, separators): tool sets drawn from one catalogue
# share their tools, and a node is immutable. Kept with the schema's lenient relaxations, said again on a hit.
# Keyed by the pickled parameters (equal bytes: equal JSON values, types included); `where` only names errors,
# which are not kept. A few hundred entries.
_ARGS_CACHE: OrderedDict = OrderedDict()
ARGS_CACHE_SIZE = 512


def args_node(tool: Tool, envelope: Envelope, max_string: int, options, source: str = "<registry>"):
    if not is_typed(tool):
        return native_args_node(tool, max_string, envelope.separators)
    from ..schema.base import collect, report
    from ..schema.build import schema_node
    where = f"{source}: tool {tool.name!r} parameters"
    try:
        key = (pickle.dumps(tool.parameters, protocol=pickle.HIGHEST_PROTOCOL), options, tuple(envelope.separators))
        hash(key)
    except Exception:                 # not picklable or options not hashable: build it, keep nothing
        key = None
    got = _ARGS_CACHE.pop(key, None) if key is not None else None
    if got is None:
        with collect() as relaxed:
            node = schema_node(tool.parameters, options, separators=envelope.separators, where=where)
        got = node, tuple(relaxed)
        report(relaxed)                                   # to the collector of the caller (its grammar)
    else:
        report([replace(r, where=where) for r in got[1]])  # the same relaxations, named for this tool
    node = got[0]
    if key is not None:
        _ARGS_CACHE[key] = got                          # newest last; the oldest go past ARGS_CACHE_SIZE
        while len(_ARGS_CACHE) > ARGS_CACHE_SIZE:
            _ARGS_CACHE.popitem(last=False)
    return node


def registry_node(registry: ToolRegistry, format: str = "seed", max_string: int = 256, options=None):
    """One grammar node for a call to any tool of `registry` in `format`: an Alt in registry order."""
    if not isinstance(max_string, int) or isinstance(max_string, bool) or max_string < 1:
        raise ValueError(f"max_string must be an integer >= 1 (a value holds at least 1 byte), got {max_string!r}")
    env = get_envelope(format)
    if options is None and any(is_typed(t) for t in registry):
        from ..schema.build import SchemaOptions
        options = SchemaOptions()
    source = getattr(registry, "source", "<registry>")
    return Alt(tuple(tool_call_node(t, env, max_string, options, source) for t in legacy_tools(registry, format)))


def tool_call_node(tool: Tool, env: Envelope, max_string: int, options, source: str = "<registry>"):
    """One call to `tool` in `env`'s format."""
    # flat Seqs of joined literals: a native tool's call is then one linear Lit/Str path, as the seed's
    return seq(Lit(env.head(tool.name)), args_node(tool, env, max_string, options, source), Lit(env.tail()))


def legacy_tools(registry: ToolRegistry, format: str) -> list[Tool]:
    """The tools of the one-call grammar (no tool_choice given): every tool in the seed format (the built-in
    `answer` is its text reply); in the others the user's own (the built-in `answer` is never shown to their
    chat templates, so never called), or `answer` alone when the registry has nothing else."""
    return list(registry) if format == "seed" else (registry.user_tools or list(registry))


def native_args_schema(tool: Tool, max_string: int) -> dict:
    """A native tool's arguments as JSON Schema: required strings of 1..max_string characters, nothing else.

    Approximate in two ways the schema language cannot say: the seed counts bytes (not characters) and
    writes no escapes."""
    names = [a.name for a in tool.required_args]
    return {"type": "object", "properties": {n: {"type": "string", "minLength": 1, "maxLength": max_string}
                                             for n in names},
            "required": names, "additionalProperties": False}


def call_schema(registry: ToolRegistry, format: str = "seed", max_string: int = 256) -> dict:
    """The JSON Schema of a call's JSON body in `format` (for validators and other engines): one branch per tool."""
    env = get_envelope(format)
    branches = []
    for t in legacy_tools(registry, format):
        args = t.parameters if is_typed(t) else native_args_schema(t, max_string)
        branches.append({"type": "object", "properties": {env.name_key: {"const": t.name}, env.args_key: args},
                         "required": [env.name_key, env.args_key], "additionalProperties": False})
    return branches[0] if len(branches) == 1 else {"anyOf": branches}


def registry_key(registry: ToolRegistry) -> list:
    """What a call grammar depends on, canonically (Tool.canonical): per tool its name and its required
    args (native) or its parameters without annotations (typed; key order kept: properties are generated
    in declared order)."""
    return [json.loads(t.canonical_json()) for t in registry]
