"""Berkeley Function Calling Leaderboard (BFCL) data read as batchmask's tools and tasks.

BFCL writes its function docs in its own dialect of JSON Schema: `"type": "dict"` for objects, `float`,
`tuple`, `any`, and Java (`HashMap`, `ArrayList`, `long`, ...) and JavaScript (`String`, `Bigint`) type
names, an `optional` flag beside `required`, and dotted function names. BFCL's own handlers read them for
OpenAI-style APIs through the GORILLA_TO_OPENAPI table (bfcl_eval/constants/type_mappings.py) and
`convert_to_tool` (bfcl_eval/model_handler/utils.py). This module states that reading again:

    openai_tool(fn, where)        one BFCL function doc -> {"type": "function", "function": {...}}
    is_question(obj)              a BFCL question line ({"id", "question", "function"} or a multi-turn one)
    question_task(obj, where)     a question line -> batchmask's task fields {"messages", "tools", "id"}
    function_docs_tools(obj, ...) a BFCL function-doc file (a list, or JSON Lines) -> OpenAI tools, else None

The reading, as BFCL's: every type name goes through the table, a name it does not hold and an absent type
mean `string` (BFCL's own fallback), at every depth (properties, items, additionalProperties); the
parameters object is `"type": "object"`; dots in a function name become underscores. Where we differ,
and why: BFCL-only keys (`optional`, the function's `response` schema) are annotations and are dropped,
not passed on; BFCL adds `"format": "float"` (and a sentence to the description) to a float, a format no
JSON Schema checker knows (batchmask refuses formats it cannot write), so a float is a plain `number` and
its description stays as written. BFCL's Java and JavaScript categories
also rewrite every parameter as a string holding source text (utils.py `_func_doc_language_specific_
pre_processing`): that is a prompt of theirs, not a schema reading, and is not applied here.

Multi-turn questions are refused: a turn after the first answers tool results BFCL's executor produces,
which a task file cannot hold, and those questions name their functions by class (`involved_classes`,
docs in data/multi_turn_func_doc/), not inline. A data error is one RegistryError line naming `where`
(file and line, or the question's id) and the field.
"""
from __future__ import annotations

import json
import re

from ..errors import RegistryError
from ..text import short as _short

# BFCL's type names and the JSON Schema type each means in its OpenAI reading (GORILLA_TO_OPENAPI).
TYPE_MAP = {
    "integer": "integer", "number": "number", "float": "number", "string": "string", "boolean": "boolean",
    "bool": "boolean", "array": "array", "list": "array", "dict": "object", "object": "object",
    "tuple": "array", "any": "string", "byte": "integer", "short": "integer", "long": "integer",
    "double": "number", "char": "string", "ArrayList": "array", "Array": "array", "HashMap": "object",
    "Hashtable": "object", "Queue": "array", "Stack": "array", "Any": "string", "String": "string",
    "Bigint": "integer",
}
# Keys BFCL writes that are no JSON Schema keyword: annotations of theirs, dropped.
BFCL_ONLY = ("optional",)
# The registry's built-in `answer` as a tools-file entry (batchmask.tools.registry.ANSWER).
ANSWER_ENTRY = {"name": "answer", "description": "Reply to the user directly with a short text.",
                "args": [{"name": "text", "type": "string", "required": True, "description": "the reply"}]}
# Subschema keys the reading walks into: a schema each, or (properties) a map of them.
_SUB = ("items", "additionalProperties")


def openai_type(t, where: str) -> str:
    """BFCL's type name as JSON Schema reads it: through the table, else `string` (BFCL's fallback)."""
    if t is None:
        return "string"
    if not isinstance(t, str):
        raise RegistryError(f"{where}: type must be a type name, got {type(t).__name__} {_short(t)}")
    return TYPE_MAP.get(t, "string")


def _schema(s, where: str) -> dict:
    """One BFCL property schema as JSON Schema: its type mapped, its subschemas read the same way."""
    if not isinstance(s, dict):
        raise RegistryError(f"{where}: a parameter schema must be an object, got {type(s).__name__} {_short(s)}")
    out = {k: v for k, v in s.items() if k not in BFCL_ONLY}
    out["type"] = openai_type(s.get("type"), f"{where}/type")
    if "properties" in s:
        out["properties"] = _properties(s["properties"], f"{where}/properties")
    for k in _SUB:
        if isinstance(s.get(k), dict):          # a boolean additionalProperties is JSON Schema's own
            out[k] = _schema(s[k], f"{where}/{k}")
    return out


def _properties(props, where: str) -> dict:
    if not isinstance(props, dict):
        raise RegistryError(f"{where}: must be an object of parameter schemas, got {type(props).__name__}")
    return {name: _schema(sub, f"{where}/{name}") for name, sub in props.items()}


def openai_tool(fn: dict, where: str) -> dict:
    """One BFCL function doc as an OpenAI tool `{"type": "function", "function": {name, description, parameters}}`."""
    if not isinstance(fn, dict):
        raise RegistryError(f"{where}: a function doc must be an object, got {type(fn).__name__}")
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise RegistryError(f"{where}: function 'name' must be a non-empty string, got {_short(name)}")
    where = f"{where}: function {_short(name)}"
    description = fn.get("description", "")
    if not isinstance(description, str):
        raise RegistryError(f"{where}: 'description' must be a string, got {type(description).__name__}")
    params = fn.get("parameters")
    if not isinstance(params, dict):
        raise RegistryError(f"{where}: 'parameters' must be an object, got {type(params).__name__}")
    if params.get("type", "dict") not in ("dict", "object"):
        raise RegistryError(f"{where}: parameters type must be \"dict\" (the arguments object), "
                            f"got {_short(params.get('type'))}")
    required = params.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise RegistryError(f"{where}: parameters 'required' must be a list of names, got {_short(required)}")
    out = {k: v for k, v in params.items() if k not in BFCL_ONLY}
    out["type"] = "object"
    try:
        out["properties"] = _properties(params.get("properties", {}), f"{where} parameters: #/properties")
    except RecursionError:
        raise RegistryError(f"{where}: parameters nested too deeply to read") from None
    missing = [r for r in required if r not in out["properties"]]
    if missing:
        raise RegistryError(f"{where}: parameters 'required' names {_short(missing[0])}, which is not among "
                            f"its properties")
    # OpenAI names match ^[a-zA-Z0-9_-]{1,64}$: BFCL writes a dotted name (math.factorial) with underscores.
    return {"type": "function", "function": {"name": re.sub(r"\.", "_", name), "description": description,
                                             "parameters": out}}


