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

from dataclasses import dataclass

import numpy as np
import torch

from .automaton import Automaton, byte_table
from .classes import classes_of, first_of_each, in_first_use_order, refine
from .next_codes import encode_relative, encode_targets, index_targets
from .table_write import RowParts
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
    far = _once(far)                    # each block's far cells: asked for by the rows and their layout
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
    shapes_of = {name: _shapes(aut, ks) for name, ks in blocks_of.items()}              # blocks alike but for exits
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
    eos_class = token_class[prep.eos_id].reshape(1)        # in `done` only eos is legal; it stays there

    def value_part(far_fn, segments):
        return _value_rows(aut, sigs, after_ev, blocks_of, shapes_of, value_rep, far_fn, dev, segments)

    value_ids, which, codes, layouts = value_part(far, True)                           # [Nk], [Nk], [M, Cv]
    v_row, v_uniq = classes_of(codes)                                                  # [M] equal rows once
    vcodes = codes.index_select(0, v_uniq)                                             # [Rv, Cv]
    # every class has a token (dense ids), so a row is dead iff it has no legal entry
    dead = (E > 0 and bool((torch.bincount(ex_r, minlength=E) == 0).any())) or \
        (len(vcodes) > 0 and bool(((vcodes.amax(1) == -1) & (vcodes.amin(1) == -1)).any()))
    state_row = torch.full((S + 1,), -1, dtype=torch.int64, device=dev)
    if not bool(dead):
        s = explicit.index_select(0, ex_r)
        ex_code = torch.where(_forward(ex_n, s, done), encode_relative(ex_n, s), ex_n)
        # the target list: the explicit states' few absolute moves, then every block's exits (segments)
        explicit_targets = torch.unique(torch.cat([ex_code[ex_code >= 0], torch.tensor([done], device=dev)]))
        targets, seg_start, seg_base = _segments(aut, after_ev, blocks_of, explicit_targets, done, dev)
        # rows: the explicit states' (sparse), `done`'s (sparse, row E), the block cells' (dense on value classes)
        parts = RowParts(E + 1, torch.cat([ex_r, torch.tensor([E], device=dev)]), torch.cat([ex_c, eos_class]),
                         index_targets(torch.cat([ex_code, torch.tensor([done], device=dev)]), explicit_targets),
                         vcodes, spread, C)
        row_of = parts.row_classes()
        state_row[explicit] = row_of[:E]
        state_row[done] = row_of[E]
        _block_rows(state_row, layouts, row_of.index_select(0, E + 1 + v_row))
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
        state_row, uniq = classes_of(codes)
        codes, targets = encode_targets(codes)
        empty = torch.zeros(0, dtype=torch.int64, device=dev)
        parts = RowParts(0, empty, empty, empty, codes.index_select(0, uniq).to(torch.int32),
                         torch.arange(C, device=dev), C)
        state_row = parts.row_classes().index_select(0, state_row)        # the rows are distinct already
        seg_start = seg_base = torch.zeros(1, dtype=torch.int64, device=dev)           # one segment: plain
    assert int(state_row.min()) >= 0, "every state has a row"
    # Number rows by first use and write the table in that order, its equal columns merged and numbered by
    # first use too (keys are sufficient, not necessary), so equal grammars give equal tables whatever the
    # hashing did (table_write.py).
    state_row, row_order = in_first_use_order(state_row)
    token_class, row_next, row_legal = parts.write(row_order, token_class)
    final = torch.zeros(S + 1, dtype=torch.bool, device=dev)
    final[acc] = True
    final[done] = True
    row_final = torch.zeros(row_next.shape[0], dtype=torch.bool, device=dev)
    row_final[state_row[final]] = True
    # accepting is a property of the row (its stop moves): no other state may share an accepting state's row.
    # Block cells are never accepting, and a far cell has the row of a computed one: checking the explicit
    # states and the computed cells checks them all.
    seen = torch.cat([explicit, value_ids, torch.tensor([done], device=dev)])
    assert torch.equal(row_final[state_row[seen]], final[seen]), "accepting is a property of the row"
    return dict(token_class=token_class, state_row=state_row, row_next=row_next, row_legal=row_legal,
                row_final=row_final, targets=targets, segment_start=seg_start, segment_base=seg_base,
                done_state=done)


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


