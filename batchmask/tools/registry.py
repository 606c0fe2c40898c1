"""The tool registry: which tools a call may name, and what arguments each takes.

Two kinds of tool, told apart by `Tool.parameters`:

  * native (parameters None): named arguments, each with a type (`string` or `number`; both travel
    as quoted JSON strings, so the grammar treats them alike) and a `required` flag. Only required
    arguments enter the grammar, in declaration order, under the seed's byte rule and caps.
  * typed (parameters a JSON Schema of the arguments object): OpenAI function calling
    (`{"type": "function", "function": {...}}` or the flat `{"type": "function", "name", "parameters"}`),
    MCP (`inputSchema`) and Anthropic (`input_schema`) entries. The schema must be in the subset
    batchmask.schema.build supports (docs/json-schema.md); it is checked when the registry is built. `args`
    is then a view of its top-level properties (for catalogues), `type` the schema's type as written.

Every tool keeps `source`, its entry exactly as read (prompts and chat templates need it verbatim).
`canonical_json()` / `fingerprint()` cover everything a call grammar depends on.

The `answer` tool (one argument, `text`) is always present and always first, so a model that
has nothing better to do can still reply in a well-formed call.
"""
from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path

from ..errors import RegistryError
from ..text import short as _short

ARG_TYPES = ("string", "number")
# JSON-schema spellings that mean one of ours: an integer is a number on the wire.
_TYPE_ALIASES = {"string": "string", "number": "number", "integer": "number"}


@dataclass(frozen=True)
class ToolArg:
    name: str
    type: str = "string"
    required: bool = True
    description: str = ""


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    args: tuple[ToolArg, ...] = field(default_factory=tuple)
    parameters: dict | None = field(default=None, hash=False)               # JSON Schema; None: native
    source: dict | None = field(default=None, hash=False, compare=False)    # the entry as read

    @property
    def required_args(self) -> tuple[ToolArg, ...]:
        return tuple(a for a in self.args if a.required)

    @property
    def typed(self) -> bool:
        return self.parameters is not None

    def canonical(self) -> dict:
        """What the grammar depends on: the name and, typed, the parameters without annotations (key order
        kept: properties are generated in declared order); native, the required args in order."""
        if self.parameters is None:
            return {"name": self.name, "args": [{"name": a.name} for a in self.required_args]}
        from ..schema.build import canonical_schema
        return {"name": self.name, "parameters": canonical_schema(self.parameters)}

    def canonical_json(self) -> str:
        return json.dumps(self.canonical(), ensure_ascii=False, separators=(",", ":"))


ANSWER = Tool("answer", "Reply to the user directly with a short text.",
              (ToolArg("text", "string", True, "the reply"),))

_DEFAULT_TOOLS = (
    ANSWER,
    Tool("calc", "Evaluate an arithmetic expression.", (ToolArg("expr", "string", True, "the expression"),)),
    Tool("read_file", "Read a text file and return its contents.", (ToolArg("path", "string", True, "file path"),)),
    Tool("list_dir", "List the entries of a directory.", (ToolArg("path", "string", True, "directory path"),)),
    Tool("write_file", "Write text to a file, replacing it.",
         (ToolArg("path", "string", True, "file path"), ToolArg("text", "string", True, "the new contents"))),
)


# --- short values in error lines -----------------------------------------------------------------
# An error line quotes what it refuses, but never kilobytes of it: a value's repr is cut to 60 characters
# (text.short), a path to _PATH_SHORT (a real path may well be longer than a value worth quoting).
_PATH_SHORT = 160


def _short_path(path) -> str:
    s = str(path)
    return s if len(s) <= _PATH_SHORT else s[:_PATH_SHORT - 3] + "..."


def _tools_path(path) -> Path:
    """`from_json`'s argument as a path: JSON text or an already parsed object is refused, pointing to from_obj."""
    if isinstance(path, (dict, list)):
        raise RegistryError(f"ToolRegistry.from_json takes a path, got a {type(path).__name__}; "
                            "pass parsed tools to ToolRegistry.from_obj")
    if isinstance(path, bytes):
        path = path.decode("utf-8", errors="surrogateescape")
    if not isinstance(path, (str, PathLike)):
        raise RegistryError(f"ToolRegistry.from_json takes a path, got {type(path).__name__} {_short(path)}")
    if isinstance(path, str) and path.lstrip()[:1] in ("{", "[") and not _exists(path):
        raise RegistryError(f"ToolRegistry.from_json takes a path, got JSON text {_short(path)}; pass "
                            "ToolRegistry.from_obj(json.loads(text)) instead")
    if isinstance(path, str) and "\0" in path:
        raise RegistryError(f"tools file not found: {_short(path)} (a path cannot hold a NUL character)")
    return Path(path)