def openai_tools(functions, where: str) -> list[dict]:
    """A question's (or file's) function docs as OpenAI tools; two docs that read as one name are refused."""
    if not isinstance(functions, list) or not functions:
        raise RegistryError(f"{where}: 'function' must be a non-empty list of function docs, "
                            f"got {_short(functions)}")
    tools, seen = [], {}
    for i, fn in enumerate(functions):
        tool = openai_tool(fn, f"{where}: function[{i}]")
        name = tool["function"]["name"]
        if name in seen:
            raise RegistryError(f"{where}: function[{i}] {_short(fn.get('name'))} reads as {_short(name)}, "
                                f"the name of function[{seen[name]}]")
        seen[name] = i
        tools.append(tool)
    return tools


def is_question(obj) -> bool:
    """A BFCL question line: `question` with its functions inline (`function`) or by class (multi-turn)."""
    return isinstance(obj, dict) and "question" in obj and ("function" in obj or "involved_classes" in obj)


def question_task(obj: dict, where: str) -> dict:
    """A BFCL question line as batchmask's task fields: {"messages", "tools", "id"}.

    `question` is a list of turns, each a list of {"role", "content"} messages; BFCL's single-turn
    categories hold one turn, whose messages are the task's. An empty `function` list (irrelevance) gives
    the `answer` tool alone. A question of more turns, or one whose functions are given by class
    (`involved_classes`), is refused."""
    qid = obj.get("id")
    if not isinstance(qid, str) or not qid:
        raise RegistryError(f"{where}: a BFCL question needs an 'id' string, got {_short(qid)}")
    where = f"{where} ({qid})"
    if "function" not in obj:
        raise RegistryError(f"{where}: functions given by class ({_short(obj.get('involved_classes'))}, "
                            "BFCL's multi-turn docs) are not read; pass a question with its 'function' list")
    turns = obj.get("question")
    if not isinstance(turns, list) or not turns:
        raise RegistryError(f"{where}: 'question' must be a non-empty list of turns, got {_short(turns)}")
    if len(turns) > 1:
        raise RegistryError(f"{where}: a multi-turn question ({len(turns)} turns) is not read: later turns "
                            "follow tool results a task file does not hold; single-turn questions only")
    messages = turns[0]
    if not isinstance(messages, list) or not messages:
        raise RegistryError(f"{where}: question[0] must be a non-empty list of messages, got {_short(messages)}")
    for j, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise RegistryError(f"{where}: question[0][{j}] must be {{\"role\": str, \"content\": str}}, "
                                f"got {_short(m)}")
    functions = obj["function"]
    # BFCL's irrelevance questions may offer no function at all: the task's tools are then `answer` alone
    # (the reply in text batchmask's registries always allow), written out since a registry may not be empty.
    tools = [ANSWER_ENTRY] if functions == [] else openai_tools(functions, where)
    return {"messages": [{"role": m["role"], "content": m["content"]} for m in messages], "tools": tools, "id": qid}


def is_function_doc(e) -> bool:
    """A BFCL function doc: a name and parameters of BFCL's `"type": "dict"` (OpenAI writes "object")."""
    return (isinstance(e, dict) and "function" not in e and isinstance(e.get("name"), str)
            and isinstance(e.get("parameters"), dict) and e["parameters"].get("type") == "dict")


def function_docs_tools(obj, raw: str, source: str) -> list[dict] | None:
    """A tools file in BFCL's form as OpenAI tools: `obj` its parsed JSON (None when it is not one JSON
    value), `raw` its text. A list of BFCL function docs, or JSON Lines of them (data/multi_turn_func_doc/),
    reads; anything else is None (not BFCL's: the caller reads it its own way)."""
    if isinstance(obj, list) and obj and all(is_function_doc(e) for e in obj):
        return openai_tools(obj, source)
    if obj is not None:
        return None
    lines = [(n, line) for n, line in enumerate(raw.splitlines(), 1) if line.strip()]
    docs = []
    for n, line in lines:
        try:
            e = json.loads(line)
        except (json.JSONDecodeError, RecursionError):      # not JSON Lines: the caller's JSON error stands
            return None
        if is_question(e):
            raise RegistryError(f"{source}:{n}: a BFCL question file holds a tool set per question; "
                                "read it as a task file, or pass one question's functions as --tools")
        if not is_function_doc(e):
            return None
        docs.append((n, e))
    if not docs:
        return None
    tools = [openai_tool(e, f"{source}:{n}") for n, e in docs]
    names = [t["function"]["name"] for t in tools]
    dup = next((i for i, nm in enumerate(names) if nm in names[:i]), None)
    if dup is not None:
        raise RegistryError(f"{source}:{docs[dup][0]}: function {_short(docs[dup][1]['name'])} reads as "
                            f"{_short(names[dup])}, a name an earlier line has")
    return tools
