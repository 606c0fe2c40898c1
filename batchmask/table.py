"""Automaton x vocabulary -> the factored token table: next_state[s, t] for every state and token.

Stored plainly, S x V would be hundreds of MB; but almost all columns repeat and deep value
states repeat by shift. So the table is stored as

    token_class  [V]      the column each token uses
    state_row    [S]      the row each state uses
    row_next     [R, C]   next-state codes (next_codes.py): absolute (an index into targets), -1
                          illegal, or relative
    targets      [T]      the states absolute codes name
    row_legal    [R], row_final [R]   legal token ids, and whether the end may follow, per row

How the columns are found without ever building S x V:
  * explicit states are simulated byte by byte on the tokens that survive their first byte
    (tokensim.explicit_columns);
  * block cells follow from the tokens' value-type signatures (tokensim.py) and the bounds rules
    of values.py, for one representative per token class;
  * tokens are grouped by a key (stop/eos role, explicit columns, signature ids, what follows a
    value's end), so rows are computed for one token per class; equal columns are merged once
    more at the end.
After a complete value exactly the stop ids are legal (they lead to `done`); in `done` only eos.
Explicit rows stay sparse (a few legal entries each) until the table is written, and the target
list comes from the few absolute moves, so the dense [R, C] table is written and read a handful
of times, not once per step (large unions of tool sets make it tens of MB).
"""
from __future__ import annotations

import numpy as np
import torch

from .automaton import Automaton, byte_table
from .classes import classes_of, column_classes, first_of_each, in_first_use_order, refine
from .next_codes import encode_relative, encode_targets, index_targets
from .tokensim import STAYS, STOPS, ByteSteps, VocabPrep, after_stops, explicit_columns
from .values import close_ok, stays_need


def far_mask(blk, reach, dev=None) -> np.ndarray:
    """bool numpy [Nb]: cells whose every move lands inside the block's full rows, away from the cap.

    `reach`: the most units a token adds from each sub-state (int64 [Q], or one int for all). From
    such a cell a token's move depends on (q, token) only (rows shared by shift). With `reach`
    None no cell is far (every cell gets its own row: the plain table). On the host: the block's
    cells are numpy arrays, and the ops are small.
    """
    ns = np.asarray(blk.ns)
    if reach is None:
        return np.zeros(len(ns), dtype=bool)
    if isinstance(reach, torch.Tensor):
        reach = reach.cpu().numpy()[blk.qs]
    return (ns >= blk.vt.far_from(blk.min)) & (ns + reach + blk.vt.max_pending <= blk.max)


