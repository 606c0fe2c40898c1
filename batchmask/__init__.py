"""batchmask: grammar-constrained tool calling for a whole batch, on the device.

Pipeline: registry -> grammar (paths) -> NFA/DFA (dfa.py) -> token table (compiler.py)
-> masker (masker.py, kernels/) -> generation loop (generation.py) -> CLI (cli.py).
"""
from .compiler import CompiledGrammar, GrammarCacheError, compile_grammar
from .masker import BatchMasker, IllegalTokenError
from .registry import RegistryError, Tool, ToolArg, ToolRegistry

__all__ = ["BatchMasker", "CompiledGrammar", "GrammarCacheError", "IllegalTokenError", "RegistryError", "Tool",
           "ToolArg", "ToolRegistry", "compile_grammar"]
__version__ = "0.1.0"
