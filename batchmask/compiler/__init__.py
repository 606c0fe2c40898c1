"""The compiler: a grammar node tree and a tokenizer in, a CompiledGrammar (the device table and its API) out.

Runs grammar -> automaton -> table (the three stages below it) and owns what a compiled table is.
In: a node tree, a tokenizer, the key it depends on. Out: a CompiledGrammar, its cache file, a GrammarSet.

    compiled.py     CompiledGrammar (allowed, next_state, legal_counts, finish_text, describe, save/load),
                    `compile_node`, and the seed's path (`compile_seed`: a native registry's linear paths)
    cache.py        the cache file format (plain tensors, loads with weights_only) and GrammarCacheError
    sets.py         grammars compiled apart joined into one table (`combine`, GrammarSet)
    shortest.py     the tokens that finish a value from any state, shortest (`Completer`: closes a row cut short)

Public names: batchmask.compiler.compiled.{CompiledGrammar, compile_node, compile_seed},
batchmask.compiler.cache.GrammarCacheError, batchmask.compiler.sets.{GrammarSet, combine},
batchmask.compiler.shortest.Completer. The user-facing
entry points (`compile_grammar`, `compile_json_schema`, `compile_grammars`) are in batchmask.api.
"""
