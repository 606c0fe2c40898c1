"""Packed rows: row_next stored by row displacement (the comb of yacc's tables), and the one place the layout rule
is written. Every reader of row_next (the kernels, Tables, CompiledGrammar, combine, forced runs, the cache
file) reads codes through `codes_at` (pointwise) or `row_codes` (whole rows), or their numpy twins.

    dense    row_next [R, C]:                      code(r, c) = row_next[r, c]
    packed   row_next [N], row_base int32 [R], row_check int16 [N]:
             code(r, c) = row_next[row_base[r] + c]   if row_check[row_base[r] + c] == c   else -1 (illegal)

Every row has its own base (no two rows share one), so a column check is enough: a slot owned by row r' holds
check c' = slot - base[r'], and it answers a query (r, c) with base[r] + c = slot only if c' = c, that is only if
base[r'] = base[r], r' = r. Slots nobody owns hold check -1. row_next and row_check are padded so that
row_base[r] + c is inside them for every row and every c < C: the kernels read without a bounds branch.
Codes keep the table's width (int16 where every code and row index fits, else int32); the check is int16, so
a packed table has C < 32768 classes (a wider one stays dense).

Why: on large JSON Schemas the dense table is 0.3-1% legal (JSONSchemaBench jreleaser on Llama 2: 47K rows x
2172 classes, 408 MB, 266K legal entries); packed it is those entries and a little slack.

When (`want_packed`): a table stays dense below PACK_MIN_BYTES (the gather is all there is, and every table the
tests and the mask benchmarks build stays bit-identical), and where it is not sparse enough to gain PACK_MIN_GAIN x,
or 2x where the dense table passes PACK_LARGE_BYTES (32 MB: JSONSchemaBench's o62899 on Llama 3 is 43 MB dense, 12%
legal, 14 MB packed); otherwise it is packed. `pack=True/False` forces either (tests run the packed path on small
grammars).

Placement (`place_rows`), vectorised and deterministic (a fixed seed):
  * rows with more than SMALL_ROW entries go on top of everything placed, one block per distinct column set: a
    large schema's big rows share few sets (JSONSchemaBench o62820 on Llama 3: 1,946 rows, 70 sets), and the k
    rows of a set S sit at bases b, b + d, ..., b + (k-1)d, where d is the least shift with S and S + m.d disjoint
    for every m < k (S's autocorrelation, by FFT). No search: the first-fit this replaced tried windows of
    candidate bases per row and took 1-2 s on those tables, for the same density;
  * the rest, where the compiled helpers are built (table/native.py), by first fit in C, largest first: each row at
    the lowest base whose slots are free and that no row holds, among FIRST_FIT_TRIES candidates from the lowest
    free slot up, else the lowest from its span below the top (JSONSchemaBench's 0.2-1 s band on Llama 3: 2.0 slots
    a legal entry, the random rounds 4; 3-5x faster); otherwise
  * the rest in tiers of decreasing size, in random rounds: each unplaced row anchors its first entry on a
    random free slot (so they fill the blocks' holes first); a row is placed when its slots are free and claimed
    by no other row this round, and its base is taken by no other row (bincounts); when a round places too few
    rows the array grows;
  * rows without entries take the lowest bases no row holds.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from .native import helpers
from .next_codes import ILLEGAL

PACK_MIN_BYTES = 4 << 20     # dense tables below 4 MB stay dense: the gather is all there is, and it is small
PACK_MIN_GAIN = 4            # pack only where the packed table is at most a quarter of the dense one
PACK_LARGE_BYTES = 32 << 20  # a dense table above 32 MB (issue 29's device-memory bound) is packed where that
PACK_LARGE_GAIN = 2          # at least halves it: memory first, where a table is that large
MAX_CLASSES = 32767          # the check is int16 (and holds -1 for a free slot)
SMALL_ROW = 48               # rows with at most this many entries are placed in random rounds, the others in blocks
_TIERS = ((25, 48), (13, 24), (7, 12), (4, 6), (3, 3), (2, 2), (1, 1))   # the random rounds' row sizes
CANDIDATES = 16              # bases a row tries in one random round
_STALL = 0.25                # a round that places fewer than this share of its rows grows the array
_SEED = 29
FIRST_FIT_TRIES = 32         # bases a row tries by first fit (the compiled path) before it looks near the top


class Packed(NamedTuple):
    """A packed row_next (the module docstring): codes [N] in the table's width, base int32 [R], check int16 [N]."""
    codes: torch.Tensor
    base: torch.Tensor
    check: torch.Tensor


