"""
The plain torch reference of the batch masker: mask, advance and choose tokens for a whole batch with dense
[B, V] tensor ops, on any device and without a host sync.

This is the specification: the Triton kernels (mask_triton.py) and the CPU fast paths (mask_cpu.py) must give
its results (bit for bit for masking and advancing, the same tokens for choosing). It is also the torch backend
off the CPU. Tables, Rows and the next-state lookup are in tables.py; the Gumbel process in gumbel.py.

Choosing a token, per row, over the tokens it may emit (legal, and inside the nucleus when top_p < 1), with
y = logits (greedy) or logits / T (sampling), computed in float32, and NaN read as -inf:
  - no legal y is finite (the logits overflowed): the first legal token (EOS where none is legal: a dead
    state, which the advance then reports);
  - else, a legal y is +inf: the first such token;
  - else greedy: the first maximum of y; sampling: the maximum of the Gumbel process of gumbel.py.
"""
from __future__ import annotations

import torch
from batchmask.kernels import gumbel, rng
from batchmask.kernels.tables import Rows, Tables, first_legal_token, legal_counts, legal_mask, next_states, row_ids

NEG_INF = float("-inf")


# ----------------------------------------------------------------------------------------------------------
# masking

def mask_logits_(logits: torch.Tensor, state: torch.Tensor, t: Tables) -> torch.Tensor:
    """In place: illegal and padded logits -> -inf, NaN -> -inf, other legal ones keep their exact value.
    logits: [B, V'] -> int32 [B] legal counts."""
    V = t.vocab_size
    x = logits[:, :V]
    x.masked_fill_(~legal_mask(state, t) | torch.isnan(x), NEG_INF)
    if logits.shape[1] > V:
        logits[:, V:].fill_(NEG_INF)  # ids the model has but the tokenizer does not
    return legal_counts(state, t)  # [B]


# ----------------------------------------------------------------------------------------------------------
# advancing

def advance_(tokens: torch.Tensor, rows: Rows, t: Tables) -> None:
    """Move every row by its token (int [B]); an illegal token leaves the row as it was and records a fault."""
    V, H = t.vocab_size, rows.history.shape[1]
    tokens = tokens.long()  # [B]
    state = rows.state  # [B] int32
    clamped = tokens.clamp(0, V - 1)  # padded / negative ids read a real column, then fail the in_vocab test
    nxt = next_states(state, t.token_class.index_select(0, clamped), t)  # [B]
    ok = (nxt >= 0) & (clamped == tokens)
    moved = ok & (state != t.done_state)  # a finished row repeating EOS adds nothing to its text

    # history[r, step[r]] = token, for rows that moved and still have room (others rewrite what is there)
    col = rows.step.clamp(max=H - 1).long()[:, None]  # [B, 1]
    write = (moved & (rows.step < H))[:, None]
    rows.history.scatter_(1, col, torch.where(write, tokens.int()[:, None], rows.history.gather(1, col)))

    # the first fault of a row is the informative one: later ones follow from it
    new_fault = ~ok & (rows.fault[:, 0] == 0)  # [B]
    record = torch.stack([torch.ones_like(tokens), tokens, state.long()], dim=1)  # [B, 3]
    rows.fault.copy_(torch.where(new_fault[:, None], record, rows.fault))
    rows.step.add_(moved)
    rows.state.copy_(torch.where(ok, nxt, state))


def write_ragged_(buf: torch.Tensor, start: torch.Tensor, values: torch.Tensor, counts: torch.Tensor) -> None:
    """In place: buf[r, start[r] + j] = values[r, j] for j < counts[r] (buf [B, H], values [B, K], K <= H; the
    caller keeps start + counts <= H). The other entries of the [B, K] write rewrite what they meet: wrapped into
    the row, K columns of a row never meet, so they never land on a written one."""
    K, H = values.shape[1], buf.shape[1]
    j = torch.arange(K, device=buf.device)
    col = torch.remainder(start.long()[:, None] + j, H)  # [B, K]
    keep = j[None, :] < counts.long()[:, None]
    buf.scatter_(1, col, torch.where(keep, values.to(buf.dtype), buf.gather(1, col)))


def skip_(rows: Rows, tokens: torch.Tensor, counts: torch.Tensor, states: torch.Tensor) -> None:
    """Jump-forward: row r takes its first counts[r] tokens of tokens [B, K] (walked through the grammar
    beforehand: no check) and is then in states[r] (where counts[r] > 0)."""
    room = (rows.history.shape[1] - rows.step.long()).clamp(min=0)
    write_ragged_(rows.history, rows.step, tokens, torch.minimum(counts.long(), room))
    rows.step.add_(counts.to(rows.step.dtype))
    rows.state.copy_(torch.where(counts > 0, states.to(rows.state.dtype), rows.state))


# ----------------------------------------------------------------------------------------------------------
# choosing

