"""The table stage: an automaton x a vocabulary in, the factored state x token table out.

In: an Automaton (batchmask.automaton) and a tokenizer's token bytes. Out: token_class [V], state_row [S],
row_next [R, C], row_legal [R], row_final [R], targets [T], segment_start/segment_base [G] (numpy/torch arrays).

    tokensim.py     tokens through the automaton (explicit states over the trie, value bodies by signature);
                    the vocabulary-only work, cached per tokenizer (`prepare_vocab`)
    trie.py         the vocabulary as a trie, level by level, and the explicit states' columns walked over it
    classes.py      grouping equal keys: token classes, shared rows, equal columns
    native.py       the compile's hot loops in C (native_c/: grouping, packed rows' first fit, the trie walk), or None
    build.py        the pipeline: rows shared by shift, the target list, `build_tables`
    blocks.py       value blocks' cells -> their rows and target segments
    delegated.py    explicit states that read some tokens from a block cell's row instead of walking them
    write.py        the distinct rows -> row_next, written once in its final order and width
    next_codes.py   what one table entry means (the only place that rule is written; the kernels read it too)
    packed.py       where a row's codes are stored: dense [R, C] or packed by row displacement, and when

Public names: batchmask.table.build.build_tables, batchmask.table.tokensim.{prepare_vocab, vocab_hash_of,
stop_ids_of}, batchmask.table.next_codes.{decode_next, encode_relative, encode_targets, index_targets}.
"""
