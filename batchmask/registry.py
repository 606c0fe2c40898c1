"""The tool registry: which tools a call may name, and which arguments each must carry.

A tool has a name, a one-line description and named arguments. Each argument has a type
(`string` or `number`; both travel as quoted JSON strings, so the grammar treats them alike)
and a `required` flag. Only required arguments enter the grammar, in declaration order: an
optional one would make the call's path branch, and a small model has no business choosing
whether to supply it.

The `answer` tool (one argument, `text`) is always present and always first, so a model that
has nothing better to do can still reply in a well-formed call.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ARG_TYPES = ("string", "number")
# JSON-schema spellings that mean one of ours: an integer is a number on the wire.
_TYPE_ALIASES = {"string": "string", "number": "number", "integer": "number"}


class RegistryError(ValueError):
    """A tool registry (or the file it came from) is malformed."""


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

    @property
    def required_args(self) -> tuple[ToolArg, ...]:
        return tuple(a for a in self.args if a.required)


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


def _check_name(name, what: str) -> str:
    """A name goes into the grammar's literals verbatim, so it must need no JSON escaping."""
    if not isinstance(name, str):
        raise RegistryError(f"{what}: name must be a string, got {type(name).__name__} {name!r}")
    if name == "":
        raise RegistryError(f"{what}: name is empty")
    bad = [c for c in name if c in '"\\' or ord(c) < 0x20]
    if bad:
        raise RegistryError(f"{what}: name {name!r} holds {bad[0]!r}; names may not contain '\"', '\\' "
                            "or control characters (below 0x20)")
    return name


class ToolRegistry:
    """An ordered, validated set of tools. `answer` is always first."""

    def __init__(self, tools: Iterable[Tool], source: str = "<registry>"):
        tools = list(tools)
        seen: set[str] = set()
        for i, tool in enumerate(tools):
            where = f"{source}: tool #{i}"
            _check_name(tool.name, where)
            where = f"{source}: tool {tool.name!r}"
            if tool.name in seen:
                raise RegistryError(f"{where}: duplicate tool name")
            seen.add(tool.name)
            arg_names: set[str] = set()
            for a in tool.args:
                _check_name(a.name, f"{where}: arg #{len(arg_names)}")
                if a.name in arg_names:
                    raise RegistryError(f"{where}: duplicate arg name {a.name!r}")
                arg_names.add(a.name)
                if a.type not in ARG_TYPES:
                    raise RegistryError(f"{where}: arg {a.name!r} has unknown type {a.type!r} "
                                        f"(expected one of {', '.join(ARG_TYPES)})")
        # answer first: present it if missing, move it to the front otherwise.
        answer = [t for t in tools if t.name == ANSWER.name]
        if answer:
            if [a.name for a in answer[0].required_args] != ["text"]:
                raise RegistryError(f"{source}: tool 'answer' must take exactly one required arg 'text', "
                                    f"got {[a.name for a in answer[0].required_args]}")
        rest = [t for t in tools if t.name != ANSWER.name]
        self.tools: tuple[Tool, ...] = tuple(answer or [ANSWER]) + tuple(rest)
        self.source = source

    # --- construction -------------------------------------------------------------------
    @classmethod
    def defaults(cls) -> ToolRegistry:
        """answer, calc(expr), read_file(path), list_dir(path), write_file(path, text)."""
        return cls(_DEFAULT_TOOLS, source="<defaults>")

    @classmethod
    def from_json(cls, path) -> ToolRegistry:
        """Read `{"tools": [...]}` (or a bare list) of native or function-calling tool entries."""
        path = Path(path)
        try:
            raw = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise RegistryError(f"{path}: tools file not found") from None
        except (OSError, UnicodeDecodeError) as e:
            raise RegistryError(f"{path}: cannot read tools file: {e}") from None
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            raise RegistryError(f"{path}: not valid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
        return cls.from_obj(obj, source=str(path))

    @classmethod
    def from_obj(cls, obj, source: str = "<registry>") -> ToolRegistry:
        entries = obj.get("tools") if isinstance(obj, dict) else obj
        if not isinstance(entries, list):
            raise RegistryError(f"{source}: expected {{\"tools\": [...]}} or a list of tools, "
                                f"got {type(obj).__name__}")
        if not entries:
            raise RegistryError(f"{source}: the registry defines no tools")
        return cls([_parse_entry(e, i, source) for i, e in enumerate(entries)], source=source)

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

    def to_obj(self) -> dict:
        return {"tools": [{"name": t.name, "description": t.description,
                           "args": [{"name": a.name, "type": a.type, "required": a.required}
                                    for a in t.args]} for t in self.tools]}

    def grammar_key(self) -> list:
        """What the grammar depends on: tool names and their required arg names, in order."""
        return [[t.name, [a.name for a in t.required_args]] for t in self.tools]

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(self.grammar_key()).encode()).hexdigest()

    def __repr__(self) -> str:
        return f"ToolRegistry({', '.join(self.names)})"


