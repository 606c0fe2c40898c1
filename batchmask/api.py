"""The public compile entry points: a tool registry in a call format, or one bare JSON Schema.

    compile_grammar(registry, tokenizer, format="seed")     a call to any tool of the registry
    compile_json_schema(schema, tokenizer)                  one JSON value of `schema`

Both give a CompiledGrammar (same table, same masker). The grammar node comes from
batchmask.envelope (calls) or batchmask.schema (values); the table from the compiler's
`compile_node`, which records `key` (what the grammar depends on) in cache files and checks it
on load. A native registry in the seed format keeps the compiler's seed path, so its table and
`describe()` are exactly today's.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import TYPE_CHECKING

from .envelope import get_envelope, is_typed, registry_key, registry_node
from .registry import RegistryError, ToolRegistry

if TYPE_CHECKING:                       # annotations only: importing torch here would slow `import batchmask`
    import torch

    from .compiler import CompiledGrammar
    from .models.tokenizer_base import BaseTokenizer
    from .schema import SchemaOptions


def _options_key(options):
    if options is None:
        return None
    if dataclasses.is_dataclass(options):
        return json.loads(json.dumps(dataclasses.asdict(options)))
    raise TypeError(f"options must be a SchemaOptions (batchmask.schema), got {type(options).__name__}")


def call_grammar_key(registry: ToolRegistry, format: str = "seed", max_string: int = 256, utf8: bool = True,
                     options=None) -> dict:
    """What a call grammar depends on (JSON-able): registry canonical form, format, options, byte rule, caps."""
    get_envelope(format)
    if options is None and any(is_typed(t) for t in registry):
        from .schema import SchemaOptions
        options = SchemaOptions()
    return {"grammar": "call", "format": format, "registry": registry_key(registry), "max_string": max_string,
            "utf8": bool(utf8), "options": _options_key(options)}


def schema_grammar_key(schema, options=None) -> dict:
    """What a bare-schema grammar depends on (JSON-able)."""
    if options is None:
        from .schema import SchemaOptions
        options = SchemaOptions()
    from .schema import canonical_schema
    return {"grammar": "json-schema", "schema": json.loads(json.dumps(canonical_schema(schema))), "utf8": True,
            "options": _options_key(options)}


def uses_seed_path(registry: ToolRegistry, format: str) -> bool:
    """The seed format on a registry of native tools only: the compiler's original path."""
    return format == "seed" and not any(is_typed(t) for t in registry)


def _seed_path(compiler):
    seed = getattr(compiler, "compile_seed", None) or compiler.compile_grammar
    if seed is compile_grammar:
        raise RuntimeError("batchmask.compiler has no seed compile path (compile_seed)")
    return seed


def compile_grammar(registry: ToolRegistry, tokenizer: BaseTokenizer, *, format: str = "seed", max_string: int = 256,
                    utf8: bool = True, options: SchemaOptions | None = None,
                    device: str | torch.device = "cpu") -> CompiledGrammar:
    """Compile a call to any tool of `registry`, in `format` (see batchmask.envelope), into a CompiledGrammar.

    `tokenizer` needs `token_bytes` (list[bytes], b"" for ids with no text) and `eos_id`
    (optionally `stop_ids`, `vocab_hash()`). `max_string` caps native tools' values (bytes);
    `options` (batchmask.schema.SchemaOptions) sets the caps of typed tools' schemas.
    """
    get_envelope(format)
    if not isinstance(registry, ToolRegistry):
        raise RegistryError(f"compile_grammar needs a ToolRegistry, got {type(registry).__name__}")
    from . import compiler
    if uses_seed_path(registry, format):
        return _seed_path(compiler)(registry, tokenizer, max_string=max_string, utf8=utf8, device=device)
    node = registry_node(registry, format, max_string, options)
    key = call_grammar_key(registry, format, max_string, utf8, options)
    return compiler.compile_node(node, tokenizer, utf8=utf8, key=key, device=device)


def compile_json_schema(schema: dict | bool | str, tokenizer: BaseTokenizer, *, options: SchemaOptions | None = None,
                        device: str | torch.device = "cpu") -> CompiledGrammar:
    """Compile one JSON value of `schema` (a JSON Schema: dict, or a path-free JSON string) into a CompiledGrammar.

    Serialisation is compact (no whitespace, "," and ":"); objects hold their declared properties
    only, in declared order; every value is bounded (see batchmask.schema.SchemaOptions).
    """
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise ValueError(f"<schema>: not valid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    if not isinstance(schema, (dict, bool)):
        raise ValueError(f"<schema>: a JSON Schema is an object (or true/false), got {type(schema).__name__}")
    from . import compiler
    from .schema import SchemaOptions, schema_node
    opts = options if options is not None else SchemaOptions()
    node = schema_node(schema, opts, separators=(",", ":"), where="<schema>")
    return compiler.compile_node(node, tokenizer, utf8=True, key=schema_grammar_key(schema, opts), device=device)


def load_grammar(path: str | os.PathLike, registry: ToolRegistry, tokenizer: BaseTokenizer | None = None, *,
                 format: str = "seed", max_string: int = 256, utf8: bool = True, options: SchemaOptions | None = None,
                 device: str | torch.device = "cpu") -> CompiledGrammar:
    """A cache file (CompiledGrammar.save) checked against what compile_grammar would build from the same
    arguments: another registry, format, options or vocabulary is refused with GrammarCacheError."""
    get_envelope(format)
    from .compiler import CompiledGrammar
    if uses_seed_path(registry, format):
        return CompiledGrammar.load(path, device=device, registry=registry, tokenizer=tokenizer,
                                    max_string=max_string, utf8=utf8)
    return CompiledGrammar.load(path, device=device, tokenizer=tokenizer, utf8=utf8,
                                key=call_grammar_key(registry, format, max_string, utf8, options))
