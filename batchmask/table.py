"""Automaton x vocabulary -> the factored token table: next_state[s, t] for every state and token.

Stored plainly, S x V would be hundreds of MB; but almost all columns repeat and deep value
states repeat by shift. So the table is stored as

    token_class  [V]      the column each token uses
    state_row    [S]      the row each state uses
    row_next     [R, C]   next-state codes (next_codes.py): absolute, -1 illegal, or relative

How the columns are found without ever building S x V:
  * explicit states are simulated byte by byte on the tokens that survive their first byte
    (tokensim.explicit_columns);
  * block cells follow from the tokens' value-type signatures (tokensim.py) and the bounds rules
    of values.py, for one representative per token class;
  * tokens are grouped by a key (stop/eos role, explicit columns, signature ids, what follows a
    value's end), so rows are computed for one token per class; equal columns are merged once
    more at the end.
After a complete value exactly the stop ids are legal (they lead to `done`); in `done` only eos.
"""
from __future__ import annotations

import numpy as np
import torch

from .automaton import Automaton, byte_table
from .classes import classes_of, in_first_use_order, sparse_classes
from .next_codes import encode_relative
from .tokensim import STAYS, STOPS, VocabPrep, after_stops, explicit_columns
from .values import close_ok, stays_ok


def far_mask(blk, token_len, dev) -> torch.Tensor:
    """bool [Nb]: cells whose every move lands inside the block's full rows, away from the cap.

    From such a cell a token's move depends on (q, token) only (rows shared by shift). With
    `token_len` None no cell is far (every cell gets its own row: the plain table).
    """
    ns = torch.as_tensor(blk.ns, device=dev)
    if token_len is None:
        return torch.zeros_like(ns, dtype=torch.bool)
    return (ns >= blk.vt.far_from(blk.min)) & (ns + token_len + blk.vt.max_pending <= blk.max)


