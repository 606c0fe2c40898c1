"""
Counter-based random numbers for seeded sampling, torch side.

A row's draw at a decoding step must depend only on (seed, row, step, token id), never on which other rows
share the batch or on how the work is split into launches. So instead of a stateful generator we hash the
counters: every uniform is a pure function of those four integers.

The hash is a 32-bit integer mixer (xor-shift / multiply rounds). The Triton kernels in `mask_triton.py`
compute the very same function with uint32 arithmetic; here torch has no dependable uint32 multiply, so we
keep the values in int64 in [0, 2**32) and mask with 0xFFFFFFFF after every multiply. All multipliers are
below 2**31, so a product of a 32-bit value and a multiplier stays below 2**63: it never overflows int64 and
its low 32 bits are exactly what uint32 arithmetic gives. The uniforms are therefore bit-identical between the
two backends (tests/test_kernels.py checks it).

mix32 works on Python ints and on int64 tensors alike (it only uses ^, >>, * and &); a tensor is mixed in
place (augmented assignments), which saves the allocation of a [B, V] int64 temporary per operation.
"""
import torch

MASK32 = 0xFFFFFFFF
MIX_MUL_1 = 0x7FEB352D  # odd multipliers < 2**31 (see module docstring)
MIX_MUL_2 = 0x31848BAB
WEYL_STEP = 0x61C88647  # odd, ~2**32 / golden ratio: spreads consecutive token ids over the 32-bit ring
SEED_SALT = 0x2545F491  # keeps seed 0 away from mix32's fixed point at 0
BLOCK_SALT = 0x5BD1E995  # derives a row's block key from its token key (kernels/gumbel.py's two levels of noise)
UNIFORM_SCALE = 2.0 ** -23  # 23 random bits: (n + 0.5) * 2**-23 is exact in float32 and < 1


def mix32(x):
    """Bijective 32-bit mixer. x: Python int, or int64 tensor with values in [0, 2**32) (overwritten)."""
    x ^= x >> 16
    x *= MIX_MUL_1
    x &= MASK32
    x ^= x >> 15
    x *= MIX_MUL_2
    x &= MASK32
    x ^= x >> 16
    return x


def seed_key(seed: int) -> int:
    """The 32-bit key a user seed (any Python int) stands for; computed on the host once per call."""
    return mix32((seed + SEED_SALT) & MASK32)


def row_keys(seed: int, rows: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """Per-row key of one decoding step. rows, steps: int [B] -> int64 [B] in [0, 2**32)."""
    k = mix32(seed_key(seed) ^ (rows.long() & MASK32))
    return mix32(k ^ (steps.long() & MASK32))


def block_keys(keys: torch.Tensor) -> torch.Tensor:
    """The key of a row's block-level draws (kernels/gumbel.py) from its token key: int64 [B] -> int64 [B]."""
    return mix32(keys ^ BLOCK_SALT)


def uniforms(keys: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """keys: int64 [B] (from row_keys) -> float32 [B, vocab_size], every value in (0, 1)."""
    ids = torch.arange(vocab_size, device=keys.device, dtype=torch.int64)  # [V]
    x = keys[:, None] + ids[None, :] * WEYL_STEP  # [B, V] distinct counters per token
    x = mix32(x.bitwise_and_(MASK32))
    # the top 23 bits, centred in their bucket: never 0 or 1 (with 24 bits the top bucket would round up to
    # 1.0 in float32), so the Gumbel transform stays finite
    return ((x >> 9).to(torch.float32) + 0.5) * UNIFORM_SCALE


def uniforms_at(keys: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """uniforms at chosen (key, id) pairs only: keys, ids int64 (broadcasting) -> float32, equal to
    uniforms(keys, V)[..., id] value for value."""
    x = mix32((keys + ids * WEYL_STEP).bitwise_and_(MASK32))
    return ((x >> 9).to(torch.float32) + 0.5) * UNIFORM_SCALE


def gumbel(u: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel noise from uniforms in (0, 1): argmax(logit + gumbel) samples softmax(logit)."""
    return u.log().neg_().log_().neg_()
