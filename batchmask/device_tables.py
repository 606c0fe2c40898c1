"""The grammar's tables copied to the device for the masker, in the kernels' dtypes, checked against the
CompiledGrammar contract (a bad table is one GrammarTableError line, never a wrong mask or an out-of-bounds read).

    device_tables(grammar, device) -> kernels.tables.Tables

A CompiledGrammar brings its factored table, dense or packed (batchmask/table/packed.py); any other grammar
object a plain class_next [S, C] with legal_count [S]. The checks read each table once, on the host where it
is (numpy on the CPU), never the decoded [S, C].
"""
from __future__ import annotations

import numpy as np
import torch

from batchmask.kernels.tables import Tables, make_tables
from batchmask.table.next_codes import SEGMENT_BITS, segment_bases
from batchmask.table.packed import MAX_CLASSES, owned_slots


class GrammarTableError(ValueError):
    """The compiled grammar handed to the masker breaks the CompiledGrammar contract."""


def _range(x: torch.Tensor) -> tuple[int, int]:
    """(min, max) of a tensor; numpy on the CPU (torch's threaded reductions of these small tensors wait on a
    busy core: milliseconds each)."""
    if x.device.type == "cpu":
        a = x.numpy()
        return int(a.min()), int(a.max())
    return int(x.min()), int(x.max())


