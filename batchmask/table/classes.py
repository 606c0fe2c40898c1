"""Grouping equal rows fast: token classes, shared table rows and equal columns all come from here.

On the CPU, where the compiled helpers are built (table/native.py), `refine`, `sparse_classes` and `first_of_each` run
in C (table/native_c/grouping.c: one exact pass each, ids by first use); what follows each such branch is the
numpy/torch reference, which gives the same partitions (tests/test_native.py)."""
from __future__ import annotations

import numpy as np
import torch

from .native import helpers

# On the CPU, numpy's sorts are several times torch's (32K int64: np.unique 0.4 ms, torch.unique 1.5 ms;
# searchsorted ~5x), and the compile calls them on every class and row grouping: these three take numpy's
# there and give exactly what the torch call would (unique values ascending; leftmost insertion points).


def unique_inverse(x: torch.Tensor) -> torch.Tensor:
    """int64, x's shape: the index of each entry of the 1-D `x` among its sorted distinct values
    (torch.unique(x, return_inverse=True)[1])."""
    if x.device.type != "cpu":
        return torch.unique(x, return_inverse=True)[1]
    return torch.from_numpy(np.unique(x.numpy(), return_inverse=True)[1].astype(np.int64, copy=False))


def unique_sorted(x: torch.Tensor) -> torch.Tensor:
    """The sorted distinct values of the 1-D `x` (torch.unique(x))."""
    if x.device.type != "cpu":
        return torch.unique(x)
    return torch.from_numpy(distinct(x.numpy()))


