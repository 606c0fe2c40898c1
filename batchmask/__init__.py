"""batchmask: grammar-constrained tool calling for a whole batch, on the device.

Pipeline (ARCHITECTURE.md names the file behind each step): registry (tools/registry.py) and JSON Schema
(schema*.py) -> grammar nodes in a call format (tools/envelope.py) -> automaton (automaton/dfa.py, automaton/tree.py)
-> factored token table (compiler/compiled.py, table/build.py) -> batch masker (masker.py, batchmask.kernels) ->
generation loop (run/generation.py) -> CLI (run/cli.py); batchmask.models holds the tokenizers and the model.
"""
from __future__ import annotations

TYPE_CHECKING = False                   # typing.TYPE_CHECKING without importing typing (startup time)

# The public names, imported on first use (PEP 562): `import batchmask.run.cli` must not load torch, so that
# `batchmask --help` is quick and a Ctrl-C during the heavy imports reaches the CLI's handler (exit 130).
# To export a name, add it here: name -> the module that defines it.
_EXPORTS = {
    "CompiledGrammar": ".compiler.compiled", "GrammarCacheError": ".compiler.cache",
    "compile_grammar": ".api", "compile_grammars": ".api", "compile_json_schema": ".api",
    "BatchMasker": ".masker", "IllegalTokenError": ".masker",
    "RegistryError": ".errors", "Tool": ".tools.registry", "ToolArg": ".tools.registry",
    "ToolRegistry": ".tools.registry", "SchemaError": ".errors", "SchemaOptions": ".schema.base",
}

if TYPE_CHECKING:
    from .api import compile_grammar, compile_grammars, compile_json_schema
    from .compiler.cache import GrammarCacheError
    from .compiler.compiled import CompiledGrammar
    from .errors import RegistryError, SchemaError
    from .masker import BatchMasker, IllegalTokenError
    from .schema.base import SchemaOptions
    from .tools.registry import Tool, ToolArg, ToolRegistry

__all__ = ["BatchMasker", "CompiledGrammar", "GrammarCacheError", "IllegalTokenError", "RegistryError", "SchemaError",
           "SchemaOptions", "Tool", "ToolArg", "ToolRegistry", "compile_grammar", "compile_grammars",
           "compile_json_schema"]  # sorted
__version__ = "0.1.0"


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib  # here, not at the top: the package's first import stays light
        value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
