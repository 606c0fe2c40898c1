"""
Triton kernels for the batch masker: one launch masks, samples and advances the whole batch, no host sync.

Each kernel has a plain torch twin in `mask_torch.py` that it must equal (tests/test_kernels.py):
  mask      one program per (row, block of V'):  logits = -inf where row_next[state_row[state], token_class[v]] == -1
  advance   one program per block of rows:       state = decode(that code for the token), fault on -1
  sample    one program per row: scan V in blocks keeping the best (score, id) per lane over legal tokens only,
            score = logit (greedy) or logit / T + Gumbel(seed, row, step, id); then write the token and advance
            the row in the same launch.
The uniforms come from the counter hash of `rng.py`, written again here in uint32 arithmetic.

Importing this module imports triton; `batchmask` imports it only when the Triton backend is asked for. On a
machine without a GPU set TRITON_INTERPRET=1 before this module is first imported to run the kernels on the CPU.
"""
import torch
import triton
import triton.language as tl
from batchmask.kernels import rng
from batchmask.kernels.mask_torch import Rows, Tables

# ----------------------------------------------------------------------------------------------------------
# the counter hash (same constants as rng.py; tests check the two agree bit for bit)

@triton.jit
def _mix32(x):
    # x: uint32, any shape. uint32 multiplies wrap mod 2**32, which is what rng.mix32 computes with masks
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x31848BAB
    x = x ^ (x >> 16)
    return x


@triton.jit
def _row_key(seed_key, row, step):
    # seed_key: the host's rng.seed_key(seed); row, step: int scalars -> uint32 key of this (row, step)
    k = _mix32(seed_key.to(tl.uint32) ^ row.to(tl.uint32))
    return _mix32(k ^ step.to(tl.uint32))


@triton.jit
def _uniform(key, ids):
    # key: uint32 scalar, ids: int32 [BLOCK] token ids -> float32 [BLOCK] in (0, 1), as rng.uniforms
    x = _mix32(key + ids.to(tl.uint32) * 0x61C88647)
    return ((x >> 9).to(tl.float32) + 0.5) * 1.1920928955078125e-07  # 2**-23


@triton.jit(do_not_specialize=["seed_key"])
def _uniform_kernel(out_ptr, step_ptr, seed_key, V, BLOCK_V: tl.constexpr):
    # test hook: out[row, v] = uniform of (seed, row, step[row], v); grid (B, cdiv(V, BLOCK_V))
    row = tl.program_id(0)
    v = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    key = _row_key(seed_key, row, tl.load(step_ptr + row))
    tl.store(out_ptr + row.to(tl.int64) * V + v, _uniform(key, v), mask=v < V)


# ----------------------------------------------------------------------------------------------------------
# advance: shared by the advance kernel (a block of rows) and the sample kernel (one row)

@triton.jit
def _code(state_row_ptr, row_next_ptr, s, cls, C, mask):
    # the next-state code of (state s, class cls): row_next[state_row[s], cls]; -1 where masked
    r = tl.load(state_row_ptr + s, mask=mask, other=0)
    return tl.load(row_next_ptr + r.to(tl.int64) * C + cls, mask=mask, other=-1).to(tl.int32)


@triton.jit
def _advance_rows(row, tok, live, state_ptr, step_ptr, hist_ptr, fault_ptr, token_class_ptr, state_row_ptr,
                  row_next_ptr, V, C, H, done_state):
    # row: int32, tok: int64, live: bool -- all the same shape (a scalar or a block of rows)
    s = tl.load(state_ptr + row, mask=live, other=0)
    in_vocab = (tok >= 0) & (tok < V)  # a padded or negative id is illegal, never an out-of-bounds read
    cls = tl.load(token_class_ptr + tl.where(in_vocab, tok, 0), mask=live & in_vocab, other=0)
    code = _code(state_row_ptr, row_next_ptr, s, cls, C, live & in_vocab)
    nxt = tl.where(code >= -1, code, s - 2 - code)  # codes <= -2 are relative to the state
    ok = nxt >= 0  # out-of-vocabulary ids read -1 above
    moved = ok & (s != done_state)  # a finished row repeating EOS adds nothing to its text
    step = tl.load(step_ptr + row, mask=live, other=0)
    tl.store(hist_ptr + row.to(tl.int64) * H + step, tok.to(tl.int32), mask=live & moved & (step < H))
    tl.store(step_ptr + row, step + 1, mask=live & moved)
    tl.store(state_ptr + row, nxt, mask=live & ok)
    # keep only the first fault of a row: (flag, token, state)
    fresh = tl.load(fault_ptr + row * 3, mask=live, other=1) == 0
    bad = live & (nxt < 0) & fresh
    tl.store(fault_ptr + row * 3, tok * 0 + 1, mask=bad)
    tl.store(fault_ptr + row * 3 + 1, tok, mask=bad)
    tl.store(fault_ptr + row * 3 + 2, s.to(tl.int64), mask=bad)


