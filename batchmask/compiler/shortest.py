"""Closing a value cut short, in tokens: from any state of a CompiledGrammar, the token ids that finish it.

    Completer(grammar).tokens(state)  -> [id, ...]   legal one after another from `state`; the last state is final

Used to close a row that a token ceiling cut mid-call (batchmask.hf: `LogitsProcessor.replies`).

What is appended is the grammar's shortest completion, `grammar.finish_bytes(state)`: the automaton's shortest
path from the state to acceptance (automaton/tree.py, automaton/dfa.py; '?' fills a value still under its
minimum), the one rule the generation loop's `cut` records use too, so both paths close a row alike. Those bytes
are spelled in the fewest tokens of the vocabulary (a shortest path over the byte positions, each step one token
whose bytes come next: lookups of the slices in a bytes -> id map, none per vocabulary entry), ties to the longest
last token, then the lowest id. Any tokens that spell legal bytes are legal (the table is the byte automaton
lifted to tokens), and textless ids (special tokens, padding, the stop ids) are never used; the ids are walked
through the table all the same, and a step it refuses is an error, never a silently wrong row.
"""
from __future__ import annotations

import torch


class CompletionError(ValueError):
    """A state whose completion cannot be written in the vocabulary's tokens, or that the table refuses."""


class Completer:
    """Completions in one grammar (the bytes -> id map is built once)."""

    def __init__(self, grammar):
        self.grammar = grammar
        V = len(grammar.token_bytes)
        # the lowest id of each byte string (a later duplicate, e.g. an added token that repeats a piece, loses)
        self.ids = dict(zip(reversed(grammar.token_bytes), range(V - 1, -1, -1)))
        self.ids.pop(b"", None)
        self.longest = max(map(len, self.ids), default=0)

    def tokens(self, state: int) -> list[int]:
        """The token ids (see the module docstring) from `state` to a complete value; [] where it is complete."""
        g = self.grammar
        state = int(state)
        if not 0 <= state < g.num_states:
            raise IndexError(f"state {state} out of range [0, {g.num_states})")
        owed = g.finish_bytes(state)
        ids = self.spell(owed)
        at = torch.tensor([state], device=g.device)
        for k, t in enumerate(ids):                     # one step per appended token (a completion is short)
            at = g.next_state(at, [t])
            if int(at[0]) < 0:
                raise CompletionError(f"state {state}: the table refuses token {t} ({g.token_bytes[t]!r}) at byte "
                                      f"{sum(len(g.token_bytes[i]) for i in ids[:k])} of the completion {owed!r}")
        if int(at[0]) != g.done_state and not bool(g.is_final(at)[0]):
            raise CompletionError(f"state {state}: the completion {owed!r} does not end the value")
        return ids

    def spell(self, data: bytes) -> list[int]:
        """The fewest token ids whose bytes, one after another, are `data`."""
        n = len(data)
        count = [0] + [n + 1] * n                        # fewest tokens for data[:i]
        step: list[tuple[int, int] | None] = [None] * (n + 1)     # (where the last token starts, its id)
        for i in range(n):                               # positions of the completion, not of the vocabulary
            if count[i] > n:
                continue
            for k in range(min(self.longest, n - i), 0, -1):
                t = self.ids.get(data[i:i + k])
                if t is not None and count[i] + 1 < count[i + k]:
                    count[i + k], step[i + k] = count[i] + 1, (i, t)
        if count[n] > n:
            raise CompletionError(f"the completion {data!r} cannot be written in this vocabulary's tokens")
        out, i = [], n
        while i:
            i, t = step[i]
            out.append(t)
        return out[::-1]