def _bfcl_tools(obj, raw: str, path) -> list | None:
    """A BFCL function-doc file (a list, or JSON Lines) as OpenAI tools; None for any other file."""
    from .bfcl import function_docs_tools
    return function_docs_tools(obj, raw, _short_path(path))


def _exists(path: str) -> bool:
    try:
        return Path(path).exists()
    except (OSError, ValueError):                 # a name too long for the file system, a NUL in it
        return False


def _check_name(name, what: str) -> str:
    """A name goes into the grammar's literals verbatim, so it must need no JSON escaping."""
    if not isinstance(name, str):
        raise RegistryError(f"{what}: name must be a string, got {type(name).__name__} {_short(name)}")
    if name == "":
        raise RegistryError(f"{what}: name is empty")
    bad = [c for c in name if c in '"\\' or ord(c) < 0x20]
    if bad:
        raise RegistryError(f"{what}: name {_short(name)} holds {bad[0]!r}; names may not contain '\"', '\\' "
                            "or control characters (below 0x20)")
    return name


class ToolRegistry:
    """An ordered, validated set of tools. `answer` is always first."""

    def __init__(self, tools: Iterable[Tool], source: str = "<registry>", options=None):
        """`options` (batchmask.schema.build.SchemaOptions) are the caps typed tools' schemas are checked under."""
        tools = list(tools)
        seen: set[str] = set()
        for i, tool in enumerate(tools):
            where = f"{source}: tool #{i}"
            _check_name(tool.name, where)
            where = f"{source}: tool {_short(tool.name)}"
            if tool.name in seen:
                raise RegistryError(f"{where}: duplicate tool name")
            seen.add(tool.name)
            if tool.parameters is not None:
                _check_schema(tool, where, options)
                continue
            arg_names: set[str] = set()
            for a in tool.args:
                _check_name(a.name, f"{where}: arg #{len(arg_names)}")
                if a.name in arg_names:
                    raise RegistryError(f"{where}: duplicate arg name {_short(a.name)}")
                arg_names.add(a.name)
                if a.type not in ARG_TYPES:
                    raise RegistryError(f"{where}: arg {_short(a.name)} has unknown type {_short(a.type)} "
                                        f"(expected one of {', '.join(ARG_TYPES)})")
        # answer first: present it if missing, move it to the front otherwise.
        answer = [t for t in tools if t.name == ANSWER.name]
        if answer:
            if [a.name for a in answer[0].required_args] != ["text"]:
                raise RegistryError(f"{source}: tool 'answer' must take exactly one required arg 'text', "
                                    f"got {_short([a.name for a in answer[0].required_args])}")
        rest = [t for t in tools if t.name != ANSWER.name]
        self.tools: tuple[Tool, ...] = tuple(answer or [ANSWER]) + tuple(rest)
        self.source = source
        self.options = options          # what the calls are read and validated under (SchemaOptions.open_objects)

    # --- construction -------------------------------------------------------------------
    @classmethod
    def defaults(cls) -> ToolRegistry:
        """answer, calc(expr), read_file(path), list_dir(path), write_file(path, text)."""
        return cls(_DEFAULT_TOOLS, source="<defaults>")

    @classmethod
    def from_json(cls, path, options=None) -> ToolRegistry:
        """Read `{"tools": [...]}`, a bare list, or an MCP `tools/list` response (`{"result": {"tools": [...]}}`)
        of native, OpenAI, MCP or Anthropic tool entries, from the file at `path`; or BFCL's function docs
        (a list, or JSON Lines, of `"type": "dict"` docs), read as BFCL reads them (batchmask.tools.bfcl)."""
        path = _tools_path(path)
        try:
            raw = path.read_text(encoding="utf-8-sig")       # a UTF-8 BOM (some editors write one) is skipped
        except FileNotFoundError:
            raise RegistryError(f"tools file not found: {_short_path(path)}") from None
        except UnicodeDecodeError as e:
            raise RegistryError(f"{_short_path(path)}: cannot read tools file: not UTF-8 (byte 0x"
                                f"{e.object[e.start]:02x} at offset {e.start})") from None
        except OSError as e:                                  # strerror: the errno text without the path again
            raise RegistryError(f"{_short_path(path)}: cannot read tools file: {e.strerror or type(e).__name__}") \
                from None
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            # BFCL's function-doc files are JSON Lines: one doc a line (batchmask.tools.bfcl).
            bfcl = _bfcl_tools(None, raw, path) if e.msg == "Extra data" else None
            if bfcl is not None:
                return cls.from_obj(bfcl, source=str(path), options=options)
            raise RegistryError(f"{_short_path(path)}: not valid JSON at line {e.lineno} column {e.colno}: "
                                f"{e.msg}") from None
        except RecursionError:
            raise RegistryError(f"{_short_path(path)}: JSON nested too deeply to read") from None
        bfcl = _bfcl_tools(obj, raw, path)            # a list of BFCL function docs ("type": "dict" parameters)
        return cls.from_obj(obj if bfcl is None else bfcl, source=str(path), options=options)

    @classmethod
    def from_obj(cls, obj, source: str = "<registry>", options=None) -> ToolRegistry:
        """The same forms as from_json, already parsed."""
        if isinstance(obj, dict) and "tools" not in obj and isinstance(obj.get("result"), dict):
            obj = obj["result"]                                   # an MCP tools/list response
        entries = obj.get("tools") if isinstance(obj, dict) else obj
        if not isinstance(entries, list):
            raise RegistryError(f"{source}: expected {{\"tools\": [...]}} or a list of tools, "
                                f"got {type(obj).__name__}")
        if not entries:
            raise RegistryError(f"{source}: the registry defines no tools")
        return cls([_parse_entry(e, i, source) for i, e in enumerate(entries)], source=source, options=options)

    # --- views --------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Tool]:
        return iter(self.tools)

    def __len__(self) -> int:
        return len(self.tools)

    def __getitem__(self, name: str) -> Tool:
        for t in self.tools:
            if t.name == name:
                return t
        raise KeyError(name)

    def __contains__(self, name) -> bool:
        return any(t.name == name for t in self.tools)

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tools]

    @property
    def user_tools(self) -> list[Tool]:
        """The tools but the built-in `answer` the registry adds itself (a file's own `answer` stays)."""
        return [t for t in self.tools if t is not ANSWER]

    # tool_choice / parallel_tool_calls (batchmask.tools.choice.ToolChoice); None: the one-call grammar
    choice = None

    def with_choice(self, choice) -> ToolRegistry:
        """The same tools under `choice`: its own grammar, and its replies read as `choice` allows."""
        if choice is self.choice:
            return self
        out = copy.copy(self)
        out.choice = choice
        return out

    def to_obj(self) -> dict:
        """A registry file's object: native tools in the native form, typed ones as their source entry."""
        return {"tools": [t.source if t.typed and t.source is not None else
                          {"name": t.name, "description": t.description, "parameters": t.parameters} if t.typed else
                          {"name": t.name, "description": t.description,
                           "args": [{"name": a.name, "type": a.type, "required": a.required} for a in t.args]}
                          for t in self.tools]}

    def grammar_key(self) -> list:
        """The seed path's key (native tools): tool names and their required arg names, in order."""
        return [[t.name, [a.name for a in t.required_args]] for t in self.tools]

    def canonical_json(self) -> str:
        """Everything a call grammar depends on, in registry order (Tool.canonical); itself a registry
        file that reads back into a registry with the same canonical_json."""
        return '{"tools":[' + ",".join(t.canonical_json() for t in self.tools) + "]}"

    def fingerprint(self) -> str:
        return hashlib.sha256(self.canonical_json().encode("utf-8")).hexdigest()

    def __repr__(self) -> str:
        return f"ToolRegistry({', '.join(self.names)})"


