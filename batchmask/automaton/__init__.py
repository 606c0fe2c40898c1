"""The automaton stage: a grammar node tree in, a byte-level DFA in the common form out.

In: a node tree (batchmask.grammar). Out: an `Automaton` (form.py): explicit DFA states with byte edges, plus
*blocks* (value bodies laid out as cells, read by arithmetic). Two producers:

    dfa.py      the seed's linear Lit/Str paths -> residual NFA -> DFA (keeps the seed's describe/finish)
    nfa.py      any node tree -> a hash-consed NFA (GrammarBuildError lives here)
    tree.py     that NFA -> subset construction over elements -> the common form (`build_node_automaton`)
    native.py   the same subset construction in C (native_c/, an optional extension), when it is built
    extension.py  that extension's loader (`helpers`: the module, or None); nfa.py's common nodes use it too
    layout.py   either construction's result (`Found`) -> the common form: cells numbered, targets resolved
    form.py     the common form, `byte_classes`, `byte_table` (what the token simulation reads)

Public names: batchmask.automaton.form.{Automaton, Block}, batchmask.automaton.dfa.build_byte_dfa,
batchmask.automaton.tree.build_node_automaton, batchmask.automaton.nfa.GrammarBuildError.
"""
