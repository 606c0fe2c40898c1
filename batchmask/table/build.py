"""Automaton x vocabulary -> the factored token table: next_state[s, t] for every state and token.

Stored plainly, S x V would be hundreds of MB; but almost all columns repeat and deep value
states repeat by shift. So the table is stored as

    token_class  [V]      the column each token uses
    state_row    [S]      the row each state uses
    row_next     [R, C]   next-state codes (table/next_codes.py): absolute (an index into targets from
                          the base of the state's segment), -1 illegal, or relative; a large sparse
                          table is packed instead (row_next [N], row_base [R], row_check [N]: table/packed.py)
    targets      [T]      the states absolute codes name: the explicit states' moves, then each
                          value block's exits (segment_start, segment_base [G]: table/blocks.py)
    row_legal    [R], row_final [R]   legal token ids, and whether the end may follow, per row

How the columns are found without ever building S x V:
  * explicit states are simulated byte by byte on the tokens that survive their first byte
    (tokensim.explicit_columns);
  * block cells follow from the tokens' value-type signatures (table/tokensim.py) and the bounds rules
    of grammar/values.py, for one representative per token class, once per shape of block
    (table/blocks.py);
  * tokens are grouped by a key (stop/eos role, explicit columns, signature ids, what follows a
    value's end), so rows are computed for one token per class; equal columns are merged once
    more at the end.
After a complete value exactly the stop ids are legal (they lead to `done`); in `done` only eos.
Explicit rows stay sparse (a few legal entries each) until the table is written once, in its final
order and width, from its parts (table/write.py): large unions of tool sets make it tens of MB.
"""
from __future__ import annotations

import numpy as np
import torch

from ..automaton.form import Automaton, byte_table, explicit_states
from .blocks import (
    block_exit_lists,
    block_first_use,
    block_rows,
    block_segments,
    block_templates,
    exit_classes,
    far_mask,
    shapes,
    value_rows,
)
from .classes import classes_of, first_of_each, in_first_use_order, refine, search_sorted, unique_sorted
from .delegated import cell_moves, split_edges, walked_edges
from .native import helpers
from .next_codes import encode_relative, encode_targets, index_targets
from .packed import Packed
from .tokensim import ByteSteps, VocabPrep, after_stops, explicit_pairs
from .trie import Walked, shared_budget
from .write import RowParts


def build_tables(aut: Automaton, prep: VocabPrep, dev, far=far_mask, pack: bool | None = None) -> dict:
    """The factored tables of `aut` on `prep`'s vocabulary (see the module docstring). `pack`: row_next packed
    (True), dense (False), or as table/packed.py's `want_packed` judges its size (None); a packed table comes
    with row_base and row_check (else None) and row_next holds its codes."""
    with shared_budget():               # the explicit states' two walks count as one (table/trie.py)
        return _build(aut, prep, dev, _once(far), pack)