@triton.jit
def _advance_kernel(tokens_ptr, B, state_ptr, step_ptr, hist_ptr, fault_ptr, token_class_ptr, state_row_ptr,
                    row_next_ptr, V, C, H, done_state, BLOCK_B: tl.constexpr):
    row = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    live = row < B
    tok = tl.load(tokens_ptr + row, mask=live, other=0).to(tl.int64)
    _advance_rows(row, tok, live, state_ptr, step_ptr, hist_ptr, fault_ptr, token_class_ptr, state_row_ptr,
                  row_next_ptr, V, C, H, done_state)


# ----------------------------------------------------------------------------------------------------------
# mask

@triton.jit
def _mask_kernel(logits_ptr, stride_row, counts_ptr, state_ptr, token_class_ptr, state_row_ptr, row_next_ptr,
                 legal_count_ptr, V, V_padded, C, BLOCK_V: tl.constexpr):
    row = tl.program_id(0)
    blk = tl.program_id(1)
    s = tl.load(state_ptr + row)
    v = blk * BLOCK_V + tl.arange(0, BLOCK_V)  # [BLOCK_V]
    in_vocab = v < V
    cls = tl.load(token_class_ptr + v, mask=in_vocab, other=0)
    r = tl.load(state_row_ptr + s)
    code = tl.load(row_next_ptr + r.to(tl.int64) * C + cls, mask=in_vocab, other=-1)
    # write-only: legal logits are never read or rewritten, so they keep their exact value
    neg_inf = tl.full([BLOCK_V], float("-inf"), logits_ptr.dtype.element_ty)
    tl.store(logits_ptr + row.to(tl.int64) * stride_row + v, neg_inf, mask=(v < V_padded) & (code == -1))
    if blk == 0:
        tl.store(counts_ptr + row, tl.load(legal_count_ptr + s))


# ----------------------------------------------------------------------------------------------------------
# fused sample

@triton.jit(do_not_specialize=["seed_key"])
def _sample_kernel(logits_ptr, stride_row, tokens_ptr, counts_ptr,
                   state_ptr, step_ptr, hist_ptr, fault_ptr, key_ptr,
                   token_class_ptr, state_row_ptr, row_next_ptr, legal_count_ptr,
                   V, C, H, done_state, eos_id, inv_temp, seed_key,
                   GREEDY: tl.constexpr, BLOCK_V: tl.constexpr):
    row = tl.program_id(0)
    s = tl.load(state_ptr + row)
    r = tl.load(state_row_ptr + s)
    key = _row_key(seed_key, tl.load(key_ptr + row), tl.load(step_ptr + row))
    lane = tl.arange(0, BLOCK_V)
    # per-lane running best over the positions lane, lane + BLOCK_V, ...: strict '>' keeps the earliest id
    best = tl.full([BLOCK_V], float("-inf"), tl.float32)
    best_id = tl.full([BLOCK_V], 0, tl.int32)
    first_legal = tl.full([BLOCK_V], 2147483647, tl.int32)
    for start in range(0, V, BLOCK_V):
        v = start + lane
        cls = tl.load(token_class_ptr + v, mask=v < V, other=0)
        code = tl.load(row_next_ptr + r.to(tl.int64) * C + cls, mask=v < V, other=-1)
        legal = code != -1
        x = tl.load(logits_ptr + row.to(tl.int64) * stride_row + v, mask=legal, other=float("-inf")).to(tl.float32)
        if not GREEDY:
            x = x * inv_temp - tl.log(-tl.log(_uniform(key, v)))  # Gumbel-max: argmax samples softmax(x / T)
        score = tl.where(legal, x, float("-inf"))
        better = score > best
        best = tl.where(better, score, best)
        best_id = tl.where(better, v, best_id)
        first_legal = tl.minimum(first_legal, tl.where(legal, v, 2147483647))
    top = tl.max(best, 0)
    tok = tl.min(tl.where(best == top, best_id, 2147483647), 0)  # the lowest id among the maxima
    # every legal score -inf: the first legal token; no legal token at all: EOS (the advance flags it)
    any_legal = tl.min(first_legal, 0) < 2147483647
    fallback = tl.where(any_legal, tl.min(first_legal, 0), eos_id)
    tok = tl.where(top > float("-inf"), tok, fallback).to(tl.int64)
    tl.store(tokens_ptr + row, tok)
    tl.store(counts_ptr + row, tl.load(legal_count_ptr + s))
    _advance_rows(row, tok, row >= 0, state_ptr, step_ptr, hist_ptr, fault_ptr, token_class_ptr, state_row_ptr,
                  row_next_ptr, V, C, H, done_state)