def build_tables(aut: Automaton, prep: VocabPrep, dev, far=far_mask) -> dict:
    """The factored tables of `aut` on `prep`'s vocabulary (see the module docstring)."""
    vocab = prep.vocab
    V, S = len(vocab), aut.num_states
    done = S
    delta_np, to_c_np, from_c_np = byte_table(aut, vocab.max_len)
    delta = torch.as_tensor(delta_np, device=dev)
    to_c, from_c = torch.as_tensor(to_c_np, device=dev), torch.as_tensor(from_c_np, device=dev)

    # Explicit states: sparse (state, token, next) triples.
    is_block = np.zeros(S, dtype=bool)
    for blk in aut.blocks:
        is_block[blk.base:blk.base + blk.size] = True
    explicit = torch.as_tensor(np.flatnonzero(~is_block), device=dev)                  # [E]
    row_of_explicit = torch.full((S,), -1, dtype=torch.int64, device=dev)
    row_of_explicit[explicit] = torch.arange(len(explicit), device=dev)
    edges = torch.as_tensor(aut.edges, device=dev).reshape(-1, 3)
    edges_c = torch.stack([edges[:, 0], edges[:, 1], to_c[edges[:, 2]]], 1)
    src, tok, nxt = explicit_columns(edges_c, delta, vocab)
    nxt = from_c[nxt]

    # Block cells: signatures per value type, and the state after each value-ending event.
    vts = aut.value_types()
    sigs = {vt.name: prep.signature(vt) for vt in vts}
    blocks_of = {vt.name: [k for k, b in enumerate(aut.blocks) if b.vt.name == vt.name] for vt in vts}
    after_ev = {name: after_stops(sigs[name], [aut.blocks[k] for k in ks], delta, to_c, from_c, vocab)
                for name, ks in blocks_of.items()}                                     # [B_vt, E_vt]

    # Token key: role (eos / other stop / text), explicit columns, signatures, what follows a value.
    role = torch.zeros(V, dtype=torch.int64, device=dev)
    role[list(prep.stop_ids)] = 2
    role[prep.eos_id] = 1
    parts = [role, sparse_classes(tok, src, nxt, V)]
    a_tok, a_col, a_val = [], [], []
    Qmax = max([vt.num_substates for vt in vts], default=1)
    for vt in vts:
        sig = sigs[vt.name]
        parts.append(sig.sig_id)
        qi, ti = torch.nonzero(sig.ev_of >= 0, as_tuple=True)
        for j, k in enumerate(blocks_of[vt.name]):
            val = after_ev[vt.name][j, sig.ev_of[qi, ti]]
            ok = val >= 0
            a_tok.append(ti[ok])
            a_col.append(k * Qmax + qi[ok])
            a_val.append(val[ok])
    if a_tok:
        parts.append(sparse_classes(torch.cat(a_tok), torch.cat(a_col), torch.cat(a_val), V))
    token_class, rep = classes_of(torch.stack(parts, 1))
    C = len(rep)
    class_size = torch.bincount(token_class, minlength=C)
    rep_pos = torch.full((V,), -1, dtype=torch.int64, device=dev)
    rep_pos[rep] = torch.arange(C, device=dev)

    # Rows: explicit states, block cells (one per sub-state for far cells), done.
    ex_rows = torch.full((len(explicit), C), -1, dtype=torch.int64, device=dev)
    sel = rep_pos[tok] >= 0
    ex_rows[row_of_explicit[src[sel]], rep_pos[tok[sel]]] = nxt[sel]
    stop_classes = torch.unique(token_class[list(prep.stop_ids)])
    acc = torch.as_tensor(aut.accepting, device=dev).long()
    ex_rows[row_of_explicit[acc][:, None], stop_classes[None, :]] = done
    done_row = torch.full((1, C), -1, dtype=torch.int64, device=dev)
    done_row[0, token_class[prep.eos_id]] = done           # a finished row stays finished, emitting eos

    def value_part(far_fn):
        return _value_rows(aut, sigs, after_ev, blocks_of, rep, far_fn, vocab.max_len, dev)

    value_ids, value_rows, within = value_part(far)
    rows = torch.cat([ex_rows, value_rows, done_row])                                  # [n_rows, C] absolute
    row_state = torch.cat([explicit, value_ids, torch.tensor([done], device=dev)])
    if bool((((rows >= 0) & (class_size > 0)[None, :]).sum(1) == 0).any()):
        # Some state has no way out (a vocabulary without some bytes): prune on the full table.
        value_ids, value_rows, within = value_part(lambda blk, n, d: far(blk, None, d))
        rows = torch.cat([ex_rows, value_rows, done_row])
        row_state = torch.cat([explicit, value_ids, torch.tensor([done], device=dev)])
        full = torch.full((S + 1, C), -1, dtype=torch.int64, device=dev)
        full[row_state] = rows
        finals = torch.cat([acc, torch.tensor([done], device=dev)])
        rows = _prune_dead_ends(full, class_size, finals)[row_state]
    relative = torch.zeros_like(rows, dtype=torch.bool)
    relative[len(explicit):len(explicit) + len(value_ids)] = within
    relative &= rows >= 0                                   # pruning may have cut some
    state_row, row_next = _factor_rows(aut, rows, row_state, relative, S + 1, far, vocab.max_len)
    # Merge classes whose columns came out equal (keys are sufficient, not necessary), then number
    # classes and rows by first use, so equal grammars give equal tables whatever the hashing did.
    merged, col_rep = classes_of(row_next.T.contiguous())
    token_class, cls_order = in_first_use_order(merged[token_class])
    row_next = row_next[:, col_rep[cls_order]]
    state_row, row_order = in_first_use_order(state_row)
    row_next = row_next[row_order]
    class_size = torch.bincount(token_class, minlength=row_next.shape[1])
    row_legal = ((row_next != -1).to(torch.int64) @ class_size).to(torch.int32)   # [R]
    final = torch.zeros(S + 1, dtype=torch.bool, device=dev)
    final[acc] = True
    final[done] = True
    return dict(token_class=token_class, state_row=state_row, row_next=row_next, legal_count=row_legal[state_row],
                final=final, done_state=done)