def distinct(a: np.ndarray) -> np.ndarray:
    """The sorted distinct values of the 1-D array `a` (np.unique(a)), by a sort and a mask. np.unique without an
    index or inverse takes numpy's hash path, which imports numpy.ma on its first call: 12-16 ms of a first compile
    (the compile never calls it for that reason)."""
    s = np.sort(a)
    keep = np.ones(len(s), dtype=bool)
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def search_sorted(a: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """int64: torch.searchsorted(a, v) (leftmost insertion points of v in the ascending 1-D `a`)."""
    if a.device.type != "cpu":
        return torch.searchsorted(a, v)
    return torch.from_numpy(np.searchsorted(a.numpy(), v.numpy()).astype(np.int64, copy=False))


def unique_bool_rows(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.unique(m, dim=0, return_inverse=True) for a bool [R, K] matrix (the distinct rows in lexicographic order,
    False first; each row's index among them), ~50x faster on the CPU: each row packed into bytes (first column the
    high bit, so byte order is row order) and the byte rows grouped by numpy."""
    if m.device.type != "cpu" or not m.numel():
        return torch.unique(m, dim=0, return_inverse=True)
    bits = np.packbits(m.numpy(), axis=1)                                        # [R, ceil(K / 8)] uint8
    if bits.shape[1] <= 8:           # a row fits one big-endian uint64 (ordered as its bytes): a 1-D unique
        word = np.zeros((len(bits), 8), dtype=np.uint8)
        word[:, :bits.shape[1]] = bits
        _, first, inverse = np.unique(word.view(">u8").reshape(-1), return_index=True, return_inverse=True)
    else:
        _, first, inverse = np.unique(bits, axis=0, return_index=True, return_inverse=True)
    return m[torch.from_numpy(first)], torch.from_numpy(inverse.reshape(-1).astype(np.int64))


def classes_of(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Group equal rows of an integer [V, K] tensor: (class id per row [V], first row of each class [C]).

    `torch.unique(dim=0)` sorts rows lexicographically and is slow (~0.1 s for 32000 rows
    here), so each row is first folded into two exact integer dot products with random
    weights (no overflow: the bound is checked) and grouped by a 1-D unique; then every row
    that shares its class is compared with its class's first row, and only if a collision
    shows up do we pay for the exact row sort. Only the grouping is promised: callers that
    need a canonical numbering renumber (in_first_use_order).
    """
    dev = keys.device
    V, K = keys.shape
    if V == 0:
        return torch.zeros(0, dtype=torch.int64, device=dev), torch.zeros(0, dtype=torch.int64, device=dev)
    if K == 0:
        return torch.zeros(V, dtype=torch.int64, device=dev), torch.zeros(1, dtype=torch.int64, device=dev)
    lo, hi = (int(x) for x in torch.aminmax(keys))
    bound = (max(-lo, hi) + 1) * (1 << 20) * K           # > |every partial dot product|
    gen = torch.Generator().manual_seed(K)
    weights = torch.randint(1, 1 << 20, (K, 2), generator=gen).to(dev)
    if K == 1:
        inverse = unique_inverse(keys[:, 0].contiguous())
    elif bound < (1 << 52):
        # exact dot products as a float64 matmul (every partial sum is an integer below 2^52 in
        # magnitude); no shifted copy of the keys: the sign does not matter to the grouping
        h = _rows_dot(keys, weights.double()).long()                                   # [V, 2]
        inverse = unique_inverse(pair_key(h[:, 0], h[:, 1], bound))
    elif bound < (1 << 62):
        # exact int64 dot products (CPU int64 matmul has no fast path: multiply and sum instead)
        wide = keys.long()
        h = torch.stack([(wide * weights[:, j]).sum(1) for j in range(2)], 1)           # [V, 2]
        inverse = unique_inverse(pair_key(h[:, 0], h[:, 1], bound))
    else:
        _, inverse = torch.unique(keys, dim=0, return_inverse=True)
    rep = first_of_each(inverse)
    if not _members_equal(keys, inverse, rep):                    # a hash collision: do it exactly
        _, inverse = torch.unique(keys, dim=0, return_inverse=True)
        rep = first_of_each(inverse)
    return inverse, rep


_CHUNK = 1 << 18                 # elements converted to float64 at a time (2 MB): a buffer that stays warm


def _rows_dot(keys: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """float64 keys @ weights, a block of rows at a time (not one float64 copy of the whole matrix)."""
    V, K = keys.shape
    out = torch.empty((V, weights.shape[1]), dtype=torch.float64, device=keys.device)
    step = max(1, _CHUNK // max(K, 1))
    for s in range(0, V, step):
        torch.mm(keys[s:s + step].double(), weights, out=out[s:s + step])
    return out


def pair_key(h0: torch.Tensor, h1: torch.Tensor, bound: int) -> torch.Tensor:
    """One int64 per pair of hashes (|h| < bound): exact while the first fits in 41 bits, else mixed."""
    if bound <= (1 << 41):
        return h0 * (1 << 21) + torch.remainder(h1, 1 << 21)
    return h0 ^ (h1 << 17)


def _members_equal(keys: torch.Tensor, inverse: torch.Tensor, rep: torch.Tensor, dim: int = 0) -> bool:
    """Every row (dim 0) or column (dim 1) of `keys` equals its class's first (on a device only the shared
    classes are read)."""
    if keys.device.type == "cpu":
        # on the host one gather of every row's first and one compare cost less than picking the shared rows
        # out first (a bincount, a nonzero and two gathers; most rows are shared: 32K tokens in ~100 classes)
        k, first = keys.numpy(), rep.numpy()[inverse.numpy()]
        return bool(np.array_equal(k, k[first] if dim == 0 else k[:, first]))
    shared = torch.nonzero(torch.bincount(inverse, minlength=len(rep))[inverse] > 1).flatten()
    if not len(shared):
        return True
    first = rep.index_select(0, inverse.index_select(0, shared))
    # index_select, not keys[:, idx]: a column gather by advanced indexing is ~2x slower on the CPU
    return torch.equal(keys.index_select(dim, shared), keys.index_select(dim, first))


def first_of_each(inverse: torch.Tensor) -> torch.Tensor:
    """int64 [C]: the first index of each class id in `inverse` [V]."""
    if helpers is not None and inverse.device.type == "cpu":
        return torch.from_numpy(np.frombuffer(helpers.first_of_each(_host(inverse)), dtype=np.int64))
    C = int(inverse.max()) + 1
    rep = torch.full((C,), len(inverse), dtype=torch.int64, device=inverse.device)
    return rep.scatter_reduce_(0, inverse, torch.arange(len(inverse), device=inverse.device), reduce="amin")


def in_first_use_order(inverse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Renumber class ids by first use: (new id per item [V], old id of each new class [C])."""
    order = argsort_distinct(first_of_each(inverse))            # old ids sorted by first use (distinct)
    new_of_old = torch.empty_like(order)
    new_of_old[order] = torch.arange(len(order), device=order.device)
    return new_of_old[inverse], order


_M1, _M2 = 0x3C6EF372FE94F82B, 0x1F83D9ABFB41BD6B      # odd 63-bit multipliers (products wrap in int64)


def _mix(x: torch.Tensor, m: int) -> torch.Tensor:
    x = x * m                       # a new tensor; the rest in place (these run on millions of entries)
    x ^= x >> 29
    x *= 0x5851F42D4C957F2D
    x ^= x >> 32
    return x


def sparse_classes(item: torch.Tensor, col: torch.Tensor, val: torch.Tensor, n_items: int) -> torch.Tensor:
    """Dense class ids [n_items] grouping items with equal sparse rows {col: val} (no entries: class 0).

    item/col/val int64 [P], each (item, col) at most once. Rows are hashed (the wrapping sum of one
    mixed word per entry, two 30-bit pieces of it, and the entry count), then every entry is looked up
    among its class's first item's entries, so the grouping is exact; only after a hash collision is it
    redone densely.
    """
    dev = item.device
    if len(item) == 0:
        return torch.zeros(n_items, dtype=torch.int64, device=dev)
    if helpers is not None and dev.type == "cpu":
        out = np.empty(n_items, dtype=np.int64)
        helpers.refine(None, _host(item), _host(col), _host(val), out)
        return torch.from_numpy(out)
    x = col * 0x9E3779B1
    x += val
    total = torch.zeros(n_items, dtype=torch.int64, device=dev).index_add_(0, item, _mix(x, _M1))   # wraps: fine
    mask = (1 << 30) - 1
    h = torch.stack([total & mask, (total >> 32) & mask, torch.bincount(item, minlength=n_items)], 1)
    ids, rep = classes_of(h)
    if not _same_entries_as_first(item, col, val, ids, rep):
        ncol = int(col.max()) + 1
        dense = torch.full((n_items, ncol), -(1 << 40), dtype=torch.int64, device=dev)
        dense[item, col] = val
        ids = torch.unique(dense, dim=0, return_inverse=True)[1]
    none = h[:, 2] == 0
    if bool(none.any()):          # make "no entries" class 0 and shift the others (ids stay dense)
        ids = ids + 1
        ids[none] = 0
        ids = unique_inverse(ids)
    return ids


# cells of the (class, column) lookup of _same_entries_as_first, at most, and per entry checked: filling a
# lookup much larger than the entries costs more than sorting them
_LOOKUP_CELLS, _LOOKUP_PER_ENTRY = 1 << 24, 4


def _same_entries_as_first(item, col, val, ids, rep) -> bool:
    """Whether every entry (item, col, val) is also an entry of the first item of its class (rep[ids[item]]).

    Items of a class have equal entry counts (hashed exactly) and each (item, col) is there once, so this
    is equality of the entry sets. The first items' entries go into a (class, column) lookup (columns renumbered
    to those in use when there are too many: a mark per column, not a sort), or sorted when still too large;
    every entry is then read there: O(P) gathers, not a sort of all P entries.
    """
    dev = item.device
    C = len(rep)
    cls = ids.index_select(0, item)                                            # [P] class of each entry's item
    first = rep.index_select(0, cls) == item                                   # [P] an entry of its class's first
    limit = min(_LOOKUP_CELLS, _LOOKUP_PER_ENTRY * len(item) + 4096)
    ncol = int(col.max()) + 1
    if C * ncol > limit:                  # number the columns in use densely (a mark per column)
        used = torch.zeros(ncol, dtype=torch.int64, device=dev)
        used[col] = 1
        ncol = int(used.sum())
        col = (torch.cumsum(used, 0) - 1).index_select(0, col)
    key = cls * ncol
    key += col
    fkey, fval = key[first], val[first]
    rest = ~first                                    # only these need a look: a first item's entries are its own
    key, val = key[rest], val[rest]
    if not len(key) or not len(fkey):
        return not len(key)
    if C * ncol <= limit:
        none = torch.iinfo(torch.int64).min
        table = torch.full((C * ncol,), none, dtype=torch.int64, device=dev)
        table[fkey] = fval
        return torch.equal(table.index_select(0, key), val)
    order = argsort_distinct(fkey)
    fkey, fval = fkey[order], fval[order]
    at = search_sorted(fkey, key).clamp_(max=len(fkey) - 1)
    return torch.equal(fkey.index_select(0, at), key) and torch.equal(fval.index_select(0, at), val)


def _host(x: torch.Tensor) -> np.ndarray:
    """A CPU tensor as the C-contiguous int64 array the compiled helpers read (a view where it already is one)."""
    return np.ascontiguousarray(x.numpy(), dtype=np.int64)


def argsort_distinct(x: torch.Tensor) -> torch.Tensor:
    """The permutation that sorts the 1-D `x` of distinct values (so any sort gives it: numpy's on the CPU)."""
    if x.device.type != "cpu":
        return torch.argsort(x)
    return torch.from_numpy(np.argsort(x.numpy()).astype(np.int64, copy=False))


def refine(base: torch.Tensor, item: torch.Tensor, col: torch.Tensor, val: torch.Tensor) -> torch.Tensor:
    """Split the classes `base` [V] (dense ids) by sparse rows {col: val} per item (each (item, col) once).

    Items with equal base class and equal sparse rows keep one class; items without entries keep
    their base class. Items are ids into `base` [V]. Returns dense class ids [V].
    """
    dev = base.device
    if len(item) == 0:
        return base
    if helpers is not None and dev.type == "cpu":
        out = np.empty(len(base), dtype=np.int64)
        helpers.refine(_host(base), _host(item), _host(col), _host(val), out)
        return torch.from_numpy(out)
    if 4 * len(item) < len(base):     # few entries: sort them (the items with entries, ascending, and each index)
        items = unique_sorted(item)                                            # [T]
        local = search_sorted(items, item)                                     # [P]
    else:                             # many (a million, where thousands of tokens are legal): a mark per id
        seen = torch.zeros(len(base), dtype=torch.int64, device=dev)
        seen[item] = 1
        items = torch.nonzero(seen).flatten()
        local = (torch.cumsum(seen, 0) - 1).index_select(0, item)
    rows = sparse_classes(local, col, val, len(items))                         # [T]
    B = int(base.max()) + 1
    moved = base.index_select(0, items)                                        # [T] their base classes
    pid = unique_inverse(moved * (int(rows.max()) + 1) + rows)                 # [T] (base class, row) pairs
    # dense ids: the base classes that keep a token, in order, then the pairs (no pass that marks all V ids)
    kept = torch.bincount(base, minlength=B) > torch.bincount(moved, minlength=B)              # [B]
    out = (torch.cumsum(kept, 0) - 1).index_select(0, base)
    out[items] = int(kept.sum()) + pid
    return out


def column_classes(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """classes_of over the columns of m [R, C] without transposing it: (class per column [C], first column [K])."""
    dev = m.device
    R, C = m.shape
    if C == 0 or R == 0:
        return torch.zeros(C, dtype=torch.int64, device=dev), torch.zeros(min(C, 1), dtype=torch.int64, device=dev)
    lo, hi = (int(x) for x in torch.aminmax(m))
    bound = (max(-lo, hi) + 1) * (1 << 20) * R
    if bound >= (1 << 52):
        return classes_of(m.T.contiguous())
    gen = torch.Generator().manual_seed(R)
    weights = torch.randint(1, 1 << 20, (2, R), generator=gen).to(dev).double()
    h = torch.zeros((2, C), dtype=torch.float64, device=dev)                        # [2, C], exact
    step = max(1, _CHUNK // C)
    for s in range(0, R, step):                 # a block of rows at a time (see _rows_dot); partial sums exact
        h.addmm_(weights[:, s:s + step], m[s:s + step].double())
    h = h.long()
    inverse = unique_inverse(pair_key(h[0], h[1], bound))
    rep = first_of_each(inverse)
    if not _members_equal(m, inverse, rep, dim=1):                                  # a hash collision
        return classes_of(m.T.contiguous())
    return inverse, rep
