"""The table's distinct rows -> row_next written once, from its compact parts.

Before it is written the table is two kinds of rows (table/build.py):
    sparse   explicit states and `done`: a few legal entries each, (row, class, code) triples
    dense    block cells: codes [Rd, Cd] over the value classes, column c of the table being
             column spread[c] (spread [C]: many token classes behave alike inside values)
Written out plainly that is [rows, C] int32 (tens of MB for a large union of tool sets), and
every pass over it (grouping equal rows, merging equal columns, counting legal ids, narrowing to
int16) costs as much as writing it. So all of that is done on the parts:
  * equal rows: sparse rows are grouped on their entries (classes.sparse_classes); a sparse row
    may still equal a dense row, which one linear hash over both forms finds (checked exactly);
  * equal columns: columns are equal in the table iff equal in the dense part (column classes
    of the compact codes, spread) and in the sparse part (columns grouped on their entries);
  * legal counts: class sizes summed over a sparse row's entries, and a product over the compact
    codes with the class sizes gathered per value class;
and the table is written once, in its final row and column order and integer width.
Only the grouping matters to the result: rows and columns are numbered by first use afterwards,
so the table is the one a dense build gives, entry for entry.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from .classes import (
    argsort_distinct,
    classes_of,
    column_classes,
    first_of_each,
    pair_key,
    sparse_classes,
    unique_inverse,
)
from .packed import Packed, pack, want_packed

_WEIGHT_BITS = 20


@dataclass
class RowParts:
    """The rows of a table before it is written. Rows are numbered sparse first ([0, n_sparse)), then dense."""
    n_sparse: int
    row: torch.Tensor        # int64 [P] the sparse row of each entry (each (row, col) at most once)
    col: torch.Tensor        # int64 [P] its column (token class)
    code: torch.Tensor       # int64 [P] its next-state code (table/next_codes.py), never -1
    dense: torch.Tensor      # int32 [Rd, Cd] codes of the dense rows, over their own columns
    spread: torch.Tensor     # int64 [C]: column c of the table is column spread[c] of `dense` (each is some c's)
    num_classes: int         # C

    def __post_init__(self):
        self._grouped = None
        self._codes_range = None

    @property
    def num_rows(self) -> int:
        return self.n_sparse + self.dense.shape[0]

    # ------------------------------------------------------------------------------------------------------
    # equal rows

    def row_classes(self) -> torch.Tensor:
        """int64 [num_rows]: a class id per row, equal ids for equal rows (of the table as it would be written)."""
        dev = self.dense.device
        sid = sparse_classes(self.row, self.col, self.code, self.n_sparse) if self.n_sparse else \
            torch.zeros(0, dtype=torch.int64, device=dev)
        srep = first_of_each(sid) if self.n_sparse else sid                            # [Su] a row per class
        Su = len(srep)
        is_rep = torch.zeros(self.n_sparse, dtype=torch.bool, device=dev)
        is_rep[srep] = True
        keep = is_rep.index_select(0, self.row)                                         # entries of those rows
        # candidates: the Su sparse classes (item k: row srep[k]) and the Rd dense rows (item Su + j)
        e_item, e_col, e_code = sid.index_select(0, self.row[keep]), self.col[keep], self.code[keep]
        cls = self._cross_classes(Su, e_item, e_col, e_code)                            # [Su + Rd]
        self._grouped = (sid, Su, e_item, e_col, e_code, cls)
        return torch.cat([cls.index_select(0, sid), cls[Su:]])

    def _cross_classes(self, Su, e_item, e_col, e_code) -> torch.Tensor:
        """Class ids of the Su sparse candidates and the dense rows together: a linear hash of each row as
        the table would hold it (the same sum for either form), grouped, then every shared class checked."""
        dev = self.dense.device
        Rd, C = self.dense.shape[0], self.num_classes
        n = Su + Rd
        if n == 0:
            return torch.zeros(0, dtype=torch.int64, device=dev)
        gen = torch.Generator().manual_seed(C)
        w = torch.randint(1, 1 << _WEIGHT_BITS, (C, 2), generator=gen).to(dev)            # [C, 2]
        wd = torch.zeros((self.dense.shape[1], 2), dtype=torch.int64, device=dev)
        wd.index_add_(0, self.spread, w)                                               # [Cd, 2] per dense column
        big = max([max(-int(x.min()), int(x.max())) for x in (e_code, self.dense) if x.numel()] + [0]) + 2
        bound = big * (1 << _WEIGHT_BITS) * max(C, 1)
        h = torch.zeros((n, 2), dtype=torch.int64, device=dev)
        # an illegal entry (-1) adds 0: a sparse row's missing entries and a dense row's -1 agree
        h[:Su].index_add_(0, e_item, w.index_select(0, e_col) * (e_code + 1)[:, None])
        if Rd:
            h[Su:] = _dense_dot(self.dense, wd, exact=bound < (1 << 52))
        cls = unique_inverse(pair_key(h[:, 0], h[:, 1], bound))
        rep = first_of_each(cls)
        shared = torch.nonzero(torch.bincount(cls, minlength=len(rep))[cls] > 1).flatten()
        if len(shared):
            first = rep.index_select(0, cls.index_select(0, shared))
            if not torch.equal(self._dense_of(shared, Su, e_item, e_col, e_code),
                               self._dense_of(first, Su, e_item, e_col, e_code)):
                # a hash collision: group the candidates exactly, written out (rare)
                everything = torch.arange(n, device=dev)
                cls, _ = classes_of(self._dense_of(everything, Su, e_item, e_col, e_code))
        return cls

    def _dense_of(self, items, Su, e_item, e_col, e_code) -> torch.Tensor:
        """int64 [len(items), C]: candidate rows written out (only ever a few, but for a collision)."""
        dev = self.dense.device
        items, again = torch.unique(items, return_inverse=True)            # an item may be asked for twice
        out = torch.full((len(items), self.num_classes), -1, dtype=torch.int64, device=dev)
        at = torch.full((Su + self.dense.shape[0],), -1, dtype=torch.int64, device=dev)
        at[items] = torch.arange(len(items), device=dev)
        pos = at.index_select(0, e_item)
        sel = pos >= 0
        out[pos[sel], e_col[sel]] = e_code[sel]
        d = items >= Su
        if bool(d.any()):
            out[d] = self.dense.index_select(0, items[d] - Su).long().index_select(1, self.spread)
        return out.index_select(0, again)

    # ------------------------------------------------------------------------------------------------------
    # the table

    def width(self, R: int) -> torch.dtype:
        """The table's integer width with R rows: int16 where every code and row index fits, else int32."""
        if self._codes_range is None:                  # asked for by the caller and by write: read the codes once
            codes = [x for x in (self.code, self.dense) if x.numel()]
            self._codes_range = (min([-1] + [int(x.min()) for x in codes]), max([-1] + [int(x.max()) for x in codes]))
        lo, hi = self._codes_range
        return torch.int16 if -32768 <= lo and hi <= 32767 and R <= 32767 else torch.int32

    def write(self, row_order: torch.Tensor, token_class: torch.Tensor, packing: bool | None = None, *,
              first_token: torch.Tensor | None = None, class_size: torch.Tensor | None = None):
        """The table with row r = the rows of class row_order[r] (row_classes' ids), columns merged where equal
        and numbered by first use over the tokens. Returns (token_class [V], row_next, row_legal int32 [R]):
        row_next is [R, K] int16 where every code and row index fits, else int32, or, where table/packed.py's
        `want_packed(packing, ...)` says so, a Packed table written from the legal entries alone (the dense
        [R, K] is never made). first_token [C] (each class's first token) and class_size [C] (its tokens) are
        computed when not given (the builder has them)."""
        if self._grouped is None:
            raise RuntimeError("RowParts.write: call row_classes first (the rows are written by their classes)")
        sid, Su, e_item, e_col, e_code, cls = self._grouped
        dev = self.dense.device
        C, Rd = self.num_classes, self.dense.shape[0]
        R = len(row_order)
        rep_of_class = first_of_each(cls)                                   # candidate item of each row class
        src = rep_of_class.index_select(0, row_order)                       # [R] the candidate written as row r
        pos = torch.full((Su + Rd,), -1, dtype=torch.int64, device=dev)
        pos[src] = torch.arange(R, device=dev)

        # columns: equal in the dense part (compact classes, spread) and in the sparse part (on their entries)
        dkey = column_classes(self.dense)[0].index_select(0, self.spread) if Rd else \
            torch.zeros(C, dtype=torch.int64, device=dev)
        skey = sparse_classes(e_col, e_item, e_code, C)
        merged = unique_inverse(dkey * (int(skey.max()) + 1) + skey)                        # [C]
        # final columns numbered by first use over the tokens: a merged column's first token is the least first
        # token of its classes (worked out on the C classes, not the V tokens)
        if first_token is None:
            first_token = first_of_each(token_class)
        K = int(merged.max()) + 1
        first_use = torch.full((K,), len(token_class), dtype=torch.int64, device=dev)
        first_use.scatter_reduce_(0, merged, first_token, reduce="amin")                    # [K] distinct
        new_of_merged = torch.empty(K, dtype=torch.int64, device=dev)
        new_of_merged[argsort_distinct(first_use)] = torch.arange(K, device=dev)
        final_col = new_of_merged.index_select(0, merged)                                    # [C] -> [K]
        out_class = final_col.index_select(0, token_class)                                  # [V]
        col_src = torch.empty(K, dtype=torch.int64, device=dev)
        col_src[final_col] = torch.arange(C, device=dev)                    # a class of each final column

        dtype = self.width(R)
        at = _Placed.of(self, pos, final_col, col_src)
        # packed where the shape asks for it and its legal entries (counted on the parts) are few enough: a table
        # that would not gain is written dense straight away, its entries never listed
        if want_packed(packing, R, K, dtype) and want_packed(packing, R, K, dtype, legal=self._entries(at)):
            table = self._packed(at, final_col, R, K, dtype)
        else:
            if dev.type == "cpu":            # numpy's fill is ~5x torch's for int16
                table = torch.from_numpy(np.full((R, K), -1, dtype=np.int16 if dtype == torch.int16 else np.int32))
            else:
                table = torch.full((R, K), -1, dtype=dtype, device=dev)
            self._fill(table, at, final_col, dtype)

        # legal ids per row: the sizes of the token classes a row admits, summed on the parts (merged columns
        # are equal in every row, so counting the classes is counting the final columns)
        size = torch.bincount(token_class, minlength=C) if class_size is None else class_size   # [C] tokens
        legal = torch.zeros(Su + Rd, dtype=torch.int64, device=dev)
        legal[:Su].index_add_(0, e_item, size.index_select(0, e_col))
        if Rd:
            dsize = torch.zeros(self.dense.shape[1], dtype=torch.int64, device=dev)
            dsize.index_add_(0, self.spread, size)                          # [Cd] tokens per dense column
            legal[Su:] = _count_legal(self.dense, dsize, len(token_class))
        return out_class, table, legal.index_select(0, src).to(torch.int32)

    def _fill(self, table, at: _Placed, final_col, dtype) -> None:
        """Write the rows into the dense table [R, K] (filled with -1)."""
        _, _, _, e_col, e_code, _ = self._grouped
        sel = at.entry_row >= 0
        table[at.entry_row[sel], final_col.index_select(0, e_col[sel])] = e_code[sel].to(dtype)
        if len(at.written):
            rows = self.dense.index_select(0, at.written).to(dtype)
            if table.device.type == "cpu":   # numpy's row scatter is ~10x torch's index_copy_ on int16 here
                table.numpy()[at.written_row.numpy()] = np.take(rows.numpy(), at.d_cols.numpy(), axis=1)
            else:
                table.index_copy_(0, at.written_row, rows.index_select(1, at.d_cols))

    def _entries(self, at: _Placed) -> int:
        """The legal entries of the table as written (those `_packed` lists): a sparse row's entries on the first
        class of each final column, and per written dense row its legal compact columns, each as many times as
        final columns read it (a product, no list)."""
        n = int(at.listed.sum())
        if len(at.written):
            n += int(_count_legal(self.dense.index_select(0, at.written), at.d_count, self.num_classes).sum())
        return n

    def _packed(self, at: _Placed, final_col, R, K, dtype) -> Packed:
        """The table's legal entries as (row, column, code) triples, packed (table/packed.py)."""
        _, _, _, e_col, e_code, _ = self._grouped
        dev = self.dense.device
        sel = at.listed
        rows, cols, codes = [at.entry_row[sel]], [final_col.index_select(0, e_col[sel])], [e_code[sel]]
        if len(at.written):
            # the legal entries of the compact rows [n, Cd], each spread over the final columns reading it
            i, dc = torch.nonzero(self.dense.index_select(0, at.written) != -1, as_tuple=True)
            by_dc = torch.argsort(at.d_cols, stable=True)                   # final columns grouped by dense column
            first = torch.cumsum(at.d_count, 0) - at.d_count
            reps = at.d_count.index_select(0, dc)
            offset = torch.arange(int(reps.sum()), device=dev) - torch.repeat_interleave(torch.cumsum(reps, 0) - reps,
                                                                                         reps)
            rows.append(torch.repeat_interleave(at.written_row.index_select(0, i), reps))
            cols.append(by_dc.index_select(0, torch.repeat_interleave(first.index_select(0, dc), reps) + offset))
            codes.append(torch.repeat_interleave(self.dense.index_select(0, at.written)[i, dc].long(), reps))
        row, col, code = torch.cat(rows), torch.cat(cols), torch.cat(codes)
        return pack(row, col, code, R, K, dtype)


