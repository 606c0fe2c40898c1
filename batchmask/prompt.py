"""The compact prompt protocol, and the parse that checks what the model wrote.

    Tools:
    answer(text): Reply to the user directly with a short text.
    calc(expr): Evaluate an arithmetic expression.
    ...
    TASK: what is 12 times 7?
    CALL: {"tool":"calc","args":{"expr":"12*7"}}

The harness writes everything up to and including the scaffold `\\nCALL: `; the model writes
the call. Training data (recipes/default_model/) and generation use these same functions, so the
model sees at inference exactly the token boundaries it was trained on.
"""
from __future__ import annotations

from .envelope import CallError, get_envelope, is_typed
from .registry import ToolRegistry
from .validate import check, loads

SCAFFOLD = "\nCALL: "


def catalogue(registry: ToolRegistry) -> str:
    """One line per tool: its name, its required keys in order, its description."""
    lines = ["Tools:"]
    for tool in registry:
        keys = ", ".join(a.name for a in tool.required_args)
        lines.append(f"{tool.name}({keys}): {tool.description}")
    return "\n".join(lines)


def clean_task(task: str) -> str:
    """A task is one line of the prompt: fold any whitespace run (newlines too) to one space."""
    return " ".join(str(task).split())


def render_prompt(registry: ToolRegistry, task: str) -> str:
    """The full text the model is conditioned on, scaffold included."""
    return f"{catalogue(registry)}\nTASK: {clean_task(task)}{SCAFFOLD}"


def render_call(tool: str, args: dict, format: str = "seed") -> str:
    """A call in the exact compact form the grammar produces (no spaces, keys in order)."""
    return get_envelope(format).render(tool, args)


def parse_call(text: str, registry: ToolRegistry, max_string: int | None = None, format: str = "seed"):
    """Parse and validate `text` as a call in `format` (batchmask.envelope) against `registry`.

    Returns (call, None) when it is valid, else (None, reason). Independent of the grammar: it
    is how the harness (and the ablation's free arm) judges any text. Native tools: each
    required arg, in order, a non-empty string (at most `max_string` UTF-8 bytes when given).
    Typed tools: the arguments are checked against the tool's schema (batchmask.validate).
    """
    env = get_envelope(format)
    try:
        name, args = env.parse(text)
    except CallError as e:
        return None, str(e)
    if not isinstance(name, str) or name not in registry:
        return None, f"unknown tool {name!r}"
    if not isinstance(args, dict):
        return None, f"{env.args_key!r} is not an object"
    tool = registry[name]
    if is_typed(tool):
        reason = check(loads(text[len(env.prefix): len(text) - len(env.suffix)])[env.args_key], tool.parameters)
        if reason:
            return None, f"tool {name!r}, arguments at {reason}"
        return {env.name_key: name, env.args_key: args}, None
    want = [a.name for a in tool.required_args]
    if list(args) != want:
        return None, f"tool {name!r} takes args {want}, got {list(args)}"
    for key, value in args.items():
        if not isinstance(value, str) or value == "":
            return None, f"arg {key!r} must be a non-empty string"
        if max_string is not None and len(value.encode("utf-8")) > max_string:
            return None, f"arg {key!r} is longer than {max_string} bytes"
    return {env.name_key: name, env.args_key: args}, None
