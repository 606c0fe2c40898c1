"""
The short sides of the CPU fast paths, built on first use: per table row, the token ids of the shorter of its
legal and illegal sides. (Masking with them: mask_cpu.py; greedy and sampling: choose_cpu.py.)

The tokens of a state split into a legal and an illegal side, and one side is short: few legal tokens in literal
text (a key name, punctuation, a UTF-8 continuation byte), few illegal ones inside a string value (quotes,
backslashes, control bytes, ...). Masking writes only the short side of each row.

Why lazily: listing every row's side up front costs O(R x V) work and memory (a 12-tool catalogue on Qwen2, R =
5240 rows, V = 151936, took 2-3 s and 72 MB; sixteen grammars combined have R = 33K), while a masker is built
per run and a run visits a fraction of the rows. So nothing is listed when the masker is built; each call asks
for the groups of the states it steps (`groups`), and the rows not seen before are listed then, vectorised over
those rows only:

  * rows with the same legal class set share one group (looked up by the packed set), as before;
  * a group's list is the token slices of its listed classes (tokens sorted by class once: a slice per class),
    sorted ascending (so writes walk a logits row forwards), and its noise blocks holding a legal token
    (kernels/gumbel.py) are counted from that list, not from an [R, C] x [C, V / K] product.

Memory: the lists (int32 ids, and per group its flags and noise blocks) are capped at `budget` bytes. When a
call's new groups would pass it, the store is emptied and refilled with that call's groups only, so it never
holds more than about max(budget, what one call needs); the results do not depend on the budget
(tests/test_kernels_cpu.py checks a tiny one). Measured on Qwen2 (V = 151936): a catalogue's B = 64 step from
realistic states lists ~30 groups (1.3 MB); every row of the table, its 1517 groups, 41 MB; sixteen catalogue
subsets combined (R = 33383) have 1549 distinct legal class sets, 41 MB.
"""
from __future__ import annotations

import numpy as np
from batchmask.kernels import gumbel

from batchmask.table.next_codes import ILLEGAL
from batchmask.table.packed import row_codes_np

BUDGET_BYTES = 64 << 20  # token lists kept per table (16M ids): the catalogue on Qwen2 fully visited needs 35 MB


def _grown(a: np.ndarray, need: int, cap: int) -> np.ndarray:
    """a with room for `need` items along axis 0: capacity doubles (appends cost amortised O(1) per item) up to
    cap items, past which it grows only to what is needed."""
    if need <= a.shape[0]:
        return a
    out = np.empty((max(need, min(2 * a.shape[0], cap), 16), *a.shape[1:]), dtype=a.dtype)
    out[:a.shape[0]] = a
    return out