def first_true(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """bool [b, V] -> (bool [b] any, int64 [b] the lowest index holding True, 0 where none)."""
    return x.any(dim=1), x.to(torch.uint8).argmax(dim=1)  # argmax returns the first maximum


def tempered(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """float32 [b, V]: logits (greedy) or logits / T, as every backend computes it (x * (1 / T) in float32)."""
    y = logits.float()  # float32 logits: the tensor itself (no copy)
    inv_t = 1.0 / temperature if temperature > 0 else 1.0
    if inv_t != 1.0:  # x * 1 is x bit for bit: T = 1 skips a pass
        y = y * torch.tensor(inv_t, dtype=torch.float32, device=y.device)
    return y


def top_p_keep(p: torch.Tensor, top_p: float) -> torch.Tensor:
    """p: float32 [b, V] potentials (-inf outside the legal set) -> bool [b, V], the smallest set of most likely
    tokens whose probability reaches top_p (always at least the most likely one)."""
    probs = torch.softmax(p, dim=1)  # [b, V]
    sorted_p, order = probs.sort(dim=1, descending=True, stable=True)  # [b, V]
    mass_before = sorted_p.cumsum(dim=1) - sorted_p  # probability of the tokens ranked above
    return torch.zeros_like(sorted_p, dtype=torch.bool).scatter_(1, order, mass_before < top_p)


def process_argmax(y: torch.Tensor, candidate: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """The maximum of the Gumbel process (gumbel.py) over the candidate tokens, every block computed.
    y float32 [b, V], candidate bool [b, V], keys int64 [b] -> int64 [b] (-1 where no candidate has a finite y).

    Per block: its best candidate by h (the lowest id among equals), that candidate's z; then the block whose
    z is largest (the lowest block among equals)."""
    b, V = y.shape
    K, nb = gumbel.NOISE_BLOCK, gumbel.num_blocks(V)
    p = gumbel.potentials(y)  # [b, V]
    G = gumbel.block_scores(gumbel.block_lse(p), keys)  # [b, nb]
    h = gumbel.token_scores(p, keys, torch.arange(V, device=y.device).expand(b, V))  # [b, V]
    pad = nb * K - V
    h = torch.nn.functional.pad(h, (0, pad), value=NEG_INF).view(b, nb, K)
    candidate = torch.nn.functional.pad(candidate, (0, pad), value=False).view(b, nb, K)
    Z = h.amax(dim=2)  # [b, nb] over all tokens of the block
    hc = h.masked_fill(~candidate, NEG_INF)
    j = hc.argmax(dim=2)  # [b, nb] first maximum
    z = gumbel.truncate(G, Z, hc.gather(2, j[..., None])[..., 0])  # [b, nb]
    blk = z.argmax(dim=1)  # [b]
    tok = blk * K + j.gather(1, blk[:, None])[:, 0]
    return torch.where(z.gather(1, blk[:, None])[:, 0] > NEG_INF, tok, -1)


def choose(logits: torch.Tensor, legal: torch.Tensor, keys: torch.Tensor, temperature: float, top_p: float,
           fallback: torch.Tensor) -> torch.Tensor:
    """The token of every row (module docstring). logits [b, V] (the grammar's V), legal bool [b, V],
    keys int64 [b] (rng.row_keys), fallback int64 [b] (the token of a row without a legal id) -> int64 [b]."""
    y = tempered(logits, temperature)
    y = y.masked_fill(torch.isnan(y), NEG_INF)  # [b, V]
    if temperature <= 0:
        tok = y.masked_fill(~legal, NEG_INF).argmax(dim=1)  # first maximum
    else:
        candidate = legal
        if top_p < 1.0:
            candidate = legal & top_p_keep(gumbel.potentials(y).masked_fill(~legal, NEG_INF), top_p)
        tok = process_argmax(y, candidate, keys)
    has_legal, first = first_true(legal)
    has_inf, first_inf = first_true(legal & (y == float("inf")))
    finite = (legal & torch.isfinite(y)).any(dim=1)
    return torch.where(~finite, torch.where(has_legal, first, fallback), torch.where(has_inf, first_inf, tok))


def choose_tokens(logits: torch.Tensor, state: torch.Tensor, step: torch.Tensor, t: Tables, temperature: float,
                  top_p: float, seed: int, ids: torch.Tensor | None = None) -> torch.Tensor:
    """Masked greedy / sampled choice for b rows at state [b], step [b], keyed by ids (default 0..b-1).
    logits [b, V'] -> int64 [b]."""
    ids = torch.arange(state.numel(), device=state.device) if ids is None else ids
    return choose(logits[:, :t.vocab_size], legal_mask(state, t), rng.row_keys(seed, ids, step), temperature,
                  top_p, first_legal_token(state, t))


def sample_(logits: torch.Tensor, rows: Rows, t: Tables, temperature: float = 0.0, top_p: float = 1.0,
            seed: int = 0, rows_per_chunk: int | None = None, advance=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask + choose + advance the whole batch. logits [B, V'] (not modified) -> (int64 [B] tokens, int32 [B]
    legal counts before the move). advance(tokens) replaces advance_ (the other backends pass their own).
    Rows go in chunks so the [b, V] temporaries stay a few MB; a row's draw does not depend on the chunking."""
    B, V = logits.shape[0], t.vocab_size
    chunk = rows_per_chunk or max(1, (1 << 21) // V)
    counts = legal_counts(rows.state, t)  # [B] legal counts before the move
    tokens = torch.cat([
        choose_tokens(logits[r:r + chunk], rows.state[r:r + chunk], rows.step[r:r + chunk], t, temperature,
                      top_p, seed, ids=row_ids(rows, r, min(chunk, B - r)))
        for r in range(0, B, chunk)])  # [B]
    (advance or (lambda tok: advance_(tok, rows, t)))(tokens)
    return tokens, counts