def _value_rows(aut, sigs, after_ev, blocks_of, rep, far, token_len, dev):
    """Next states from block cells for the C class representatives.

    Returns (state ids [N], rows int64 [N, C], within bool [N, C]): `within` marks moves that stay
    inside the value (the only ones whose target is a fixed shift of the state). Far cells
    (see far_mask) are represented by the first of them per sub-state; the rest share its row.
    """
    C = len(rep)
    ids_out, rows, within = [], [], []
    index_in_vt = {k: j for ks in blocks_of.values() for j, k in enumerate(ks)}
    for k, blk in enumerate(aut.blocks):     # a loop over blocks (one per value body), not over tokens
        vt = blk.vt.on(dev)
        Q = vt.num_substates
        sig = sigs[vt.name]
        fm = far(blk, token_len, dev)
        qs_all = torch.as_tensor(blk.qs, device=dev)
        keep = ~fm
        if bool(fm.any()):                   # keep the first far cell of each sub-state
            idx = torch.arange(len(fm), device=dev)
            first = torch.full((Q,), len(fm), dtype=torch.int64, device=dev)
            first.scatter_reduce_(0, qs_all[fm], idx[fm], reduce="amin")
            keep[first[first < len(fm)]] = True
        sel = torch.nonzero(keep).flatten()
        ns = torch.as_tensor(blk.ns, device=dev)[sel][:, None]               # [Nb, 1]
        qs = qs_all[sel]                                                     # [Nb]
        out = sig.out[:, rep].index_select(0, qs)                            # [Nb, C]
        n2 = ns + sig.units[:, rep].index_select(0, qs)                      # [Nb, C] units after the token
        q2 = sig.q_end[:, rep].index_select(0, qs)                           # [Nb, C]
        grid = torch.as_tensor(blk.grid, device=dev).reshape(-1)             # [(max+1) * Q]
        stays = (out == STAYS) & stays_ok(vt, n2, q2, blk.max)
        inside = grid.index_select(0, (n2.clamp(max=blk.max) * Q + q2.clamp(min=0)).reshape(-1)).view_as(n2)
        ev = sig.ev_of[:, rep].index_select(0, qs)                           # [Nb, C]
        aft = after_ev[vt.name][index_in_vt[k]]
        after = torch.where(ev >= 0, aft[ev.clamp(min=0)] if len(aft) else ev, -1)
        closes = (out == STOPS) & close_ok(vt, n2, q2.clamp(min=0), blk.min, blk.max) & (after >= 0)
        rows.append(torch.where(closes, after, torch.where(stays, inside, -1)))
        ids_out.append(blk.base + sel)
        within.append(stays)
    if not rows:
        return (torch.empty(0, dtype=torch.int64, device=dev), torch.empty((0, C), dtype=torch.int64, device=dev),
                torch.empty((0, C), dtype=torch.bool, device=dev))
    return torch.cat(ids_out), torch.cat(rows), torch.cat(within)


def _factor_rows(aut, rows, row_state, relative, S: int, far, token_len):
    """Share rows between states: (state_row int64 [S], row_next int64 [R, C]).

    In a block cell's row, a move that stays inside the value (`relative`) is stored relative to
    the state (a value only grows, so the code is <= -3); every other move stays absolute; -1 is
    illegal. Far cells then have identical rows per sub-state, and equal rows anywhere are stored
    once: R stays in the hundreds whatever a value's cap is.
    """
    dev = rows.device
    codes = torch.where(relative, encode_relative(rows, row_state[:, None]), rows)           # [n_rows, C]
    row_of, uniq = classes_of(codes)
    row_next = codes[uniq]
    state_row = torch.full((S,), -1, dtype=torch.int64, device=dev)
    state_row[row_state] = row_of
    if len(row_state) < S:
        # Cells not computed share their sub-state's representative (see _value_rows).
        for blk in aut.blocks:
            ids = blk.base + torch.arange(blk.size, device=dev)
            fm = far(blk, token_len, dev)
            qs = torch.as_tensor(blk.qs, device=dev)
            first_far = torch.full((blk.vt.num_substates,), -1, dtype=torch.int64, device=dev)
            first_far.scatter_reduce_(0, qs[fm], ids[fm], reduce="amin", include_self=False)
            state_row[ids[fm]] = state_row[first_far[qs[fm]]]
    assert int(state_row.min()) >= 0, "every state has a row"
    return state_row, row_next


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