_SCHEMA_KEYS = ("parameters", "inputSchema", "input_schema")
_EMPTY_ARGS = {"type": "object", "properties": {}}


def _parse_entry(e, i: int, source: str) -> Tool:
    where = f"{source}: tools[{i}]"
    if not isinstance(e, dict):
        raise RegistryError(f"{where}: expected an object, got {type(e).__name__}")
    kind = e.get("type")
    if "function" in e:  # OpenAI: {"type": "function", "function": {"name", "description", "parameters"}}
        fn = e["function"]
        if not isinstance(fn, dict):
            raise RegistryError(f"{where}: 'function' must be an object")
        if kind not in (None, "function"):
            raise RegistryError(f"{where}: tool type {_short(kind)} with a 'function' object (expected \"function\")")
        return _parse_typed(fn, where, "parameters", e)
    keys = [k for k in _SCHEMA_KEYS if k in e]
    if len(keys) > 1 or (keys and "args" in e):
        raise RegistryError(f"{where}: an entry has one of 'args', {', '.join(map(repr, _SCHEMA_KEYS))}; "
                            f"got {', '.join(map(repr, keys + (['args'] if 'args' in e else [])))}")
    if kind not in (None, "function", "custom"):
        raise RegistryError(f"{where}: tool type {_short(kind)} is not supported (expected a function tool)")
    if keys:                # flat OpenAI (Responses API), MCP (inputSchema), Anthropic (input_schema)
        return _parse_typed(e, where, keys[0], e)
    if kind == "function":
        return _parse_typed(e, where, "parameters", e)
    name = e.get("name")
    where = f"{where} ({_short(name)})"
    args_raw = e.get("args", [])
    if not isinstance(args_raw, list):
        raise RegistryError(f"{where}: 'args' must be a list")
    args = []
    for j, a in enumerate(args_raw):
        if not isinstance(a, dict):
            raise RegistryError(f"{where}: args[{j}] must be an object")
        required = a.get("required", True)
        if not isinstance(required, bool):
            raise RegistryError(f"{where}: arg {_short(a.get('name'))}: 'required' must be true or false")
        args.append(ToolArg(a.get("name"), _arg_type(a.get("type", "string"), where, a.get("name")),
                            required, str(a.get("description", ""))))
    return Tool(name, _description(e, where), tuple(args), source=e)


