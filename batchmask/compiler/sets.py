"""Several grammars compiled for one tokenizer as ONE table: a batch of rows in different grammars.

    table = combine([g0, g1, ...])       CompiledGrammar-like; table.starts[i] = grammar i's start state
    BatchMasker(table, B).reset(rows, starts=...)   each row starts (and stays) inside its own grammar

The masker and kernels read the combined table unchanged: it is one more factored table (packed, like its
packed inputs or where it is large and sparse: table/packed.py; the rows are written out to be joined)
(token_class [V], state_row [S], row_next [R, C], targets [T], segments [G]) whose state space is the
grammars' state spaces side by side. How it is built, without a loop over tokens or states:

  * joint token classes: two tokens share a column iff they share a class in every grammar
    (the rows of the stacked [V, G] class ids, grouped); grammar g's column for joint class c is
    its class of c's first token, so its rows are re-indexed by a gather;
  * states: grammar g's states 0..S_g-2 land at offset O_g; the done states (the compiler puts done
    last, and after a stop id every grammar's done row is the same: only eos, back to done) merge
    into one shared done state D at the end, so the kernels' single `done_state` holds;
  * codes (batchmask/table/next_codes.py) are unchanged: the target lists are joined (grammar g's targets
    move by O_g, done_g -> D) and the bases of g's target segments move by where g's list starts, so an
    absolute code reads the same target as before; relative codes (<= -2) and -1 only ever name a state
    of their own grammar; D reads as grammar 0's done state;
  * rows: grammar g's rows re-indexed and re-coded, stacked, and equal rows stored once: the compiler
    made the forward moves of rows one state uses relative, so the many rows that behave alike in
    several grammars (the same tool's arguments, like values) do not differ by where their grammar
    sits (nor by where a value's end leads, with segments), and are stored once.

`combine([g])` is `g` itself: a single grammar costs nothing. Host-side queries (finish_bytes,
finish_text, describe) go to the grammar owning the state.
"""
from __future__ import annotations

import bisect
from collections.abc import Sequence

import torch

from ..table.classes import classes_of, first_of_each, in_first_use_order
from ..table.forced import ForcedTokens, concat
from ..table.packed import MAX_CLASSES, pack_dense, row_codes, want_packed
from .compiled import CompiledGrammar, table_dtype

__all__ = ["GrammarSet", "GrammarSetError", "combine", "starts_of"]


class GrammarSetError(ValueError):
    """Grammars that cannot share one table (another vocabulary, other stop ids, another layout)."""


def starts_of(table) -> list[int]:
    """The start state of each grammar of a table: combine()'s `starts`, or [start] for a single grammar."""
    return list(getattr(table, "starts", None) or [int(table.start)])


def combine(grammars: Sequence[CompiledGrammar]):
    """One table for grammars compiled against the same tokenizer (see the module docstring).

    Returns grammars[0] itself when there is one (or the same one several times: then every row starts in its
    start); otherwise a GrammarSet on grammars[0]'s device whose `starts[i]` is grammars[i]'s start state (the
    same grammar object given twice, e.g. two tool sets differing only in descriptions, is stored once).
    """
    grammars = list(grammars)
    if not grammars:
        raise GrammarSetError("combine: no grammars given")
    distinct = list({id(g): g for g in grammars}.values())       # a grammar given twice is stored once
    if len(distinct) == 1:
        return grammars[0]
    _check_compatible(distinct)
    threads = torch.get_num_threads()
    if distinct[0].device.type == "cpu":
        torch.set_num_threads(1)      # many memory-bound ops: a second thread mostly spins (as compile_node)
    try:
        table = GrammarSet(distinct)
    finally:
        torch.set_num_threads(threads)
    if len(distinct) < len(grammars) or any(len(g.starts) > 1 for g in distinct):
        # starts: each input grammar's start states (several for grammars compiled together), in input order
        own = {id(g): starts for g, starts in zip(distinct, table.grammar_starts)}
        table.starts = [s for g in grammars for s in own[id(g)]]
    return table


def _check_compatible(grammars: list) -> None:
    g0 = grammars[0]
    hash0 = (g0.meta or {}).get("vocab_hash")
    for i, g in enumerate(grammars[1:], 1):
        where = f"combine: grammar {i}"
        if g.vocab_size != g0.vocab_size:
            raise GrammarSetError(f"{where} has a vocabulary of {g.vocab_size} tokens, grammar 0 of {g0.vocab_size}")
        if (g.eos_id, tuple(g.stop_ids)) != (g0.eos_id, tuple(g0.stop_ids)):
            raise GrammarSetError(f"{where} has eos {g.eos_id} / stop ids {list(g.stop_ids)}, grammar 0 has "
                                  f"{g0.eos_id} / {list(g0.stop_ids)}")
        same = hash0 is not None and (g.meta or {}).get("vocab_hash") == hash0
        if not same and g.token_bytes is not g0.token_bytes and g.token_bytes != g0.token_bytes:
            raise GrammarSetError(f"{where} was compiled for another vocabulary than grammar 0")
        if g.device != g0.device:
            raise GrammarSetError(f"{where} is on {g.device}, grammar 0 on {g0.device}")
    for i, g in enumerate(grammars):
        if g.done_state != g.num_states - 1 or not 0 <= g.start < g.done_state:
            raise GrammarSetError(f"combine: grammar {i} does not have the compiler's layout (done state "
                                  f"{g.done_state}, start {g.start}, {g.num_states} states; done must be last)")


