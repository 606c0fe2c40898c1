"""OpenAI Batch API files: each request line read as a task, each result written as a Batch API output line.

Input, one request per line (the OpenAI Batch API's documented form, which vLLM's `run_batch` also reads):

    {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": "...", "messages": [...], "tools": [...], "tool_choice": "auto", "parallel_tool_calls": true,
              "max_completion_tokens": 256, "temperature": 0.7, "top_p": 0.9, "seed": 1, "stop": ["\\n\\n"],
              "response_format": {"type": "json_schema", "json_schema": {"name": "...", "schema": {...}}}}}

`messages`, `tools`, `tool_choice` and `parallel_tool_calls` become the task's own (run/runfiles.py JSONL fields);
`max_completion_tokens` (or the older `max_tokens`) its token ceiling; a `json_schema` response format its schema
(run/schema_task.py). `temperature` and `top_p` hold per request (requests in a row that share them run as one
wave: run/waves.py); `seed` keys the request's draws by the seed alone, so equal requests with equal seeds
draw alike wherever they sit in the file; `stop` cuts the reply's text at the first stop string.

Output, one line per request, in input order:

    {"id": "batch_req_...", "custom_id": "r1", "error": null,
     "response": {"status_code": 200, "request_id": "req_...", "body": <a chat.completion object>}}

with `usage` counted in tokens. A request that cannot run (a bad field, a schema outside the supported
subset, a tool_choice naming a function the request lacks) is answered with status 400 and an OpenAI error
body naming the field (`param`); every other request still runs. What no answer can be given for, a line
that is not a request or a custom_id missing or repeated, refuses the file, as the Batch API's own
validation does. `--resume` reads these lines back by custom_id.
"""
from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path

from ..errors import RunFileError

URL = "/v1/chat/completions"
BATCH_KEYS = ("id", "custom_id", "response", "error")         # an output line's fields, in this order
MAX_STOPS = 4                                                  # the API's limit on `stop` strings
UNSUPPORTED = {"n": "one choice per request", "stream": "no streaming in a batch", "logprobs": "no log-probs",
               "top_logprobs": "no log-probs", "audio": "text only", "modalities": "text only",
               "prediction": "no predicted outputs", "functions": "the legacy `functions` (use `tools`)"}


