"""The grammar stage: the node types every front end builds, and the rules of the values inside them.

In: nothing from batchmask (this is the lowest stage). Out: node trees (`Lit`, `Seq`, `Alt`, `ByteSet`,
`Repeat`, `Str`, `JsonStr`, `Word`) and, for each value node, its loop automaton and the three value rules.

    nodes.py    the node types (and the seed's linear segments, `tool_path`)
    values.py   ValueType and the rules cell_ok / stays_ok / close_ok: which bytes a value may hold, its cap,
                when it may close (the automaton and table builders judge values only through these)
    utf8.py     the UTF-8 sub-states of a value body (no overlongs, no surrogates, at most U+10FFFF)

Public names: batchmask.grammar.nodes.{Lit, Seq, Alt, ByteSet, Repeat, Str, JsonStr, Word, Segment, tool_path},
batchmask.grammar.values.{ValueType, value_type, word_type, cell_ok, stays_ok, close_ok}.
"""
