"""
Triton kernels for the batch masker: one launch masks, samples and advances the whole batch, no host sync.

Each kernel has a plain torch twin in `mask_torch.py` that it must equal (tests/test_kernels.py):
  mask      one program per (row, block of V'):  logits = -inf where row_next[state_row[state], token_class[v]] == -1
            (and where a legal logit is NaN); a packed table (PACKED, a constexpr: the dense kernels compile as
            before) reads row_next[row_base[r] + c] and its check (batchmask/table/packed.py)
  advance   one program per block of rows:       state = decode(that code for the token, targets from the base of
            the state's segment), fault on -1
  sample    one program per row: greedy scans V in tiles for the first legal maximum; sampled scans V once for
            each noise block's G (gumbel.py: logsumexp + Gumbel noise, kept in a [B, nb] scratch), then visits
            the best block and any other whose G could still win; then writes the token and advances the row
            in the same launch. FP contraction is off for it, so its float expressions round as torch's do.
The uniforms come from the counter hash of `rng.py`, written again here in uint32 arithmetic.

Importing this module imports triton; `batchmask` imports it only when the Triton backend is asked for. On a
machine without a GPU set TRITON_INTERPRET=1 before this module is first imported to run the kernels on the CPU.
"""
import torch
import triton
import triton.language as tl
from batchmask.kernels import gumbel, rng
from batchmask.kernels.tables import Rows, Tables

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
def _row_at(r, row_base_ptr, C, mask, PACKED: tl.constexpr):
    # where row r's columns start in row_next: r * C (dense), row_base[r] (packed: batchmask/table/packed.py)
    if PACKED:
        return tl.load(row_base_ptr + r, mask=mask, other=0).to(tl.int64)
    return r.to(tl.int64) * C


@triton.jit
def _read(row_next_ptr, check_ptr, at, cls, mask, PACKED: tl.constexpr):
    # the code of class cls in the row starting at `at`; -1 where masked, and (packed) where the slot's check
    # names another column (batchmask.table.packed.codes_at, the one rule; tests check the two agree)
    code = tl.load(row_next_ptr + at + cls, mask=mask, other=-1)
    if PACKED:
        owner = tl.load(check_ptr + at + cls, mask=mask, other=-1)
        code = tl.where(owner == cls, code, -1)
    return code


@triton.jit
def _code(state_row_ptr, row_next_ptr, row_base_ptr, check_ptr, s, cls, C, mask, PACKED: tl.constexpr):
    # the next-state code of (state s, class cls): row_next[state_row[s], cls]; -1 where masked
    r = tl.load(state_row_ptr + s, mask=mask, other=0)
    return _read(row_next_ptr, check_ptr, _row_at(r, row_base_ptr, C, mask, PACKED), cls, mask, PACKED).to(tl.int32)


@triton.jit
def _segment_base(s, need, seg_start_ptr, seg_base_ptr, n_seg):
    # batchmask.table.next_codes.segment_bases: segment_base[k], k the last segment with segment_start[k] <= s
    # (segment_start[0] = 0), by a branchless binary search of 20 halvings (next_codes.SEGMENT_BITS). Only
    # where `need` (an absolute code) does it read memory: a step inside a value or along literal text, the
    # common case, costs no loads, and a search costs log2(segments) of them, the rest masked off
    k = s * 0
    half = k + 524288                                   # 2 ** (next_codes.SEGMENT_BITS - 1)
    for _ in tl.static_range(20):
        cand = k + half
        inside = need & (cand < n_seg)
        first = tl.load(seg_start_ptr + tl.where(inside, cand, 0), mask=inside, other=0)
        k = tl.where(inside & (first <= s), cand, k)
        half = half // 2
    return tl.load(seg_base_ptr + k, mask=need, other=0)


@triton.jit
def _decode_next(code, s, targets_ptr, seg_start_ptr, seg_base_ptr, n_seg):
    # batchmask.table.next_codes.decode_next, jitted (tests/test_kernels.py checks the two agree on every kind)
    base = _segment_base(s, code >= 0, seg_start_ptr, seg_base_ptr, n_seg)
    absolute = tl.load(targets_ptr + base + tl.maximum(code, 0), mask=code >= 0, other=0)
    return tl.where(code >= 0, absolute, tl.where(code == -1, -1, s - 2 - code))