def _build(aut: Automaton, prep: VocabPrep, dev, far, pack: bool | None) -> dict:
    vocab = prep.vocab
    V, S = len(vocab), aut.num_states
    done = S
    delta_np, byte_class, to_c_np, from_c_np = byte_table(aut, vocab.max_len, vocab.max_tail)
    steps = ByteSteps.of(delta_np, byte_class, vocab, dev)
    to_c, from_c = torch.as_tensor(to_c_np, device=dev), torch.as_tensor(from_c_np, device=dev)

    def walk(edges) -> Walked:          # the tokens walked from each edge's byte, per distinct (byte, after) pair
        return explicit_pairs(torch.stack([edges[:, 0], edges[:, 1], to_c[edges[:, 2]].long()], 1), steps, vocab)

    # Explicit states' edges that no block cell takes over, walked over the trie first: where thousands of tokens
    # are legal in many states the walk is refused (table/trie.py MAX_PAIRS) before the value work below.
    alone, shared, shared_cell = split_edges(aut, torch.as_tensor(aut.edges, device=dev).reshape(-1, 3))
    walked_alone = walk(alone)

    # Explicit states: sparse (state, token, next) triples.
    explicit = torch.as_tensor(explicit_states(aut), device=dev)                         # [E] ascending

    def row_of_explicit(states):                            # explicit state id -> its index in `explicit`
        return search_sorted(explicit, states)

    # Block cells: signatures per value type, and the state after each value-ending event.
    vts = aut.value_types()
    sigs = {vt.name: prep.signature(vt) for vt in vts}
    blocks_of = {vt.name: [k for k, b in enumerate(aut.blocks) if b.vt.name == vt.name] for vt in vts}
    shapes_of = {name: shapes(aut, ks) for name, ks in blocks_of.items()}              # blocks alike but for exits
    after_ev = {name: after_stops(sigs[name], [aut.blocks[k] for k in ks], steps, to_c, from_c, vocab)
                for name, ks in blocks_of.items()}                                     # [B_vt, E_vt]
    exits = {name: exit_classes(a, len(sigs[name].ev_tok)) for name, a in after_ev.items()}   # events alike, once

    # Token keys: first how a token behaves in block cells (role: eos / other stop / text; its
    # signatures; what follows a value it ends), then with its explicit columns as well. Block
    # rows are computed per value class (far fewer than classes), then spread to the classes.
    a_tok, a_col, a_val = [], [], []
    Qmax = max([vt.num_substates for vt in vts], default=1)
    for vt in vts:
        sig = sigs[vt.name]
        qi, ti, evs = sig.stop_q, sig.stop_t, sig.stop_ev                          # kept per tokenizer
        events, after = after_ev[vt.name]                                          # only events legal somewhere
        pos = torch.full((len(sig.ev_tok),), -1, dtype=torch.int64, device=dev)
        pos[events] = torch.arange(len(events), device=dev)
        cand = torch.nonzero(pos.index_select(0, evs) >= 0).flatten()             # stop cells of those events
        val = after.index_select(1, pos.index_select(0, evs.index_select(0, cand)))   # [B_vt, P'], all blocks
        bj, pj = torch.nonzero(val >= 0, as_tuple=True)
        val_at = val[bj, pj]
        pj = cand.index_select(0, pj)
        a_tok.append(ti[pj])
        a_col.append(torch.as_tensor(blocks_of[vt.name], device=dev)[bj] * Qmax + qi[pj])
        a_val.append(val_at)
    base = prep.value_classes(vts)                                                     # cached per tokenizer
    if a_tok:
        value_class = refine(base, torch.cat(a_tok), torch.cat(a_col), torch.cat(a_val))
    else:
        value_class = base
    value_rep = first_of_each(value_class)                                             # [Cv]

    def value_part(far_fn, segments):
        return value_rows(aut, sigs, exits, blocks_of, shapes_of, value_rep, far_fn, dev, segments)

    value_ids, which, codes, layouts = value_part(far, True)                           # [Nk], [Nk], [M, Cv]
    # Explicit states, walked over the trie; the moves some take exactly as a block cell does are read from
    # that cell's row instead (table/delegated.py).
    edges, delegates = walked_edges(shared, shared_cell, computed_ids=value_ids)
    walked = Walked.cat(walked_alone, walk(edges))
    token_class, (src, tok, nxt) = _walked_classes(walked, value_class, from_c)
    rep = first_of_each(token_class)
    C = len(rep)
    spread = value_class[rep]                                                          # [C] value class of each
    class_size = torch.bincount(token_class, minlength=C)
    rep_pos = torch.full((V,), -1, dtype=torch.int64, device=dev)
    rep_pos[rep] = torch.arange(C, device=dev)

    # Rows: explicit states, block cells (one per sub-state for far cells), done. An explicit row has a few
    # legal entries (one per class representative that moves), kept sparse until the table is written:
    # (row, class, next state), the accepting rows' stop classes -> done last (stop ids have no bytes).
    E = len(explicit)
    sel = rep_pos[tok] >= 0
    stop_classes = torch.unique(token_class[list(prep.stop_ids)])
    acc = torch.as_tensor(aut.accepting, device=dev).long()
    acc_rows = row_of_explicit(acc)
    ex_r = torch.cat([row_of_explicit(src[sel]), acc_rows.repeat_interleave(len(stop_classes))])
    ex_c = torch.cat([rep_pos[tok[sel]], stop_classes.repeat(len(acc_rows))])
    ex_n = torch.cat([nxt[sel], torch.full((len(acc_rows) * len(stop_classes),), done, device=dev)])
    eos_class = token_class[prep.eos_id].reshape(1)        # in `done` only eos is legal; it stays there

    exit_lists = block_exit_lists(aut, exits, blocks_of, dev)                          # each block's segment
    d_r, d_c, d_n = cell_moves(aut, delegates, value_ids, which, codes, exit_lists, spread, ex_r, ex_c,
                               row_of_explicit)
    ex_r, ex_c, ex_n = torch.cat([ex_r, d_r]), torch.cat([ex_c, d_c]), torch.cat([ex_n, d_n])
    v_row, v_uniq = classes_of(codes)                                                  # [M] equal rows once
    vcodes = codes.index_select(0, v_uniq)                                             # [Rv, Cv]
    # every class has a token (dense ids), so a row is dead iff it has no legal entry
    dead = (E > 0 and bool((torch.bincount(ex_r, minlength=E) == 0).any())) or \
        (len(vcodes) > 0 and bool(((vcodes.amax(1) == -1) & (vcodes.amin(1) == -1)).any()))
    if not bool(dead):
        s = explicit.index_select(0, ex_r)
        ex_code = torch.where(_forward(ex_n, s, done), encode_relative(ex_n, s), ex_n)
        # the target list: the explicit states' few absolute moves, then every block's exits (segments)
        explicit_targets = unique_sorted(torch.cat([ex_code[ex_code >= 0], torch.tensor([done], device=dev)]))
        targets, seg_start, seg_base = block_segments(aut, exit_lists, explicit_targets, done, dev)
        # rows: the explicit states' (sparse), `done`'s (sparse, row E), the block cells' (dense on value classes)
        parts = RowParts(E + 1, torch.cat([ex_r, torch.tensor([E], device=dev)]), torch.cat([ex_c, eos_class]),
                         index_targets(torch.cat([ex_code, torch.tensor([done], device=dev)]), explicit_targets),
                         vcodes, spread, C)
        row_of = parts.row_classes()
        templates = block_templates(layouts, row_of.index_select(0, E + 1 + v_row))
        state_row, row_order = _state_rows(row_of, explicit, done, templates, parts)
    else:
        # Some state has no way out (a vocabulary without some bytes): prune on the full table.
        value_ids, which, codes, _ = value_part(lambda blk, n, d: far(blk, None, d), False)
        codes = codes.index_select(0, which)                                           # [Nk, Cv]
        within = codes <= -2                                                           # relative: stays inside
        full = torch.full((S + 1, C), -1, dtype=torch.int32, device=dev)
        full[explicit[ex_r], ex_c] = ex_n.to(torch.int32)
        full[value_ids] = torch.where(within, value_ids[:, None] - 2 - codes, codes)[:, spread].to(torch.int32)
        full[done, eos_class] = done
        finals = torch.cat([acc, torch.tensor([done], device=dev)])
        full = _prune_dead_ends(full, class_size, finals)
        relative = torch.zeros_like(full, dtype=torch.bool)
        relative[value_ids] = within[:, spread]
        relative[explicit] = _forward(full[explicit], explicit[:, None], done)
        relative &= full >= 0
        states = torch.arange(S + 1, device=dev)[:, None]
        codes = torch.where(relative, encode_relative(full, states), full)
        state_row, uniq = classes_of(codes)                                            # [S + 1]
        codes, targets = encode_targets(codes)
        empty = torch.zeros(0, dtype=torch.int64, device=dev)
        parts = RowParts(0, empty, empty, empty, codes.index_select(0, uniq).to(torch.int32),
                         torch.arange(C, device=dev), C)
        state_row = parts.row_classes().index_select(0, state_row)        # the rows are distinct already
        seg_start = seg_base = torch.zeros(1, dtype=torch.int64, device=dev)           # one segment: plain
        state_row, row_order = in_first_use_order(state_row)
    assert int(state_row.min()) >= 0, "every state has a row"
    # Rows are numbered by first use; the table is written in that order, its equal columns merged and numbered
    # by first use too (keys are sufficient, not necessary), so equal grammars give equal tables whatever the
    # hashing did (table/write.py).
    token_class, row_next, row_legal = parts.write(row_order, token_class, pack, first_token=rep, class_size=class_size)
    num_classes = int(token_class.max()) + 1 if len(token_class) else 0   # every class has a token
    row_base = row_check = None
    if isinstance(row_next, Packed):
        row_next, row_base, row_check = row_next
    final = torch.zeros(S + 1, dtype=torch.bool, device=dev)
    final[acc] = True
    final[done] = True
    row_final = torch.zeros(len(row_legal), dtype=torch.bool, device=dev)
    row_final[state_row[final].long()] = True
    # accepting is a property of the row (its stop moves): no other state may share an accepting state's row.
    # Block cells are never accepting, and a far cell has the row of a computed one: checking the explicit
    # states and the computed cells checks them all.
    seen = torch.cat([explicit, value_ids, torch.tensor([done], device=dev)])
    assert torch.equal(row_final[state_row[seen].long()], final[seen]), "accepting is a property of the row"
    return dict(token_class=token_class, state_row=state_row, row_next=row_next, row_base=row_base,
                row_check=row_check, num_classes=num_classes, row_legal=row_legal,
                row_final=row_final, targets=targets, segment_start=seg_start, segment_base=seg_base,
                done_state=done)


