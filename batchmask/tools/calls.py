"""Tool calls in OpenAI's shape, in one place: what a record's `tool_calls` holds, and the reading of
generated texts back into it.

OpenAI's chat completion writes a call as

    {"id": "call_...", "type": "function", "function": {"name": "calc", "arguments": "{\\"expr\\":\\"1+2\\"}"}}

with `arguments` a JSON *text* (a client json.loads it), here written compactly (separators (",", ":"),
non-ASCII kept) so equal arguments give equal text.

Ids are stable: `call_id(request_id, index)` is `call_` + the first 24 hex digits of SHA-256 over
`"<request_id>:<index>"`, so a rerun (or a resumed run) of one request names its calls alike, and two calls of
one reply differ. `request_id` is whatever names the request (a task id, a Batch API `custom_id`).

A reply with several calls is written the way its format writes several:

    hermes  several `<tool_call>` blocks, one after another, a newline allowed between them (Qwen2.5's template)
    seed, json, llama3   one call object alone, or a JSON array of call objects (`[{...},{...}]`)

In the seed format a call to the built-in `answer` tool is the seed's way of replying in text: it is read as
content, not as a call (`parse_reply`).
"""
from __future__ import annotations

import hashlib
import json

from .choice import TEXT_END, is_text_reply, refused_calls
from .envelope import CallError, Envelope, get_envelope, no_repeated_keys
from .prompt import parse_call
from .registry import ANSWER, ToolRegistry

_COMPACT = (",", ":")


def call_id(request_id, index: int) -> str:
    """The stable id of call `index` (0-based) of the reply to `request_id`."""
    digest = hashlib.sha256(f"{request_id}:{int(index)}".encode()).hexdigest()
    return "call_" + digest[:24]


def arguments_text(arguments: dict) -> str:
    """The arguments as OpenAI's `arguments` string: compact JSON, non-ASCII kept."""
    return json.dumps(arguments, ensure_ascii=False, separators=_COMPACT)


def tool_call(name: str, arguments: dict, call_id: str) -> dict:
    """One call in OpenAI's shape."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a tool call needs a non-empty string name, got {name!r}")
    if not isinstance(arguments, dict):
        raise ValueError(f"tool {name!r}: arguments must be an object, got {type(arguments).__name__}")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments_text(arguments)}}


def split_calls(text: str, env: Envelope) -> list[str]:
    """The call texts of a reply in `env`'s format (see the module docstring), each as Envelope.parse takes it;
    CallError when the text is neither one call nor several written the format's way."""
    if env.prefix:
        return _split_blocks(text, env)
    stripped = text.strip()
    if not stripped.startswith("["):
        return [text]
    try:
        items = json.loads(stripped, object_pairs_hook=no_repeated_keys)
    except json.JSONDecodeError as e:
        raise CallError(f"not JSON: {e}") from None
    if not isinstance(items, list) or not items:
        raise CallError("a list of calls must hold at least one call")
    return [json.dumps(item, ensure_ascii=False, separators=env.separators) for item in items]


def _split_blocks(text: str, env: Envelope) -> list[str]:
    """Consecutive `prefix BODY suffix` blocks; the body's end is found by decoding JSON, not by searching for
    the suffix (which a string argument may contain)."""
    decoder = json.JSONDecoder()
    out, at = [], 0
    while True:
        if not text.startswith(env.prefix, at):
            raise CallError(f"at offset {at}: expected {env.prefix!r}")
        body_at = at + len(env.prefix)
        try:
            _, end = decoder.raw_decode(text, body_at)
        except json.JSONDecodeError as e:
            raise CallError(f"not JSON: {e}") from None
        if not text.startswith(env.suffix, end):
            raise CallError(f"at offset {end}: expected {env.suffix!r}")
        stop = end + len(env.suffix)
        out.append(text[at:stop])
        rest = text[stop:]
        if not rest.strip():
            return out
        at = stop + (len(rest) - len(rest.lstrip("\n")))


def parse_reply(text: str, registry: ToolRegistry, format: str = "json", request_id=0,
                max_string: int | None = None) -> tuple[str | None, list[dict], str | None]:
    """(content, tool_calls, reason) for one generated text.

    A valid call (or several): content None, the calls in OpenAI's shape. A seed-format call to `answer`: its
    text as content, no call. Under the registry's tool_choice (batchmask.tools.choice) a text reply, where the
    choice allows one, is content (without the line end that closes it), and calls the choice does not allow
    (too many, another function, any under "none") are refused with the reason. Anything else: content None,
    no calls, and the reason it is not a call."""
    env = get_envelope(format)
    choice = getattr(registry, "choice", None)
    if choice is not None and is_text_reply(text, format):
        if not choice.text_ok:
            return None, [], f"tool_choice {choice.mode!r} asks for a call, got text"
        return text[:-len(TEXT_END)] if text.endswith(TEXT_END) else text, [], None
    try:
        pieces = split_calls(text, env)
    except CallError as e:
        return None, [], str(e)
    calls = []
    for index, piece in enumerate(pieces):
        call, reason = parse_call(piece, registry, max_string=max_string, format=format)
        if call is None:
            return None, [], (f"call {index}: {reason}" if len(pieces) > 1 else reason)
        calls.append((call[env.name_key], call[env.args_key]))
    if format == "seed" and len(calls) == 1 and calls[0][0] == ANSWER.name:
        if choice is not None and not choice.text_ok:
            return None, [], f"tool_choice {choice.mode!r} asks for a call, got the text reply ('answer')"
        return calls[0][1]["text"], [], None
    reason = None if choice is None else refused_calls(choice, [name for name, _ in calls], format, registry)
    if reason:
        return None, [], reason
    return None, [tool_call(name, args, call_id(request_id, i)) for i, (name, args) in enumerate(calls)], None


def parse_calls(texts, registry: ToolRegistry, format: str = "json", request_ids=None,
                max_string: int | None = None) -> list[list[dict]]:
    """For each text, its calls in OpenAI's shape ([] for a text reply or a text that is not a valid call).

    `request_ids[i]` names text i's request for the ids (default: its index in `texts`)."""
    texts = list(texts)
    ids = list(range(len(texts))) if request_ids is None else list(request_ids)
    if len(ids) != len(texts):
        raise ValueError(f"parse_calls: {len(texts)} texts but {len(ids)} request ids")
    return [parse_reply(t, registry, format, rid, max_string)[1] for t, rid in zip(texts, ids)]


def reply_fields(text: str, registry: ToolRegistry, format: str = "json", request_id=0, ended: bool = True,
                 max_string: int | None = None) -> dict:
    """A result record's reply fields for one generated text: the OpenAI message's `content` and `tool_calls`,
    `finish_reason` ("length" when the token ceiling ended the row, else "tool_calls" or "stop"), and the
    older `call` / `error`. Without a tool_choice `call` is the one call parse_call reads; with one, the first
    call (envelope keys) or, in the seed format, the `answer` call of a text reply."""
    content, calls, reason = parse_reply(text, registry, format, request_id, max_string)
    if getattr(registry, "choice", None) is None:
        call, error = parse_call(text, registry, max_string=max_string, format=format)
    else:
        env = get_envelope(format)
        call, error = None, reason
        if calls:
            fn = calls[0]["function"]
            call = {env.name_key: fn["name"], env.args_key: json.loads(fn["arguments"])}
        elif content is not None and format == "seed":
            call = {env.name_key: ANSWER.name, env.args_key: {"text": content}}
    finish = "length" if not ended else "tool_calls" if calls else "stop"
    return {"call": call, "error": error, "content": content, "tool_calls": calls, "finish_reason": finish}