class ShortSides:
    """The groups of one table's rows, listed on demand.

    After `g = groups(states)`, for each group id in g (valid until the next call of `groups`):
      few_legal[g]   bool             the group lists its legal tokens (else its illegal ones)
      start[g], length[g]  int64      its token ids are tokens[start : start + length], ascending
      block_legal[g] bool [nb]        noise block b (gumbel.NOISE_BLOCK ids) holds a legal token
    The arrays have spare capacity past the groups built; index them only by group ids.
    """

    def __init__(self, token_class: np.ndarray, state_row: np.ndarray, row_next: np.ndarray,
                 row_base: np.ndarray | None, row_check: np.ndarray | None, num_classes: int,
                 budget: int = BUDGET_BYTES):
        self.vocab_size = token_class.size                      # V
        self.num_blocks = gumbel.num_blocks(self.vocab_size)    # nb
        self._token_class = token_class                         # int32 [V]
        self._state_row = state_row                             # int32 [S]
        self._row_next = row_next                               # int16|int32 [R, C] (packed: [N])
        self._row_base = row_base                               # int32 [R] packed, None dense
        self._row_check = row_check                             # int16 [N] packed, None dense
        self._num_rows = row_next.shape[0] if row_base is None else row_base.size   # R
        self._num_classes = num_classes                         # C
        self.budget = budget
        self.resets = 0                                         # times the store was emptied (tests read it)
        self._layout = None                                     # the class slices, on the first build
        self._empty()

    def _empty(self) -> None:
        self.row_group = np.full(self._num_rows, -1, dtype=np.int64)  # [R] -1: not listed yet
        self._group_of_set: dict[bytes, int] = {}              # packed legal class set -> group
        self.num_groups, self.num_tokens = 0, 0
        self.few_legal = np.zeros(0, dtype=bool)               # [G]
        self.start = np.zeros(0, dtype=np.int64)               # [G]
        self.length = np.zeros(0, dtype=np.int64)              # [G]
        self.block_legal = np.zeros((0, self.num_blocks), dtype=bool)  # [G, nb]
        self.tokens = np.zeros(0, dtype=np.int32)              # [T]

    @property
    def nbytes(self) -> int:
        """Host memory held now (capacity included)."""
        arrays = [self.row_group, self.few_legal, self.start, self.length, self.block_legal, self.tokens]
        return sum(a.nbytes for a in arrays + list(self._layout or ()))

    # ------------------------------------------------------------------------------------------------------
    # lookups

    def groups(self, states: np.ndarray) -> np.ndarray:
        """int [b] states -> int64 [b] their groups, listing the rows not seen before."""
        rows = self._state_row[states]                          # [b]
        g = self.row_group[rows]
        if (g < 0).any():
            if not self._add(np.unique(rows[g < 0])):           # over budget: start over with this call's rows
                self._empty()
                self.resets += 1
                self._add(np.unique(rows), force=True)
            g = self.row_group[rows]
        return g

    # ------------------------------------------------------------------------------------------------------
    # building

    def _class_layout(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(token ids sorted by class, stably: int32 [V]; each class's first position int64 [C]; its size [C])."""
        if self._layout is None:
            C = self._num_classes
            cls = self._token_class.astype(np.int16) if C <= np.iinfo(np.int16).max else self._token_class
            by_class = np.argsort(cls, kind="stable").astype(np.int32)  # int16 keys: a radix sort
            size = np.bincount(self._token_class, minlength=C).astype(np.int64)
            self._layout = (by_class, np.cumsum(size) - size, size)
        return self._layout

    def _add(self, rows: np.ndarray, force: bool = False) -> bool:
        """List the groups of table rows (int64 [k], distinct, none listed yet). False (nothing changed) if
        the new lists would pass the budget while others are stored, unless force."""
        codes = row_codes_np(self._row_next, self._row_base, self._row_check, rows, self._num_classes)  # [k, C]
        sets = codes != ILLEGAL                                 # [k, C] legal classes
        keys = [p.tobytes() for p in np.packbits(sets, axis=1)]  # one per new row (at most the call's rows)
        group = np.empty(rows.size, dtype=np.int64)             # [k]
        fresh: dict[bytes, int] = {}                            # sets not stored yet -> index among the new
        first_row = []                                          # [m] a row of each new set
        for i, key in enumerate(keys):
            g = self._group_of_set.get(key)
            if g is None:
                g = fresh.get(key)
                if g is None:
                    g = fresh[key] = self.num_groups + len(first_row)
                    first_row.append(i)
            group[i] = g
        if first_row:
            few, length, tokens, blocks = self._list(sets[first_row])
            if not force and self.num_groups and self._bytes(self.num_groups + few.size,
                                                             self.num_tokens + tokens.size) > self.budget:
                return False
            self._store(few, length, tokens, blocks)
            self._group_of_set.update(fresh)
        self.row_group[rows] = group
        return True

    def _list(self, sets: np.ndarray):
        """The short sides of m legal class sets bool [m, C] -> (few_legal bool [m], length int64 [m],
        tokens int32 [T'] (each set's ids ascending, sets one after another), block_legal bool [m, nb])."""
        V, nb, K = self.vocab_size, self.num_blocks, gumbel.NOISE_BLOCK
        by_class, class_start, class_size = self._class_layout()
        m = sets.shape[0]
        few = (sets @ class_size) * 2 < V                       # [m] fewer legal than illegal tokens
        group, cls = np.nonzero(sets == few[:, None])           # [n] the listed classes, grouped by set
        n = class_size[cls]                                     # [n] tokens per listed class
        total = int(n.sum())
        first = np.cumsum(n) - n
        label = np.repeat(group, n)                             # [T'] the set each listed token belongs to
        tokens = by_class[np.repeat(class_start[cls] - first, n) + np.arange(total)]  # [T'] class slices
        # ascending ids within each set (the slices are ascending runs: the stable sort merges them)
        tokens = (np.sort(label * V + tokens, kind="stable") - label * V).astype(np.int32)
        length = np.bincount(label, minlength=m).astype(np.int64)
        # noise blocks with a legal token: a listed legal token in it, or fewer listed illegal ones than it holds
        hits = np.bincount(label * nb + tokens // K, minlength=m * nb).reshape(m, nb)  # [m, nb]
        block_size = np.minimum(K, V - K * np.arange(nb))       # [nb] the last block may be short
        blocks = np.where(few[:, None], hits > 0, hits < block_size)
        return few, length, tokens, blocks

    def _bytes(self, groups: int, tokens: int) -> int:
        """What the lists of that many groups and ids hold (counted against the budget)."""
        return 4 * tokens + groups * (1 + 8 + 8 + self.num_blocks)

    def _store(self, few: np.ndarray, length: np.ndarray, tokens: np.ndarray, blocks: np.ndarray) -> None:
        g0, t0 = self.num_groups, self.num_tokens
        g1, t1 = g0 + few.size, t0 + tokens.size
        group_cap = self.budget // self._bytes(1, 0)  # capacity never doubles past the budget on its own
        self.few_legal, self.start, self.length, self.block_legal = (
            _grown(a, g1, group_cap) for a in (self.few_legal, self.start, self.length, self.block_legal))
        self.tokens = _grown(self.tokens, t1, self.budget // 4)
        self.few_legal[g0:g1], self.length[g0:g1], self.block_legal[g0:g1] = few, length, blocks
        self.start[g0:g1] = t0 + np.cumsum(length) - length
        self.tokens[t0:t1] = tokens
        self.num_groups, self.num_tokens = g1, t1