# ----------------------------------------------------------------------------------------------------------
# launchers (same signatures as the torch reference)

def mask_logits_(logits: torch.Tensor, state: torch.Tensor, t: Tables, counts: torch.Tensor | None = None,
                 block_v: int = 1024) -> torch.Tensor:
    """In place: illegal and padded logits -> -inf. logits [B, V'] (unit stride along V') -> int32 [B] counts."""
    B, V_padded = logits.shape
    counts = torch.empty(B, dtype=torch.int32, device=logits.device) if counts is None else counts
    block_v = min(block_v, triton.next_power_of_2(V_padded))
    grid = (B, triton.cdiv(V_padded, block_v))
    _mask_kernel[grid](logits, logits.stride(0), counts, state, t.token_class, t.state_row, t.row_next,
                       t.legal_count, t.vocab_size, V_padded, t.num_classes, BLOCK_V=block_v)
    return counts


def advance_(tokens: torch.Tensor, rows: Rows, t: Tables, block_b: int = 128) -> None:
    """Move every row by its token (int [B]); an illegal token leaves the row unchanged and records a fault."""
    B = tokens.numel()
    _advance_kernel[(triton.cdiv(B, block_b),)](
        tokens, B, rows.state, rows.step, rows.history, rows.fault, t.token_class, t.state_row, t.row_next,
        t.vocab_size, t.num_classes, rows.history.shape[1], t.done_state, BLOCK_B=block_b)


def sample_(logits: torch.Tensor, rows: Rows, t: Tables, temperature: float = 0.0, seed: int = 0,
            tokens: torch.Tensor | None = None, counts: torch.Tensor | None = None,
            block_v: int = 2048, num_warps: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask + sample (greedy or Gumbel-max at temperature) + advance in one launch; logits are not modified.
    logits [B, V'] -> (int64 [B] tokens, int32 [B] legal counts before the move)."""
    B = logits.shape[0]
    dev = logits.device
    tokens = torch.empty(B, dtype=torch.int64, device=dev) if tokens is None else tokens
    counts = torch.empty(B, dtype=torch.int32, device=dev) if counts is None else counts
    greedy = temperature <= 0
    block_v = min(block_v, triton.next_power_of_2(t.vocab_size))  # no lanes wasted on a small vocabulary
    keys = rows.key if rows.key is not None else torch.arange(B, device=dev)  # [B] what draws are keyed by
    _sample_kernel[(B,)](
        logits, logits.stride(0), tokens, counts, rows.state, rows.step, rows.history, rows.fault, keys,
        t.token_class, t.state_row, t.row_next, t.legal_count, t.vocab_size, t.num_classes, rows.history.shape[1],
        t.done_state, t.eos_id, 1.0 if greedy else 1.0 / temperature, rng.seed_key(seed),
        GREEDY=greedy, BLOCK_V=block_v, num_warps=num_warps)
    return tokens, counts


def uniforms(seed: int, step: torch.Tensor, vocab_size: int, block_v: int = 1024) -> torch.Tensor:
    """The kernel's uniforms for rows 0..B-1 at step (int32 [B]) -> float32 [B, V]; equals rng.uniforms."""
    B = step.numel()
    out = torch.empty(B, vocab_size, dtype=torch.float32, device=step.device)
    _uniform_kernel[(B, triton.cdiv(vocab_size, block_v))](out, step, rng.seed_key(seed), vocab_size,
                                                            BLOCK_V=block_v)
    return out