class Refusal(ValueError):
    """A request that cannot run: answered with status 400 naming `param`."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


def is_request(obj) -> bool:
    return isinstance(obj, dict) and "custom_id" in obj and "body" in obj


# --- reading ----------------------------------------------------------------------------------------
def request_task(obj, where: str) -> tuple[dict, dict]:
    """(the task's JSONL fields, the request's own settings) of one request line; a request that cannot run
    gets a stand-in task and settings["refused"] = (param, message)."""
    if not isinstance(obj, dict):
        raise RunFileError(f"{where}: expected a Batch API request object, got {type(obj).__name__}")
    cid = obj.get("custom_id")
    if not isinstance(cid, str) or not cid:
        raise RunFileError(f"{where}: \"custom_id\" must be a non-empty string, got {json.dumps(cid)[:40]}")
    settings = {"custom_id": cid, "model": None, "temperature": None, "top_p": None, "seed": None, "stop": [],
                "refused": None}
    try:
        fields = _body_fields(obj, settings)
    except Refusal as r:
        settings["refused"] = (r.param, str(r))
        fields = {"task": f"(request {cid}: refused)"}
    return fields, settings


def _body_fields(obj: dict, s: dict) -> dict:
    if obj.get("method", "POST") != "POST":
        raise Refusal("method", f"method must be \"POST\", got {json.dumps(obj.get('method'))[:40]}")
    if obj.get("url", URL) != URL:
        raise Refusal("url", f"url must be \"{URL}\" (chat completions), got {json.dumps(obj.get('url'))[:60]}")
    body = obj["body"]
    if not isinstance(body, dict):
        raise Refusal("body", f"body must be an object, got {type(body).__name__}")
    for key, why in UNSUPPORTED.items():
        value = body.get(key)
        if value not in (None, False) and not (key == "n" and value == 1):
            raise Refusal(key, f"{key}={json.dumps(value)[:40]} is not supported ({why})")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise Refusal("model", f"model must be a string, got {type(model).__name__}")
    s["model"] = model
    fields = {"messages": _messages(body.get("messages"))}
    if body.get("tools") is not None:
        if not isinstance(body["tools"], list) or not body["tools"]:
            raise Refusal("tools", "tools must be a non-empty list of tools")
        fields["tools"] = body["tools"]
    for key in ("tool_choice", "parallel_tool_calls"):
        if body.get(key) is not None:
            fields[key] = body[key]
    limits = [k for k in ("max_completion_tokens", "max_tokens") if body.get(k) is not None]
    if limits:
        n = body[limits[0]]
        if type(n) is not int or n < 1:
            raise Refusal(limits[0], f"{limits[0]} must be a positive integer, got {json.dumps(n)[:40]}")
        fields["max_new_tokens"] = n
        s["limit_field"] = limits[0]                   # the field a 400 for it names
    s["temperature"] = _number(body, "temperature", 0.0, 2.0)
    s["top_p"] = _number(body, "top_p", 0.0, 1.0)
    if s["top_p"] == 0.0:
        raise Refusal("top_p", "top_p must be above 0")
    seed = body.get("seed")
    if seed is not None and type(seed) is not int:
        raise Refusal("seed", f"seed must be an integer, got {json.dumps(seed)[:40]}")
    s["seed"] = seed
    s["stop"] = _stops(body.get("stop"))
    schema = _response_schema(body.get("response_format"))
    if schema is not None:
        if "tools" in fields:
            raise Refusal("response_format", "a json_schema response_format together with tools is not supported "
                                             "(a reply is either calls or one JSON value)")
        fields["schema"] = schema
    return fields


def _messages(convo) -> list:
    if not isinstance(convo, list) or not convo:
        raise Refusal("messages", "messages must be a non-empty list")
    out = []
    for k, m in enumerate(convo):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise Refusal(f"messages[{k}]", "each message must be an object with a string \"role\"")
        content = m.get("content")
        if isinstance(content, list):               # content parts: text only
            texts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise Refusal(f"messages[{k}].content[{j}]", "only text content parts are supported")
                texts.append(part["text"])
            m = {**m, "content": "".join(texts)}
        elif content is not None and not isinstance(content, str):
            raise Refusal(f"messages[{k}].content", "content must be a string or a list of text parts")
        out.append(m)
    return out


def _number(body: dict, key: str, low: float, high: float) -> float | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not low <= v <= high:
        raise Refusal(key, f"{key} must be a number in [{low:g}, {high:g}], got {json.dumps(v)[:40]}")
    return float(v)


def _stops(stop) -> list[str]:
    stops = [stop] if isinstance(stop, str) else stop if stop is not None else []
    if not isinstance(stops, list) or len(stops) > MAX_STOPS or not all(isinstance(x, str) and x for x in stops):
        raise Refusal("stop", f"stop must be a string or a list of at most {MAX_STOPS} non-empty strings")
    return stops


def _response_schema(fmt) -> dict | None:
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise Refusal("response_format.json_schema.schema", "a json_schema response_format needs "
                                                                "json_schema.schema, a JSON Schema object")
        return spec["schema"]
    if kind == "json_object":
        raise Refusal("response_format", "json_object (any JSON object, free keys) is not supported: every value "
                                         "batchmask writes is bounded; give a json_schema with the properties")
    raise Refusal("response_format", f"response_format type must be \"text\" or \"json_schema\", got "
                                     f"{json.dumps(kind)[:40]}")


# --- writing ----------------------------------------------------------------------------------------
def _ids(run_key: str, custom_id: str) -> tuple[str, str, str]:
    """(line id, request id, completion id): stable for one run's request, so a rerun writes the same ids."""
    h = hashlib.sha256(f"{run_key}\0{custom_id}".encode()).hexdigest()
    return f"batch_req_{h[:24]}", f"req_{h[24:48]}", f"chatcmpl-{h[40:64]}"


def refused_line(settings: dict, run_key: str) -> dict:
    line_id, request_id, _ = _ids(run_key, settings["custom_id"])
    param, message = settings["refused"]
    body = {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": None}}
    return {"id": line_id, "custom_id": settings["custom_id"],
            "response": {"status_code": 400, "request_id": request_id, "body": body}, "error": None}


def output_line(record: dict, settings: dict, prompt_tokens: int, model: str, run_key: str, schema: bool) -> dict:
    """A result record (run/generation.py Result.record) as the request's Batch API output line."""
    line_id, request_id, completion_id = _ids(run_key, settings["custom_id"])
    content = record["text"] if schema else record.get("content")
    finish = record.get("finish_reason") or ("length" if record["cut"] else "stop")
    for stop in settings["stop"]:
        if isinstance(content, str) and stop in content:
            content, finish = content[:content.index(stop)], "stop"
    message = {"role": "assistant", "content": content, "refusal": None}
    if record.get("tool_calls") and not schema:
        message["tool_calls"] = record["tool_calls"]
    completion = {"id": completion_id, "object": "chat.completion", "created": int(time.time()),
                  "model": settings["model"] or model,
                  "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
                  "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": record["tokens"],
                            "total_tokens": prompt_tokens + record["tokens"]}}
    return {"id": line_id, "custom_id": settings["custom_id"],
            "response": {"status_code": 200, "request_id": request_id, "body": completion}, "error": None}