@triton.jit
def _decode_kernel(codes_ptr, states_ptr, targets_ptr, seg_start_ptr, seg_base_ptr, n_seg, out_ptr, n,
                   BLOCK: tl.constexpr):
    # test hook: out[i] = _decode_next(codes[i], states[i], targets, segments)
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    code = tl.load(codes_ptr + i, mask=i < n, other=-1)
    tl.store(out_ptr + i, _decode_next(code, tl.load(states_ptr + i, mask=i < n, other=0), targets_ptr,
                                       seg_start_ptr, seg_base_ptr, n_seg), mask=i < n)


@triton.jit
def _advance_rows(row, tok, live, state_ptr, step_ptr, hist_ptr, fault_ptr, token_class_ptr, state_row_ptr,
                  row_next_ptr, row_base_ptr, check_ptr, targets_ptr, seg_start_ptr, seg_base_ptr, n_seg, V, C, H,
                  done_state, PACKED: tl.constexpr):
    # row: int32, tok: int64, live: bool -- all the same shape (a scalar or a block of rows)
    s = tl.load(state_ptr + row, mask=live, other=0)
    in_vocab = (tok >= 0) & (tok < V)  # a padded or negative id is illegal, never an out-of-bounds read
    cls = tl.load(token_class_ptr + tl.where(in_vocab, tok, 0), mask=live & in_vocab, other=0)
    code = _code(state_row_ptr, row_next_ptr, row_base_ptr, check_ptr, s, cls, C, live & in_vocab, PACKED)
    nxt = _decode_next(code, s, targets_ptr, seg_start_ptr, seg_base_ptr, n_seg)
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
                    row_next_ptr, row_base_ptr, check_ptr, targets_ptr, seg_start_ptr, seg_base_ptr, n_seg, V, C, H,
                    done_state, BLOCK_B: tl.constexpr, PACKED: tl.constexpr):
    row = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    live = row < B
    tok = tl.load(tokens_ptr + row, mask=live, other=0).to(tl.int64)
    _advance_rows(row, tok, live, state_ptr, step_ptr, hist_ptr, fault_ptr, token_class_ptr, state_row_ptr,
                  row_next_ptr, row_base_ptr, check_ptr, targets_ptr, seg_start_ptr, seg_base_ptr, n_seg, V, C, H,
                  done_state, PACKED)


# ----------------------------------------------------------------------------------------------------------
# mask

@triton.jit
def _mask_kernel(logits_ptr, stride_row, counts_ptr, state_ptr, token_class_ptr, state_row_ptr, row_next_ptr,
                 row_base_ptr, check_ptr, row_legal_ptr, V, V_padded, C, BLOCK_V: tl.constexpr, PACKED: tl.constexpr):
    row = tl.program_id(0)
    blk = tl.program_id(1)
    s = tl.load(state_ptr + row)
    v = blk * BLOCK_V + tl.arange(0, BLOCK_V)  # [BLOCK_V]
    in_vocab = v < V
    cls = tl.load(token_class_ptr + v, mask=in_vocab, other=0)
    r = tl.load(state_row_ptr + s)
    code = _read(row_next_ptr, check_ptr, _row_at(r, row_base_ptr, C, r >= 0, PACKED), cls, in_vocab, PACKED)
    # legal logits are read (a NaN becomes -inf) but never rewritten otherwise: they keep their exact value
    ptrs = logits_ptr + row.to(tl.int64) * stride_row + v
    x = tl.load(ptrs, mask=in_vocab & (code != -1), other=0.0).to(tl.float32)
    neg_inf = tl.full([BLOCK_V], float("-inf"), logits_ptr.dtype.element_ty)
    tl.store(ptrs, neg_inf, mask=(v < V_padded) & ((code == -1) | (x != x)))
    if blk == 0:
        tl.store(counts_ptr + row, tl.load(row_legal_ptr + r))


# ----------------------------------------------------------------------------------------------------------
# fused sample: greedy, or the Gumbel process of gumbel.py

@triton.jit
def _gumbel(u):
    return -tl.log(-tl.log(u))


