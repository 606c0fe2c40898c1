"""`tool_choice` and `parallel_tool_calls`: which replies a row may write, with OpenAI's meanings.

    auto       a text reply, or 1..N calls to any of the task's tools (OpenAI's default when there are tools)
    required   1..N calls to any of the task's tools, no text
    function   ({"type": "function", "function": {"name": NAME}}) 1..N calls, each to NAME only
    none       a text reply, no call

N is `max_calls` under `parallel_tool_calls` (OpenAI's default: true), 1 without. Each choice is its own
grammar (a ToolRegistry carries its choice: `registry.with_choice(choice)`; the grammar key says which).

How each format writes them:

    several calls   hermes: `<tool_call>` blocks one after another, one "\\n" between them (Qwen2.5's template);
                    seed, json, llama3: one call object alone, or a JSON array `[call, call, ...]` of 1..N,
                    items separated as the format separates items (batchmask.tools.calls.split_calls reads both)
    a text reply    seed: a call to the built-in `answer` tool, the seed's way to say auto (read back as content);
                    json, llama3, hermes: one line of text and a "\\n" that ends it: whole UTF-8 characters, at
                    most `max_text` bytes, no `"`, `\\` or control character, not starting with a space or with
                    what opens a call (`{`, `[`, or hermes' `<`); the record's content is the line without its "\\n"

A task's tools are the user's (ToolRegistry.user_tools): the built-in `answer` is never shown to a chat
template and never named by a call; in the seed format a tool named `answer` is the text reply.

Per-task API (used by the task readers: JSONL fields, Batch API bodies):

    run = ToolChoice.from_cli("required", parallel=False, max_calls=4)     # or None: the legacy one-call grammar
    choice = resolve_choice(run, {"tool_choice": ..., "parallel_tool_calls": ...}, where="tasks.jsonl line 3")
    check_choice(choice, registry, format, where)                           # a named function must exist
    registry = registry.with_choice(choice)                                 # what generation compiles and parses
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import RegistryError
from ..grammar.nodes import Alt, Lit, Repeat, Seq, Str
from ..schema.nodes import bytes_of, seq
from ..text import short
from .envelope import Envelope, get_envelope, is_typed, tool_call_node
from .registry import ANSWER, Tool, ToolRegistry

DEFAULT_MAX_CALLS = 4           # calls one reply may hold under parallel_tool_calls (--max-calls)
MAX_CALLS_LIMIT = 64            # each allowed call is its own copy of the call grammar's states
DEFAULT_MAX_TEXT = 1024         # bytes of a text reply (the token ceiling bounds it too)
MODES = ("auto", "required", "none")
TEXT_END = "\n"                 # what ends a text reply in the native formats (a value needs a closing byte)


@dataclass(frozen=True)
class ToolChoice:
    mode: str = "auto"                  # auto | required | none | function
    name: str | None = None             # mode "function": the one tool a call may name
    parallel: bool = True               # parallel_tool_calls
    max_calls: int = DEFAULT_MAX_CALLS  # calls a reply may hold under parallel

    def __post_init__(self):
        if self.mode not in (*MODES, "function") or (self.mode == "function") != isinstance(self.name, str):
            raise ValueError(f"tool_choice: mode {self.mode!r} with name {self.name!r}")
        if type(self.max_calls) is not int or not 1 <= self.max_calls <= MAX_CALLS_LIMIT:
            raise ValueError(f"max_calls must be an integer in [1, {MAX_CALLS_LIMIT}], got {self.max_calls!r}")

    @property
    def most_calls(self) -> int:
        return self.max_calls if self.parallel else 1

    @property
    def text_ok(self) -> bool:
        return self.mode in ("auto", "none")

    @property
    def calls_ok(self) -> bool:
        return self.mode != "none"

    def key(self) -> dict:
        """What the grammar depends on (JSON-able): the mode, the name, and how many calls a reply may hold."""
        return {"mode": self.mode, "name": self.name, "calls": self.most_calls if self.calls_ok else 0}

    def openai(self):
        """tool_choice in OpenAI's form."""
        return {"type": "function", "function": {"name": self.name}} if self.mode == "function" else self.mode

    @classmethod
    def from_cli(cls, value: str | None = None, *, parallel: bool = True,
                 max_calls: int = DEFAULT_MAX_CALLS) -> ToolChoice:
        """--tool-choice auto|required|none|NAME (None: auto)."""
        value = "auto" if value is None else value
        if not isinstance(value, str) or not value:
            raise ValueError(f"--tool-choice: expected auto, required, none or a tool name, got {value!r}")
        if value in MODES:
            return cls(value, None, parallel, max_calls)
        return cls("function", value, parallel, max_calls)


def parse_tool_choice(value, where: str = "tool_choice") -> tuple[str, str | None]:
    """(mode, name) from OpenAI's forms: "auto", "required", "none", {"type": "function", "function": {"name"}}."""
    if isinstance(value, str) and value in MODES:
        return value, None
    if isinstance(value, dict):
        fn = value.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if value.get("type") == "function" and isinstance(name, str) and name and set(value) == {"type", "function"}:
            return "function", name
    raise RegistryError(f"{where}: \"tool_choice\" must be \"auto\", \"required\", \"none\" or "
                        f"{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got {short(value)}")