def _walked_classes(walked: Walked, value_class: torch.Tensor, from_c: torch.Tensor):
    """(token_class [V], the walked moves (src, tok, nxt) of enough tokens: one per class at least). Classes are the
    value classes split by the tokens' moves from the explicit states, found in two steps on fewer entries than the
    moves: first by the moves per walked (byte, after) pair (walked.pair), which is finer (two tokens that start with
    different bytes may move alike from every state), then the classes of that step by the moves of one token each
    (handed to the states, Walked.moves). Equal moves per pair mean equal moves per state, so this is the grouping
    by moves per state. Where the pairs' edges are few (under two a find), the moves are grouped in one step."""
    dev = value_class.device

    def on_device(src, tok, nxt):       # host arrays -> tensors, next states in the automaton's ids
        return torch.from_numpy(src).to(dev), torch.from_numpy(tok).to(dev), from_c[torch.from_numpy(nxt).to(dev)]
    one_step = int(walked.edge_n[walked.pair].sum()) < 2 * len(walked.pair)     # few edges share a pair
    if helpers is not None and dev.type == "cpu":
        return _walked_classes_native(walked, value_class, from_c, one_step)
    if one_step:                                                                   # one step is less work
        src, tok, nxt = on_device(*walked.moves())
        return refine(value_class, tok, src, nxt), (src, tok, nxt)
    pair, tok, nxt = on_device(walked.pair, walked.tok, walked.nxt)
    by_pair = refine(value_class, tok, pair, nxt)                                       # [V]
    first = first_of_each(by_pair)                                                      # [C1] a token of each
    is_first = torch.zeros(len(value_class), dtype=torch.bool, device=dev)
    is_first[first] = True
    src, tok, nxt = on_device(*walked.moves(is_first.index_select(0, tok).cpu().numpy()))
    merged = refine(value_class.index_select(0, first), by_pair.index_select(0, tok), src, nxt)   # [C1]
    return merged.index_select(0, by_pair), (src, tok, nxt)


