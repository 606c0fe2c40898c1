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

An instruct model was trained on its own chat template instead: when the tokenizer has one
(`tokenizer.chat_template`), the prompt is that template rendered as transformers renders it
(batchmask.tools.chat_template) with the task as the user's message (after an optional system message),
the registry's tools (`tool_schemas`: each tool's entry as its file gives it) and
add_generation_prompt=True; the model then writes its call in the format asked (`--format`).
"""
from __future__ import annotations

import json

from ..schema.validate import check, loads
from .envelope import CallError, get_envelope, is_typed
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


def render_prompt(registry: ToolRegistry, task, tokenizer=None, *, system: str | None = None) -> str:
    """The exact text the model is conditioned on.

    `task`: the user's request (str), or a whole conversation (a list of {"role", "content"} messages).
    With a tokenizer that has a chat template: the template rendered with messages = [system?] + [the task
    as the user's message] (or the conversation as given), tools = `tool_schemas(registry)`,
    add_generation_prompt=True and the tokenizer's special-token strings. Otherwise the catalogue prompt,
    scaffold included (a conversation or a system message then has no place: ValueError)."""
    template = None
    if tokenizer is not None:
        from .chat_template import pick_template
        template = pick_template(tokenizer, tools=True)
    if template is None:
        if not isinstance(task, str):
            raise ValueError("a task given as messages needs a chat template, and the tokenizer has none "
                             "(no chat_template in tokenizer_config.json or chat_template.jinja)")
        if system is not None:
            raise ValueError("--system needs a chat template, and the tokenizer has none (no chat_template in "
                             "tokenizer_config.json or chat_template.jinja)")
        return f"{catalogue(registry)}\nTASK: {clean_task(task)}{SCAFFOLD}"
    from .chat_template import render, special_tokens
    messages, tools, specials = chat_messages(task, system), tool_schemas(registry), special_tokens(tokenizer)
    if tools and ignores_tools(template, specials):            # the tools must reach the model some way
        messages, tools = with_tools_message(messages, tools), None
    return render(template, messages, tools=tools, add_generation_prompt=True, **specials)


# A chat template that renders `tools=` to nothing (some base models' templates) would leave the model held to
# tools it never saw: such a template gets them in a system message instead, written as TOOLS_MESSAGE says.
TOOLS_MESSAGE = ("You can call these tools (one JSON object per line: name, description, parameters):\n"
                 "{tools}\nTo call a tool, reply with the call only.")
_PROBE_TOOL = {"type": "function", "function": {"name": "probe", "description": "probe",
                                                "parameters": {"type": "object", "properties": {}}}}
_IGNORES: dict[str, bool] = {}                   # template text -> whether it renders tools= to nothing


def ignores_tools(template: str, specials: dict) -> bool:
    """Whether `template` renders the same text with and without `tools=` (checked once per template, on a probe
    conversation); the first time it does, a warning says so."""
    if template not in _IGNORES:
        from ..text import say_warning
        from .chat_template import render
        probe = [{"role": "user", "content": "hi"}]
        with_tools = render(template, probe, tools=[_PROBE_TOOL], add_generation_prompt=True, **specials)
        _IGNORES[template] = with_tools == render(template, probe, tools=None, add_generation_prompt=True, **specials)
        if _IGNORES[template]:
            say_warning("the tokenizer's chat template ignores tools=: the tools are given in a system message "
                        "instead (batchmask.tools.prompt.TOOLS_MESSAGE)")
    return _IGNORES[template]


def with_tools_message(messages: list[dict], tools: list[dict]) -> list[dict]:
    """`messages` with the tools listed in the system message (after its own text, if it has one)."""
    text = TOOLS_MESSAGE.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
    if messages and messages[0].get("role") == "system" and isinstance(messages[0].get("content"), str):
        return [{**messages[0], "content": messages[0]["content"] + "\n\n" + text}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def task_text(task) -> str:
    """What a result record names as its task: the text, or for a conversation its last user message's content
    (the whole conversation as JSON when that is not a string)."""
    if isinstance(task, str):
        return task
    users = [m.get("content") for m in task if isinstance(m, dict) and m.get("role") == "user"]
    if users and isinstance(users[-1], str):
        return users[-1]
    return json.dumps(task, ensure_ascii=False)


def chat_messages(task, system: str | None = None) -> list[dict]:
    """The conversation a task stands for: [system?] + the task as the user's message, or its own messages."""
    messages = [{"role": "user", "content": task}] if isinstance(task, str) else [dict(m) for m in task]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    return messages


def tool_schemas(registry: ToolRegistry) -> list[dict]:
    """The tools as a chat template takes them (transformers' `tools=`): each typed tool's entry exactly as its
    file gives it (Tool.source); a native tool as an OpenAI function object. Exactly the user's tools: the
    built-in `answer` the registry adds is not listed (ToolRegistry.user_tools)."""
    out = []
    for tool in registry.user_tools:
        if tool.typed and tool.source is not None:
            out.append(tool.source)
            continue
        if tool.typed:
            params = tool.parameters
        else:   # native args travel as JSON strings whatever their declared type (the grammar writes strings)
            props = {a.name: {"type": "string", **({"description": a.description} if a.description else {})}
                     for a in tool.required_args}
            params = {"type": "object", "properties": props, "required": list(props)}
        out.append({"type": "function", "function": {"name": tool.name, "description": tool.description,
                                                     "parameters": params}})
    return out


def encode_prompt(registry: ToolRegistry, task, tokenizer, *, system: str | None = None) -> list[int]:
    """The prompt's token ids. The catalogue prompt starts with BOS; a rendered chat template writes its own
    begin token as text (its bos_token), which the encode maps to its id as transformers does
    (apply_chat_template encodes with add_special_tokens=False), so BOS is never doubled."""
    text = render_prompt(registry, task, tokenizer, system=system)
    from .chat_template import pick_template
    if pick_template(tokenizer, tools=True) is None:
        return tokenizer.encode(text, bos=True)
    return encode_rendered(tokenizer, text)


def encode_rendered(tokenizer, text: str) -> list[int]:
    """A rendered template's ids without added BOS. A Hugging Face tokenizer matches every added token in the
    text itself (as transformers does); another vocabulary gets its bos/eos strings mapped to their ids."""
    if hasattr(tokenizer, "backend"):
        return tokenizer.encode(text, bos=False)
    marks = {s: i for s, i in ((getattr(tokenizer, "bos_token", None), tokenizer.bos_id),
                               (getattr(tokenizer, "eos_token", None), tokenizer.eos_id)) if s and i is not None}
    ids: list[int] = []
    rest = text
    while rest:
        hits = [(rest.find(s), s) for s in marks if s in rest]
        if not hits:
            ids += tokenizer.encode(rest, bos=False)
            break
        at, mark = min(hits, key=lambda h: (h[0], -len(h[1])))
        if at:
            ids += tokenizer.encode(rest[:at], bos=False)
        ids.append(marks[mark])
        rest = rest[at + len(mark):]
    return ids


def render_call(tool: str, args: dict, format: str = "seed") -> str:
    """A call in the exact compact form the grammar produces (no spaces, keys in order)."""
    return get_envelope(format).render(tool, args)


def parse_call(text: str, registry: ToolRegistry, max_string: int | None = None, format: str = "seed"):
    """Parse and validate `text` as a call in `format` (batchmask.tools.envelope) against `registry`.

    Returns (call, None) when it is valid, else (None, reason). Independent of the grammar: it
    is how the harness (and the ablation's free arm) judges any text. Native tools: each
    required arg, in order, a non-empty string (at most `max_string` UTF-8 bytes when given).
    Typed tools: the arguments are checked against the tool's schema (batchmask.schema.validate).
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
        closed = not getattr(getattr(registry, "options", None), "open_objects", False)
        reason = check(loads(text[len(env.prefix): len(text) - len(env.suffix)])[env.args_key], tool.parameters,
                       closed=closed)
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