class _Placed(NamedTuple):
    """Where the parts land in the written table (RowParts.write; read by _fill, _entries and _packed)."""
    entry_row: torch.Tensor    # int64 [P]: the table row of each sparse entry's row, -1 where none is written
    listed: torch.Tensor       # bool [P]: written, and on the first class of its final column (it stands for all)
    written: torch.Tensor      # int64 [n]: the dense rows some table row is
    written_row: torch.Tensor  # int64 [n]: that table row
    d_cols: torch.Tensor       # int64 [K]: the dense column each final column reads
    d_count: torch.Tensor      # int64 [Cd]: how many final columns read each dense column

    @classmethod
    def of(cls, parts: RowParts, pos, final_col, col_src) -> _Placed:
        """pos: int64 [Su + Rd] the table row of each candidate (sparse classes, then dense rows), -1 if none."""
        _, Su, e_item, e_col, _, _ = parts._grouped
        entry_row = pos.index_select(0, e_item)
        listed = (entry_row >= 0) & (col_src.index_select(0, final_col.index_select(0, e_col)) == e_col)
        written = torch.nonzero(pos[Su:] >= 0).flatten()
        d_cols = parts.spread.index_select(0, col_src)
        return cls(entry_row, listed, written, pos[Su:].index_select(0, written), d_cols,
                   torch.bincount(d_cols, minlength=parts.dense.shape[1]))