def _highest_next(row_next: torch.Tensor, state_row: torch.Tensor, targets: torch.Tensor, seg_start: torch.Tensor,
                  seg_base: torch.Tensor, row_base: torch.Tensor | None = None,
                  row_check: torch.Tensor | None = None) -> tuple[int, int]:
    """(highest index an absolute code reads from the target list, highest decoded next state) of a factored
    table: absolute codes read the list from their state's segment base; per state, its row's lowest relative
    code gives its furthest move (the target grows with the state). O(R*C + S), never the decoded [S, C] (a
    combined table of many grammars has a million states). On the CPU the rows' minima and maxima come from one
    read of row_next, a block of rows at a time while it is in cache."""
    top = int(targets.max()) if targets.numel() else -1
    S = state_row.numel()
    if row_next.dim() == 1:
        return _highest_next_packed(row_next, row_base, row_check, state_row, targets, seg_start, seg_base, top)
    if row_next.device.type != "cpu":
        row_lo, row_hi = (x.long().index_select(0, state_row.long()) for x in row_next.aminmax(dim=1))   # [S]
        states = torch.arange(S, device=row_next.device)
        jump = torch.where(row_lo <= -2, states - 2 - row_lo, -1)  # [S]
        base = segment_bases(states, seg_start, seg_base)
        read = torch.where(row_hi >= 0, row_hi + base, -1)
        return int(read.max()), max(top, int(jump.max()))
    a = row_next.numpy()
    lo = np.empty(a.shape[0], dtype=a.dtype)  # [R]
    hi = np.empty(a.shape[0], dtype=a.dtype)  # [R]
    step = max(1, (1 << 18) // max(1, a.shape[1]))  # rows per block: ~1 MB of int32
    for r in range(0, a.shape[0], step):
        block = a[r:r + step]
        np.min(block, axis=1, out=lo[r:r + step])
        np.max(block, axis=1, out=hi[r:r + step])
    sr = state_row.numpy()
    lo_s = lo[sr].astype(np.int64)  # [S]
    jump = np.where(lo_s <= -2, np.arange(lo_s.size) - 2 - lo_s, -1)  # [S]
    seg_hi = np.maximum.reduceat(hi[sr].astype(np.int64), seg_start.numpy().astype(np.int64))     # [G]
    read = np.where(seg_hi >= 0, seg_hi + seg_base.numpy(), -1)
    return int(read.max()), max(top, int(jump.max()))


def _highest_next_packed(codes, row_base, row_check, state_row, targets, seg_start, seg_base, top):
    """_highest_next of a packed table: each row's lowest and highest code over the slots it owns."""
    slot, row, _ = owned_slots(row_base, row_check)
    R, S = row_base.numel(), state_row.numel()
    code = codes.index_select(0, slot).long()
    lo = torch.zeros(R, dtype=torch.int64, device=codes.device).scatter_reduce_(0, row, code, "amin")   # [R]
    hi = torch.full((R,), -1, dtype=torch.int64, device=codes.device).scatter_reduce_(0, row, code, "amax")
    states = torch.arange(S, device=codes.device)
    row_lo, row_hi = lo.index_select(0, state_row.long()), hi.index_select(0, state_row.long())       # [S]
    jump = torch.where(row_lo <= -2, states - 2 - row_lo, -1)
    read = torch.where(row_hi >= 0, row_hi + segment_bases(states, seg_start, seg_base), -1)
    return int(read.max()) if S else -1, max(top, int(jump.max()) if S else -1)


def _packed_layout(grammar, device, R: int, C: int):
    """The packed layout's row_base int32 [R] and row_check int16 [N] on the device, checked: the kernels read
    row_base[r] + c for every c < C without a bounds test (table/packed.py)."""
    base = grammar.row_base.to(device=device, dtype=torch.int32).contiguous()
    check = grammar.row_check.to(device=device, dtype=torch.int16).contiguous()
    N = check.numel()
    if base.shape != (R,) or grammar.row_next.dim() != 1 or grammar.row_next.numel() != N or C > MAX_CLASSES:
        raise GrammarTableError(f"a packed table needs row_base [{R}] and row_next, row_check of one length, and at "
                                f"most {MAX_CLASSES} classes")
    if R and (_range(base)[0] < 0 or _range(base)[1] + C > N or torch.unique(base).numel() != R):
        raise GrammarTableError(f"row_base must be distinct, with row_base + {C} <= {N} (the packed length)")
    return base, check


def _segments(grammar, device, S: int, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The grammar's target segments on the device (one at 0 where it has none), checked."""
    start, base = getattr(grammar, "segment_start", None), getattr(grammar, "segment_base", None)
    if start is None:
        start = base = torch.zeros(1, dtype=torch.int32)
    start = start.to(device=device, dtype=torch.int32).contiguous()
    base = base.to(device=device, dtype=torch.int32).contiguous()
    G = start.numel()
    if start.dim() != 1 or base.shape != start.shape or not 1 <= G <= (1 << SEGMENT_BITS):
        raise GrammarTableError(f"segment_start and segment_base must be 1-D of one length in [1, 2^{SEGMENT_BITS}], "
                                f"got shapes {list(start.shape)} and {list(base.shape)}")
    lo, hi = _range(start)
    if int(start[0]) != 0 or hi >= S or (G > 1 and not bool((start[1:] > start[:-1]).all())):
        raise GrammarTableError(f"segment_start must rise from 0 and stay below S = {S}")
    lo, hi = _range(base)
    if lo < 0 or hi > T:
        raise GrammarTableError(f"segment_base values must be in [0, {T}] (the target list), got [{lo}, {hi}]")
    return start, base


def device_tables(grammar, device: torch.device) -> Tables:
    """Copy the grammar's tables to the device in the kernels' dtypes, checking them against the contract.

    A CompiledGrammar brings its factored table (state_row [S], row_next [R, C] of next-state codes, row_legal
    [R], targets [T]); any other grammar object a plain class_next [S, C] with legal_count [S] (the special case
    state_row = arange(S), targets = arange(S))."""
    token_class = grammar.token_class.to(device=device, dtype=torch.int32).contiguous()  # [V]
    packed = getattr(grammar, "row_base", None) is not None
    if hasattr(grammar, "row_next"):
        name, row_next = "row_next", grammar.row_next.to(device).contiguous()  # [R, C], or [N] packed
        state_row = grammar.state_row.to(device).contiguous()  # [S]
        row_legal = grammar.row_legal.to(device=device, dtype=torch.int32).contiguous()  # [R]
        targets = grammar.targets.to(device=device, dtype=torch.int32).contiguous()  # [T]
        S = state_row.numel()
    else:
        name, row_next = "class_next", grammar.class_next.to(device).contiguous()  # [S, C]
        state_row = targets = None
        row_legal = grammar.legal_count.to(device=device, dtype=torch.int32).contiguous()  # [S]
        S = row_next.shape[0] if row_next.dim() == 2 else 0
    if row_next.dtype not in (torch.int16, torch.int32):
        raise GrammarTableError(f"{name} must be int16 or int32, got {row_next.dtype}")
    if row_next.dim() != (1 if packed else 2):
        raise GrammarTableError(f"{name} must be {'1-D (packed)' if packed else '2-D'}, got shape "
                                f"{list(row_next.shape)}")
    R, C = (grammar.row_base.numel(), int(grammar.num_classes)) if packed else row_next.shape
    row_base = row_check = None
    if packed:
        row_base, row_check = _packed_layout(grammar, device, R, C)
    V = token_class.numel()
    if token_class.dim() != 1 or V != grammar.vocab_size:
        raise GrammarTableError(f"token_class must be [{grammar.vocab_size}], got {list(token_class.shape)}")
    if row_legal.shape != (R,):
        what = "row_legal must be [{R}] (one per row)" if state_row is not None else "legal_count must be [{R}] " \
            "(one per state)"
        raise GrammarTableError(what.format(R=R) + f", got {list(row_legal.shape)}")
    lo, hi = _range(token_class)
    if lo < 0 or hi >= C:
        raise GrammarTableError(f"token_class values must be in [0, {C}), got [{lo}, {hi}]")
    if state_row is not None:
        row_range = _range(state_row) if state_row.shape == (S,) else (-1, -1)
        if not 0 <= row_range[0] <= row_range[1] < R:
            raise GrammarTableError(f"state_row must be [{S}] with values in [0, {R})")
        if targets.dim() != 1 or (targets.numel() and int(targets.min()) < 0):
            raise GrammarTableError(f"targets must be a 1-D list of states, got shape {list(targets.shape)}")
        seg_start, seg_base = _segments(grammar, device, S, targets.numel())
        top_code, hi = _highest_next(row_next, state_row, targets, seg_start, seg_base, row_base, row_check)
        if top_code >= targets.numel():
            raise GrammarTableError(f"row_next absolute codes must read the target list inside [0, {targets.numel()}) "
                                    f"(from their state's segment base), got {top_code}")
        lo = -1  # decoded codes are >= -1
    else:
        lo, hi = _range(row_next)
    if lo < -1 or hi >= S:
        raise GrammarTableError(f"{name} values must be in [-1, {S}), got [{lo}, {hi}]")
    for attr in ("start", "done_state"):
        if not 0 <= int(getattr(grammar, attr)) < S:
            raise GrammarTableError(f"{attr} = {getattr(grammar, attr)} is not a state (S = {S})")
    if not 0 <= int(grammar.eos_id) < V:
        raise GrammarTableError(f"eos_id = {grammar.eos_id} is not a token id (V = {V})")
    if state_row is None:
        return make_tables(token_class, row_next, row_legal, int(grammar.done_state), int(grammar.eos_id))
    if state_row.dtype.is_floating_point or state_row.dtype == torch.bool:
        raise GrammarTableError(f"state_row must be integers, got {state_row.dtype}")
    width = row_next.dtype if R <= 32767 or row_next.dtype == torch.int32 else torch.int32
    row_next, state_row = row_next.to(width).contiguous(), state_row.to(width).contiguous()  # one table width
    return make_tables(token_class, None, None, int(grammar.done_state), int(grammar.eos_id), state_row=state_row,
                       row_next=row_next, row_legal=row_legal, targets=targets, segment_start=seg_start,
                       segment_base=seg_base, row_base=row_base, row_check=row_check, num_classes=C)
