"""The value rules, in one place: which bytes a value may hold, where its cap falls, when it may close.

A value (the body of a seed `Str` or of a `JsonStr`) is a run of *units* (bytes for the seed's
`Str`, characters for `JsonStr`) read by a small loop automaton, its *value type*:

    table    int64 [Q, 256]  next sub-state after a byte, -1 where the byte is not allowed
    inc      int64 [Q, 256]  units the byte starts (0 or 1); a unit is counted at its first byte,
                             so a state in the middle of a unit already counts it
    pending  int64 [Q]       units still owed by the unit in progress (the seed counts the bytes
                             of a UTF-8 character one by one: its lead byte is legal only where the
                             whole character fits under the cap)
    lo       int64 [Q]       the smallest count at which sub-state q can occur
    accept   bool  [Q]       the value may end here (between units)

A value with `min`/`max` is then a grid of cells (n, q): n units counted so far, sub-state q.
The three rules below are the only places the builders (automaton/dfa.py, automaton/tree.py, automaton/form.py)
and the table builder (table/build.py) judge a value:

    cell_ok(n, q)        lo[q] <= n and n + pending[q] <= max     (the cell exists)
    stays_ok(n2, q2)     q2 >= 0 and n2 + pending[q2] <= max      (a move inside the value is legal)
    close_ok(n, q)       accept[q] and min <= n <= max            (the value may end here)

(`stays_need` restates stays_ok per (sub-state, byte) for builders that vary only n and max.)

A value without a max (JsonStr(min, None)) has the same rules with max = UNBOUNDED, and its grid stops at the
row `far_from(min)`: from there on every count has every sub-state and the minimum is met, so the rows are all
alike and the last one stands for them all (its count *saturates*: a move past it lands in it). Its cells are
`saturated_cells`; the builders send a move from count n by k units to min(n + k, that row).

The byte that ends a value (the closing quote) belongs to what follows; at an accepting sub-state
it must not be a byte the value could also take, so where a value ends needs no lookahead.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from . import utf8 as U
from .nodes import QUOTE

BACKSLASH = 0x5C
FILL = b"?"          # one unit, used by `finish` to pad a value up to its minimum
UNBOUNDED = 1 << 29  # the max the rules read for a value without one (stays_need's "never", 2^30, stays above it)
CELLS_KEPT = 64      # value layouts kept per value type (by cap)


@dataclass(frozen=True, eq=False)
class ValueType:
    name: str                      # also its cache key: equal names are equal automata
    table: np.ndarray              # int64 [Q, 256]
    inc: np.ndarray                # int64 [Q, 256]
    pending: np.ndarray            # int64 [Q]
    lo: np.ndarray                 # int64 [Q]
    accept: np.ndarray             # bool [Q]
    names: tuple                   # Q sub-state names (describe)
    completion: tuple              # Q: the smallest bytes that end the unit in progress (finish)
    completion_units: tuple        # Q: units those bytes add to the count
    rank: np.ndarray = None        # int64 [Q]: position of each sub-state within a row of cells (see cells)
    fill: bytes = FILL             # one unit that pads a value up to its minimum (finish)
    _torch: dict = field(default_factory=dict, repr=False)

    @property
    def num_substates(self) -> int:
        return self.table.shape[0]

    @property
    def max_pending(self) -> int:
        return self._cached("max_pending", lambda: int(self.pending.max()))

    @property
    def only_accept(self) -> int | None:
        """The accepting sub-state if there is exactly one (close_ok then compares instead of gathering)."""
        def one():
            idx = [i for i, a in enumerate(self.accept.tolist()) if a]
            return idx[0] if len(idx) == 1 else None
        return self._cached("only_accept", one)

    def _cached(self, key: str, make):
        # small facts of the (immutable) tables, kept beside the device views: the rules below ask per call
        if key not in self._torch:
            self._torch[key] = make()
        return self._torch[key]

    def on(self, device) -> ValueType:
        """The same value type with torch tensors on `device` (the rules below work on either)."""
        import torch
        key = str(device)
        if key not in self._torch:
            self._torch[key] = ValueType(self.name, *(torch.as_tensor(getattr(self, f), device=device) for f in
                                                      ("table", "inc", "pending", "lo", "accept")),
                                         self.names, self.completion, self.completion_units, self.rank, self.fill)
        return self._torch[key]

    def body_bytes_at_accept(self) -> np.ndarray:
        """bool [256]: bytes the value may take at some accepting sub-state (an ending byte must not be one)."""
        return (self.table[self.accept] >= 0).any(0)

    # --- layout -------------------------------------------------------------------------------------
    def cells(self, max_: int, base: int):
        """The grid of a value with cap `max_`: (grid int64 [max+1, Q] state id or -1, ns [Nb], qs [Nb]).

        Cells are numbered row by row from `base`, in `rank` order within a row: every move inside
        a value then leads to a higher id (the count grows, or stays while the unit in progress goes
        on), which the relative next-state codes need. Away from both ends every row is full, so
        grid[n + k, q'] - grid[n, q] depends on (k, q, q') only (rows shared by shift).
        """
        grid0, ns, qs = self.local_cells(max_)
        return np.where(grid0 >= 0, grid0 + base, -1), ns, qs

    def local_cells(self, max_: int):
        """`cells` numbered from 0, all three arrays shared and read-only (a grammar repeats caps)."""
        kept = self._cached("cells", OrderedDict)
        got = kept.pop(max_, None)
        if got is None:
            got = self._cells_from_0(max_)
            got[0].setflags(write=False)
        kept[max_] = got                                   # newest last; the oldest go past CELLS_KEPT
        while len(kept) > CELLS_KEPT:
            kept.popitem(last=False)
        return got

    def saturation_row(self, min_: int) -> int:
        """The count at which a value without a max stops counting (module docstring): far_from(min_)."""
        return self.far_from(min_)

    def saturated_cells(self, min_: int):
        """The cells of a value without a max (see the module docstring): rows 0 .. saturation_row(min_), the last
        one full and standing for every count from there on. Shared and read-only, as local_cells."""
        return self.local_cells(("saturated", self.saturation_row(min_)))

    def _cells_from_0(self, max_):
        rows, cap = (max_[1] + 1, UNBOUNDED) if isinstance(max_, tuple) else (max_ + 1, max_)
        order = np.argsort(self.rank)                                      # sub-states in row order
        n = np.arange(rows)[:, None]                                       # [rows, 1]
        ok = cell_ok(self, n, order[None, :], cap)                         # [rows, Q] in row order
        ids = np.full(ok.shape, -1, dtype=np.int64)
        ids[ok] = np.arange(int(ok.sum()))
        grid = np.empty_like(ids)
        grid[:, order] = ids
        ns, pos = np.nonzero(ok)
        qs = order[pos]
        ns.setflags(write=False)
        qs.setflags(write=False)
        return grid, ns, qs

    def far_from(self, min_: int) -> int:
        """The first count from which every cell of a row exists and the minimum is met."""
        return max(int(self.lo.max()), min_)

    def finish(self, n: int, q: int, min_: int) -> bytes:
        """The shortest bytes that end the value from cell (n, q): end the unit, then pad to `min_`."""
        out = self.completion[q]
        n += self.completion_units[q]
        return out + self.fill * max(0, min_ - n)


# --- the three rules: `vt` is a ValueType (numpy) or its `.on(device)` view (torch); arrays broadcast ---------
def cell_ok(vt: ValueType, n, q, max_: int):
    """Cell (n, q) exists: q can occur at count n, and the unit in progress fits under the cap."""
    return (n >= vt.lo[q]) & (n + vt.pending[q] <= max_)


def stays_ok(vt: ValueType, n2, q2, max_: int):
    """A move to (n2, q2) inside the value is legal (q2 < 0: the byte was refused)."""
    if vt.max_pending == 0:                  # nothing is ever owed (a JSON string): no lookup of pending
        return (q2 >= 0) & (n2 <= max_)
    return (q2 >= 0) & (n2 + vt.pending[q2.clamp(min=0) if hasattr(q2, "clamp") else np.maximum(q2, 0)] <= max_)


def stays_need(vt: ValueType, q2, inc):
    """The least `max - n` at which a move from count n adding `inc` units to sub-state `q2` is legal
    (stays_ok(vt, n + inc, q2, max) holds iff max - n >= this); 2^30 where q2 < 0 (never). numpy or torch."""
    if hasattr(q2, "clamp"):
        import torch
        return torch.where(q2 >= 0, inc + vt.pending[q2.clamp(min=0)], 1 << 30)
    return np.where(q2 >= 0, inc + vt.pending[np.maximum(q2, 0)], 1 << 30)


def close_ok(vt: ValueType, n, q, min_: int, max_: int):
    """The value may end at (n, q): between units, with the minimum met (q >= 0: a sub-state)."""
    a = vt.only_accept
    return (vt.accept[q] if a is None else q == a) & (n >= min_) & (n <= max_)


def _rank(table: np.ndarray, inc: np.ndarray) -> np.ndarray:
    """Sub-states ordered so that a byte that adds no unit always moves to a later one (Kahn's order)."""
    Q = table.shape[0]
    edges = {(int(q), int(table[q, b])) for q, b in zip(*np.nonzero((table >= 0) & (inc == 0)))}
    indeg = np.zeros(Q, dtype=np.int64)
    for _, t in edges:
        indeg[t] += 1
    order, ready = [], [q for q in range(Q) if indeg[q] == 0]
    while ready:
        q = ready.pop(0)
        order.append(q)
        for a, t in sorted(edges):
            if a == q:
                indeg[t] -= 1
                if indeg[t] == 0:
                    ready.append(t)
    if len(order) != Q:
        raise ValueError("a value type may not loop without counting a unit")
    rank = np.empty(Q, dtype=np.int64)
    rank[order] = np.arange(Q)
    return rank


def _seed(utf8: bool) -> ValueType:
    """The seed's `Str` body: printable bytes but the quote and the backslash; the cap counts bytes."""
    table = U.body_table(utf8)
    Q = table.shape[0]
    completion = tuple(U.COMPLETION[:Q])
    return ValueType(
        name="seed-utf8" if utf8 else "seed-bytes", table=table, inc=(table >= 0).astype(np.int64),
        pending=U.PENDING[:Q].copy(), lo=np.array([0] + [1] * (Q - 1), dtype=np.int64),
        accept=np.arange(Q) == U.BOUNDARY, names=tuple(U.NAMES[:Q]), completion=completion,
        completion_units=tuple(len(c) for c in completion), rank=np.arange(Q))


# JSON string escapes: after '\\' one of these ends the escape; 'u' opens \\u00XX.
_SIMPLE_ESCAPES = b'"\\bfnrt'
_HEX = b"0123456789abcdefABCDEF"


def _json(utf8: bool) -> ValueType:
    """`JsonStr`'s body: raw characters but '"', '\\' and U+0000-U+001F, U+007F; the escapes
    \\" \\\\ \\b \\f \\n \\r \\t, and \\u00XX for exactly the characters that may not be raw.
    The cap counts characters (an escape is one), counted at their first byte."""
    names = ["boundary"]
    completion = [b""]
    if utf8:
        names += U.NAMES[1:]
        completion += U.COMPLETION[1:]
    esc = len(names)
    names += ["escape", "u", "u0", "u00", "u00x", "u007"]
    completion += [b'"', b"0000", b"000", b"00", b"0", b"f"]
    E, EU, EU0, EU00, EU00X, EU007 = range(esc, esc + 6)
    Q = len(names)
    t = np.full((Q, 256), -1, dtype=np.int64)
    inc = np.zeros((Q, 256), dtype=np.int64)
    raw = [b for b in range(0x20, 0x7F) if b not in (QUOTE, BACKSLASH)]
    t[0, raw] = 0
    if utf8:
        u = U.body_table(True)
        high = np.arange(0x80, 0x100)
        t[:esc, high] = u[:, high]                  # UTF-8 sub-states, numbered as in grammar/utf8.py
    else:
        t[0, 0x80:] = 0
    t[0, BACKSLASH] = E
    inc[0] = t[0] >= 0                              # every byte allowed between characters starts one
    t[E, list(_SIMPLE_ESCAPES)] = 0
    t[E, ord("u")] = EU
    t[EU, ord("0")] = EU0
    t[EU0, ord("0")] = EU00
    t[EU00, [ord("0"), ord("1")]] = EU00X           # \u0000 - \u001F
    t[EU00, ord("7")] = EU007                       # \u007F
    t[EU00X, list(_HEX)] = 0
    t[EU007, [ord("f"), ord("F")]] = 0
    return ValueType(
        name="json-utf8" if utf8 else "json-bytes", table=t, inc=inc, pending=np.zeros(Q, dtype=np.int64),
        lo=np.array([0] + [1] * (Q - 1), dtype=np.int64), accept=np.arange(Q) == 0, names=tuple(names),
        completion=tuple(completion), completion_units=(0,) * Q, rank=_rank(t, inc))


_TYPES: dict[str, ValueType] = {}


def word_type(start: bytes, body: bytes, end: bytes) -> ValueType:
    """The value type of a `Word` (grammar/nodes.py): ASCII bytes, the first from `start`, the others from `body`,
    the last from `end`; each byte one unit. Sub-states: 0 before the first byte, 1 after a byte of `end`,
    2 after one of `body` but not `end` (a word may not end there). 0 and 1 accept: a word of 0 bytes is
    ruled out by its block's minimum, not by its type. Built once per (start, body, end)."""
    start, body, end = bytes(start), bytes(body), bytes(end)
    name = "word-" + hashlib.sha256(start + body + end).hexdigest()[:24]
    if name not in _TYPES:
        s, b, e = (np.frombuffer(m, dtype=np.uint8).astype(bool) for m in (start, body, end))
        if len(start) != 256 or len(body) != 256 or len(end) != 256 or (s | b)[0x80:].any() or (e & ~b).any() \
                or not (s & b & e).any():
            raise ValueError("a Word's masks: 256 bytes each, ASCII only, end within body, and some byte in all "
                             "three (what finish pads with)")
        table = np.full((3, 256), -1, dtype=np.int64)
        table[0, s] = np.where(e[s], 1, 2)
        table[1:, b] = np.where(e[b], 1, 2)[None, :]
        completion = (b"", b"", bytes([int(np.flatnonzero(e)[0])]))          # end a word in sub-state 2
        _TYPES[name] = ValueType(
            name=name, table=table, inc=(table >= 0).astype(np.int64), pending=np.array([0, 0, 1]),
            lo=np.array([0, 1, 1]), accept=np.array([True, True, False]), names=("start", "end", "body"),
            completion=completion, completion_units=(0, 0, 1), rank=_rank(table, (table >= 0).astype(np.int64)),
            fill=bytes([int(np.flatnonzero(s & b & e)[0])]))
    return _TYPES[name]


def run_type(table: np.ndarray) -> ValueType:
    """The value type of a run (automaton/runs.py): a Repeat of an item, determinised. `table` int64 [Q, 256]:
    sub-state 0 is the boundary between items (the only accepting one), a byte leaving it starts an item (one
    unit), and a byte back to 0 from another sub-state completes one. Built once per table."""
    table = np.ascontiguousarray(table, dtype=np.int64)
    name = "run-" + hashlib.sha256(table.tobytes()).hexdigest()[:24]
    if name not in _TYPES:
        Q = table.shape[0]
        inc = np.zeros((Q, 256), dtype=np.int64)
        inc[0] = table[0] >= 0
        _TYPES[name] = ValueType(
            name=name, table=table, inc=inc, pending=np.zeros(Q, dtype=np.int64),
            lo=np.array([0] + [1] * (Q - 1), dtype=np.int64), accept=np.arange(Q) == 0,
            names=("boundary",) + tuple(f"item{q}" for q in range(1, Q)),
            completion=tuple(_to_boundary(table, q) for q in range(Q)), completion_units=(0,) * Q,
            rank=_rank(table, inc), fill=_to_boundary(table, 0, leave=True))
    return _TYPES[name]


def _to_boundary(table: np.ndarray, q: int, leave: bool = False) -> bytes:
    """The shortest bytes from sub-state q back to the boundary (with `leave`, one whole item from it), the
    lowest byte first among equals."""
    if q == 0 and not leave:
        return b""
    seen, frontier = {q: b""}, [q]
    while frontier:
        nxt = []
        for s in frontier:
            for b in np.flatnonzero(table[s] >= 0).tolist():
                t = int(table[s, b])
                if t == 0:
                    return seen[s] + bytes([b])
                if t not in seen:
                    seen[t] = seen[s] + bytes([b])
                    nxt.append(t)
        frontier = nxt
    raise ValueError("a run's item never completes")


def value_type_named(name: str, utf8: bool) -> ValueType:
    """A value type by its name: a run's (made when its grammar was built) or a string body's."""
    if name in _TYPES:
        return _TYPES[name]
    return value_type(name.split("-")[0], utf8)


def value_type(kind: str, utf8: bool) -> ValueType:
    """The value type of a `Str` ("seed") or `JsonStr` ("json") body, built once per process."""
    name = f"{kind}-{'utf8' if utf8 else 'bytes'}"
    if name not in _TYPES:
        if kind == "seed":
            _TYPES[name] = _seed(utf8)
        elif kind == "json":
            _TYPES[name] = _json(utf8)
        else:
            raise ValueError(f"unknown value kind {kind!r} (expected 'seed' or 'json')")
    return _TYPES[name]
