"""Explicit states that read some of their tokens from a block cell's row instead of walking them.

An explicit state that holds one block position beside other elements (a pattern's `(...)+` beside the string's
end, a URI path beside its query) moves on some first bytes exactly as that position's cell does
(automaton/tree.py `_moves_alone`: `Automaton.delegates`, `Automaton.from_cell`). A token starting with such a
byte goes exactly where it goes from the cell, and the cell's row is worked out anyway from the tokens'
signatures (table/blocks.py). So those edges are left out of the trie walk (table/tokensim.explicit_columns:
for wide byte sets that walk is most of the vocabulary, again at every copy of the value) and the state's row
takes the cell's moves for every class the walk left without a move. Exact: a class with a walked move holds
only tokens that start with a walked byte; a class without one either starts with a cell's byte (its move is
the cell's) or died in the walk, and then it dies in the cell too (the cell is one of the state's elements).
The table is the one the full walk gives.
"""
from __future__ import annotations

import torch

from .next_codes import ILLEGAL


def walked_edges(aut, edges: torch.Tensor, computed_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the edges [E', 3] of aut.edges the trie walk still takes, the delegates int64 [D, 2] (state, cell) whose
    edges it leaves out). A delegate is used only where its cell has a row of its own among the computed cells
    `computed_ids` (a far cell shares another's row: its moves are walked as before)."""
    dev = edges.device
    if aut.delegates is None or not len(aut.delegates) or not len(computed_ids):
        return edges, torch.zeros((0, 2), dtype=torch.int64, device=dev)
    delegates = torch.as_tensor(aut.delegates, device=dev)
    ids = torch.sort(computed_ids).values
    at = torch.searchsorted(ids, delegates[:, 1].contiguous()).clamp(max=len(ids) - 1)
    delegates = delegates[ids[at] == delegates[:, 1]]
    skip = torch.as_tensor(aut.from_cell, device=dev) & torch.isin(edges[:, 0], delegates[:, 0])
    return edges[~skip], delegates


def cell_moves(aut, delegates, value_ids, which, codes, exit_lists: dict, spread, ex_r, ex_c, row_of_explicit):
    """Sparse (row of the explicit state, class, next state) entries: each delegate's cell moves on the classes its
    walk left without a move. codes [M, Cv]: the block cells' rows (value_rows with segments) over value classes;
    spread [C]: each class's value class; ex_r, ex_c: the walked entries (rows in `explicit` order)."""
    dev = codes.device
    if not len(delegates):
        e = torch.zeros(0, dtype=torch.int64, device=dev)
        return e, e, e
    states, cells = delegates[:, 0], delegates[:, 1]
    order = torch.argsort(value_ids)
    at = order[torch.searchsorted(value_ids[order], cells.contiguous())]
    rows = codes.index_select(0, which.index_select(0, at)).long()                              # [D, Cv]
    # an absolute code indexes the exit list of the cell's block; a relative one is a move inside the value
    K = len(aut.blocks)
    bases = torch.as_tensor([b.base for b in aut.blocks], dtype=torch.int64, device=dev)
    by_base = torch.argsort(bases)
    block = by_base[torch.searchsorted(bases[by_base], cells.contiguous(), right=True) - 1]                   # [D]
    lists = [exit_lists[k].long() for k in range(K)]
    sizes = torch.as_tensor([len(x) for x in lists], dtype=torch.int64, device=dev)
    flat = torch.cat(lists)
    at = (torch.cumsum(sizes, 0) - sizes).index_select(0, block)[:, None] + rows.clamp(min=0)
    absolute = flat.index_select(0, at.clamp(max=len(flat) - 1).flatten()).view_as(rows)
    nxt = torch.where(rows >= 0, absolute, torch.where(rows <= -2, cells[:, None] - 2 - rows, ILLEGAL))
    nxt = nxt.index_select(1, spread)                                                           # [D, C]
    # the classes the walk gave a move from the state keep it
    r = row_of_explicit(states.contiguous())
    slot = torch.full((int(r.max()) + 1,), -1, dtype=torch.int64, device=dev)
    slot[r] = torch.arange(len(r), device=dev)
    near = ex_r[ex_r < len(slot)], ex_c[ex_r < len(slot)]
    mine = slot.index_select(0, near[0])
    walked = torch.zeros(nxt.shape, dtype=torch.bool, device=dev)
    walked[mine[mine >= 0], near[1][mine >= 0]] = True
    d, c = torch.nonzero((nxt >= 0) & ~walked, as_tuple=True)
    return r[d], c, nxt[d, c]