def build_tables(aut: Automaton, prep: VocabPrep, dev, far=far_mask) -> dict:
    """The factored tables of `aut` on `prep`'s vocabulary (see the module docstring)."""
    vocab = prep.vocab
    V, S = len(vocab), aut.num_states
    far = _once(far)                    # each block's far cells: asked for by the rows and by _share_far
    done = S
    delta_np, byte_class, to_c_np, from_c_np = byte_table(aut, vocab.max_len, vocab.max_tail)
    steps = ByteSteps.of(delta_np, byte_class, vocab, dev)
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
    src, tok, nxt = explicit_columns(edges_c, steps, vocab)
    nxt = from_c[nxt]

    # Block cells: signatures per value type, and the state after each value-ending event.
    vts = aut.value_types()
    sigs = {vt.name: prep.signature(vt) for vt in vts}
    blocks_of = {vt.name: [k for k, b in enumerate(aut.blocks) if b.vt.name == vt.name] for vt in vts}
    after_ev = {name: after_stops(sigs[name], [aut.blocks[k] for k in ks], steps, to_c, from_c, vocab)
                for name, ks in blocks_of.items()}                                     # [B_vt, E_vt]

    # Token keys: first how a token behaves in block cells (role: eos / other stop / text; its
    # signatures; what follows a value it ends), then with its explicit columns as well. Block
    # rows are computed per value class (far fewer than classes), then spread to the classes.
    a_tok, a_col, a_val = [], [], []
    Qmax = max([vt.num_substates for vt in vts], default=1)
    for vt in vts:
        sig = sigs[vt.name]
        qi, ti, evs = sig.stop_q, sig.stop_t, sig.stop_ev                          # kept per tokenizer
        val = after_ev[vt.name].index_select(1, evs)                              # [B_vt, P], all blocks at once
        bj, pj = torch.nonzero(val >= 0, as_tuple=True)
        a_tok.append(ti[pj])
        a_col.append(torch.as_tensor(blocks_of[vt.name], device=dev)[bj] * Qmax + qi[pj])
        a_val.append(val[bj, pj])
    base = prep.value_classes(vts)                                                     # cached per tokenizer
    if a_tok:
        value_class = refine(base, torch.cat(a_tok), torch.cat(a_col), torch.cat(a_val))
    else:
        value_class = base
    value_rep = first_of_each(value_class)                                             # [Cv]
    token_class = refine(value_class, tok, src, nxt)
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
    acc_rows = row_of_explicit[acc]
    ex_r = torch.cat([row_of_explicit[src[sel]], acc_rows.repeat_interleave(len(stop_classes))])
    ex_c = torch.cat([rep_pos[tok[sel]], stop_classes.repeat(len(acc_rows))])
    ex_n = torch.cat([nxt[sel], torch.full((len(acc_rows) * len(stop_classes),), done, device=dev)])
    done_row = torch.full((1, C), -1, dtype=torch.int32, device=dev)
    done_row[0, token_class[prep.eos_id]] = done           # a finished row stays finished, emitting eos

    def value_part(far_fn):
        return _value_rows(aut, sigs, after_ev, blocks_of, value_rep, far_fn, dev)

    value_ids, value_rows, within = value_part(far)                                    # [Nk, Cv]
    # every class has a token (dense ids), so a row is dead iff it has no legal entry
    dead = (E > 0 and bool((torch.bincount(ex_r, minlength=E) == 0).any())) or \
        (len(value_rows) > 0 and bool((value_rows.amax(1) < 0).any()))
    state_row = torch.full((S + 1,), -1, dtype=torch.int64, device=dev)
    if not bool(dead):
        codes = torch.where(within, encode_relative(value_rows, value_ids.to(value_rows.dtype)[:, None]),
                            value_rows).to(torch.int32)
        v_row, v_uniq = classes_of(codes)                                              # equal cell rows once
        vcodes = codes.index_select(0, v_uniq)                                         # [Rv, Cv]
        s = explicit.index_select(0, ex_r)
        ex_code = torch.where(_forward(ex_n, s, done), encode_relative(ex_n, s), ex_n)
        # the target list from the few absolute moves, before they are spread over the table's columns
        targets = torch.unique(torch.cat([ex_code[ex_code >= 0], vcodes[vcodes >= 0].long(),
                                          torch.tensor([done], device=dev)]))
        ex_code = index_targets(ex_code, targets)
        vcodes = index_targets(vcodes, targets)
        Rv = len(v_uniq)
        allc = torch.full((E + Rv + 1, C), -1, dtype=torch.int32, device=dev)         # [E + Rv + 1, C]
        allc[ex_r, ex_c] = ex_code.to(torch.int32)
        allc[E:E + Rv] = _take_columns(vcodes, spread)
        allc[-1] = index_targets(done_row[0], targets)
        row_of, uniq = classes_of(allc)
        rows_of = allc                                                                 # row r is allc[uniq[r]]
        state_row[explicit] = row_of[:E]
        state_row[value_ids] = row_of[E + v_row]
        state_row[done] = row_of[-1]
        _share_far(aut, state_row, far, sigs)
    else:
        # Some state has no way out (a vocabulary without some bytes): prune on the full table.
        value_ids, value_rows, within = value_part(lambda blk, n, d: far(blk, None, d))
        full = torch.full((S + 1, C), -1, dtype=torch.int32, device=dev)
        full[explicit[ex_r], ex_c] = ex_n.to(torch.int32)
        full[value_ids] = value_rows[:, spread].to(torch.int32)
        full[done] = done_row[0]
        finals = torch.cat([acc, torch.tensor([done], device=dev)])
        full = _prune_dead_ends(full, class_size, finals)
        relative = torch.zeros_like(full, dtype=torch.bool)
        relative[value_ids] = within[:, spread]
        relative[explicit] = _forward(full[explicit], explicit[:, None], done)
        relative &= full >= 0
        states = torch.arange(S + 1, device=dev)[:, None]
        codes = torch.where(relative, encode_relative(full, states), full)
        state_row, uniq = classes_of(codes)
        codes, targets = encode_targets(codes)
        rows_of = codes
    assert int(state_row.min()) >= 0, "every state has a row"
    # Number rows by first use (one gather builds the table in that order), merge classes whose columns came
    # out equal (keys are sufficient, not necessary) and number them by first use too, so equal grammars give
    # equal tables whatever the hashing did.
    state_row, row_order = in_first_use_order(state_row)
    row_next = rows_of.index_select(0, uniq.index_select(0, row_order))
    merged, col_rep = column_classes(row_next)
    token_class, cls_order = in_first_use_order(merged[token_class])
    row_next = _take_columns(row_next, col_rep.index_select(0, cls_order))
    class_size = torch.bincount(token_class, minlength=row_next.shape[1])
    # through BLAS (an int64 matmul does not): every partial sum is a count <= V, exact in float32 below 2^24
    exact = torch.float32 if V < (1 << 24) else torch.float64
    if dev.type == "cpu":                   # numpy's conversion and product are ~2x torch's here; in blocks
        ft = np.float32 if exact == torch.float32 else np.float64                # of rows that stay in cache
        rn, cs, R = row_next.numpy(), class_size.numpy().astype(ft), row_next.shape[0]
        step = max(1, CELL_ENTRIES // max(1, rn.shape[1]))
        legal = np.concatenate([(rn[a:a + step] != -1).astype(ft) @ cs for a in range(0, R, step)] or [np.zeros(0)])
        row_legal = torch.from_numpy(legal).to(torch.int32)                                           # [R]
    else:
        row_legal = ((row_next != -1).to(exact) @ class_size.to(exact)).to(torch.int32)               # [R]
    final = torch.zeros(S + 1, dtype=torch.bool, device=dev)
    final[acc] = True
    final[done] = True
    row_final = torch.zeros(row_next.shape[0], dtype=torch.bool, device=dev)
    row_final[state_row[final]] = True
    assert torch.equal(row_final[state_row], final), "accepting is a property of the row (its stop moves)"
    return dict(token_class=token_class, state_row=state_row, row_next=row_next, row_legal=row_legal,
                row_final=row_final, targets=targets, done_state=done)


def _take_columns(x: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """x[:, cols] (numpy's take on the CPU: ~3x torch's index_select along dim 1)."""
    if x.device.type == "cpu":
        return torch.from_numpy(np.take(x.numpy(), cols.numpy(), axis=1))
    return x.index_select(1, cols)


# An explicit state's forward moves (not to `done`) are stored relative when they reach no further than
# this: equal runs of literal text (a key's chain, an enum value, an array's separators) then have equal
# rows wherever they sit, and the codes stay within int16 (next_codes.py). Block cells' moves out of their
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


def _value_rows(aut, sigs, after_ev, blocks_of, rep, far, dev):
    """Next states from block cells for the C class representatives.

    Returns (state ids [N], rows int32 [N, C], within bool [N, C]): `within` marks moves that stay
    inside the value (the only ones whose target is a fixed shift of the state). Far cells
    (see far_mask) are represented by the first of them per sub-state; the rest share its row.
    All blocks of one value type are done together: cells concatenated, their grids too.
    """
    C = len(rep)
    ids_out, rows, within = [], [], []
    for name, ks in blocks_of.items():
        vt = aut.blocks[ks[0]].vt.on(dev)
        Q, sig = vt.num_substates, sigs[name]
        blks = [aut.blocks[k] for k in ks]
        # the cells of every block of the type, concatenated (host: small ops per block), and which to compute:
        # every cell that is not far, and the first far cell of each (block, sub-state)
        fm = np.concatenate([far(blk, sig.reach, dev) for blk in blks])             # [N]
        qs_all = np.concatenate([blk.qs for blk in blks])
        ns_all = np.concatenate([blk.ns for blk in blks])
        cj_all = np.repeat(np.arange(len(blks)), [blk.size for blk in blks])
        id_all = np.concatenate([blk.base + np.arange(blk.size) for blk in blks])
        keep = ~fm
        far_at = np.flatnonzero(fm)
        if far_at.size:
            first = _min_per_key(cj_all[far_at] * Q + qs_all[far_at], far_at, len(blks) * Q)
            keep[first[first >= 0]] = True
        sel = np.flatnonzero(keep)
        grids = [blk.grid.reshape(-1) for blk in blks]
        gstart = np.concatenate([[0], np.cumsum([g.size for g in grids])])
        qs, ns, ids, cj = (torch.from_numpy(x[sel]).to(dev) for x in (qs_all, ns_all, id_all, cj_all))
        grid = torch.from_numpy(np.concatenate(grids)).to(dev).to(torch.int32)
        bounds = torch.tensor([[aut.blocks[k].min, aut.blocks[k].max] for k in ks], device=dev)
        room = (bounds[cj, 1] - ns).to(torch.int32)                           # [Nk] max - n
        low = (bounds[cj, 0] - ns).to(torch.int32)                            # [Nk] min - n
        at0 = (torch.as_tensor(gstart[:-1], device=dev)[cj] + ns * Q).to(torch.int32)   # [Nk] grid offset of row n
        per_q = _per_substate(vt, sig, rep, after_ev[name])
        step = max(1, CELL_ENTRIES // max(1, C))
        for a in range(0, len(qs), step):    # cells in chunks: the [cells, C] temporaries stay in cache
            cut = slice(a, a + step)
            r, w = _cell_rows(vt, per_q, qs[cut], room[cut], low[cut], at0[cut], cj[cut], grid)
            rows.append(r)
            within.append(w)
        ids_out.append(ids)
    if not rows:
        return (torch.empty(0, dtype=torch.int64, device=dev), torch.empty((0, C), dtype=torch.int64, device=dev),
                torch.empty((0, C), dtype=torch.bool, device=dev))
    return torch.cat(ids_out), torch.cat(rows), torch.cat(within)


# cells x classes per chunk of _cell_rows (int64 temporaries of ~2 MB)
CELL_ENTRIES = 1 << 18


def _per_substate(vt, sig, rep, aft):
    """What each class representative does from each sub-state, on [Q, C] (tiny): the least room
    (max - n) a move that stays needs (stays_ok), the grid offset of its target, the units it adds,
    whether it may close the value (close_ok but the bounds) and its event (an index into `aft`'s
    rows with one -1 column appended, for cells without an event)."""
    Q = vt.num_substates
    out, units, q_end, ev = (getattr(sig, f)[:, rep] for f in ("out", "units", "q_end", "ev_of"))
    qc = q_end.clamp(min=0)
    need = torch.where(out == STAYS, stays_need(vt, q_end, units), 1 << 30).to(torch.int32)
    step = (units * Q + qc).to(torch.int32)
    stops = (out == STOPS) & (ev >= 0)
    E1 = aft.shape[1] + 1
    aflat = torch.cat([aft, torch.full((aft.shape[0], 1), -1, dtype=aft.dtype, device=aft.device)], 1)
    evx = torch.where(ev >= 0, ev, E1 - 1).to(torch.int32)
    return need, step, units.to(torch.int32), qc.to(torch.int32), stops, evx, aflat.reshape(-1).to(torch.int32), E1


def _cell_rows(vt, per_q, qs, room, low, at0, cj, grid):
    """Rows of block cells (sub-state qs, room max - n, low min - n, grid offset of their row, block cj
    of the type; all [n]) for the class representatives: (next states int32 [n, C], within bool [n, C])."""
    need, step, units, qc, stops, evx, aflat, E1 = per_q
    room = room[:, None]
    stays = need.index_select(0, qs) <= room                                   # [n, C] stays_ok
    at = at0[:, None] + step.index_select(0, qs)
    inside = grid.index_select(0, at.clamp_(max=len(grid) - 1).view(-1)).view(at.shape)
    ai = (cj * E1).to(torch.int32)[:, None] + evx.index_select(0, qs)
    after = aflat.index_select(0, ai.view(-1)).view(ai.shape)
    u = units.index_select(0, qs)                                              # close_ok at n + u, bounds shifted by n
    closes = stops.index_select(0, qs) & close_ok(vt, u, qc.index_select(0, qs), low[:, None], room) & (after >= 0)
    return torch.where(closes, after, torch.where(stays, inside, -1)), stays


def _min_per_key(key: np.ndarray, values: np.ndarray, num_keys: int) -> np.ndarray:
    """int64 [num_keys]: the least of `values` per key in [0, num_keys) (-1 for a key not present); one
    scatter (a sort, as np.unique would do, costs more on the ~100K far cells of a catalogue)."""
    big = np.iinfo(np.int64).max
    out = torch.full((num_keys,), big, dtype=torch.int64)
    out.scatter_reduce_(0, torch.from_numpy(np.ascontiguousarray(key, dtype=np.int64)),
                        torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64)), reduce="amin")
    out = out.numpy()
    return np.where(out == big, -1, out)


def _share_far(aut, state_row, far, sigs) -> None:
    """Far cells not computed take the row of their sub-state's first far cell (see _value_rows).

    In a block cell's row a move that stays inside the value is stored relative to the state (a
    value only grows, so the code is <= -2); every other move stays absolute; -1 is illegal. Far
    cells then have identical rows per sub-state, and equal rows anywhere are stored once: R stays
    in the hundreds whatever a value's cap is.
    """
    dev = state_row.device
    Qm = max([b.vt.num_substates for b in aut.blocks], default=1)
    ids_l, key_l = [], []
    for k, blk in enumerate(aut.blocks):    # all blocks at once: one scatter of (block, sub-state)
        sel = np.flatnonzero(far(blk, sigs[blk.vt.name].reach, dev))
        ids_l.append(blk.base + sel)
        key_l.append(k * Qm + blk.qs[sel])
    ids = np.concatenate(ids_l) if ids_l else np.zeros(0, dtype=np.int64)
    if not len(ids):
        return
    key = np.concatenate(key_l)
    first = _min_per_key(key, ids, len(aut.blocks) * Qm)[key]               # [far cells] the first of its kind
    state_row[torch.from_numpy(ids).to(dev)] = state_row.index_select(0, torch.from_numpy(first).to(dev))


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