def _value_rows(aut, sigs, after_ev, blocks_of, shapes_of, rep, far, dev, segments: bool):
    """Next-state codes from block cells for the C class representatives.

    Returns (state ids [N] of the cells computed, their row [N] in `codes`, codes int32 [M, C]): a move that
    stays inside the value is relative (the only ones whose target is a fixed shift of the state), -1 is
    illegal, and a token that ends the value has an absolute code: with `segments`, the index of its ending
    event in the block's exits (read from the block's own segment of the target list, next_codes.py), else
    the next state itself. Blocks of one value type with the same bounds have the same cells (_shapes), so
    their rows are worked out once per shape with the ending events left open; then with `segments` every
    pattern of legal exits among the shape's blocks gives one set of rows, shared by the blocks with that
    pattern (wherever their exits lead), and without, every block fills in its own next states (one gather).
    Far cells (see far_mask) are represented by the first of them per sub-state; the rest share its row
    (_block_rows).
    """
    C = len(rep)
    ids_out, which, rows, layouts = [], [], [], []
    made = 0
    for name, ks in blocks_of.items():
        vt = aut.blocks[ks[0]].vt.on(dev)
        Q, sig = vt.num_substates, sigs[name]
        per_q = _per_substate(vt, sig, rep, after_ev[name])
        aft = per_q[6].view(len(ks), -1)                                          # [B_vt, E + 1] the exits
        for js in shapes_of[name].values():                                     # js: blocks of the type
            blk = aut.blocks[ks[js[0]]]
            sel = _cells_computed(blk, far(blk, sig.reach, dev), Q)                 # [n] cells of the shape
            grid = torch.from_numpy(np.where(blk.grid >= 0, blk.grid - blk.base, -1).reshape(-1)).to(dev)
            grid = grid.to(torch.int32)
            bases = torch.as_tensor([aut.blocks[ks[j]].base for j in js], device=dev)
            exits = aft.index_select(0, torch.as_tensor(js, device=dev))                 # [b, E + 1]
            if segments:                    # the blocks' patterns of legal exits: [P, E + 1], pattern of each
                patterns, pattern_of = torch.unique(exits >= 0, dim=0, return_inverse=True)
                sources = patterns.to(torch.int32)
            else:
                sources, pattern_of = exits, torch.arange(len(js), device=dev)
            P, n = len(sources), len(sel)
            cells = torch.from_numpy(sel).to(dev)
            ids_out.append((bases[:, None] + cells).view(-1))                      # [b * n], block-major
            which.append((made + pattern_of[:, None] * n + torch.arange(n, device=dev)).view(-1))
            layouts.append(_Layout(bases.cpu().numpy(), blk.size, pattern_of.cpu().numpy(), sel, made, P,
                                   *_far_sources(blk, far(blk, sig.reach, dev), sel)))
            out = torch.empty((P, n, C), dtype=torch.int32, device=dev)            # rows made: pattern-major
            cstep = max(1, CELL_ENTRIES // max(1, C))
            for c0 in range(0, n, cstep):                 # cells in chunks, then patterns in chunks: the
                cut = cells[c0:c0 + cstep]                # [cells, C] temporaries stay in cache
                at = sel[c0:c0 + cstep]
                qs, ns = torch.from_numpy(blk.qs[at]).to(dev), torch.from_numpy(blk.ns[at]).to(dev)
                code, ev = _cell_rows(vt, per_q, qs, (blk.max - ns).to(torch.int32), (blk.min - ns).to(torch.int32),
                                      (ns * Q).to(torch.int32), cut, grid)
                bstep = max(1, CELL_ENTRIES // max(1, code.numel()))
                for b0 in range(0, P, bstep):
                    got = sources[b0:b0 + bstep].index_select(1, ev.view(-1)).view(-1, *ev.shape)   # [p, cells, C]
                    if segments:          # a legal exit: its event's index in the block's exits
                        got = torch.where(got > 0, ev.to(torch.int32), -1)
                    out[b0:b0 + bstep, c0:c0 + cstep] = torch.where(got >= 0, got, code)
            rows.append(out.view(-1, C))
            made += P * n
    if not rows:
        z = torch.empty(0, dtype=torch.int64, device=dev)
        return z, z, torch.empty((0, C), dtype=torch.int32, device=dev), layouts
    return torch.cat(ids_out), torch.cat(which), torch.cat(rows), layouts


@dataclass
class _Layout:
    """Where one shape's computed rows go (_value_rows): blocks at `bases` of `size` cells, block j with the
    rows of pattern pattern_of[j]: rows made + p * n + i for its computed cells sel[i] (n of them); its other
    (far) cells at offsets `far` take the row of the cell at offsets `src` (the first far cell of their
    sub-state)."""
    bases: np.ndarray
    size: int
    pattern_of: np.ndarray
    sel: np.ndarray
    made: int
    P: int
    far: np.ndarray
    src: np.ndarray


def _far_sources(blk, fm: np.ndarray, sel: np.ndarray):
    """(offsets of the far cells not computed, offset of the computed far cell each one shares a row with)."""
    at = np.flatnonzero(fm)
    if not at.size:
        return at, at
    q = blk.qs[at]
    first = _min_per_key(q, at, int(q.max()) + 1)[q]
    rest = at != first
    return at[rest], first[rest]


def _block_rows(state_row: torch.Tensor, layouts: list, cell_row: torch.Tensor) -> None:
    """Every block cell's row into state_row [S + 1]: per shape and pattern one row per cell offset (computed
    cells their own, far cells their sub-state's first far cell's, see far_mask), copied to each block of it
    (one slice each: no per-cell index arrays over the million cells of a large union)."""
    out, rows = state_row.numpy() if state_row.device.type == "cpu" else None, cell_row.cpu().numpy()
    for L in layouts:
        n = len(L.sel)
        tmpl = np.empty((L.P, L.size), dtype=np.int64)
        tmpl[:, L.sel] = rows[L.made:L.made + L.P * n].reshape(L.P, n)
        tmpl[:, L.far] = tmpl[:, L.src]
        for j, b in enumerate(L.bases.tolist()):
            if out is not None:
                out[b:b + L.size] = tmpl[L.pattern_of[j]]
            else:
                state_row[b:b + L.size] = torch.from_numpy(tmpl[L.pattern_of[j]]).to(state_row.device)


def _segments(aut, after_ev, blocks_of, explicit_targets: torch.Tensor, done: int, dev):
    """The target list and its segments (next_codes.py): explicit states (and `done`) read `explicit_targets`
    from 0; each block's cells read its exits (E states, one per ending event of its type; an illegal exit
    holds state 0, never read) from a base of their own. Returns (targets, segment_start, segment_base)."""
    exits_of = {}
    for name, ks in blocks_of.items():
        for j, k in enumerate(ks):
            exits_of[k] = after_ev[name][j]
    lists, start, base = [explicit_targets], [0], [0]
    at = explicit_targets.numel()
    order = sorted(range(len(aut.blocks)), key=lambda k: aut.blocks[k].base)
    for i, k in enumerate(order):
        blk = aut.blocks[k]
        ex = exits_of[k].clamp(min=0)
        start.append(blk.base)
        base.append(at)
        lists.append(ex)
        at += ex.numel()
        end = blk.base + blk.size
        if i + 1 == len(order) or aut.blocks[order[i + 1]].base != end:
            start.append(end)                          # explicit states (or done) after the block: from 0 again
            base.append(0)
    as_t = lambda x: torch.tensor(x, dtype=torch.int64, device=dev)   # noqa: E731
    return torch.cat([x.long() for x in lists]), as_t(start), as_t(base)


def _shapes(aut, ks) -> dict:
    """Blocks ks (of one value type) grouped by shape: {(min, max): [positions in ks]}. A block's cells are
    its type's layout for its cap numbered from its base (ValueType.cells), so the bounds are the shape."""
    out = {}
    for j, k in enumerate(ks):
        blk = aut.blocks[k]
        out.setdefault((blk.min, blk.max), []).append(j)
    return out


def _cells_computed(blk, fm: np.ndarray, Q: int) -> np.ndarray:
    """Offsets of the cells whose rows are computed: every cell that is not far, and the first far
    cell of each sub-state (fm: the far mask)."""
    keep = ~fm
    far_at = np.flatnonzero(fm)
    if far_at.size:
        first = _min_per_key(blk.qs[far_at], far_at, Q)
        keep[first[first >= 0]] = True
    return np.flatnonzero(keep)


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


def _cell_rows(vt, per_q, qs, room, low, at0, cell, grid):
    """Rows of block cells (sub-state qs, room max - n, low min - n, grid offset of their row, their offset in
    the block; all [n]) for the class representatives, but for where a token ends the value:
    (codes int32 [n, C]: relative for moves inside the value, else -1; the ending event of each entry, int64
    [n, C], an index into a block's exits, the last one (-1) where the entry does not end the value)."""
    need, step, units, qc, stops, evx, aflat, E1 = per_q
    room = room[:, None]
    stays = need.index_select(0, qs) <= room                                   # [n, C] stays_ok
    at = at0[:, None] + step.index_select(0, qs)
    inside = grid.index_select(0, at.clamp_(max=len(grid) - 1).view(-1)).view(at.shape)
    u = units.index_select(0, qs)                                              # close_ok at n + u, bounds shifted by n
    closes = stops.index_select(0, qs) & close_ok(vt, u, qc.index_select(0, qs), low[:, None], room)
    ev = torch.where(closes, evx.index_select(0, qs), E1 - 1).long()
    code = torch.where(stays, encode_relative(inside, cell[:, None].to(inside.dtype)), -1).to(torch.int32)
    return code, ev


def _min_per_key(key: np.ndarray, values: np.ndarray, num_keys: int) -> np.ndarray:
    """int64 [num_keys]: the least of `values` per key in [0, num_keys) (-1 for a key not present); one
    scatter (a sort, as np.unique would do, costs more on the ~100K far cells of a catalogue)."""
    big = np.iinfo(np.int64).max
    out = torch.full((num_keys,), big, dtype=torch.int64)
    out.scatter_reduce_(0, torch.from_numpy(np.ascontiguousarray(key, dtype=np.int64)),
                        torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64)), reduce="amin")
    out = out.numpy()
    return np.where(out == big, -1, out)


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