@triton.jit
def _truncate(G, Z, h):
    # gumbel.truncate, the same expression: the value of h once its block's maximum Z is moved to G
    v = G - h + tl.log(1 - tl.exp(h - Z))
    z = G - (tl.maximum(v, 0.0) + tl.log(1 + tl.exp(-tl.abs(v))))
    return tl.where(h == float("-inf"), float("-inf"), z)


@triton.jit
def _tile(row_logits, row_at, token_class_ptr, row_next_ptr, check_ptr, v, V, inv_temp, GREEDY: tl.constexpr,
          PACKED: tl.constexpr):
    # the ids v (any shape) of one row (its columns at row_at: _row_at): (legal, y) with y = logit (greedy) or
    # logit / T, float32, NaN -> -inf
    in_v = v < V
    cls = tl.load(token_class_ptr + v, mask=in_v, other=0)
    code = _read(row_next_ptr, check_ptr, row_at, cls, in_v, PACKED)
    x = tl.load(row_logits + v, mask=in_v, other=float("-inf")).to(tl.float32)
    if not GREEDY:
        x = x * inv_temp
    return code != -1, tl.where(x != x, float("-inf"), x)


@triton.jit(do_not_specialize=["seed_key"])
def _sample_kernel(logits_ptr, stride_row, tokens_ptr, counts_ptr,
                   state_ptr, step_ptr, hist_ptr, fault_ptr, key_ptr,
                   token_class_ptr, state_row_ptr, row_next_ptr, row_base_ptr, check_ptr, targets_ptr, seg_start_ptr,
                   seg_base_ptr, n_seg, row_legal_ptr, scratch_ptr, V, C, H, NB, done_state, eos_id, inv_temp,
                   seed_key, GREEDY: tl.constexpr, BLOCKS: tl.constexpr, K: tl.constexpr, PACKED: tl.constexpr):
    # one program per row; the vocabulary in tiles of BLOCKS noise blocks of K ids. scratch: float32 [B, NB],
    # each block's G (-inf where the block holds no legal id), read again by the search
    BIG: tl.constexpr = 2147483647
    row = tl.program_id(0)
    s = tl.load(state_ptr + row)
    r = tl.load(state_row_ptr + s)
    at = _row_at(r, row_base_ptr, C, r >= 0, PACKED)
    key = _row_key(seed_key, tl.load(key_ptr + row), tl.load(step_ptr + row))
    bkey = _mix32(key ^ 0x5BD1E995)  # rng.block_keys (rng.BLOCK_SALT)
    row_logits = logits_ptr + row.to(tl.int64) * stride_row
    bb = tl.arange(0, BLOCKS)
    jj = tl.arange(0, K)
    first_legal = tl.full([], BIG, tl.int32)
    first_inf = tl.full([], BIG, tl.int32)
    any_finite = tl.full([], 0, tl.int32)
    best = tl.full([], float("-inf"), tl.float32)  # greedy: the best legal y; sampled: the best block's G
    best_id = tl.full([], 0, tl.int32)             # greedy: its token; sampled: that block
    for start in range(0, V, BLOCKS * K):
        v = start + bb[:, None] * K + jj[None, :]  # [BLOCKS, K]
        legal, y = _tile(row_logits, at, token_class_ptr, row_next_ptr, check_ptr, v, V, inv_temp, GREEDY, PACKED)
        first_legal = tl.minimum(first_legal, tl.min(tl.where(legal, v, BIG)))
        first_inf = tl.minimum(first_inf, tl.min(tl.where(legal & (y == float("inf")), v, BIG)))
        any_finite = tl.maximum(any_finite, tl.max(tl.where(legal & (tl.abs(y) < float("inf")), 1, 0)))
        if GREEDY:
            score = tl.where(legal, y, float("-inf"))
            top = tl.max(score)
            top_id = tl.min(tl.where(score == top, v, BIG))
        else:
            p = tl.where(tl.abs(y) < float("inf"), y, float("-inf"))  # potentials
            m = tl.max(p, axis=1)  # [BLOCKS] logsumexp per block, as torch.logsumexp computes it
            m = tl.where(tl.abs(m) == float("inf"), 0.0, m)
            lse = tl.log(tl.sum(tl.exp(p - m[:, None]), axis=1)) + m
            blk = start // K + bb  # [BLOCKS]
            G = lse + _gumbel(_uniform(bkey, blk))
            G = tl.where(tl.max(tl.where(legal, 1, 0), axis=1) > 0, G, float("-inf"))
            tl.store(scratch_ptr + row.to(tl.int64) * NB + blk, G, mask=blk < NB)
            top = tl.max(G)
            top_id = tl.min(tl.where(G == top, blk, BIG))
        better = top > best
        best = tl.where(better, top, best)
        best_id = tl.where(better, top_id, best_id)
    if GREEDY:
        tok = best_id
    else:
        # the scratch G of the first pass is read back by other threads of this program: make it visible
        tl.debug_barrier()
        # the best candidate block first; then every other one whose G could still beat the best z so far
        first_blk = best_id
        legal1, y1 = _tile(row_logits, at, token_class_ptr, row_next_ptr, check_ptr, first_blk * K + jj, V, inv_temp,
                           GREEDY, PACKED)
        h1 = tl.where(tl.abs(y1) < float("inf"), y1, float("-inf")) + _gumbel(_uniform(key, first_blk * K + jj))
        hc1 = tl.where(legal1, h1, float("-inf"))
        hb1 = tl.max(hc1)
        tok = first_blk * K + tl.min(tl.where(hc1 == hb1, jj, K))
        best_z = _truncate(best, tl.max(h1), hb1)
        for start in range(0, NB, BLOCKS):
            blk = start + bb  # [BLOCKS]
            G = tl.load(scratch_ptr + row.to(tl.int64) * NB + blk, mask=blk < NB, other=float("-inf"))
            visit = (G > float("-inf")) & (G >= best_z) & (blk != first_blk)
            if tl.max(tl.where(visit, 1, 0)) > 0:
                v2 = blk[:, None] * K + jj[None, :]  # [BLOCKS, K]
                legal2, y2 = _tile(row_logits, at, token_class_ptr, row_next_ptr, check_ptr, v2, V, inv_temp, GREEDY,
                                   PACKED)
                h2 = tl.where(tl.abs(y2) < float("inf"), y2, float("-inf")) + _gumbel(_uniform(key, v2))
                hc2 = tl.where(legal2, h2, float("-inf"))
                hb2 = tl.max(hc2, axis=1)  # [BLOCKS]
                cand = blk * K + tl.min(tl.where(hc2 == hb2[:, None], jj[None, :], K), axis=1)
                z = tl.where(visit, _truncate(G, tl.max(h2, axis=1), hb2), float("-inf"))
                zt = tl.max(z)
                tt = tl.min(tl.where(z == zt, cand, BIG))
                better = (zt > best_z) | ((zt == best_z) & (tt < tok))
                best_z = tl.where(better, zt, best_z)
                tok = tl.where(better, tt, tok)
        tok = tl.where(first_inf < BIG, first_inf, tok)  # a legal +inf: the first one
    # no finite legal logit: the first legal token; no legal token at all: EOS (the advance flags it)
    tok = tl.where(any_finite > 0, tok, tl.where(first_legal < BIG, first_legal, eos_id)).to(tl.int64)
    tl.store(tokens_ptr + row, tok)
    tl.store(counts_ptr + row, tl.load(row_legal_ptr + r))
    _advance_rows(row, tok, row >= 0, state_ptr, step_ptr, hist_ptr, fault_ptr, token_class_ptr, state_row_ptr,
                  row_next_ptr, row_base_ptr, check_ptr, targets_ptr, seg_start_ptr, seg_base_ptr, n_seg, V, C, H,
                  done_state, PACKED)


