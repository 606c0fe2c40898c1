"""The error types that cross stages, in one low module: every layer above may raise or catch them.

    RegistryError   a tool registry (or the file it came from) is malformed
    SchemaError     a schema outside what the compiler reads, or one no value satisfies (a RegistryError:
                    a tool's parameters are part of its registry)
    RunFileError    a task, result or run file of `batchmask generate` that cannot be used as it is

Errors that stay inside one stage live beside their rule (GrammarBuildError in automaton/nfa.py,
GrammarCacheError in compiler/cache.py, IllegalTokenError in masker.py, ...).
"""
from __future__ import annotations


class RegistryError(ValueError):
    """A tool registry (or the file it came from) is malformed."""


class SchemaError(RegistryError):
    """A schema (or one tool's parameters) outside the supported subset, or one no value satisfies."""


class RunFileError(ValueError):
    """A task, result or run file that cannot be used as it is (the message names file, line and reason)."""
