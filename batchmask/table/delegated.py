"""Explicit states that read some of their tokens from a block cell's row instead of walking them.

An explicit state that holds block positions beside other elements (a pattern's `(...)+` beside the string's
end, a hostname's letter-first and digit-first labels) moves on some first bytes exactly as one position's cell does
(automaton/tree.py `_moves_alone`: `Automaton.edge_cell`). A token starting with such a
byte goes exactly where it goes from the cell, and the cell's row is worked out anyway from the tokens'
signatures (table/blocks.py). So those edges are left out of the trie walk (table/tokensim.explicit_columns:
for wide byte sets that walk is most of the vocabulary, again at every copy of the value) and the state's row
takes the cell's moves for every class the walk left without a move. Exact: a class with a walked move holds
only tokens that start with a walked byte; a class without one either starts with a cell's byte (its move is
the cell's) or died in the walk, and then it dies in the cell too (the cell is one of the state's elements). Two
cells never both move on one class: a byte both take is walked. The table is the one the full walk gives.
"""
from __future__ import annotations

import torch

from .classes import search_sorted, unique_sorted
from .next_codes import ILLEGAL


def _index_in(ids: torch.Tensor, wanted: torch.Tensor) -> torch.Tensor:
    """int64, wanted's shape: the index of each wanted value in the distinct 1-D `ids`, -1 where it is absent."""
    order = torch.argsort(ids)
    at = search_sorted(ids.index_select(0, order), wanted.contiguous()).clamp(max=max(len(ids) - 1, 0))
    found = order.index_select(0, at)
    return torch.where(ids.index_select(0, found) == wanted, found, torch.full_like(found, -1))


def split_edges(aut, edges: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the edges [E1, 3] of aut.edges that are always walked, the edges [E2, 3] that a cell may take over, their
    cells int64 [E2]). The first part is known before any block row is worked out: table/build.py walks it first,
    so that a walk past its budget is refused before the value work."""
    if aut.edge_cell is None:
        return edges, edges[:0], torch.zeros(0, dtype=torch.int64, device=edges.device)
    cell = torch.as_tensor(aut.edge_cell, device=edges.device)
    alone = cell < 0
    return edges[alone], edges[~alone], cell[~alone]


def walked_edges(edges: torch.Tensor, cell: torch.Tensor, computed_ids: torch.Tensor) -> tuple[torch.Tensor,
                                                                                              torch.Tensor]:
    """(the edges [E', 3] of `edges` (each with a cell, split_edges) the trie walk still takes, the delegates
    int64 [D, 2] (state, cell): the pairs whose edges it leaves out). An edge is left out only where its cell has a
    row of its own among the computed cells `computed_ids` (a far cell shares another's row: its tokens are walked
    as before)."""
    dev = edges.device
    none = torch.zeros((0, 2), dtype=torch.int64, device=dev)
    if not len(cell) or not len(computed_ids):
        return edges, none
    read = _index_in(computed_ids, cell) >= 0
    if not bool(read.any()):
        return edges, none
    # the distinct (state, cell) pairs, ascending: one int64 key each (torch.unique(dim=0) sorts rows, ~50x slower)
    width = int(cell.max()) + 1
    key = unique_sorted(edges[read, 0] * width + cell[read])
    delegates = torch.stack([key // width, key % width], 1)
    return edges[~read], delegates


def cell_moves(aut, delegates, value_ids, which, codes, exit_lists: dict, spread, ex_r, ex_c, row_of_explicit):
    """Sparse (row of the explicit state, class, next state) entries: each delegate's cell moves on the classes its
    walk left without a move. codes [M, Cv]: the block cells' rows (value_rows with segments) over value classes;
    spread [C]: each class's value class; ex_r, ex_c: the walked entries (rows in `explicit` order)."""
    dev = codes.device
    if not len(delegates):
        e = torch.zeros(0, dtype=torch.int64, device=dev)
        return e, e, e
    states, cells = delegates[:, 0], delegates[:, 1]
    rows = codes.index_select(0, which.index_select(0, _index_in(value_ids, cells))).long()     # [D, Cv]
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
    # the classes the walk gave a move from the state keep it (a state may have several cells: one per position)
    r = row_of_explicit(states.contiguous())
    rows_u, u_of = torch.unique(r, return_inverse=True)
    slot = torch.full((int(rows_u.max()) + 1,), -1, dtype=torch.int64, device=dev)
    slot[rows_u] = torch.arange(len(rows_u), device=dev)
    near = ex_r < len(slot)
    mine, cls = slot.index_select(0, ex_r[near]), ex_c[near]
    walked = torch.zeros((len(rows_u), nxt.shape[1]), dtype=torch.bool, device=dev)
    walked[mine[mine >= 0], cls[mine >= 0]] = True
    d, c = torch.nonzero((nxt >= 0) & ~walked.index_select(0, u_of), as_tuple=True)
    return r[d], c, nxt[d, c]