# ----------------------------------------------------------------------------------------------------------
# launchers (same signatures as the torch reference)

MASK_BLOCK_V = 1024     # ids per program of the mask kernel (fewer for a vocabulary below it)
ADVANCE_BLOCK_B = 128   # rows per program of the advance kernel
SAMPLE_BLOCK_V = 2048   # ids per tile of the sample kernel (a multiple of gumbel.NOISE_BLOCK)
SAMPLE_NUM_WARPS = 8

def mask_logits_(logits: torch.Tensor, state: torch.Tensor, t: Tables, counts: torch.Tensor | None = None,
                 block_v: int = MASK_BLOCK_V) -> torch.Tensor:
    """In place: illegal and padded logits -> -inf. logits [B, V'] (unit stride along V') -> int32 [B] counts."""
    B, V_padded = logits.shape
    counts = torch.empty(B, dtype=torch.int32, device=logits.device) if counts is None else counts
    block_v = min(block_v, triton.next_power_of_2(V_padded))
    grid = (B, triton.cdiv(V_padded, block_v))
    row_base, check = _layout(t)
    _mask_kernel[grid](logits, logits.stride(0), counts, state, t.token_class, t.state_row, t.row_next, row_base,
                       check, t.row_legal, t.vocab_size, V_padded, t.num_classes, BLOCK_V=block_v,
                       PACKED=t.row_base is not None)
    return counts