def _parse_entry(e, i: int, source: str) -> Tool:
    where = f"{source}: tools[{i}]"
    if not isinstance(e, dict):
        raise RegistryError(f"{where}: expected an object, got {type(e).__name__}")
    if "function" in e:  # {"type": "function", "function": {"name", "description", "parameters"}}
        fn = e["function"]
        if not isinstance(fn, dict):
            raise RegistryError(f"{where}: 'function' must be an object")
        return _parse_function(fn, where)
    if "parameters" in e and "args" not in e:  # a bare function object
        return _parse_function(e, where)
    name = e.get("name")
    where = f"{where} ({name!r})"
    args_raw = e.get("args", [])
    if not isinstance(args_raw, list):
        raise RegistryError(f"{where}: 'args' must be a list")
    args = []
    for j, a in enumerate(args_raw):
        if not isinstance(a, dict):
            raise RegistryError(f"{where}: args[{j}] must be an object")
        required = a.get("required", True)
        if not isinstance(required, bool):
            raise RegistryError(f"{where}: arg {a.get('name')!r}: 'required' must be true or false")
        args.append(ToolArg(a.get("name"), _arg_type(a.get("type", "string"), where, a.get("name")),
                            required, str(a.get("description", ""))))
    return Tool(name, _description(e, where), tuple(args))


def _parse_function(fn: dict, where: str) -> Tool:
    name = fn.get("name")
    where = f"{where} ({name!r})"
    params = fn.get("parameters", {}) or {}
    if not isinstance(params, dict):
        raise RegistryError(f"{where}: 'parameters' must be a JSON schema object")
    props = params.get("properties", {}) or {}
    required = params.get("required", []) or []
    if not isinstance(props, dict) or not isinstance(required, list):
        raise RegistryError(f"{where}: 'parameters' needs 'properties' (object) and 'required' (list)")
    unknown = [r for r in required if r not in props]
    if unknown:
        raise RegistryError(f"{where}: required arg {unknown[0]!r} is not among the properties")
    args = []
    for arg_name, schema in props.items():
        schema = schema if isinstance(schema, dict) else {}
        args.append(ToolArg(arg_name, _arg_type(schema.get("type", "string"), where, arg_name),
                            arg_name in required, str(schema.get("description", ""))))
    return Tool(name, _description(fn, where), tuple(args))


def _arg_type(t, where: str, arg) -> str:
    if isinstance(t, str) and t in _TYPE_ALIASES:
        return _TYPE_ALIASES[t]
    raise RegistryError(f"{where}: arg {arg!r} has unknown type {t!r} (expected string or number)")


def _description(e: dict, where: str) -> str:
    d = e.get("description", "")
    if not isinstance(d, str):
        raise RegistryError(f"{where}: 'description' must be a string")
    # The catalogue shows one line per tool.
    return " ".join(d.split())
