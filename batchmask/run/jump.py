"""Jump-forward decoding in the generation loop: the tokens the grammar forces, for a whole batch, with no model
step per forced token.

After each row's sampled token the row sits in some grammar state. Where the grammar forces the text that follows
(batchmask/table/forced.py: one byte edge, the frame of a call, the rest of a tool name whose prefix is unique, a
required key), that text's tokens are appended to the row at once and its state moves past them; the next forward
pass takes every row's new tokens together (models/ragged.py: one ragged [B, 1 + K] pass that fills each row's KV
cache; a row without forced text takes its one token). The forced tokens of a call's start state go into its
prefill. Everything here is tensor work on the device: one lookup of [B] states in the sorted forced states, one
gather of [B, K] tokens. The loop reads the per-row counts back with the bools it already reads (one host sync a
step, as before): the ragged pass's width is a host number.

The trade-off: forced text is written in the tokenizer's canonical tokenization of that text (its own encode),
so the model never chooses another split of it. That is usually what it was trained on: training text is
tokenized by the same encode, so a model saw `{"name": "` as encode gives it, and a different split of the same
bytes is text it rarely or never saw. At the boundaries the split is not the canonical one of the whole call: the
model's last token ends where the model put it (forced text starts after it), and the forced run stops before
any state from which a longer legal token could carry on past it, so the model still chooses how text continues
across the end of forced text (`"` or `"pa` before a value).
"""
from __future__ import annotations

import torch

from batchmask.kernels.mask_torch import write_ragged_

from ..table.forced import MAX_TOKENS, ForcedTokens


class JumpForward:
    """A grammar's forced tokens on the device, looked up for a batch of states at once."""

    def __init__(self, grammar, tokenizer, device, max_tokens: int = MAX_TOKENS):
        self.host: ForcedTokens = grammar.forced_tokens(tokenizer, max_tokens)
        data = self.host.to(device)
        self.states, self.offsets, self.tokens, self.after = data.states, data.offsets, data.tokens, data.after
        self.width = self.host.max_tokens          # K: the most tokens one state forces
        self.nbytes = self.host.nbytes

    def start_tokens(self, state: int, stop_ids=()) -> list[int]:
        """The tokens a row starting in `state` is forced to write first (host-side: they join its prefill); an end
        token (a grammar of one fixed text) is left to the first step, which writes it."""
        tokens = self.host.of(state)[0]
        return tokens[:-1] if tokens and tokens[-1] in stop_ids else tokens

    def lookup(self, states: torch.Tensor, room: torch.Tensor):
        """Each row's forced tokens after `states` (int [B]), at most room[b] of them:
        (tokens int64 [B, K], counts int64 [B], the state after them int32 [B]: `states` where counts is 0)."""
        B, K, F = states.shape[0], self.width, self.states.numel()
        if F == 0 or K == 0:
            return (torch.zeros(B, 0, dtype=torch.long, device=states.device),
                    torch.zeros(B, dtype=torch.long, device=states.device), states.to(torch.int32))
        s = states.to(torch.int32).contiguous()
        i = torch.searchsorted(self.states, s).clamp(max=F - 1)              # [B]
        lo = self.offsets[i].long()
        n = torch.where(self.states[i] == s, self.offsets[i + 1].long() - lo, 0)
        n = torch.minimum(n, room.long().clamp(min=0))
        j = torch.arange(K, device=states.device)
        at = (lo[:, None] + j).clamp(max=self.tokens.numel() - 1)            # [B, K]
        tokens = torch.where(j[None, :] < n[:, None], self.tokens[at].long(), 0)
        after = torch.where(n > 0, self.after[(lo + n - 1).clamp(min=0)], s)
        return tokens, n, after


def append_(history: torch.Tensor, n_gen: torch.Tensor, tokens: torch.Tensor, counts: torch.Tensor) -> None:
    """history[b, n_gen[b] + j] = tokens[b, j] for j < counts[b]; n_gen += counts (the loop's own record)."""
    write_ragged_(history, n_gen, tokens, counts)
    n_gen += counts
