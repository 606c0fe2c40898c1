"""
CPU fast paths of the batch masker, choosing tokens: the tokens of the reference (mask_torch.py) with far less
work. (Masking and advancing: mask_cpu.py.)

- Greedy: the first maximum of the raw row (a blocked maximum, faster than argmax) is the answer whenever it is
  legal; only rows whose maximum is illegal pay for a masked copy (short sides, short_sides.py).
- Sampling: the search of gumbel.py: one logsumexp pass over the logits, then the noise of the best block of
  each row (and of the few other blocks that could still win), instead of a uniform per (row, token).
- Top-p: the nucleus from numpy's sort of the probability values (torch's CPU sort, with the indices the
  reference asks for, is 20x slower), then the same search over legal tokens inside it.

These paths size their index lists on the host (free on the CPU). A row whose logits hold NaN or +inf takes the
reference, which defines the result.
"""
from __future__ import annotations

import numpy as np
import torch
from batchmask.kernels import gumbel, mask_torch, rng
from batchmask.kernels.mask_cpu import advance_, mask_logits_, row_entries, sides_of
from batchmask.kernels.tables import Rows, Tables, first_legal_token, legal_counts, legal_mask, next_states, row_ids

from batchmask.table.next_codes import ILLEGAL
from batchmask.table.packed import row_codes

NEG_INF = float("-inf")


# ----------------------------------------------------------------------------------------------------------
# greedy

FIRST_MAX_BLOCK = 128  # ids per block in first_max: the block maxima are a vectorised amax over contiguous ids