# ----------------------------------------------------------------------------------------------------------
# the rule: reading codes

def codes_at(t, rows: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
    """The codes (row_next's dtype) at (rows, classes): int64 tensors of one shape. `t` has row_next, row_base
    (None: dense), row_check and num_classes (a Tables or a CompiledGrammar)."""
    if t.row_base is None:
        flat = rows.reshape(-1) * t.num_classes + classes.reshape(-1)
        return t.row_next.view(-1).index_select(0, flat).view(rows.shape)
    at = t.row_base.index_select(0, rows.reshape(-1)).long() + classes.reshape(-1)
    code = t.row_next.index_select(0, at)
    owned = t.row_check.index_select(0, at) == classes.reshape(-1)
    return code.masked_fill(~owned, ILLEGAL).view(rows.shape)


def row_codes(t, rows: torch.Tensor) -> torch.Tensor:
    """[n, C] codes (row_next's dtype): the rows `rows` (int64 [n]) written out."""
    if t.row_base is None:
        return t.row_next.index_select(0, rows)
    cols = torch.arange(t.num_classes, device=rows.device)
    at = t.row_base.index_select(0, rows).long()[:, None] + cols                       # [n, C]
    code = t.row_next.index_select(0, at.view(-1)).view(at.shape)
    owned = t.row_check.index_select(0, at.view(-1)).view(at.shape) == cols
    return code.masked_fill(~owned, ILLEGAL)


def codes_at_np(row_next: np.ndarray, row_base: np.ndarray | None, row_check: np.ndarray | None,
                rows: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """codes_at on numpy arrays (the CPU fast paths work on numpy views)."""
    if row_base is None:
        return row_next[rows, classes]
    at = row_base[rows].astype(np.int64) + classes
    return np.where(row_check[at] == classes, row_next[at], ILLEGAL).astype(row_next.dtype, copy=False)


def row_codes_np(row_next: np.ndarray, row_base: np.ndarray | None, row_check: np.ndarray | None,
                 rows: np.ndarray, num_classes: int) -> np.ndarray:
    """row_codes on numpy arrays: [n, C]."""
    if row_base is None:
        return row_next[rows]
    cols = np.arange(num_classes)
    at = row_base[rows].astype(np.int64)[:, None] + cols                               # [n, C]
    return np.where(row_check[at] == cols, row_next[at], ILLEGAL).astype(row_next.dtype, copy=False)


def owned_slots(row_base: torch.Tensor, row_check: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The legal entries of a packed table: (slot, row, col), int64 [P] each, in slot order. A slot whose
    check names no row's base (never written by pack) is left out."""
    slot = torch.nonzero(row_check >= 0).flatten()
    col = row_check.index_select(0, slot).long()
    owner_base = slot - col
    order = torch.argsort(row_base.long())
    sorted_base = row_base.long().index_select(0, order)
    k = torch.searchsorted(sorted_base, owner_base).clamp(max=max(row_base.numel() - 1, 0))
    if not row_base.numel():
        return slot[:0], slot[:0], col[:0]
    real = sorted_base.index_select(0, k) == owner_base
    return slot[real], order.index_select(0, k[real]), col[real]


# ----------------------------------------------------------------------------------------------------------
# when to pack

def dense_bytes(num_rows: int, num_classes: int, dtype: torch.dtype) -> int:
    return num_rows * num_classes * torch.empty(0, dtype=dtype).element_size()


def want_packed(pack: bool | None, num_rows: int, num_classes: int, dtype: torch.dtype,
                legal: int | None = None) -> bool:
    """Whether a table of that shape is stored packed: `pack` True/False forces it (True refuses C >= 32768);
    None (auto): at least PACK_MIN_BYTES dense and, where `legal` (entries) is known, sparse enough that the
    packed form is at most 1/PACK_MIN_GAIN of the dense one (1/PACK_LARGE_GAIN above PACK_LARGE_BYTES dense)."""
    if pack is not None:
        if pack and num_classes > MAX_CLASSES:
            raise ValueError(f"pack=True: a table of {num_classes} token classes cannot be packed (the check is "
                             f"int16: at most {MAX_CLASSES} classes)")
        return bool(pack)
    dense = dense_bytes(num_rows, num_classes, dtype)
    if num_classes > MAX_CLASSES or dense < PACK_MIN_BYTES:
        return False
    if legal is None:
        return True
    width = torch.empty(0, dtype=dtype).element_size()
    gain = PACK_LARGE_GAIN if dense > PACK_LARGE_BYTES else PACK_MIN_GAIN
    return packed_bound(legal, num_rows, num_classes) * (width + 2) + 4 * num_rows <= dense / gain


def packed_bound(legal: int, num_rows: int, num_classes: int) -> int:
    """The slots place_rows is built to stay within: 1.5 x the legal entries (or one base per row, when there are
    more rows than entries) plus 2C of padding. tests/test_packed.py checks it on random sparse tables."""
    return int(1.5 * max(legal, num_rows)) + 2 * num_classes


# ----------------------------------------------------------------------------------------------------------
# writing a packed table

def pack(row: torch.Tensor, col: torch.Tensor, code: torch.Tensor, num_rows: int, num_classes: int,
         dtype: torch.dtype) -> Packed:
    """The packed table of the legal entries (row, col, code) (int64 [P] each, each (row, col) at most once,
    codes never -1) of a table with num_rows rows and num_classes columns, codes in `dtype`."""
    if num_classes > MAX_CLASSES:
        raise ValueError(f"a table of {num_classes} token classes cannot be packed (at most {MAX_CLASSES})")
    dev = row.device
    r, c = row.cpu().numpy().astype(np.int64), col.cpu().numpy().astype(np.int64)
    base = place_rows(r, c, num_rows, num_classes)                                     # [R]
    N = int(base.max()) + num_classes if num_rows else num_classes
    at = base[r] + c
    codes = np.full(N, ILLEGAL, dtype=np.int16 if dtype == torch.int16 else np.int32)   # [N]
    check = np.full(N, ILLEGAL, dtype=np.int16)                                         # [N]
    codes[at] = code.cpu().numpy()
    check[at] = c
    return Packed(torch.from_numpy(codes).to(dev), torch.from_numpy(base.astype(np.int32)).to(dev),
                  torch.from_numpy(check).to(dev))


def pack_dense(table: torch.Tensor) -> Packed:
    """A dense [R, C] table packed (combine's joint table, tests)."""
    R, C = table.shape
    r, c = torch.nonzero(table != ILLEGAL, as_tuple=True)
    return pack(r, c, table[r, c].long(), R, C, table.dtype)


def place_rows(row: np.ndarray, col: np.ndarray, num_rows: int, num_classes: int, seed: int = _SEED) -> np.ndarray:
    """int64 [R]: a distinct base per row such that no two rows' entries (row, col) (int64 [P] each, each pair at
    most once) land on one slot base[row] + col; bases >= 0. See the module docstring for how."""
    R, C = num_rows, num_classes
    n = np.bincount(row, minlength=R)                                                  # [R] entries per row
    order = np.argsort(row * max(C, 1) + col)             # keys distinct (each (row, col) once): one sort, not two
    col = col[order]                                                                   # grouped by row, ascending
    start = np.cumsum(n) - n                                                           # [R]
    space = _Space(int(1.25 * len(row)) + 2 * C)
    base = np.full(R, -1, dtype=np.int64)
    large = np.flatnonzero(n > SMALL_ROW)
    sets = column_sets(col, start, n, large)                      # [k] set id per large row, by first row
    groups = np.split(large[np.argsort(sets, kind="stable")], np.cumsum(np.bincount(sets))[:-1]) if large.size else []
    for rows in sorted(groups, key=lambda g: -n[g[0]]):                                # largest sets first (stable)
        cols = col[start[rows[0]]:start[rows[0]] + n[rows[0]]]
        b = max(space.top - int(cols[0]), space.top_base + 1)                           # past every slot and base
        bases = b + block_shift(cols, rows.size, C) * np.arange(rows.size)             # [k]
        space.grow(int(bases[-1]) + C + 1)
        space.take(bases, (bases[:, None] + cols[None, :]).reshape(-1))
        base[rows] = bases
    if helpers is not None:          # the rest by first fit, largest first (table/native_c/), empty rows last
        rest = np.flatnonzero(n <= SMALL_ROW)
        order = rest[np.argsort(-n[rest], kind="stable")]
        helpers.first_fit(space.occupied, space.used, order, start, n, col, base, FIRST_FIT_TRIES)
        return base
    rng = np.random.default_rng(seed)
    for lo, hi in _TIERS:
        rows = np.flatnonzero((n >= lo) & (n <= hi))
        if rows.size:
            base[rows] = space.random_rounds(rows, n, start, col, C, rng)
    empty = np.flatnonzero(n == 0)
    if empty.size:
        base[empty] = space.free_bases(empty.size)
    return base


def column_sets(col: np.ndarray, start: np.ndarray, n: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """int64 [k]: an id per row of `rows` (int64 [k]), equal exactly where the rows' column sets are equal, numbered
    by first row. `col` is grouped by row, ascending within it (row r's columns are col[start[r]:start[r] + n[r]]),
    so a set is its bytes: one dict lookup per row (a few thousand large rows, a few MB of columns in all)."""
    ids: dict[bytes, int] = {}
    return np.array([ids.setdefault(col[start[r]:start[r] + n[r]].tobytes(), len(ids)) for r in rows.tolist()],
                    dtype=np.int64)


def block_shift(cols: np.ndarray, k: int, C: int) -> int:
    """The least d >= 1 such that a set of columns S (`cols`, ascending, all < C) and S + m.d are disjoint for every
    m = 1..k-1: k rows of S then fit at bases b, b + d, ..., b + (k-1)d. 0 for a single row."""
    if k <= 1:
        return 0
    L = 1 << int(2 * C - 1).bit_length()
    ind = np.zeros(L, dtype=np.float64)
    ind[cols] = 1.0
    f = np.fft.rfft(ind)
    hit = np.rint(np.fft.irfft(f * np.conj(f), L)[:C]) > 0          # [C] hit[e]: S and S + e share a column
    span = int(cols[-1] - cols[0]) + 1                               # shifts of span or more never overlap
    d = np.arange(1, span)                                           # [span - 1] candidates below span
    per = np.minimum(k - 1, (span - 1) // d)                         # multiples m.d < span that can overlap
    first = np.cumsum(per) - per
    dd = np.repeat(d, per)
    shift = dd * (np.arange(int(per.sum())) - np.repeat(first, per) + 1)               # m.d, m = 1..per[d]
    bad = np.bincount(dd, weights=hit[shift], minlength=span)[1:] > 0                  # [span - 1]
    ok = np.flatnonzero(~bad)
    return int(d[ok[0]]) if ok.size else span


def _claimed_twice(x: np.ndarray) -> np.ndarray:
    """bool, x's shape: which entries of the 1-D `x` hold a value that occurs more than once in it."""
    order = np.argsort(x, kind="stable")
    s = x[order]
    dup = np.zeros(len(x) + 1, dtype=bool)
    dup[1:-1] = s[1:] == s[:-1]                                  # dup[i + 1]: s[i + 1] equals s[i]
    out = np.empty(len(x), dtype=bool)
    out[order] = dup[:-1] | dup[1:]                              # equal to its left or right neighbour
    return out


class _Space:
    """The slots while rows are placed: which are occupied (bool [L]) and which bases rows hold (bool [L])."""

    def __init__(self, size: int):
        self.occupied = np.zeros(size, dtype=bool)   # [L] slot owned by a placed row
        self.used = np.zeros(size, dtype=bool)       # [L] base held by a placed row (a base is <= its slots)
        self.top = 0                                 # every slot at or above it is free
        self.top_base = -1                           # the highest base held

    def grow(self, need: int) -> None:
        if need > self.occupied.size:
            size = max(need, self.occupied.size + self.occupied.size // 8)
            self.occupied = np.concatenate([self.occupied, np.zeros(size - self.occupied.size, dtype=bool)])
            self.used = np.concatenate([self.used, np.zeros(size - self.used.size, dtype=bool)])

    def take(self, bases: np.ndarray, slots: np.ndarray) -> None:
        self.used[bases] = True
        if bases.size:
            self.top_base = max(self.top_base, int(bases.max()))
        self.occupied[slots] = True
        if slots.size:
            self.top = max(self.top, int(slots.max()) + 1)

    def random_rounds(self, rows: np.ndarray, n: np.ndarray, start: np.ndarray, col: np.ndarray, C: int,
                      rng: np.random.Generator) -> np.ndarray:
        """int64 [k]: the bases of rows (int64 [k], each with entries) placed in random rounds."""
        out = np.full(rows.size, -1, dtype=np.int64)
        alive = np.arange(rows.size)                                                   # [a] into rows
        while alive.size:
            free = np.flatnonzero(~self.occupied)
            if not free.size:
                self.grow(self.occupied.size + C)
                continue
            L = self.occupied.size
            r = rows[alive]
            k = n[r]                                                                   # [a]
            e_row = np.repeat(np.arange(alive.size), k)                                # [E] entry -> alive row
            first = np.cumsum(k) - k
            e_col = col[np.repeat(start[r] - first, k) + np.arange(int(k.sum()))]      # [E]
            # CANDIDATES bases a row: its first entry on a random free slot; the lowest that fits is its choice
            b = free[rng.integers(0, free.size, size=(alive.size, CANDIDATES))] - col[start[r]][:, None]  # [a, M]
            slot = b[e_row] + e_col[:, None]                                           # [E, M]
            inside = slot < L
            s = np.where(inside, slot, 0)
            bc = np.clip(b, 0, L - 1)
            bad = (b < 0) | (b >= L) | self.used[bc]                                   # [a, M]
            bad_e = ~inside | self.occupied[s]                                         # [E, M]
            bad |= np.add.reduceat(bad_e, first, axis=0) > 0 if e_row.size else bad
            pick = np.argmin(np.where(bad, np.iinfo(np.int64).max, b), axis=1)         # [a] lowest fitting base
            fits = ~bad[np.arange(alive.size), pick]
            b, slot = b[np.arange(alive.size), pick], slot[np.arange(e_row.size), pick[e_row]]
            # rows that chose the same slot or the same base this round all wait for the next one (found by sorting
            # the claims, not by counting over all L slots: a round claims far fewer)
            e_fits = np.flatnonzero(fits[e_row])
            clash = np.zeros(alive.size, dtype=bool)
            clash[e_row[e_fits[_claimed_twice(slot[e_fits])]]] = True
            f_rows = np.flatnonzero(fits)
            clash[f_rows[_claimed_twice(b[f_rows])]] = True
            ok = fits & ~clash
            out[alive[ok]] = b[ok]
            self.take(b[ok], slot[ok[e_row]])
            if ok.sum() < _STALL * alive.size:
                self.grow(L + max(L // 8, C))
            alive = alive[~ok]
        return out

    def free_bases(self, count: int) -> np.ndarray:
        """The `count` lowest bases no row holds (rows without entries need only a base of their own)."""
        free = np.flatnonzero(~self.used)
        if free.size < count:
            self.grow(self.used.size + count)
            free = np.flatnonzero(~self.used)
        return free[:count]
