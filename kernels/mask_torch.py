"""
Plain torch reference for the batch masker: mask, advance and sample a whole batch with a few large tensor ops.

This is both the CPU backend and the specification the Triton kernels in `mask_triton.py` must equal
(bit for bit for masking and advancing, same tokens for sampling). The grammar is a DFA over tokens, factored
by token classes:  next_state = class_next[state, token_class[token]],  -1 = illegal.

All functions work on any device. Names used in the shape comments:
  B rows in the batch, V grammar vocabulary, V' >= V logits width (padded ids are illegal),
  S states, C token classes, H history length (tokens remembered per row).
"""
from dataclasses import dataclass

import torch

from kernels import rng


@dataclass
class Tables:
    """The compiled grammar, as the kernels read it (all on one device, contiguous). Build with make_tables."""
    token_class: torch.Tensor        # int32 [V]     class of every token id
    class_next: torch.Tensor         # int16|int32 [S, C]  next state per (state, class), -1 = illegal
    legal_count: torch.Tensor        # int32 [S]     number of legal token ids per state
    class_first_token: torch.Tensor  # int64 [C]     lowest token id of each class (V for an empty class)
    done_state: int                  # absorbing state after EOS (only EOS legal)
    eos_id: int

    @property
    def vocab_size(self) -> int:
        return self.token_class.numel()

    @property
    def num_classes(self) -> int:
        return self.class_next.shape[1]


def make_tables(token_class: torch.Tensor, class_next: torch.Tensor, legal_count: torch.Tensor,
                done_state: int, eos_id: int) -> Tables:
    V, C = token_class.numel(), class_next.shape[1]
    ids = torch.arange(V, device=token_class.device)
    first = torch.full((C,), V, dtype=torch.int64, device=token_class.device)
    first.scatter_reduce_(0, token_class.long(), ids, reduce="amin")  # [C]
    return Tables(token_class, class_next, legal_count, first, done_state, eos_id)


@dataclass
class Rows:
    """The per-row decoding state, resident on the device so the hot loop never syncs."""
    state: torch.Tensor    # int32 [B]     current DFA state
    step: torch.Tensor     # int32 [B]     tokens emitted so far (EOS included, repeats after done not counted)
    history: torch.Tensor  # int32 [B, H]  history[r, i] = i-th token row r emitted (i < H)
    fault: torch.Tensor    # int64 [B, 3]  first illegal advance per row: (flag 0/1, token id, state)


# ----------------------------------------------------------------------------------------------------------
# masking

def class_legal(state: torch.Tensor, t: Tables) -> torch.Tensor:
    """state: int32 [B] -> bool [B, C], which token classes each row may emit."""
    return t.class_next.index_select(0, state) >= 0


def legal_bound(state: torch.Tensor, t: Tables, out: torch.Tensor | None = None) -> torch.Tensor:
    """state: int32 [B] -> float32 [B, V]: +inf where the token is legal, -inf where it is illegal.

    min(logit, bound) is then the masked logit: legal values come back bit for bit (min(x, +inf) == x),
    illegal ones become -inf. Built this way because on the CPU a float32 index_select along dim 1 is
    several times faster than the same gather of a bool mask, and torch.minimum beats masked_fill_.
    """
    inf = torch.tensor(float("inf"), device=state.device)
    class_bound = torch.where(class_legal(state, t), inf, -inf)  # [B, C]
    return torch.index_select(class_bound, 1, t.token_class, out=out)  # [B, V]


def mask_logits_(logits: torch.Tensor, state: torch.Tensor, t: Tables,
                 scratch: torch.Tensor | None = None) -> torch.Tensor:
    """In place: illegal and padded logits -> -inf, legal ones untouched. logits: [B, V'] -> int32 [B] counts.

    (A NaN logit stays NaN: torch.minimum propagates it. NaN logits are outside the contract.)
    """
    V = t.vocab_size
    bound = legal_bound(state, t, out=scratch)  # [B, V] float32
    x = logits[:, :V]
    if x.dtype != bound.dtype:
        bound = bound.to(x.dtype)  # +-inf are exact in every float dtype; same-dtype minimum is the fast one
    torch.minimum(x, bound, out=x)
    if logits.shape[1] > V:
        logits[:, V:].fill_(float("-inf"))  # ids the model has but the tokenizer does not
    return t.legal_count.index_select(0, state)  # [B]


# ----------------------------------------------------------------------------------------------------------
# advancing