def first_max(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """scores: [b, V] (any float dtype, any strides) -> (max [b], int64 [b] the lowest index holding it).

    Equals (scores.max(1), scores.argmax(1)) for non-NaN scores, ~3x faster on the CPU, where argmax is a
    scalar loop: the block maxima come from a vectorised amax, argmax then runs over the [b, V / 128]
    maxima (the first block holding the maximum holds its first occurrence) and over that one block.
    A NaN makes its row's maximum NaN (amax propagates it), which callers treat as not finite.
    """
    b, V = scores.shape
    blk = FIRST_MAX_BLOCK
    if V < 2 * blk:
        idx = scores.argmax(dim=1)
        return scores.gather(1, idx[:, None])[:, 0], idx
    n_full = V // blk
    block_max = scores[:, :n_full * blk].unflatten(1, (n_full, blk)).amax(dim=2)  # [b, n_full]
    if V > n_full * blk:
        block_max = torch.cat([block_max, scores[:, n_full * blk:].amax(dim=1, keepdim=True)], dim=1)
    block = block_max.argmax(dim=1)  # [b] first block holding the maximum
    base = block * blk  # [b]
    # the ids of that block; the short last block repeats its last id, which cannot come first
    ids = (base[:, None] + torch.arange(blk)).clamp_(max=V - 1)  # [b, blk]
    idx = base + scores.gather(1, ids).argmax(dim=1)  # [b]
    return block_max.gather(1, block[:, None])[:, 0], idx


def segment_first_max(x: torch.Tensor, row: torch.Tensor, token: torch.Tensor, b: int):
    """Per row, the maximum of the listed scores x float32 [N] of (row, token) int64 [N] and the lowest token
    holding it -> (float32 [b] maximum (-inf for a row without entries), int64 [b] token (-1 for none))."""
    none = torch.iinfo(torch.int64).max
    best = torch.full((b,), NEG_INF).scatter_reduce_(0, row, x, reduce="amax")  # [b]
    winner = torch.where(x == best.index_select(0, row), token, none)  # [N]
    tok = torch.full((b,), none, dtype=torch.int64).scatter_reduce_(0, row, winner, reduce="amin")
    return best, torch.where(tok == none, -1, tok)  # [b]


def _greedy(logits: torch.Tensor, state: torch.Tensor, t: Tables, redo: list) -> torch.Tensor:
    """Greedy tokens of the rows whose answer is cheap; rows appended to redo take the reference."""
    V, width, b = t.vocab_size, logits.shape[1], state.numel()
    sides = sides_of(t)
    group = sides.groups(state.numpy())  # [b]
    few = torch.from_numpy(sides.few_legal[group])  # [b]
    tok = torch.empty(b, dtype=torch.int64)
    keep_rows = few.nonzero()[:, 0]  # [k] rows scored over their legal tokens only
    if keep_rows.numel():
        row, legal, _ = row_entries(keep_rows, group, sides)  # [N] ascending ids per row
        x = logits.take(row * width + legal).float()  # [N]
        best, pick = segment_first_max(x.masked_fill_(torch.isnan(x), NEG_INF), row, legal, b)
        tok.index_copy_(0, keep_rows, torch.where(pick >= 0, pick, t.eos_id).index_select(0, keep_rows))
        redo.append(keep_rows[best.index_select(0, keep_rows) == float("inf")])  # is any legal logit finite?
    dense_rows = (~few).nonzero()[:, 0]  # [m]
    if dense_rows.numel():
        if 2 * dense_rows.numel() >= b:  # most rows: one pass over a view beats copying them out
            best, first = (x.index_select(0, dense_rows) for x in first_max(logits[:, :V]))  # [m]
        else:
            best, first = first_max(logits[dense_rows, :V])  # [m]
        nxt = next_states(state.index_select(0, dense_rows), t.token_class.index_select(0, first), t)  # [m]
        tok.index_copy_(0, dense_rows, first)
        # the row's first maximum, if legal and finite, is also its first legal maximum (an equal legal score
        # earlier would have come first); rows whose maximum is not finite (NaN, overflow) take the reference
        finite = best.float().abs() < float("inf")
        redo.append(dense_rows[~finite])
        masked = dense_rows[(nxt < 0) & finite]  # the maximum is illegal: mask a copy of these rows
        if masked.numel():
            x = logits[masked, :V].float()  # [r, V]
            mask_logits_(x, state.index_select(0, masked), t)
            best, first = first_max(x)  # legal logits are finite or -inf here
            tok.index_copy_(0, masked, first)
            redo.append(masked[best == NEG_INF])  # no finite legal logit: the reference's first legal token
    return tok


# ----------------------------------------------------------------------------------------------------------
# sampling: the block search of gumbel.py

def _legal_at(state: torch.Tensor, t: Tables):
    """allowed(row, ids) for the grammar: row int64 [n], ids int64 [n, K] -> bool [n, K] legal in row's state."""
    def allowed(row: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        codes = row_codes(t, t.state_row.index_select(0, state.index_select(0, row)).long())  # [n, C]
        return codes.gather(1, t.token_class.index_select(0, ids.view(-1)).view_as(ids).long()) != ILLEGAL
    return allowed


def _visit(y: torch.Tensor, keys: torch.Tensor, G: torch.Tensor, row: torch.Tensor, block: torch.Tensor,
           allowed) -> tuple[torch.Tensor, torch.Tensor]:
    """z and token of the best allowed token (by h) of each (row, block) pair, int64 [n] each -> float32 [n] z
    (-inf where the block has no allowed finite token), int64 [n] token. The reference's per-block step."""
    V, K = y.shape[1], gumbel.NOISE_BLOCK
    ids = block[:, None] * K + torch.arange(K)  # [n, K]
    valid = ids < V
    ids = ids.clamp_(max=V - 1)
    p = y[row[:, None], ids].masked_fill_(~valid, NEG_INF)  # [n, K] finite or -inf (rows with NaN/+inf: reference)
    h = gumbel.token_scores(p, keys.index_select(0, row), ids)  # [n, K]
    Z = h.amax(dim=1)  # [n] over all tokens of the block
    hc = h.masked_fill_(~(allowed(row, ids) & valid), NEG_INF)
    j = hc.argmax(dim=1)  # [n] first maximum
    z = gumbel.truncate(G[row, block], Z, hc.gather(1, j[:, None])[:, 0])
    return z, block * K + j


def _search(y: torch.Tensor, keys: torch.Tensor, G: torch.Tensor, candidate: torch.Tensor, allowed):
    """The maximum of the process over the allowed tokens: y float32 [b, V], G [b, nb], candidate bool [b, nb]
    (the blocks holding an allowed token) -> (float32 [b] its z, -inf for none; int64 [b] its token)."""
    b = y.shape[0]
    rows = torch.arange(b)
    first = G.masked_fill(~candidate, NEG_INF).argmax(dim=1)  # [b] the best block holding an allowed token
    z1, tok1 = _visit(y, keys, G, rows, first, allowed)  # [b]
    # every other block whose maximum could still beat it (ties included: the lower id must win them)
    more = candidate & (G >= z1[:, None])
    more[rows, first] = False
    r2, b2 = more.nonzero(as_tuple=True)  # [n2] usually none or a few
    z2, tok2 = _visit(y, keys, G, r2, b2, allowed)
    return segment_first_max(torch.cat([z1, z2]), torch.cat([rows, r2]), torch.cat([tok1, tok2]), b)


def _not_clean(lse: torch.Tensor) -> torch.Tensor:
    """Rows whose block logsumexp shows a NaN or +inf logit (they take the reference) -> int64 [k]."""
    return (torch.isnan(lse) | (lse == float("inf"))).any(dim=1).nonzero()[:, 0]


def _sampled(logits: torch.Tensor, state: torch.Tensor, keys: torch.Tensor, t: Tables, temperature: float,
             redo: list) -> torch.Tensor:
    """Sampled tokens by the search of gumbel.py; rows appended to redo (NaN, +inf) take the reference."""
    y = mask_torch.tempered(logits[:, :t.vocab_size], temperature)  # [b, V] a view of float32 logits at T = 1
    lse = gumbel.block_lse(y)  # [b, nb]: NaN or +inf wherever a block holds one
    redo.append(_not_clean(lse))
    sides = sides_of(t)
    group = sides.groups(state.numpy())  # [b] first: it may rebuild the arrays read next
    candidate = torch.from_numpy(sides.block_legal[group])  # [b, nb]
    best, tok = _search(y, keys, gumbel.block_scores(lse, keys), candidate, _legal_at(state, t))
    return torch.where(best > NEG_INF, tok, first_legal_token(state, t))  # no legal finite logit: first legal


def top_p_keep(p: torch.Tensor, top_p: float) -> torch.Tensor:
    """mask_torch.top_p_keep, the same set, from numpy's sort of the probability values alone: the kept tokens
    are those above the last kept value, and the lowest ids among those equal to it (the reference's stable
    order). p float32 [b, V] -> bool [b, V]."""
    probs = torch.softmax(p, dim=1)  # [b, V] the reference's values
    asc = torch.from_numpy(np.sort(probs.numpy(), axis=1))  # [b, V] ascending
    sorted_p = asc.flip(1)  # [b, V] descending
    mass_before = sorted_p.cumsum(dim=1) - sorted_p  # [b, V] the reference's numbers, rank by rank
    # the kept ranks (mass_before < top_p) almost always form a prefix: rounding can make mass_before dip by an
    # ulp, and where that crosses top_p the reference decides the row. Counts by numpy and binary searches:
    # sums and cumsums of bool [b, V] tensors are scalar loops in torch on the CPU.
    kept = mass_before.numpy() < top_p  # [b, V]
    count = np.count_nonzero(kept, axis=1)  # [b]
    prefix = count == np.where(kept.all(axis=1), kept.shape[1], np.argmin(kept, axis=1))  # first False == count
    n = torch.from_numpy(count).clamp_(min=1)[:, None]  # [b, 1] kept ranks (0 only for a row of NaN)
    last = sorted_p.gather(1, n - 1)  # [b, 1] the smallest kept probability
    n_above = p.shape[1] - torch.searchsorted(asc, last, right=True)  # [b, 1]
    n_ties = p.shape[1] - n_above - torch.searchsorted(asc, last)  # [b, 1]
    keep = probs >= last
    crowded = (n_ties > n - n_above)[:, 0].nonzero()[:, 0]  # the boundary falls inside a run of equal values
    if crowded.numel():  # the lowest ids of the run are kept (the reference's stable order)
        ties = probs[crowded] == last[crowded]
        keep[crowded] = (probs[crowded] > last[crowded]) | (ties & (ties.cumsum(dim=1) <= (n - n_above)[crowded]))
    odd = torch.from_numpy(np.flatnonzero(~prefix))
    if odd.numel():
        keep[odd] = mask_torch.top_p_keep(p[odd], top_p)
    return keep


def _top_p(logits: torch.Tensor, state: torch.Tensor, keys: torch.Tensor, t: Tables, temperature: float,
           top_p: float, redo: list) -> torch.Tensor:
    """Sampled tokens inside the nucleus of the legal tokens: the search over legal & nucleus."""
    V, K = t.vocab_size, gumbel.NOISE_BLOCK
    y = mask_torch.tempered(logits[:, :V], temperature)  # [b, V]
    lse = gumbel.block_lse(y)
    redo.append(_not_clean(lse))
    legal = legal_mask(state, t)  # [b, V]
    allowed = legal & top_p_keep(torch.where(legal & (y.abs() < float("inf")), y, NEG_INF), top_p)  # [b, V]
    nb = gumbel.num_blocks(V)
    padded = torch.nn.functional.pad(allowed, (0, nb * K - V), value=False)
    candidate = padded.view(-1, nb, K).any(dim=2)  # [b, nb]
    best, tok = _search(y, keys, gumbel.block_scores(lse, keys), candidate, lambda row, ids: allowed[row[:, None], ids])
    return torch.where(best > NEG_INF, tok, first_legal_token(state, t))


def choose_tokens(logits: torch.Tensor, state: torch.Tensor, step: torch.Tensor, t: Tables, temperature: float,
                  top_p: float, seed: int, ids: torch.Tensor | None = None) -> torch.Tensor:
    """mask_torch.choose_tokens, the CPU way (the same tokens). logits [b, V'] -> int64 [b]."""
    ids = torch.arange(state.numel()) if ids is None else ids
    keys = rng.row_keys(seed, ids, step)  # [b]
    redo: list[torch.Tensor] = []
    if temperature <= 0:
        tok = _greedy(logits, state, t, redo)
    elif top_p < 1.0:
        tok = _top_p(logits, state, keys, t, temperature, top_p, redo)
    else:
        tok = _sampled(logits, state, keys, t, temperature, redo)
    redo = torch.cat(redo) if redo else torch.zeros(0, dtype=torch.int64)
    if redo.numel():
        tok.index_copy_(0, redo, mask_torch.choose(
            logits.index_select(0, redo)[:, :t.vocab_size], legal_mask(state.index_select(0, redo), t),
            keys.index_select(0, redo), temperature, top_p, first_legal_token(state.index_select(0, redo), t)))
    return tok


def sample_(logits: torch.Tensor, rows: Rows, t: Tables, temperature: float = 0.0, top_p: float = 1.0,
            seed: int = 0, rows_per_chunk: int | None = None, advance=None) -> tuple[torch.Tensor, torch.Tensor]:
    """mask_torch.sample_ with the CPU fast paths (other devices take the reference)."""
    if logits.device.type != "cpu":
        return mask_torch.sample_(logits, rows, t, temperature, top_p, seed, rows_per_chunk, advance)
    B, V = logits.shape[0], t.vocab_size
    chunk = rows_per_chunk or max(1, (1 << 22) // V)
    counts = legal_counts(rows.state, t)  # [B] legal counts before the move
    tokens = torch.cat([choose_tokens(logits[r:r + chunk], rows.state[r:r + chunk], rows.step[r:r + chunk], t,
                                      temperature, top_p, seed, ids=row_ids(rows, r, min(chunk, B - r)))
                        for r in range(0, B, chunk)])  # [B]
    (advance or (lambda tok: advance_(tok, rows, t)))(tokens)
    return tokens, counts
