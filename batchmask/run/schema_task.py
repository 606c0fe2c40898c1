"""A task whose answer is one JSON value of a bare JSON Schema (JSONL `"schema"`), instead of a tool call.

    {"task": "the weather in Paris as a record", "schema": {"type": "object", "properties": {...}}}

The row is constrained by the schema's own grammar (batchmask.compile_json_schema: compact JSON, declared
properties in order, every value bounded); it stands in the run where a task's tool set would, so it
has the three things generation asks of one: a key for the grammar cache, a prompt and a parse.

Prompt: without a chat template, `Schema: <the schema, compact>`, the task and the scaffold `\\nJSON: `;
with one, the template rendered with a system message asking for one JSON value of the schema (after
--system's, if given) and the task as the user's message, no tools. The schema must describe an object
(`"type": "object"`), so a result's "call" is always an object (or null), as for tool calls.
"""
from __future__ import annotations

import json

from ..tools.registry import RegistryError

SCAFFOLD = "\nJSON: "


class SchemaTask:
    """One JSON value of `schema` (checked now against the supported subset: batchmask.schema.build)."""

    def __init__(self, schema, source: str = "<schema>", options=None):
        if not isinstance(schema, dict) or schema.get("type") != "object":
            raise RegistryError(f"{source}: a task's schema must be a JSON Schema object with \"type\": \"object\", "
                                f"got {json.dumps(schema)[:60]}")
        from ..schema.build import SchemaOptions, schema_node
        self.options = options if options is not None else SchemaOptions()
        schema_node(schema, self.options, separators=(",", ":"), where=source)     # refuses what it cannot take
        self.schema, self.source = schema, source
        self.text = json.dumps(schema, ensure_ascii=False, separators=(",", ":"))

    # --- the grammar ---------------------------------------------------------------------------------
    def grammar_key(self) -> dict:
        from ..api import schema_grammar_key
        return schema_grammar_key(self.schema, self.options)

    def grammar_node(self):
        from ..schema.build import schema_node
        return schema_node(self.schema, self.options, separators=(",", ":"), where=self.source)

    def compile(self, tokenizer, device="cpu"):
        from ..api import compile_json_schema
        return compile_json_schema(self.schema, tokenizer, options=self.options, device=device)

    def load(self, path, tokenizer, device="cpu"):
        from ..compiler.compiled import CompiledGrammar
        return CompiledGrammar.load(path, device=device, tokenizer=tokenizer, utf8=True, key=self.grammar_key())

    # --- prompt and parse ----------------------------------------------------------------------------
    def render_prompt(self, task, tokenizer=None, *, system: str | None = None) -> str:
        from ..tools.chat_template import pick_template
        from ..tools.prompt import chat_messages, clean_task
        template = pick_template(tokenizer, tools=False) if tokenizer is not None else None
        if template is None:
            if not isinstance(task, str) or system is not None:
                raise ValueError("a task given as messages, or --system, needs a chat template, and the tokenizer "
                                 "has none")
            return f"Schema: {self.text}\nTASK: {clean_task(task)}{SCAFFOLD}"
        from ..tools.chat_template import render, special_tokens
        ask = f"Reply with one JSON value of this JSON Schema, and nothing else: {self.text}"
        messages = chat_messages(task, ask if system is None else f"{system}\n\n{ask}")
        return render(template, messages, add_generation_prompt=True, **special_tokens(tokenizer))

    def encode_prompt(self, task, tokenizer, *, system: str | None = None) -> list[int]:
        from ..tools.chat_template import pick_template
        from ..tools.prompt import encode_rendered
        text = self.render_prompt(task, tokenizer, system=system)
        if pick_template(tokenizer, tools=False) is None:
            return tokenizer.encode(text, bos=True)
        return encode_rendered(tokenizer, text)

    def parse(self, text: str):
        """(value, None) if `text` is one JSON value valid under the schema, else (None, reason)."""
        from ..schema.validate import check, loads
        try:
            value = loads(text)
        except (json.JSONDecodeError, RecursionError) as e:
            return None, f"not JSON ({e})"
        reason = check(value, self.schema, closed=not self.options.open_objects)
        if reason:
            return None, f"schema: at {reason}"
        try:
            return json.loads(text), None
        except ValueError:              # an integer past Python's 4300-digit limit (no digit cap): the exact value
            return value, None

    def __repr__(self) -> str:
        return f"SchemaTask({self.text[:60]})"


def render_prompt(registry, task, tokenizer=None, *, system: str | None = None) -> str:
    """batchmask.tools.prompt.render_prompt for a tool set, SchemaTask.render_prompt for a schema task."""
    if isinstance(registry, SchemaTask):
        return registry.render_prompt(task, tokenizer, system=system)
    from ..tools.prompt import render_prompt as tools_prompt
    return tools_prompt(registry, task, tokenizer, system=system)