def _walked_classes_native(walked: Walked, value_class: torch.Tensor, from_c: torch.Tensor, one_step: bool):
    """_walked_classes in C (table/native_c/walked.c), the moves never written out: in one step, or first by the moves
    per pair (refine on the finds) and then the first token of each such class by its moves."""
    vc, nxt = value_class.numpy(), from_c.numpy()[walked.nxt]

    def classes_by_moves(base, pair, item, nxt):       # (class per item, the moves of each class's first item)
        out = np.empty(len(base), dtype=np.int64)
        _, *moves = helpers.refine_walked(base, pair, item, nxt, walked.edge_src, walked.edge_at, walked.edge_n, out)
        return out, [np.frombuffer(x, dtype=np.int64) for x in moves]
    if one_step:
        out, (src, tok, nxt) = classes_by_moves(vc, walked.pair, walked.tok, nxt)
        return torch.from_numpy(out), (torch.from_numpy(src), torch.from_numpy(tok), torch.from_numpy(nxt))
    by_pair = np.empty(len(vc), dtype=np.int64)
    helpers.refine(vc, walked.tok, walked.pair, nxt, by_pair)                         # [V] ids by first use, so
    first = np.frombuffer(helpers.first_of_each(by_pair), dtype=np.int64)            # [C1] ascends
    at = np.full(len(vc), -1, dtype=np.int64)
    at[first] = np.arange(len(first))
    keep = at[walked.tok] >= 0                                                      # the finds of those tokens
    merged, (src, item, nxt) = classes_by_moves(vc[first], walked.pair[keep], at[walked.tok[keep]], nxt[keep])
    # each merged class's first item is its least token (first ascends), so the moves are of each class's first
    return torch.from_numpy(merged[by_pair]), (torch.from_numpy(src), torch.from_numpy(first[item]),
                                              torch.from_numpy(nxt))