def advance_(tokens: torch.Tensor, rows: Rows, t: Tables) -> None:
    """Move every row by its token (int [B]); an illegal token leaves the row as it was and records a fault."""
    V, C, H = t.vocab_size, t.num_classes, rows.history.shape[1]
    tokens = tokens.long()
    state = rows.state
    in_vocab = (tokens >= 0) & (tokens < V)  # padded / negative ids are illegal, not an index error
    cls = t.token_class.index_select(0, torch.where(in_vocab, tokens, 0))  # [B]
    nxt = t.class_next.view(-1).index_select(0, state.long() * C + cls).int()  # [B]
    ok = in_vocab & (nxt >= 0)
    # a finished row keeps emitting EOS in place: that is not a new token of its text
    moved = ok & (state != t.done_state)

    # history[r, step[r]] = token, for rows that moved and still have room
    col = rows.step.long().clamp(max=H - 1)[:, None]  # [B, 1]
    keep = rows.history.gather(1, col)  # [B, 1]
    write = (moved & (rows.step < H))[:, None]
    rows.history.scatter_(1, col, torch.where(write, tokens.int()[:, None], keep))

    # the first fault of a row is the informative one: later ones follow from it
    new_fault = ~ok & (rows.fault[:, 0] == 0)  # [B]
    record = torch.stack([torch.ones_like(tokens), tokens, state.long()], dim=1)  # [B, 3]
    rows.fault.copy_(torch.where(new_fault[:, None], record, rows.fault))

    rows.step.add_(moved.int())
    rows.state.copy_(torch.where(ok, nxt, state))


# ----------------------------------------------------------------------------------------------------------
# sampling

def first_legal_max(scores: torch.Tensor, state: torch.Tensor, t: Tables) -> torch.Tensor:
    """The chosen token of every row: the first maximum of scores (float32 [B, V], -inf where illegal).

    If every legal score is -inf (the model ruled them all out) take the first legal token; if a row has no
    legal token at all (a dead state) return EOS, which the advance then reports as illegal.
    """
    tok = scores.argmax(dim=1)  # [B] torch.argmax returns the first maximum: ties go to the lowest id
    best = scores.gather(1, tok[:, None])[:, 0]  # [B]
    V = t.vocab_size
    # first legal id from the [B, C] class table, no [B, V] pass: the lowest first-token of a legal class
    first_legal = torch.where(class_legal(state, t), t.class_first_token, V).amin(dim=1)  # [B]
    fallback = torch.where(first_legal < V, first_legal, t.eos_id)
    return torch.where(best > float("-inf"), tok, fallback)


def top_p_keep(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """scores: float32 [B, V] (tempered logits, -inf illegal) -> bool [B, V], the smallest set of most
    likely tokens whose probability reaches top_p (always at least the most likely one)."""
    probs = torch.softmax(scores, dim=1)  # [B, V]
    sorted_p, order = probs.sort(dim=1, descending=True, stable=True)  # [B, V]
    mass_before = sorted_p.cumsum(dim=1) - sorted_p  # probability of the tokens ranked above
    keep_sorted = mass_before < top_p
    return torch.zeros_like(keep_sorted).scatter_(1, order, keep_sorted)


def choose_tokens(logits: torch.Tensor, state: torch.Tensor, step: torch.Tensor, t: Tables,
                  temperature: float, top_p: float, seed: int, row_offset: int = 0) -> torch.Tensor:
    """Masked greedy / Gumbel-max sampling for rows row_offset.. of the batch. logits [b, V'] -> int64 [b]."""
    V = t.vocab_size
    bound = legal_bound(state, t)  # [b, V] +inf legal, -inf illegal
    scores = logits[:, :V].float()  # [b, V] (aliases the logits when they are float32: no in-place ops)
    if temperature > 0:
        inv_t = torch.tensor(1.0 / temperature, dtype=torch.float32, device=logits.device)
        rows = torch.arange(row_offset, row_offset + state.numel(), device=state.device)
        noise = rng.gumbel(rng.uniforms(rng.row_keys(seed, rows, step), V))  # [b, V]
        scores = scores * inv_t
        if top_p < 1.0:
            keep = top_p_keep(torch.minimum(scores, bound), top_p)  # [b, V]
            bound = bound.masked_fill(~keep, float("-inf"))
        scores = scores.add_(noise)
    return first_legal_max(torch.minimum(scores, bound), state, t)


def sample_(logits: torch.Tensor, rows: Rows, t: Tables, temperature: float = 0.0, top_p: float = 1.0,
            seed: int = 0, rows_per_chunk: int | None = None, advance=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask + sample + advance the whole batch. logits [B, V'] (not modified) -> (int64 [B] tokens, int32 [B] counts).
    advance(tokens) replaces the torch advance_ (the Triton backend passes its own).

    Rows are processed in chunks so the [b, V] temporaries (scores, noise) stay a few MB even at B=1024, V=128K;
    a row's draw does not depend on the chunking (its key is (seed, row, step)).
    """
    B, V = logits.shape[0], t.vocab_size
    chunk = rows_per_chunk or max(1, (1 << 22) // V)
    counts = t.legal_count.index_select(0, rows.state)  # [B] legal counts before the move
    tokens = torch.cat([
        choose_tokens(logits[r:r + chunk], rows.state[r:r + chunk], rows.step[r:r + chunk], t,
                      temperature, top_p, seed, row_offset=r)
        for r in range(0, B, chunk)
    ])  # [B]
    if advance is None:
        advance_(tokens, rows, t)
    else:
        advance(tokens)
    return tokens, counts
