"""
The compiled grammar and the per-row decoding state as every backend reads them (torch reference, CPU fast
paths, Triton kernels), and the one lookup they all share: the state a token leads to.

The grammar is a DFA over tokens, factored by token classes and by rows of states:

    code = row_next[state_row[state], token_class[token]]      next state = batchmask.table.next_codes.decode_next
                                                                (absolute codes index the target list from
                                                                the base of the state's segment)

row_next is dense [R, C], or packed (row_next [N], row_base [R], row_check [N]); every read here goes through
batchmask.table.packed (`codes_at`, `row_codes`), the one place that layout is written.

A plain [S, C] table is the special case state_row = arange(S), targets = arange(S), one segment. Names used in the
shape comments: B rows in the batch, V grammar vocabulary, V' >= V logits width (padded ids are illegal),
S states, R distinct table rows, C token classes, T absolute targets, G target segments, H history length
(tokens remembered per row).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from batchmask.table.next_codes import ILLEGAL, decode_next
from batchmask.table.packed import codes_at, row_codes


@dataclass
class Tables:
    """The compiled grammar on one device (contiguous). Build with make_tables."""
    token_class: torch.Tensor        # int32 [V]     class of every token id
    state_row: torch.Tensor          # int16|int32 [S]     the row of row_next each state uses } the same
    row_next: torch.Tensor           # int16|int32 [R, C]  next-state codes, -1 = illegal     } width
    #                                  (packed: int16|int32 [N], read through batchmask.table.packed)
    row_legal: torch.Tensor          # int32 [R]     number of legal token ids in a state of each row
    targets: torch.Tensor            # int32 [T]     the states absolute codes name
    class_first_token: torch.Tensor  # int64 [C]     lowest token id of each class (V for an empty class)
    done_state: int                  # absorbing state after EOS (only EOS legal)
    eos_id: int
    sides: object | None = None      # the CPU fast paths' token lists (kernels.short_sides.ShortSides), lazy
    segment_start: torch.Tensor | None = None   # int32 [G]  first state of each target segment (ascending, [0] first)
    segment_base: torch.Tensor | None = None    # int32 [G]  where its absolute codes start in targets
    row_base: torch.Tensor | None = None        # int32 [R]  packed: where each row's columns start (None: dense)
    row_check: torch.Tensor | None = None       # int16 [N]  packed: the column owning each slot, -1 none

    def __post_init__(self):
        dev = self.token_class.device
        if self.segment_start is None:                      # one segment: the plain list
            self.segment_start = torch.zeros(1, dtype=torch.int32, device=dev)
            self.segment_base = torch.zeros(1, dtype=torch.int32, device=dev)

    @property
    def vocab_size(self) -> int:
        return self.token_class.numel()

    @property
    def num_classes(self) -> int:
        return self.class_first_token.numel()

    @property
    def class_next(self) -> torch.Tensor:
        """int64 [S, C]: the plain table of next states (-1 illegal), decoded (for references and checks)."""
        S = self.state_row.numel()
        return decode_next(row_codes(self, self.state_row.long()),
                           torch.arange(S, device=self.state_row.device)[:, None], self.targets,
                           self.segment_start, self.segment_base)


def make_tables(token_class: torch.Tensor, class_next: torch.Tensor | None, legal_count: torch.Tensor | None,
                done_state: int, eos_id: int, state_row: torch.Tensor | None = None,
                row_next: torch.Tensor | None = None, row_legal: torch.Tensor | None = None,
                targets: torch.Tensor | None = None, segment_start: torch.Tensor | None = None,
                segment_base: torch.Tensor | None = None, row_base: torch.Tensor | None = None,
                row_check: torch.Tensor | None = None, num_classes: int | None = None) -> Tables:
    """From a plain [S, C] table (class_next, legal_count [S]), or from the compiler's factored one
    (state_row, row_next, row_legal, targets, and the target segments; packed: row_base, row_check and
    num_classes too)."""
    if state_row is None:
        S = class_next.shape[0]
        row_next, row_legal = class_next, legal_count
        if row_next.dtype == torch.int16 and S > 32767:
            row_next = row_next.to(torch.int32)                 # state_row and row_next: one width
        width = torch.int16 if row_next.dtype == torch.int16 else torch.int32
        state_row = torch.arange(S, dtype=width, device=class_next.device)
        targets = torch.arange(S, dtype=torch.int32, device=class_next.device)
    V, C = token_class.numel(), row_next.shape[1] if row_base is None else int(num_classes)
    ids = torch.arange(V, device=token_class.device)
    first = torch.full((C,), V, dtype=torch.int64, device=token_class.device)
    first.scatter_reduce_(0, token_class.long(), ids, reduce="amin")  # [C]
    return Tables(token_class, state_row, row_next, row_legal, targets, first, done_state, eos_id,
                  segment_start=segment_start, segment_base=segment_base, row_base=row_base, row_check=row_check)


@dataclass
class Rows:
    """The per-row decoding state, resident on the device so the hot loop never syncs."""
    state: torch.Tensor    # int32 [B]     current DFA state
    step: torch.Tensor     # int32 [B]     tokens emitted so far (EOS included, repeats after done not counted)
    history: torch.Tensor  # int32 [B, H]  history[r, i] = i-th token row r emitted (i < H)
    fault: torch.Tensor    # int64 [B, 3]  first illegal advance per row: (flag 0/1, token id, state)
    key: torch.Tensor | None = None  # int64 [B]  what keys a row's random draws with (seed, key, step);
    #                                  None: the row index. Generation sets one per task, so a task's
    #                                  draws do not depend on which slot or batch size it ran in.


def row_ids(rows: Rows, start: int, count: int) -> torch.Tensor:
    """int64 [count]: the random-draw keys of rows start..start+count-1."""
    if rows.key is not None:
        return rows.key[start:start + count]
    return torch.arange(start, start + count, device=rows.state.device)


# ----------------------------------------------------------------------------------------------------------
# lookups

def next_states(state: torch.Tensor, cls: torch.Tensor, t: Tables) -> torch.Tensor:
    """int64 [n]: the state after a token of class cls [n] from state [n] (-1 illegal)."""
    row = t.state_row.index_select(0, state).long()
    return decode_next(codes_at(t, row, cls.long()), state, t.targets, t.segment_start, t.segment_base)


def legal_counts(state: torch.Tensor, t: Tables) -> torch.Tensor:
    """int32 [n]: how many token ids are legal in each state [n]."""
    return t.row_legal.index_select(0, t.state_row.index_select(0, state).long())


def class_legal(state: torch.Tensor, t: Tables) -> torch.Tensor:
    """state: int32 [B] -> bool [B, C], which token classes each row may emit."""
    return row_codes(t, t.state_row.index_select(0, state).long()) != ILLEGAL


def legal_mask(state: torch.Tensor, t: Tables) -> torch.Tensor:
    """state: int32 [B] -> bool [B, V], which token ids each row may emit."""
    return class_legal(state, t).index_select(1, t.token_class)


def first_legal_token(state: torch.Tensor, t: Tables) -> torch.Tensor:
    """int64 [B]: each row's lowest legal id, or EOS where the state allows none (the advance then flags it).
    From the [B, C] class table: the lowest first-token of a legal class, no [B, V] pass."""
    V = t.vocab_size
    first = torch.where(class_legal(state, t), t.class_first_token, V).amin(dim=1)  # [B]
    return torch.where(first < V, first, t.eos_id)