# --- reading output back (--resume) -----------------------------------------------------------------
def check_output_line(obj, where: str) -> dict:
    """`obj` if it is a Batch API output line, else RunFileError naming `where`."""
    if not isinstance(obj, dict) or not all(k in obj for k in BATCH_KEYS):
        raise RunFileError(f"{where}: not a Batch API output line (it needs {', '.join(BATCH_KEYS)})")
    if not isinstance(obj["custom_id"], str) or not isinstance(obj["response"], (dict, type(None))):
        raise RunFileError(f"{where}: not a Batch API output line (\"custom_id\" or \"response\")")
    return obj


# --- a run's settings per request --------------------------------------------------------------------
def per_task(requests: list[dict], todo: list[int], temperature: float, top_p: float):
    """(sampling, keys) for the tasks at `todo`: each request's (temperature, top_p), the run's where it gives
    none, and its draw key (its seed's, so equal seeds draw alike; None: keyed by its place); (None, None)
    for a file of other tasks."""
    if not requests:
        return None, None
    from .limits import task_seed
    sampling = [(requests[i]["temperature"] if requests[i]["temperature"] is not None else temperature,
                 requests[i]["top_p"] if requests[i]["top_p"] is not None else top_p) for i in todo]
    keys = [None if requests[i]["seed"] is None else task_seed(requests[i]["seed"], 0) for i in todo]
    return sampling, keys


def check_fit(taskfile, plan, tokenizer, context: int, system: str | None) -> None:
    """Each task's ceiling and prompt against the model's context, once it is loaded. A task file's task that
    does not fit ends the run (TaskFile.check_limits; its prompt: generation.encode_prompts); a Batch API
    request that does not fit is answered with status 400, and the others run."""
    if not taskfile.requests:
        taskfile.check_limits(context, "the model's context (seq_len)")
        return
    from .generation import encode_prompts
    for i, req in enumerate(taskfile.requests):
        if req["refused"]:
            continue
        limit = taskfile.limits[i]
        if limit is not None and limit > context:
            key = req.get("limit_field", "max_completion_tokens")
            req["refused"] = (key, f"{key} {limit} is above the model's context ({context} tokens)")
            continue
        reg = plan.registries[plan.groups[i]]
        n = len(encode_prompts([taskfile.task_input(i)], tokenizer, [reg], 1 << 62, system)[0])
        if n >= context:
            req["refused"] = ("messages", f"the prompt is {n} tokens, but the model's context is {context}: it "
                                          "needs at least one position left for the reply")


# --- a run's output -----------------------------------------------------------------------------------
class BatchWriter:
    """A run's results written as Batch API output lines, in input order: a refused request's line goes out
    as soon as every earlier request's has (rank 0 writes them all under torchrun)."""

    def __init__(self, taskfile, sink, skip: set[int], prompt_tokens: dict[int, int], checkpoint,
                 writes_refused: bool = True):
        self.requests, self.sink, self.run_key = taskfile.requests, sink, taskfile.key()
        self.model = Path(str(checkpoint)).name if checkpoint else "batchmask-default"   # a request may name its own
        self.prompt_tokens = prompt_tokens                  # task index -> its prompt's tokens (usage)
        self.refused = [i for i, r in enumerate(self.requests) if r["refused"] and i not in skip] \
            if writes_refused else []

    def _refused_before(self, index: int) -> None:
        while self.refused and self.refused[0] < index:
            self.sink.write(refused_line(self.requests[self.refused.pop(0)], self.run_key))

    def write(self, record: dict, schema: bool = False) -> None:
        """Task record["index"]'s result (`schema`: a json_schema response, whose text is the content)."""
        i = record["index"]
        self._refused_before(i)
        self.sink.write(output_line(record, self.requests[i], self.prompt_tokens.get(i, 0), self.model,
                                    self.run_key, schema))

    def finish(self) -> None:
        self._refused_before(len(self.requests))
