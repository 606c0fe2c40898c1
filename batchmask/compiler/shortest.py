"""The shortest way to finish a value in tokens: from any state of a CompiledGrammar, the fewest tokens (and among
those, the fewest bytes) that reach a state where the value is complete, read from the token table itself.

    Completer(grammar).tokens(state)  -> [id, ...]   legal one after another from `state`; the last state is final

Used to close a row that a token ceiling cut mid-call (batchmask.hf: `LogitsProcessor.replies`), so that what it
appends is exactly what the masker would have allowed, token by token, not bytes to be tokenized afterwards.

How: a breadth-first search over the grammar's states, one level per token, each level one batched gather over
the frontier's table rows (all token classes at once) and one decode of their next-state codes
(table/next_codes.py); no step per token id and none per (state, class) pair. A token class stands for its
shortest token with text (ties: the lowest id), so a class's byte cost is that token's length; tokens without
text (special tokens, padding, the stop ids) never occur inside a value and are not used. Within a level, a
state keeps the predecessor that reached it in the fewest bytes (a shortest path in tokens only passes through
states at their BFS depth, so this is exact): fewest tokens first, fewest bytes second, then the first class in
table order.
"""
from __future__ import annotations

import numpy as np
import torch

from ..table.next_codes import decode_next

CHUNK = 1 << 22          # (state, class) entries decoded at once: bounds the memory of a wide frontier


class CompletionError(ValueError):
    """No complete value can be reached from a state (a grammar without an accepting state after it)."""


class Completer:
    """Shortest completions in one grammar (the class representatives are worked out once)."""

    def __init__(self, grammar):
        self.grammar = grammar
        dev = grammar.device
        V = grammar.vocab_size
        lengths = torch.from_numpy(np.fromiter(map(len, grammar.token_bytes), dtype=np.int64, count=V)).to(dev)
        # per class, the shortest token with text: key = length * V + id, minimised (textless ids never win)
        big = int(lengths.max()) + 1 if V else 1
        key = torch.where(lengths > 0, lengths, torch.full_like(lengths, big)) * V + torch.arange(V, device=dev)
        best = torch.full((grammar.num_classes,), big * V + V, dtype=torch.int64, device=dev)
        best.scatter_reduce_(0, grammar.token_class.long(), key, reduce="amin")
        usable = best < big * V                                         # [C] the class has a token with text
        self.columns = usable.nonzero().flatten()                       # [C'] the classes searched
        self.token = (best % V)[self.columns]                           # [C'] its representative token
        self.cost = (best // V)[self.columns]                           # [C'] that token's bytes

    def tokens(self, state: int) -> list[int]:
        """The token ids (see the module docstring) from `state` to a complete value; [] where it is complete."""
        g = self.grammar
        state = int(state)
        if not 0 <= state < g.num_states:
            raise IndexError(f"state {state} out of range [0, {g.num_states})")
        if state == g.done_state or bool(g.is_final([state])[0]):
            return []
        dev = g.device
        seen = torch.zeros(g.num_states, dtype=torch.bool, device=dev)
        parent = torch.full((g.num_states, 2), -1, dtype=torch.int64, device=dev)    # (state before, column)
        seen[state] = True
        frontier = torch.tensor([state], device=dev)                    # states first reached at this depth
        spent = torch.zeros(1, dtype=torch.int64, device=dev)           # their bytes so far
        while frontier.numel():
            to, prev, col, cost = self._level(frontier, spent, seen)
            if not to.numel():
                break
            seen[to] = True
            parent[to, 0], parent[to, 1] = prev, col
            final = g.is_final(to)
            if bool(final.any()):
                ends, end_cost = to[final], cost[final]
                end = int(ends[int(torch.argmin(end_cost))])            # the first of the cheapest (ends ascend)
                return self._path(parent, state, end)
            frontier, spent = to, cost
        raise CompletionError(f"state {state}: no complete value can be reached from it")

    def _level(self, frontier, spent, seen):
        """The states first reached from `frontier` by one token: (states ascending, predecessor, column, bytes)."""
        g = self.grammar
        per = max(1, CHUNK // max(1, self.columns.numel()))
        found = []
        for at in range(0, frontier.numel(), per):
            src = frontier[at:at + per]                                             # [F]
            codes = g.row_next[g.state_row[src].long()].index_select(1, self.columns)   # [F, C']
            nxt = decode_next(codes, src[:, None], g.targets, g.segment_start, g.segment_base)
            ok = (nxt >= 0) & (nxt != g.done_state)
            ok &= ~seen[nxt.clamp(min=0)]
            f, c = ok.nonzero(as_tuple=True)
            found.append((nxt[f, c], at + f, c))
        to, f, c = (torch.cat(parts) for parts in zip(*found))
        cost = spent[f] + self.cost[c]
        if not to.numel():
            return to, f, c, cost
        # per target, the cheapest candidate (ties: the first found, i.e. frontier order then class order)
        order = torch.arange(to.numel(), device=to.device)
        states, which = torch.unique(to, return_inverse=True)                     # ascending
        pick_key = cost * to.numel() + order
        best = torch.full((states.numel(),), int(pick_key.max()) + 1, dtype=torch.int64, device=to.device)
        best.scatter_reduce_(0, which, pick_key, reduce="amin")
        pick = best % to.numel()
        return states, frontier[f[pick]], c[pick], cost[pick]

    def _path(self, parent, start: int, end: int) -> list[int]:
        steps = parent.cpu()
        out, s = [], end
        while s != start:                                   # one step per token of the completion
            prev, col = steps[s].tolist()
            out.append(int(self.token[col]))
            s = prev
        return out[::-1]
