"""Block cells -> their rows of the table, and the target segments they read (table/build.py's value half).

A value block (automaton.Block) is a grid of cells (n units so far, sub-state q). Its rows are worked out
for the class representatives only, and only for the cells that differ:
  * blocks of one value type with the same bounds have the same cells (`_shapes`), so a shape's rows
    are computed once, the value's ending events left open (`_cell_rows`);
  * a cell far from both ends moves by shift: its row depends on its sub-state only, so one far cell per
    sub-state is computed and the rest share its row (`far_mask`, `block_rows`);
  * a token that ends the value names its ending event; the event's state (where the value's end leads)
    is read from the block's own segment of the target list (table/next_codes.py, `block_segments`), so blocks
    whose exits are legal alike share rows wherever they lead.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..grammar.values import close_ok, stays_need
from ..select import pick
from .classes import column_classes, unique_bool_rows
from .next_codes import encode_relative
from .signature import STAYS, STOPS


def far_mask(blk, reach, dev=None) -> np.ndarray:
    """bool numpy [Nb]: cells whose every move lands inside the block's full rows, away from the cap.

    `reach`: the most units a token adds from each sub-state (int64 [Q], or one int for all). From
    such a cell a token's move depends on (q, token) only (rows shared by shift). With `reach`
    None no cell is far (every cell gets its own row: the plain table). On the host: the block's
    cells are numpy arrays, and the ops are small.
    """
    ns = np.asarray(blk.ns)
    if reach is None or blk.saturates is not None:       # a saturating block's rows are few: each its own
        return np.zeros(len(ns), dtype=bool)
    if isinstance(reach, torch.Tensor):
        reach = reach.cpu().numpy()[blk.qs]
    return (ns >= blk.vt.far_from(blk.min)) & (ns + reach + blk.vt.max_pending <= blk.max)


def value_rows(aut, sigs, exit_cls, blocks_of, shapes_of, rep, far, dev, segments: bool):
    """Next-state codes from block cells for the C class representatives.

    Returns (state ids [N] of the cells computed, their row [N] in `codes`, codes int32 [M, C]): a move that
    stays inside the value is relative (the only ones whose target is a fixed shift of the state), -1 is
    illegal, and a token that ends the value has an absolute code: with `segments`, the index of its ending
    event's class (exit_cls: ExitClasses per type) in the block's exits (read from the block's own segment of
    the target list, table/next_codes.py), else the next state itself. Blocks of one value type with the same
    bounds have the same cells (shapes), so their rows are worked out once per shape with the ending events
    left open; then with `segments` every pattern of legal exits among the shape's blocks gives one set of
    rows, shared by the blocks with that pattern (wherever their exits lead), and without, every block fills
    in its own next states (one gather). Far cells (see far_mask) are represented by the first of them per
    sub-state; the rest share its row (block_rows).
    """
    C = len(rep)
    ids_out, which, rows, layouts = [], [], [], []
    made = 0
    for name, ks in blocks_of.items():
        vt = aut.blocks[ks[0]].vt.on(dev)
        Q, sig = vt.num_substates, sigs[name]
        per_q = _per_substate(vt, sig, rep, exit_cls[name])
        aft = per_q[6].view(len(ks), -1)                                          # [B_vt, E + 1] the exits
        if any(aut.blocks[k].saturates is not None for k in ks):
            aft = torch.cat([aft, saturated_row_ids(aut, ks, Q, dev)], 1)         # [B_vt, E + 1 + Q]
        shapes_here = []                # per shape: (its cells' span in `cells`, out [P, n, C], sources, pattern_of)
        for js in shapes_of[name].values():                                     # js: blocks of the type
            blk = aut.blocks[ks[js[0]]]
            sel, far_at, far_src = cells_computed(blk, far(blk, sig.reach, dev), Q)    # [n] cells of the shape
            bases = torch.as_tensor([aut.blocks[ks[j]].base for j in js], device=dev)
            exits = aft.index_select(0, torch.as_tensor(js, device=dev))                 # [b, E + 1]
            if segments:                    # the blocks' patterns of legal exits: [P, E + 1], pattern of each
                if len(js) == 1:            # one block: its pattern (what torch.unique gives, without its sort)
                    patterns, pattern_of = exits >= 0, torch.zeros(1, dtype=torch.int64, device=dev)
                else:
                    patterns, pattern_of = unique_bool_rows(exits >= 0)
                sources = patterns.to(torch.int32)
            else:
                sources, pattern_of = exits, torch.arange(len(js), device=dev)
            P, n = len(sources), len(sel)
            cells = torch.from_numpy(sel).to(dev)
            ids_out.append((bases[:, None] + cells).view(-1))                      # [b * n], block-major
            which.append((made + pattern_of[:, None] * n + torch.arange(n, device=dev)).view(-1))
            layouts.append(_Layout(bases.cpu().numpy(), blk.size, pattern_of.cpu().numpy(), sel, made, P,
                                   far_at, far_src))
            out = torch.empty((P, n, C), dtype=torch.int32, device=dev)            # rows made: pattern-major
            shapes_here.append((blk, sel, out, sources))
            rows.append(out.view(-1, C))
            made += P * n
        _fill_type_rows(vt, per_q, sig, shapes_here, segments, dev)
    if not rows:
        z = torch.empty(0, dtype=torch.int64, device=dev)
        return z, z, torch.empty((0, C), dtype=torch.int32, device=dev), layouts
    return torch.cat(ids_out), torch.cat(which), torch.cat(rows), layouts


def _fill_type_rows(vt, per_q, sig, shapes_here, segments: bool, dev) -> None:
    """Fill each shape's rows out [P, n, C] (value_rows) for one value type. The cells of all its shapes go
    through _cell_rows together, a chunk of cells at a time (each shape's grid at its own offset in one
    array, its bounds per cell): a catalogue's dozen shapes of ~70 cells each cost one pass of small ops,
    not a dozen. Then per shape its patterns of legal exits fill in where a token ends the value."""
    Q = vt.num_substates
    qs, ns, hi, lo, at0, cell, last, gend, grids, spans = [], [], [], [], [], [], [], [], [], []
    g_at = c_at = 0
    for blk, sel, _, _ in shapes_here:
        depth = len(blk.local) + int(sig.reach.max()) + 2 if blk.saturates is not None else len(blk.local)
        grid = blk.saturated_grid(depth).reshape(-1).astype(np.int32)
        n = len(sel)
        qs.append(blk.qs[sel])
        ns.append(blk.ns[sel])
        hi.append(np.full(n, blk.max, dtype=np.int64))
        lo.append(np.full(n, blk.min, dtype=np.int64))
        at0.append(np.full(n, g_at, dtype=np.int64))                   # its grid's offset in the joined grids
        gend.append(np.full(n, g_at + len(grid) - 1, dtype=np.int64))  # its grid's last entry (the clamp)
        last.append(np.full(n, blk.size - Q if blk.saturates is not None else 1 << 30, dtype=np.int64))
        cell.append(sel)
        grids.append(grid)
        spans.append((c_at, c_at + n))
        g_at += len(grid)
        c_at += n
    if not c_at:
        return
    qs, ns, hi, lo, at0, cell = (torch.from_numpy(np.concatenate(x).astype(np.int64, copy=False)).to(dev)
                                 for x in (qs, ns, hi, lo, at0, cell))
    # grid offsets and the saturating rows' offsets in int32 where the joined grids allow, as the [cells, C] sums
    # they enter (half the memory traffic)
    wide = torch.int32 if g_at < (1 << 31) - 1 else torch.int64
    last, gend = (torch.from_numpy(np.concatenate(x)).to(device=dev, dtype=wide) for x in (last, gend))
    grid = torch.from_numpy(np.concatenate(grids)).to(dev)
    C = shapes_here[0][2].shape[2]
    cstep = max(1, CELL_ENTRIES // max(1, C))
    for c0 in range(0, c_at, cstep):                 # cells in chunks, then patterns in chunks: the
        c1 = min(c0 + cstep, c_at)                    # [cells, C] temporaries stay in cache
        part = slice(c0, c1)
        code, ev = _cell_rows(vt, per_q, qs[part], (hi[part] - ns[part]).to(torch.int32),
                              (lo[part] - ns[part]).to(torch.int32), (at0[part] + ns[part] * Q).to(wide),
                              cell[part], grid,
                              last[part], gend[part])
        for (a, b), (_, _, out, sources) in zip(spans, shapes_here):
            a2, b2 = max(a, c0), min(b, c1)
            if a2 >= b2:
                continue
            sc, se = code[a2 - c0:b2 - c0], ev[a2 - c0:b2 - c0]      # this shape's cells in the chunk
            P = len(sources)
            bstep = max(1, CELL_ENTRIES // max(1, sc.numel()))
            width = sources.shape[1]
            for b0 in range(0, P, bstep):
                src = sources[b0:b0 + bstep]                                                     # [p, E + 1]
                # [p, cells, C] = src[:, se], as one flat gather (a gather along dim 1 is ~3x slower)
                at = se.reshape(1, -1) + (torch.arange(len(src), device=dev, dtype=se.dtype) * width)[:, None]
                got = src.reshape(-1).index_select(0, at.reshape(-1)).view(-1, *se.shape)
                if segments:          # a legal exit (pattern entry 1): its event's index in the block's exits
                    out[b0:b0 + bstep, a2 - a:b2 - a] = pick(got.bool(), se, sc)
                else:
                    out[b0:b0 + bstep, a2 - a:b2 - a] = pick(got >= 0, got, sc)


@dataclass
class _Layout:
    """Where one shape's computed rows go (value_rows): blocks at `bases` of `size` cells, block j with the
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


