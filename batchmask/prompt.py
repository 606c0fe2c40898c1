"""The compact prompt protocol, and the parse that checks what the model wrote.

    Tools:
    answer(text): Reply to the user directly with a short text.
    calc(expr): Evaluate an arithmetic expression.
    ...
    TASK: what is 12 times 7?
    CALL: {"tool":"calc","args":{"expr":"12*7"}}

The harness writes everything up to and including the scaffold `\\nCALL: `; the model writes
the call. Training data (models/train.py) and generation use these same functions, so the
model sees at inference exactly the token boundaries it was trained on.
"""
from __future__ import annotations

import json

from .registry import ToolRegistry

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


def render_call(tool: str, args: dict) -> str:
    """A call in the exact compact form the grammar produces (no spaces, keys in order)."""
    return json.dumps({"tool": tool, "args": args}, separators=(",", ":"), ensure_ascii=False)


def parse_call(text: str, registry: ToolRegistry, max_string: int | None = None):
    """Parse and validate `text` as a call against `registry`.

    Returns (call, None) when it is valid, else (None, reason). Independent of the grammar: it
    is how the harness (and the ablation's free arm) judges any text.
    """
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, TypeError) as e:
        return None, f"not JSON: {e}"
    if not isinstance(obj, dict) or set(obj) != {"tool", "args"}:
        return None, "not an object with exactly the keys 'tool' and 'args'"
    name, args = obj["tool"], obj["args"]
    if not isinstance(name, str) or name not in registry:
        return None, f"unknown tool {name!r}"
    if not isinstance(args, dict):
        return None, "'args' is not an object"
    want = [a.name for a in registry[name].required_args]
    if list(args) != want:
        return None, f"tool {name!r} takes args {want}, got {list(args)}"
    for key, value in args.items():
        if not isinstance(value, str) or value == "":
            return None, f"arg {key!r} must be a non-empty string"
        if max_string is not None and len(value.encode("utf-8")) > max_string:
            return None, f"arg {key!r} is longer than {max_string} bytes"
    return obj, None