def advance_(tokens: torch.Tensor, rows: Rows, t: Tables, block_b: int = ADVANCE_BLOCK_B) -> None:
    """Move every row by its token (int [B]); an illegal token leaves the row unchanged and records a fault."""
    B = tokens.numel()
    row_base, check = _layout(t)
    _advance_kernel[(triton.cdiv(B, block_b),)](
        tokens, B, rows.state, rows.step, rows.history, rows.fault, t.token_class, t.state_row, t.row_next,
        row_base, check, t.targets, t.segment_start, t.segment_base, t.segment_start.numel(), t.vocab_size,
        t.num_classes, rows.history.shape[1], t.done_state, BLOCK_B=block_b, PACKED=t.row_base is not None)


def sample_(logits: torch.Tensor, rows: Rows, t: Tables, temperature: float = 0.0, seed: int = 0,
            tokens: torch.Tensor | None = None, counts: torch.Tensor | None = None,
            block_v: int = SAMPLE_BLOCK_V, num_warps: int = SAMPLE_NUM_WARPS) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask + choose (greedy, or the Gumbel process of gumbel.py at temperature) + advance in one launch;
    logits are not modified. logits [B, V'] -> (int64 [B] tokens, int32 [B] legal counts before the move)."""
    B = logits.shape[0]
    dev = logits.device
    tokens = torch.empty(B, dtype=torch.int64, device=dev) if tokens is None else tokens
    counts = torch.empty(B, dtype=torch.int32, device=dev) if counts is None else counts
    greedy = temperature <= 0
    K = gumbel.NOISE_BLOCK
    block_v = max(K, min(block_v, triton.next_power_of_2(t.vocab_size)))  # no tiles wasted on a small vocabulary
    nb = gumbel.num_blocks(t.vocab_size)
    scratch = torch.empty(1 if greedy else B * nb, dtype=torch.float32, device=dev)  # [B, nb] each block's G
    keys = rows.key if rows.key is not None else torch.arange(B, device=dev)  # [B] what draws are keyed by
    inv_temp = 1.0 if greedy else 1.0 / temperature
    row_base, check = _layout(t)
    _sample_kernel[(B,)](
        logits, logits.stride(0), tokens, counts, rows.state, rows.step, rows.history, rows.fault, keys,
        t.token_class, t.state_row, t.row_next, row_base, check, t.targets, t.segment_start, t.segment_base,
        t.segment_start.numel(), t.row_legal, scratch, t.vocab_size, t.num_classes,
        rows.history.shape[1], nb, t.done_state, t.eos_id, inv_temp, _int32(rng.seed_key(seed)),
        GREEDY=greedy, BLOCKS=block_v // K, K=K, PACKED=t.row_base is not None, num_warps=num_warps,
        enable_fp_fusion=False)
    return tokens, counts


def _layout(t: Tables) -> tuple[torch.Tensor, torch.Tensor]:
    """(row_base int32, row_check int16) for the kernels: the packed table's, or (dense: PACKED is off and they
    are never read) one-element stand-ins of the same dtypes, kept on the tables."""
    if t.row_base is not None:
        return t.row_base, t.row_check
    if getattr(t, "_stand_ins", None) is None:
        dev = t.token_class.device
        t._stand_ins = (torch.zeros(1, dtype=torch.int32, device=dev), torch.zeros(1, dtype=torch.int16, device=dev))
    return t._stand_ins


def uniforms(seed: int, step: torch.Tensor, vocab_size: int, block_v: int = 1024) -> torch.Tensor:
    """The kernel's uniforms for rows 0..B-1 at step (int32 [B]) -> float32 [B, V]; equals rng.uniforms."""
    B = step.numel()
    out = torch.empty(B, vocab_size, dtype=torch.float32, device=step.device)
    _uniform_kernel[(B, triton.cdiv(vocab_size, block_v))](out, step, _int32(rng.seed_key(seed)), vocab_size,
                                                            BLOCK_V=block_v)
    return out


def _int32(key: int) -> int:
    """A 32-bit key as a signed int32 value: Triton types Python ints by range (i32 below 2**31, u32 above), so
    passing keys this way keeps one compiled kernel for every seed; the kernels read it back as uint32."""
    return key - (1 << 32) if key >= 1 << 31 else key


# ----------------------------------------------------------------------------------------------------------
# what the launchers compile (for ahead-of-time checks: batchmask check-kernels)

LOGIT_TYPES = {"float32": "*fp32", "bfloat16": "*bf16", "float16": "*fp16"}
TABLE_TYPES = {"int16": "*i16", "int32": "*i32"}


def launch_specs() -> list[dict]:
    """Every specialisation the launchers above compile: for each, the kernel, a label, its signature (Triton
    type per argument), constexprs and compile options. Logits float32 / bfloat16 / float16, tables int16 /
    int32 (row_next and state_row), dense and packed, greedy and sampled, at the block sizes the launchers choose
    for a real vocabulary."""
    specs = []

    def add(fn, label, types, constexprs, **options):
        sig = {name: types.get(name, "i32") for name in fn.arg_names}
        sig.update({name: "constexpr" for name in constexprs})
        specs.append(dict(kernel=fn.__name__, label=label, fn=fn, signature=sig, constexprs=constexprs,
                          options={"num_warps": 4, **options}))

    rows = {"state_ptr": "*i32", "step_ptr": "*i32", "hist_ptr": "*i32", "fault_ptr": "*i64", "key_ptr": "*i64",
            "token_class_ptr": "*i32", "row_legal_ptr": "*i32", "counts_ptr": "*i32",
            "targets_ptr": "*i32", "seg_start_ptr": "*i32", "seg_base_ptr": "*i32",
            "tokens_ptr": "*i64", "scratch_ptr": "*fp32", "inv_temp": "fp32",
            "row_base_ptr": "*i32", "check_ptr": "*i16"}
    for packed in (False, True):
        layout = ", packed" if packed else ""
        for tname, ttype in TABLE_TYPES.items():
            for lname, ltype in LOGIT_TYPES.items():
                types = {**rows, "row_next_ptr": ttype, "state_row_ptr": ttype, "logits_ptr": ltype}
                add(_mask_kernel, f"logits {lname}, table {tname}{layout}", types,
                    {"BLOCK_V": MASK_BLOCK_V, "PACKED": packed})
                for greedy in (True, False):
                    add(_sample_kernel, f"logits {lname}, table {tname}{layout}, {'greedy' if greedy else 'sampled'}",
                        types, {"GREEDY": greedy, "BLOCKS": SAMPLE_BLOCK_V // gumbel.NOISE_BLOCK,
                                "K": gumbel.NOISE_BLOCK, "PACKED": packed},
                        num_warps=SAMPLE_NUM_WARPS, enable_fp_fusion=False)
            for tok in ("i64", "i32"):  # advance takes the caller's integer tokens as they are
                add(_advance_kernel, f"tokens {'int64' if tok == 'i64' else 'int32'}, table {tname}{layout}",
                    {**rows, "row_next_ptr": ttype, "state_row_ptr": ttype, "tokens_ptr": f"*{tok}"},
                    {"BLOCK_B": ADVANCE_BLOCK_B, "PACKED": packed})
    add(_uniform_kernel, "test hook", {"out_ptr": "*fp32", "step_ptr": "*i32"}, {"BLOCK_V": 1024})
    return specs
