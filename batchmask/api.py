"""The public compile entry points: a tool registry in a call format, or one bare JSON Schema.

    compile_grammar(registry, tokenizer, format="seed")     a call to any tool of the registry
    compile_json_schema(schema, tokenizer)                  one JSON value of `schema`
    compile_grammars([registry, ...], tokenizer)            several tool sets in one table, a start each

Both give a CompiledGrammar (same table, same masker). The grammar node comes from
batchmask.tools.envelope (calls) or batchmask.schema.build (values); the table from the compiler's
`compile_node`, which records `key` (what the grammar depends on) in cache files and checks it
on load. A native registry in the seed format keeps the compiler's seed path, so its table and
`describe()` are exactly today's.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import TYPE_CHECKING

# The compiler and the schema side load with this module (torch comes with automaton.form already), not inside
# the calls: a first compile pays no imports. `import batchmask` and the CLI's start stay light (batchmask/__init__.py).
from . import checks
from .automaton.form import gc_paused
from .compiler import compiled as compiler
from .schema.base import collect
from .schema.build import SchemaOptions, canonical_schema, schema_node
from .tools.choice import reply_key, reply_node
from .tools.envelope import get_envelope, is_typed, registry_key, registry_node
from .tools.registry import RegistryError, ToolRegistry

if TYPE_CHECKING:                       # annotations only
    import torch

    from .compiler.compiled import CompiledGrammar
    from .models.tokenizer_base import BaseTokenizer


def _options_key(options):
    if options is None:
        return None
    if dataclasses.is_dataclass(options):
        return json.loads(json.dumps(dataclasses.asdict(options)))
    raise TypeError(f"options must be a SchemaOptions (batchmask.schema.build), got {type(options).__name__}")


def call_grammar_key(registry: ToolRegistry, format: str = "seed", max_string: int = 256, utf8: bool = True,
                     options=None) -> dict:
    """What a call grammar depends on (JSON-able): registry canonical form, format, options, byte rule, caps."""
    get_envelope(format)
    if options is None and any(is_typed(t) for t in registry):
        options = SchemaOptions()
    key = {"grammar": "call", "format": format, "registry": registry_key(registry), "max_string": max_string,
           "utf8": bool(utf8), "options": _options_key(options)}
    if getattr(registry, "choice", None) is not None:        # tool_choice / parallel calls: another grammar
        key["choice"] = reply_key(registry.choice)
    return key


def call_node(registry: ToolRegistry, format: str = "seed", max_string: int = 256, options=None):
    """The grammar tree of a reply to `registry`'s tools: under its tool_choice (batchmask.tools.choice) if it
    carries one, else one call to any of its tools (batchmask.tools.envelope.registry_node)."""
    if getattr(registry, "choice", None) is not None:
        return reply_node(registry, format, max_string, options, registry.choice)
    return registry_node(registry, format, max_string, options)


def schema_grammar_key(schema, options=None) -> dict:
    """What a bare-schema grammar depends on (JSON-able)."""
    if options is None:
        options = SchemaOptions()
    return {"grammar": "json-schema", "schema": json.loads(json.dumps(canonical_schema(schema))), "utf8": True,
            "options": _options_key(options)}


def uses_seed_path(registry: ToolRegistry, format: str) -> bool:
    """The seed format on a registry of native tools only: the compiler's original path."""
    return format == "seed" and not any(is_typed(t) for t in registry) and getattr(registry, "choice", None) is None


def _seed_path(compiler):
    seed = getattr(compiler, "compile_seed", None) or compiler.compile_grammar
    if seed is compile_grammar:
        raise RuntimeError("batchmask.compiler.compiled has no seed compile path (compile_seed)")
    return seed


def compile_grammar(registry: ToolRegistry, tokenizer: BaseTokenizer, *, format: str = "seed", max_string: int = 256,
                    utf8: bool = True, options: SchemaOptions | None = None,
                    device: str | torch.device = "cpu", pack: bool | None = None) -> CompiledGrammar:
    """Compile a call to any tool of `registry`, in `format` (see batchmask.tools.envelope), into a CompiledGrammar.

    `tokenizer` needs `token_bytes` (list[bytes], b"" for ids with no text) and `eos_id`
    (optionally `stop_ids`, `vocab_hash()`). `max_string` caps native tools' values (bytes);
    `options` (batchmask.schema.build.SchemaOptions) sets the caps of typed tools' schemas. `pack`: the table
    packed (True), dense (False) or by its size (None; batchmask/table/packed.py).
    """
    get_envelope(format)
    if not isinstance(registry, ToolRegistry):
        raise RegistryError(f"compile_grammar needs a ToolRegistry, got {type(registry).__name__}")
    _check_tokenizer("compile_grammar", tokenizer)
    max_string = checks.integer("max_string", max_string, 1)
    if uses_seed_path(registry, format):
        return _seed_path(compiler)(registry, tokenizer, max_string=max_string, utf8=utf8, device=device, pack=pack)
    key = call_grammar_key(registry, format, max_string, utf8, options)

    def attempt(opts):
        with collect() as relaxed:
            node = call_node(registry, format, max_string, opts)
        return noted(compiler.compile_node(node, tokenizer, utf8=utf8, key=key, device=device, pack=pack), relaxed)
    return narrower_if_too_large(attempt, options, [t.parameters for t in registry.tools])