def _parse_typed(fn: dict, where: str, key: str, entry: dict) -> Tool:
    """A tool whose arguments are a JSON Schema under `key`; absent, null or {} mean no arguments."""
    name = fn.get("name")
    where = f"{where} ({_short(name)})"
    params = fn.get(key)
    if params is None or params == {}:
        params = dict(_EMPTY_ARGS)
    if not isinstance(params, dict):
        raise RegistryError(f"{where}: {key!r} must be a JSON Schema object, got {type(params).__name__}")
    if params.get("type", "object") != "object":
        raise RegistryError(f"{where}: {key!r} must describe the arguments object (\"type\": \"object\"), "
                            f"got type {_short(params.get('type'))}")
    props = params.get("properties", {})
    required = params.get("required", [])
    if not isinstance(props, dict) or not isinstance(required, list):
        raise RegistryError(f"{where}: {key!r} needs 'properties' (object) and 'required' (list)")
    args = tuple(ToolArg(arg, _schema_label(sub), arg in required,
                         " ".join(str(sub.get("description", "")).split()) if isinstance(sub, dict) else "")
                 for arg, sub in props.items())
    return Tool(name, _description(fn, where), args, parameters=params, source=entry)


def _schema_label(sub) -> str:
    """A short label of a property's schema for catalogues: its type as written, or what it is instead."""
    if not isinstance(sub, dict):
        return "any" if sub is True else "none"
    t = sub.get("type")
    if isinstance(t, str):
        return t
    if isinstance(t, list):
        return "|".join(map(str, t))
    for k in ("enum", "const", "anyOf", "oneOf", "allOf", "$ref"):
        if k in sub:
            return k
    return "any"


def _check_schema(tool: Tool, where: str, options) -> None:
    """Typed tools are checked against the supported subset when the registry is built (one clear error)."""
    from ..schema.build import SchemaOptions, schema_node
    schema_node(tool.parameters, options or SchemaOptions(), where=f"{where} parameters")


def _arg_type(t, where: str, arg) -> str:
    if isinstance(t, str) and t in _TYPE_ALIASES:
        return _TYPE_ALIASES[t]
    raise RegistryError(f"{where}: arg {_short(arg)} has unknown type {_short(t)} (expected string or number)")


def _description(e: dict, where: str) -> str:
    d = e.get("description", "")
    if not isinstance(d, str):
        raise RegistryError(f"{where}: 'description' must be a string")
    # The catalogue shows one line per tool.
    return " ".join(d.split())