def _dense_dot(m: torch.Tensor, w: torch.Tensor, exact: bool) -> torch.Tensor:
    """int64 [R, 2]: (m + 1) @ w, exactly: in float64 when every partial sum is an integer below 2^52 (`exact`),
    else in int64 (wrapping: it is only a hash), a block of rows at a time."""
    R, K = m.shape
    out = torch.empty((R, w.shape[1]), dtype=torch.int64, device=m.device)
    step = max(1, _CHUNK // max(K, 1))
    wf = w.double()
    for a in range(0, R, step):
        x = m[a:a + step].long() + 1
        if exact:
            out[a:a + step] = torch.mm(x.double(), wf).long()
        else:
            out[a:a + step] = torch.stack([(x * w[:, j]).sum(1) for j in range(w.shape[1])], 1)
    return out


def _count_legal(m: torch.Tensor, size: torch.Tensor, V: int) -> torch.Tensor:
    """int64 [R]: per row, the sum of `size` over its legal (!= -1) columns; through BLAS in blocks of rows
    (every partial sum is a count <= V: exact in float32 below 2^24)."""
    ft = torch.float32 if V < (1 << 24) else torch.float64
    R, K = m.shape
    out = torch.empty(R, dtype=torch.int64, device=m.device)
    step = max(1, _CHUNK // max(K, 1))
    sf = size.to(ft)
    for a in range(0, R, step):
        out[a:a + step] = ((m[a:a + step] != -1).to(ft) @ sf).long()
    return out


_CHUNK = 1 << 18                 # entries per block of rows in the products (a buffer that stays in cache)