def resolve_choice(run: ToolChoice | None, fields: Mapping, where: str = "task") -> ToolChoice | None:
    """A task's choice: the run's (None: the legacy one-call grammar), under the task's own `tool_choice` and
    `parallel_tool_calls` (absent or null: the run's; either one given starts from auto, parallel, if the run
    set none)."""
    tc, par = fields.get("tool_choice"), fields.get("parallel_tool_calls")
    if tc is None and par is None:
        return run
    base = run or ToolChoice()
    mode, name = (base.mode, base.name) if tc is None else parse_tool_choice(tc, where)
    if par is not None and not isinstance(par, bool):
        raise RegistryError(f"{where}: \"parallel_tool_calls\" must be true or false, got {short(par)}")
    return ToolChoice(mode, name, base.parallel if par is None else par, base.max_calls)


# --- which tools ----------------------------------------------------------------------------------
def callable_tools(registry: ToolRegistry, format: str) -> list[Tool]:
    """The tools a call may name: the user's (seed: every tool but `answer`, which is the text reply there)."""
    if format == "seed":
        return [t for t in registry if t.name != ANSWER.name]
    return registry.user_tools


def check_choice(choice: ToolChoice | None, registry: ToolRegistry, format: str, where: str = "task") -> None:
    """Refuse a choice the task's tools cannot meet: a named function they lack, calls required of no tools."""
    if choice is None or not choice.calls_ok:
        return
    names = [t.name for t in callable_tools(registry, format)]
    if choice.mode == "function" and choice.name not in names:
        raise RegistryError(f"{where}: \"tool_choice\" names function {short(choice.name)}, which the task's tools "
                            f"do not define (they are: {', '.join(names) or 'none'})")
    if choice.mode == "required" and not names:
        raise RegistryError(f"{where}: \"tool_choice\" is \"required\" but the task has no tools")


def refused_calls(choice: ToolChoice, names: list[str], format: str, registry: ToolRegistry) -> str | None:
    """Why calls to `names` (in order) are not a reply `choice` allows (None: they are). The grammar writes only
    allowed ones; this judges any text (the free arm's)."""
    users = {t.name for t in callable_tools(registry, format)}
    if format != "seed" and any(n not in users for n in names):
        return f"{next(n for n in names if n not in users)!r} is the built-in text reply, not one of the task's tools"
    if not choice.calls_ok:
        return "tool_choice 'none' allows no call"
    if len(names) > choice.most_calls:
        return f"{len(names)} calls, but at most {choice.most_calls} allowed (parallel_tool_calls, --max-calls)"
    if format == "seed" and ANSWER.name in names:
        return "the text reply ('answer') cannot be one of several calls"
    if choice.mode == "function" and any(n != choice.name for n in names):
        return f"tool_choice names {choice.name!r}, got a call to {next(n for n in names if n != choice.name)!r}"
    return None


# --- the grammar ------------------------------------------------------------------------------------
def text_first_bytes(env: Envelope) -> list[int]:
    """The bytes a native format's text reply may start with: printable ASCII, not what opens a call."""
    opens = {env.prefix[0]} if env.prefix else {"{", "["}
    return [b for b in range(0x21, 0x7F) if chr(b) not in opens and b not in b'"\\']


def is_text_reply(text: str, format: str) -> bool:
    """A native format's text reply (as the grammar writes one): it does not open a call."""
    env = get_envelope(format)
    return format != "seed" and text[:1] != "" and ord(text[0]) in text_first_bytes(env)


def text_node(env: Envelope, max_text: int = DEFAULT_MAX_TEXT):
    """One line of text ended by TEXT_END (see the module docstring)."""
    return Seq((bytes_of(text_first_bytes(env)), Str(0, max_text - 1), Lit(TEXT_END.encode())))


def calls_node(calls: list, env: Envelope, most: int):
    """1..most calls (each an Alt of the allowed tools' calls) written as `env` writes several."""
    one = calls[0] if len(calls) == 1 else Alt(tuple(calls))
    if most == 1:
        return one
    if env.prefix:
        return Seq((one, Repeat(Seq((Lit(b"\n"), one)), 0, most - 1)))
    sep = env.separators[0].encode()
    return Alt((one, Seq((Lit(b"["), one, Repeat(Seq((Lit(sep), one)), 0, most - 1), Lit(b"]")))))


def reply_node(registry: ToolRegistry, format: str, max_string: int, options, choice: ToolChoice,
               max_text: int = DEFAULT_MAX_TEXT):
    """The grammar of one reply to a task with `registry`'s tools under `choice`."""
    env = get_envelope(format)
    if options is None and any(is_typed(t) for t in registry):
        from ..schema.build import SchemaOptions
        options = SchemaOptions()
    source = getattr(registry, "source", "<registry>")
    check_choice(choice, registry, format, source)
    tools = callable_tools(registry, format)
    if choice.mode == "function":
        tools = [t for t in tools if t.name == choice.name]
    options_: list = []
    if choice.text_ok:                    # seed: the answer call, first (ties in finish go to a text reply)
        options_.append(tool_call_node(registry[ANSWER.name], env, max_string, options, source)
                        if format == "seed" else text_node(env, max_text))
    if choice.calls_ok and tools:
        options_.append(calls_node([tool_call_node(t, env, max_string, options, source) for t in tools], env,
                                   choice.most_calls))
    return seq(options_[0]) if len(options_) == 1 else Alt(tuple(options_))


def reply_key(choice: ToolChoice | None, max_text: int = DEFAULT_MAX_TEXT) -> dict | None:
    """The choice's part of a call grammar's key (None: the legacy grammar, whose key has no such part)."""
    return None if choice is None else {**choice.key(), "max_text": max_text}