def block_templates(layouts: list, cell_row: torch.Tensor) -> list:
    """Per shape and pattern, the row of every cell offset (computed cells their own, far cells their
    sub-state's first far cell's, see far_mask): [(layout, int64 [P, size])]."""
    rows = cell_row.cpu().numpy()
    out = []
    for L in layouts:
        n = len(L.sel)
        tmpl = np.empty((L.P, L.size), dtype=np.int64)
        tmpl[:, L.sel] = rows[L.made:L.made + L.P * n].reshape(L.P, n)
        tmpl[:, L.far] = tmpl[:, L.src]
        out.append((L, tmpl))
    return out


def block_first_use(templates: list, first: np.ndarray) -> None:
    """Lower first[r] (int64 [R]) to the first block cell using row r: in each pattern's first block (the
    lowest base), each row's first offset in the template."""
    for L, tmpl in templates:
        lowest = np.full(L.P, np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(lowest, L.pattern_of, L.bases)                  # every pattern has a block
        # the cell ids of each pattern's first block rise with the offset: a row's least is its first use
        # (one scatter-min for all patterns: ~20x a np.unique(return_index) per pattern)
        np.minimum.at(first, tmpl.reshape(-1), (lowest[:, None] + np.arange(L.size)).reshape(-1))


def block_rows(state_row: np.ndarray, templates: list, renumber: np.ndarray) -> None:
    """Every block cell's row into state_row (numpy [S + 1]), rows renumbered (renumber[old] = new): each
    pattern's template copied to each block of it, one slice each (no per-cell index arrays over the million
    cells of a large union)."""
    for L, tmpl in templates:
        tmpl = renumber[tmpl].astype(state_row.dtype)
        for b, p in zip(L.bases.tolist(), L.pattern_of.tolist()):
            state_row[b:b + L.size] = tmpl[p]


@dataclass
class ExitClasses:
    """A value type's ending events, grouped: events that lead to the same state from every block of the type
    are one class (a token's close quote and a comma after it, say, whichever token it is), so rows and the
    blocks' exit lists hold classes, not the (token, position) events of the vocabulary (tens of thousands
    for a type whose end many tokens carry)."""
    of_event: torch.Tensor       # int64 [E] the class of each event
    after: torch.Tensor          # int64 [B_vt, K] the state after each class, per block of the type (-1 illegal)


def exit_classes(after_ev, num_events: int) -> ExitClasses:
    """after_ev: (events [E'], after [B_vt, E']) of tokensim.after_stops, the other of the type's `num_events`
    events illegal in every block -> the events grouped by their columns."""
    events, after = after_ev
    if num_events == 0:
        return ExitClasses(torch.zeros(0, dtype=torch.int64, device=after.device), after)
    if len(events) < num_events:                   # the events illegal everywhere: one column of -1 for them all
        after = torch.cat([after, torch.full((after.shape[0], 1), -1, dtype=after.dtype, device=after.device)], 1)
    of_col, first = column_classes(after)
    of_event = torch.full((num_events,), int(of_col[-1]), dtype=torch.int64, device=after.device)
    of_event[events] = of_col[:len(events)]
    return ExitClasses(of_event, after.index_select(1, first))


def block_exit_lists(aut, exits: dict, blocks_of, dev) -> dict:
    """Block index -> the states its cells' absolute codes name (its segment of the target list, -1 where an exit
    is illegal): one per exit class of its type, then for a saturating block an unused entry (E) and its last
    row's cells (_cell_rows)."""
    exits_of = {}
    for name, ks in blocks_of.items():
        for j, k in enumerate(ks):
            exits_of[k] = exits[name].after[j]
            blk = aut.blocks[k]
            if blk.saturates is not None:
                row = torch.from_numpy(blk.last_row_ids()).to(device=dev, dtype=exits_of[k].dtype)
                exits_of[k] = torch.cat([exits_of[k], torch.zeros(1, dtype=exits_of[k].dtype, device=dev), row])
    return exits_of


def block_segments(aut, exits_of: dict, explicit_targets: torch.Tensor, done: int, dev):
    """The target list and its segments (table/next_codes.py): explicit states (and `done`) read `explicit_targets`
    from 0; each block's cells read its exits (`exits_of`: block_exit_lists; an illegal exit holds state 0, never
    read) from a base of their own. Returns (targets, segment_start, segment_base)."""
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


def shapes(aut, ks) -> dict:
    """Blocks ks (of one value type) grouped by shape: {(min, max): [positions in ks]}. A block's cells are
    its type's layout for its cap numbered from its base (ValueType.cells), so the bounds are the shape."""
    out = {}
    for j, k in enumerate(ks):
        blk = aut.blocks[k]
        out.setdefault((blk.min, blk.max), []).append(j)
    return out


_COMPUTED: dict = {}        # cells_computed's answers, by layout and far mask (the same shapes recur across compiles)
COMPUTED_KEPT = 256


def cells_computed(blk, fm: np.ndarray, Q: int):
    """_cells_computed, remembered: a block's cells are its value type's layout for its cap (ValueType.cells), so
    the answer depends on the type, the cap and the far mask only."""
    key = (blk.vt.name, blk.max if blk.saturates is None else ("saturates", blk.saturates), Q, fm.tobytes())
    got = _COMPUTED.get(key)
    if got is None:
        got = _COMPUTED[key] = _cells_computed(blk, fm, Q)  # shared by later compiles: value_rows only reads them
        while len(_COMPUTED) > COMPUTED_KEPT:
            _COMPUTED.pop(next(iter(_COMPUTED)))
    return got


def _cells_computed(blk, fm: np.ndarray, Q: int):
    """(offsets of the cells whose rows are computed: every cell that is not far, and the first far cell of
    each sub-state; offsets of the other far cells; offset of the computed far cell each of those shares a
    row with). fm: the far mask."""
    keep = ~fm
    far_at = np.flatnonzero(fm)
    if not far_at.size:
        return np.flatnonzero(keep), far_at, far_at
    q = blk.qs[far_at]
    first = _min_per_key(q, far_at, Q)                               # [Q] the first far cell per sub-state
    keep[first[first >= 0]] = True
    src = first[q]
    rest = far_at != src
    return np.flatnonzero(keep), far_at[rest], src[rest]


# cells x classes per chunk of _cell_rows (int64 temporaries of ~2 MB)
CELL_ENTRIES = 1 << 18


def _per_substate(vt, sig, rep, exits):
    """What each class representative does from each sub-state, on [Q, C] (tiny): the least room
    (max - n) a move that stays needs (stays_ok), the grid offset of its target, the units it adds,
    whether it may close the value (close_ok but the bounds) and its ending event's class (ExitClasses:
    an index into the compact exits' rows with one -1 column appended, for cells without an event)."""
    aft = exits.after
    Q = vt.num_substates
    out, units, q_end, ev = sig.columns(rep)                                   # [Q, C] each
    qc = q_end.clamp(min=0)
    need = torch.where(out == STAYS, stays_need(vt, q_end, units), 1 << 30).to(torch.int32)
    step = (units * Q + qc).to(torch.int32)
    stops = (out == STOPS) & (ev >= 0)
    E1 = aft.shape[1] + 1
    aflat = torch.cat([aft, torch.full((aft.shape[0], 1), -1, dtype=aft.dtype, device=aft.device)], 1)
    evx = torch.where(ev >= 0, exits.of_event.index_select(0, ev.clamp(min=0).flatten()).view_as(ev),
                      E1 - 1).to(torch.int32)
    return need, step, units.to(torch.int32), qc.to(torch.int32), stops, evx, aflat.reshape(-1).to(torch.int32), E1


def _cell_rows(vt, per_q, qs, room, low, at0, cell, grid, last_row, grid_end):
    """Rows of block cells (sub-state qs, room max - n, low min - n, grid offset of their row, their offset in
    the block; all [n]) for the class representatives, but for where a token ends the value:
    (codes int32 [n, C]: relative for moves inside the value, else -1; the ending event of each entry, int32
    [n, C], an index into a block's exits, the last one (-1) where the entry does not end the value).

    A saturating block's grid repeats its last row (offsets from `last_row` on; Block.saturated_grid), so a
    move there may lead back to an earlier cell of that row: that move cannot be relative (codes only go
    forward) and is read like an exit instead, from the block's own list (event E + 1 + its place in the row,
    saturated_row_ids)."""
    need, step, units, qc, stops, evx, aflat, E1 = per_q
    room = room[:, None]
    stays = need.index_select(0, qs) <= room                                   # [n, C] stays_ok
    at = at0[:, None] + step.index_select(0, qs)
    at = torch.minimum(at, grid_end[:, None])                                 # within each cell's own grid
    inside = grid.index_select(0, at.view(-1)).view(at.shape)
    u = units.index_select(0, qs)                                              # close_ok at n + u, bounds shifted by n
    closes = stops.index_select(0, qs) & close_ok(vt, u, qc.index_select(0, qs), low[:, None], room)
    ev = pick(closes, evx.index_select(0, qs), E1 - 1)                        # int32: an index into the exits
    back = stays & (inside < cell[:, None].to(inside.dtype))                  # only in a saturating last row
    if bool(back.any()):
        ev = torch.where(back, E1 + (inside - last_row[:, None]), ev)
        stays = stays & ~back
    code = pick(stays, encode_relative(inside, cell[:, None].to(inside.dtype)), -1).to(torch.int32)
    return code, ev


def saturated_row_ids(aut, ks, Q: int, dev) -> torch.Tensor:
    """int64 [len(ks), Q]: per block of a type, the state ids of a saturating block's last row (its last Q cells;
    the row is full), -1 for a bounded block: the targets of the moves back within that row (_cell_rows)."""
    out = torch.full((len(ks), Q), -1, dtype=torch.int64, device=dev)
    for j, k in enumerate(ks):
        blk = aut.blocks[k]
        if blk.saturates is not None:
            out[j] = torch.from_numpy(blk.last_row_ids()).to(dev)
    return out


def _min_per_key(key: np.ndarray, values: np.ndarray, num_keys: int) -> np.ndarray:
    """int64 [num_keys]: the least of `values` per key in [0, num_keys) (-1 for a key not present); one
    scatter (a sort, as np.unique would do, costs more on the ~100K far cells of a catalogue)."""
    big = np.iinfo(np.int64).max
    out = torch.full((num_keys,), big, dtype=torch.int64)
    out.scatter_reduce_(0, torch.from_numpy(np.ascontiguousarray(key, dtype=np.int64)),
                        torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64)), reduce="amin")
    out = out.numpy()
    return np.where(out == big, -1, out)