def _check_tokenizer(where: str, tokenizer) -> None:
    """A vocabulary the compiler can read: token_bytes (a list of bytes) and an integer eos_id."""
    if not hasattr(tokenizer, "token_bytes") or not hasattr(tokenizer, "eos_id"):
        hint = (" (a Hugging Face tokenizer: batchmask.models.tokenizer_transformers.from_transformers(tok), or "
                "batchmask.hf.LogitsProcessor.from_pretrained)" if hasattr(tokenizer, "backend_tokenizer") else "")
        raise TypeError(f"{where}: tokenizer must be batchmask's tokenizer (token_bytes and eos_id: "
                        f"batchmask.models.tokenizer.load_tokenizer(path)){hint}, got {type(tokenizer).__name__}")
    checks.integer(f"{where}: tokenizer.eos_id", tokenizer.eos_id, 0)


def compile_json_schema(schema: dict | bool | str, tokenizer: BaseTokenizer, *, options: SchemaOptions | None = None,
                        device: str | torch.device = "cpu", pack: bool | None = None) -> CompiledGrammar:
    """Compile one JSON value of `schema` (a JSON Schema: dict, or a path-free JSON string) into a CompiledGrammar.

    Serialisation is compact (no whitespace, "," and ":"); objects hold their declared properties
    only, in declared order; what the schema leaves unbounded has no cap (see batchmask.schema.build.SchemaOptions).
    """
    _check_tokenizer("compile_json_schema", tokenizer)
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise ValueError(f"<schema>: not valid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    if not isinstance(schema, (dict, bool)):
        raise ValueError(f"<schema>: a JSON Schema is an object (or true/false), got {type(schema).__name__}")
    opts = options if options is not None else SchemaOptions()
    key = schema_grammar_key(schema, opts)

    def attempt(o):
        with collect() as relaxed:
            node = schema_node(schema, o, separators=(",", ":"), where="<schema>")
        return noted(compiler.compile_node(node, tokenizer, utf8=True, key=key, device=device, pack=pack),
                     relaxed)
    with gc_paused():                   # one pause for the whole compile (automaton.form.gc_paused)
        return narrower_if_too_large(attempt, opts, [schema])


def narrower_if_too_large(attempt, options: SchemaOptions | None, schemas: list) -> CompiledGrammar:
    """attempt(options); if its automaton passes a size limit (GrammarBuildError) and one of `schemas` writes keys
    beside declared properties (SchemaOptions.other_keys), attempt again without them: each such object is then
    closed, a narrowing its grammar's relaxations report. The key stays the caller's: the same arguments give the
    same table."""
    from .automaton.nfa import GrammarBuildError
    from .schema.objects import writes_other_keys
    from .table.trie import pairs_budget
    opts = options if options is not None else SchemaOptions()
    if not opts.other_keys or not any(writes_other_keys(s, opts.open_objects) for s in schemas):
        return attempt(options)
    try:
        with pairs_budget(OTHER_KEYS_PAIRS):
            return attempt(options)
    except GrammarBuildError:
        pass
    return attempt(dataclasses.replace(opts, other_keys=False))


# live token prefixes the walk of a grammar with keys beside declared properties may carry (table/trie.py) before
# it is compiled again without them: a third of the limit, so that a refused first attempt costs a fraction of
# the compile that follows it
OTHER_KEYS_PAIRS = 4_000_000


def compile_grammars(items: list, tokenizer: BaseTokenizer, *, format: str = "seed", max_string: int = 256,
                     utf8: bool = True, options: SchemaOptions | None = None,
                     device: str | torch.device = "cpu", pack: bool | None = None) -> CompiledGrammar:
    """Several tool sets (ToolRegistry) or bare-schema tasks (batchmask.run.schema_task.SchemaTask) compiled
    together into one CompiledGrammar: `starts[i]` is where a row constrained by items[i] begins.

    One automaton holds them all, so what they share (a tool several sets list, the call envelope) is
    the same states and rows, compiled once; the vocabulary work is done once for all. A row never
    leaves the grammar it started in. Schema tasks are UTF-8 (`utf8` must be True when there are any).
    """
    _check_tokenizer("compile_grammars", tokenizer)
    items = list(items)
    if not items:
        raise ValueError("compile_grammars: no tool sets given")
    for i, item in enumerate(items):
        if not isinstance(item, ToolRegistry) and not hasattr(item, "grammar_node"):
            raise RegistryError(f"compile_grammars: item {i} is a {type(item).__name__}, not a ToolRegistry "
                                f"(or a batchmask.run.schema_task.SchemaTask)")
    keys = [item_key(item, format, max_string, utf8, options) for item in items]
    if len(items) == 1:
        item = items[0]
        if isinstance(item, ToolRegistry):
            return compile_grammar(item, tokenizer, format=format, max_string=max_string, utf8=utf8,
                                   options=options, device=device, pack=pack)
        return item.compile(tokenizer, device)

    def attempt(opts):
        with collect() as relaxed:
            nodes = [item_node(item, format, max_string, utf8, opts) for item in items]
        return noted(compiler.compile_node(nodes, tokenizer, utf8=utf8, key=grammars_key(keys), device=device,
                                           pack=pack), relaxed)
    registries = [item for item in items if isinstance(item, ToolRegistry)]       # a schema task has its options
    return narrower_if_too_large(attempt, options, [t.parameters for r in registries for t in r.tools])


def noted(grammar: CompiledGrammar, relaxed: list) -> CompiledGrammar:
    """`grammar` with the lenient relaxations of its schemas in its meta (kept in its cache file):
    `grammar.relaxations`, one dict each (where, pointer, keyword, kind, effect), in the order met."""
    grammar.meta["relaxations"] = [r.to_json() for r in dict.fromkeys(relaxed)]
    return grammar


def grammars_key(keys: list) -> dict:
    """What grammars compiled together depend on: each one's key, in order."""
    return {"grammar": "together", "grammars": list(keys)}


def item_node(item, format: str, max_string: int, utf8: bool, options):
    """The grammar tree of a tool set (ToolRegistry) in `format`, or of a bare-schema task."""
    if isinstance(item, ToolRegistry):
        return call_node(item, format, max_string, options)
    if not utf8:
        raise ValueError(f"{getattr(item, 'source', '<schema>')}: a schema task is UTF-8; it cannot share a table "
                         f"with tool sets compiled byte by byte (--bytes)")
    return item.grammar_node()


def item_key(item, format: str, max_string: int, utf8: bool, options) -> dict:
    """What the grammar of a tool set in `format`, or of a bare-schema task, depends on (JSON-able)."""
    if isinstance(item, ToolRegistry):
        return call_grammar_key(item, format, max_string, utf8, options)
    return item.grammar_key()


def load_grammars(path: str | os.PathLike, items: list, tokenizer: BaseTokenizer | None = None, *,
                  format: str = "seed", max_string: int = 256, utf8: bool = True,
                  options: SchemaOptions | None = None, device: str | torch.device = "cpu") -> CompiledGrammar:
    """A cache file of compile_grammars(items, ...), checked against what it would build (item by item, in
    order): anything else is refused with GrammarCacheError."""
    from .compiler.compiled import CompiledGrammar
    keys = [item_key(item, format, max_string, utf8, options) for item in items]
    return CompiledGrammar.load(path, device=device, tokenizer=tokenizer, utf8=utf8, key=grammars_key(keys))


def load_grammar(path: str | os.PathLike, registry: ToolRegistry, tokenizer: BaseTokenizer | None = None, *,
                 format: str = "seed", max_string: int = 256, utf8: bool = True, options: SchemaOptions | None = None,
                 device: str | torch.device = "cpu") -> CompiledGrammar:
    """A cache file (CompiledGrammar.save) checked against what compile_grammar would build from the same
    arguments: another registry, format, options or vocabulary is refused with GrammarCacheError."""
    get_envelope(format)
    from .compiler.compiled import CompiledGrammar
    if uses_seed_path(registry, format):
        return CompiledGrammar.load(path, device=device, registry=registry, tokenizer=tokenizer,
                                    max_string=max_string, utf8=utf8)
    return CompiledGrammar.load(path, device=device, tokenizer=tokenizer, utf8=utf8,
                                key=call_grammar_key(registry, format, max_string, utf8, options))