def _state_rows(row_of: torch.Tensor, explicit: torch.Tensor, done: int, templates: list, parts: RowParts):
    """(state_row [S + 1] in the table's width, row_order [R]: the row class of each table row) with rows
    numbered by first use over the states. row_of: the row class of each explicit state, of done (index E)
    and of the block rows behind `templates` (table_blocks.block_templates). The first use of each class
    comes from the parts (explicit states, done, and per block pattern its template's first offsets in its
    first block), and state_row is written once, already renumbered: no pass over a union's million cells."""
    dev, E = row_of.device, len(explicit)
    R = int(row_of.max()) + 1
    ex = explicit.cpu().numpy()
    first = np.full(R, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, row_of[:E + 1].cpu().numpy(), np.append(ex, done))
    block_first_use(templates, first)
    order = np.argsort(first, kind="stable")
    renumber = np.empty(R, dtype=np.int64)
    renumber[order] = np.arange(R)
    out = np.full(done + 1, -1, dtype=np.int16 if parts.width(R) == torch.int16 else np.int32)
    out[ex] = renumber[row_of[:E].cpu().numpy()]
    out[done] = renumber[int(row_of[E])]
    block_rows(out, templates, renumber)
    return torch.from_numpy(out).to(dev), torch.from_numpy(order).to(dev)


# An explicit state's forward moves (not to `done`) are stored relative when they reach no further than
# this: equal runs of literal text (a key's chain, an enum value, an array's separators) then have equal
# rows wherever they sit, and the codes stay within int16 (table/next_codes.py). Block cells' moves out of their
# value stay absolute: the same target from every far cell, which is what lets those cells share a row.
RELATIVE_REACH = 32000


def _forward(moves: torch.Tensor, states: torch.Tensor, done: int) -> torch.Tensor:
    """bool, moves' shape: which moves (next states, -1 illegal) from `states` are stored relative."""
    return (moves > states) & (moves != done) & (moves - states <= RELATIVE_REACH)


def _once(far):
    """`far` remembering its answer per block (and per reach given or not)."""
    memo = {}

    def far_once(blk, reach, dev):
        key = (id(blk), reach is None)
        if key not in memo:
            memo[key] = far(blk, reach, dev)
        return memo[key]
    return far_once


def _prune_dead_ends(table: torch.Tensor, class_size: torch.Tensor, final_states) -> torch.Tensor:
    """Cut every transition into a state from which no token sequence reaches the end.

    With a vocabulary that has every single byte this changes nothing; with one that lacks
    some, it keeps a row from being steered into a state it can never leave (the automaton is
    acyclic apart from `done`, so repeating until nothing changes is exact).
    """
    keep = torch.zeros(table.shape[0], dtype=torch.bool, device=table.device)
    keep[final_states] = True
    while True:
        live = (table >= 0) & (class_size > 0)[None, :]
        dead = ~live.any(1) & ~keep
        if not dead.any():
            return table
        into_dead = (table >= 0) & dead[table.clamp(min=0)]
        if not into_dead.any():
            return table
        table = torch.where(into_dead, torch.full_like(table, -1), table)
        keep = keep | dead          # already cut off: don't count them again
