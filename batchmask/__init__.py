"""batchmask: grammar-constrained tool calling for a whole batch, on the device.

Pipeline (ARCHITECTURE.md names the file behind each step): registry (registry.py) and JSON Schema
(schema*.py) -> grammar nodes in a call format (envelope.py) -> automaton (dfa.py, node_automaton.py)
-> factored token table (compiler.py, table.py) -> batch masker (masker.py, batchmask.kernels) ->
generation loop (generation.py) -> CLI (cli.py); batchmask.models holds the tokenizers and the model.
"""
from __future__ import annotations

import importlib

TYPE_CHECKING = False                   # typing.TYPE_CHECKING without importing typing (startup time)

# The public names, imported on first use (PEP 562): `import batchmask.cli` must not load torch, so that
# `batchmask --help` is quick and a Ctrl-C during the heavy imports reaches the CLI's handler (exit 130).
# To export a name, add it here: name -> the module that defines it.
_EXPORTS = {
    "CompiledGrammar": ".compiler", "GrammarCacheError": ".compiler",
    "compile_grammar": ".api", "compile_grammars": ".api", "compile_json_schema": ".api",
    "BatchMasker": ".masker", "IllegalTokenError": ".masker",
    "RegistryError": ".registry", "Tool": ".registry", "ToolArg": ".registry", "ToolRegistry": ".registry",
    "SchemaError": ".schema", "SchemaOptions": ".schema",
}

if TYPE_CHECKING:
    from .api import compile_grammar, compile_grammars, compile_json_schema
    from .compiler import CompiledGrammar, GrammarCacheError
    from .masker import BatchMasker, IllegalTokenError
    from .registry import RegistryError, Tool, ToolArg, ToolRegistry
    from .schema import SchemaError, SchemaOptions

__all__ = ["BatchMasker", "CompiledGrammar", "GrammarCacheError", "IllegalTokenError", "RegistryError", "SchemaError",
           "SchemaOptions", "Tool", "ToolArg", "ToolRegistry", "compile_grammar", "compile_grammars",
           "compile_json_schema"]  # sorted
__version__ = "0.1.0"


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