def _segment_of(g, state: int) -> int:
    """The index of the target segment holding `state`."""
    return bisect.bisect_right(g.segment_start.tolist(), int(state)) - 1


def _share_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Store equal rows once: (row id of each input row [N], the distinct rows [R, C]), numbered by first use.

    Rows are grouped by two exact integer dot products with random weights (float64, a few thousand rows at a
    time: no [N, C] int64 copy), every row is checked against its group's first, and only after a hash
    collision are they grouped exactly (a row sort)."""
    N, C = rows.shape
    dev = rows.device
    lo = int(rows.min())
    top = int(rows.max()) - lo + 1
    gen = torch.Generator().manual_seed(C)
    weights = torch.randint(1, 1 << 20, (C, 2), generator=gen).to(device=dev, dtype=torch.float64)
    inverse = None
    if top * (1 << 20) * C < (1 << 52):                    # every partial sum is an integer below 2^53: exact
        h = torch.cat([(rows[i:i + 4096].to(torch.float64) - lo) @ weights for i in range(0, N, 4096)]).long()
        key = h[:, 0] * (1 << 21) + torch.remainder(h[:, 1], 1 << 21) if int(h.max()) < (1 << 41) \
            else h[:, 0] ^ (h[:, 1] << 17)
        inverse = torch.unique(key, return_inverse=True)[1]
        rep = first_of_each(inverse)
        twin = rep.index_select(0, inverse)
        if not all(torch.equal(rows[i:i + 4096], rows.index_select(0, twin[i:i + 4096])) for i in range(0, N, 4096)):
            inverse = None                                 # a collision: group exactly
    if inverse is None:
        inverse = torch.unique(rows, dim=0, return_inverse=True)[1]
        rep = first_of_each(inverse)
    row_id, order = in_first_use_order(inverse)
    return row_id, rows.index_select(0, rep.index_select(0, order))


class GrammarSet(CompiledGrammar):
    """Grammars side by side in one factored table (build with combine()).

        starts         list[int]       the grammars' start states in the combined state space, in order
                                       (one per grammar; several for grammars compiled together)
        state_offset   list[int] [G]   grammar i's state s (s < its done state) is state_offset[i] + s
        done_state     int             the one done state all grammars share (the last state)
        grammars       list            the grammars combined (for their automata and metadata)
    """

    def __init__(self, grammars: list[CompiledGrammar]):
        g0 = grammars[0]
        dev = g0.device
        self.grammars = grammars
        # joint token classes, numbered by first use (so the table does not depend on hashing)
        stacked = torch.stack([g.token_class.to(torch.int64) for g in grammars], 1)          # [V, G]
        joint, rep = classes_of(stacked)
        joint, order = in_first_use_order(joint)
        rep = rep[order]                                                                     # [C] first token
        # state offsets: every grammar's states but its done state, then the shared done state
        sizes = [g.num_states - 1 for g in grammars]
        offsets = [0]
        for n in sizes[:-1]:
            offsets.append(offsets[-1] + n)
        done = offsets[-1] + sizes[-1]
        # each grammar's rows, re-indexed by the joint classes, written into one buffer (int32, then int16 if it
        # fits); codes unchanged: grammar g's target list moves past the lists before it, and so do the bases
        # of its segments (table/next_codes.py), so its absolute codes read the same states as before
        row_base, target_base = [0], [0]
        for g in grammars:
            row_base.append(row_base[-1] + g.num_rows)
            target_base.append(target_base[-1] + g.targets.numel())
        rows = torch.empty((row_base[-1], len(rep)), dtype=torch.int32, device=dev)           # [sum R_g, C]
        for g, base in zip(grammars, row_base):
            all_rows = torch.arange(g.num_rows, device=dev)             # packed grammars: their rows written out
            rows[base:base + g.num_rows].copy_(row_codes(g, all_rows).index_select(1, g.token_class.to(torch.int64)
                                                                                   .index_select(0, rep)))
        targets = torch.cat([torch.where(g.targets == g.done_state, done, g.targets.to(torch.int64) + off)
                             for g, off in zip(grammars, offsets)])                         # [sum T_g]
        seg_start, seg_base = [], []
        for g, off, tbase in zip(grammars, offsets, target_base):
            keep = g.segment_start.to(torch.int64) < g.done_state      # its done state is the shared one
            seg_start.append(g.segment_start.to(torch.int64)[keep] + off)
            seg_base.append(g.segment_base.to(torch.int64)[keep] + tbase)
        g0_done = _segment_of(g0, g0.done_state)
        seg_start.append(torch.tensor([done], device=dev))                 # the shared done state reads as g0's
        seg_base.append(torch.tensor([int(g0.segment_base[g0_done])], device=dev))
        row_id, row_next = _share_rows(rows)
        row_legal = torch.empty(row_next.shape[0], dtype=torch.int32, device=dev)
        row_final = torch.empty(row_next.shape[0], dtype=torch.bool, device=dev)
        row_legal[row_id] = torch.cat([g.row_legal.to(torch.int32) for g in grammars])      # equal rows: equal
        row_final[row_id] = torch.cat([g.row_final for g in grammars])
        parts, done_legal = [], set()
        for g, base in zip(grammars, row_base):
            sr = row_id.index_select(0, g.state_row.to(torch.int64) + base)                  # [S_g]
            parts.append(sr[:-1])
            done_legal.add(tuple(torch.nonzero(row_next[int(sr[-1])] != -1).flatten().tolist()))
        if len(done_legal) != 1:
            raise GrammarSetError("combine: the grammars' done states differ (another stop rule?)")
        done_row = row_id[int(g0.state_row[-1]) + row_base[0]].reshape(1)
        state_row = torch.cat(parts + [done_row])                                             # [S]
        meta = {"format": "batchmask-grammar-set", "vocab_hash": (g0.meta or {}).get("vocab_hash"),
                "grammars": [g.meta for g in grammars]}
        width = table_dtype(row_next)
        row_next, packed = row_next.to(width), {}
        legal = int((row_next != -1).sum())
        force = True if any(g.packed for g in grammars) and len(rep) <= MAX_CLASSES else None
        if want_packed(force, *row_next.shape, width, legal=legal):
            # packed like its inputs, or large and sparse (table/packed.py): the joint table packed again
            row_next, base, check = pack_dense(row_next)
            packed = {"row_base": base, "row_check": check, "num_classes": len(rep)}
        super().__init__(joint.to(torch.int32), state_row.to(width), row_next,
                         row_legal, row_final, targets.to(torch.int32), torch.cat(seg_start).to(torch.int32),
                         torch.cat(seg_base).to(torch.int32), offsets[0] + g0.start, g0.eos_id, done,
                         g0.token_bytes, meta, None, stop_ids=g0.stop_ids, **packed)
        self.state_offset = offsets
        self.grammar_starts = [[off + s for s in g.starts] for g, off in zip(grammars, offsets)]
        self.starts = [s for starts in self.grammar_starts for s in starts]
        self.compile_seconds = sum(g.compile_seconds for g in grammars)

    # --- which grammar a state belongs to ------------------------------------------------------
    def grammar_of(self, state: int) -> int:
        """The index of the grammar owning `state` (the shared done state: -1)."""
        state = int(state)
        if not 0 <= state < self.num_states:
            raise IndexError(f"state {state} out of range [0, {self.num_states})")
        if state == self.done_state:
            return -1
        return bisect.bisect_right(self.state_offset, state) - 1

    def _local(self, state: int):
        i = self.grammar_of(state)
        if i < 0:
            return None, None
        return self.grammars[i], int(state) - self.state_offset[i]

    # --- host-side helpers, by owner ----------------------------------------------------------
    def finish_bytes(self, state: int) -> bytes:
        g, s = self._local(state)
        return b"" if g is None else g.finish_bytes(s)

    def describe(self, state: int) -> list:
        g, s = self._local(state)
        return ["done"] if g is None else g.describe(s)

    def _forced_tokens(self, tokenizer, max_tokens: int) -> ForcedTokens:
        """Each grammar's forced tokens, its states moved to where they sit here (its done state never follows a
        forced token: stop ids are never forced)."""
        return concat([g.forced_tokens(tokenizer, max_tokens) for g in self.grammars], self.state_offset)

    def to(self, device) -> GrammarSet:
        return GrammarSet([g.to(device) for g in self.grammars])

    def save(self, path) -> None:
        raise GrammarSetError("a combined table is not saved: save (or cache) the grammars it combines")

    def __repr__(self) -> str:
        return (f"GrammarSet(grammars={len(self.grammars)}, states={self.num_states}, rows={self.num_rows}, "
                f"classes={self.num_classes}, vocab={self.vocab_size}, bytes={self.nbytes}, device={self.device})")
