"""
Shared pieces of the kernel tests: the test grammars as the kernels read them, rows over all states, and plainly
written per-row references (Python loops and float64 formulas; small sizes only).
"""
import importlib.util
import math

import pytest
import torch
from batchmask.kernels import gumbel, rng
from batchmask.kernels.tables import Rows, make_tables

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
NEG_INF = float("-inf")
HAVE_TRITON = importlib.util.find_spec("triton") is not None
# The masker's backends: Triton runs in its interpreter without a GPU (conftest sets TRITON_INTERPRET).
BACKENDS = ["torch", pytest.param("triton", marks=pytest.mark.skipif(not HAVE_TRITON, reason="triton missing"))]


def tables_of(g):
    return make_tables(g.token_class.to(DEVICE), g.class_next.to(DEVICE).contiguous(), g.legal_count.to(DEVICE),
                       g.done_state, g.eos_id)


def random_rows(g, B, H=16, seed=0) -> Rows:
    """Rows spread over all states (done_state included), some with history and a step count."""
    gen = torch.Generator().manual_seed(seed)
    state = torch.randint(0, g.num_states, (B,), generator=gen, dtype=torch.int32)
    state[0] = g.done_state
    return Rows(state=state.to(DEVICE),
                step=torch.randint(0, H + 3, (B,), generator=gen, dtype=torch.int32).to(DEVICE),
                history=torch.randint(0, g.vocab_size, (B, H), generator=gen, dtype=torch.int32).to(DEVICE),
                fault=torch.zeros(B, 3, dtype=torch.int64, device=DEVICE))


def clone_rows(r: Rows) -> Rows:
    return Rows(r.state.clone(), r.step.clone(), r.history.clone(), r.fault.clone(),
                None if r.key is None else r.key.clone())


def assert_rows_equal(a: Rows, b: Rows):
    for name in ("state", "step", "history", "fault"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


# ----------------------------------------------------------------------------------------------------------
# plain per-row references (Python loops, small sizes only)

def naive_legal(g, state: int) -> list[bool]:
    table = g.class_next.long().tolist()
    return [table[state][c] >= 0 for c in g.token_class.tolist()]


def naive_pick(g, state: int, scores: list[float]) -> int:
    """First maximum among legal tokens; first legal if all are -inf; EOS if none is legal."""
    legal = naive_legal(g, state)
    best, best_id = NEG_INF, None
    for v, (ok, x) in enumerate(zip(legal, scores)):
        if ok and (best_id is None or x > best):
            best, best_id = x, v
    return g.eos_id if best_id is None else best_id


def naive_process(x: torch.Tensor, temperature: float, key: int) -> list[float]:
    """z_v of every token of one row, in float64 from the defining formulas of kernels/gumbel.py (no stable
    rewriting, no block search): y = x * (1 / T) (float32, as every backend computes it), G_b = logsumexp of
    the block + Gumbel(block uniform), h_v = y_v + Gumbel(token uniform), z_v = -log(e^-G - e^-Z + e^-h)."""
    V, K = x.numel(), gumbel.NOISE_BLOCK
    y = (x.float() * torch.tensor(1.0 / temperature, dtype=torch.float32)).tolist()
    keys = torch.tensor([key])
    ut = rng.uniforms(keys, V)[0].double().tolist()
    ub = rng.uniforms(rng.block_keys(keys), -(-V // K))[0].double().tolist()
    z = []
    for b in range(0, V, K):
        ys = y[b:b + K]
        top = max(ys)
        G = top + math.log(sum(math.exp(v - top) for v in ys)) - math.log(-math.log(ub[b // K]))
        hs = [v - math.log(-math.log(u)) for v, u in zip(ys, ut[b:b + K])]
        Z = max(hs)
        z += [G - math.log(1 - math.exp(G - Z) + math.exp(G - h)) for h in hs]  # -log(e^-G - e^-Z + e^-h)
    return z


def tables_of_cpu(g):
    return make_tables(g.token_class, g.class_next.contiguous(), g.legal_count, g.done_state, g.eos_id)


def mixed_rows(g, B, seed):
    """Rows over all states, with both kinds present: few legal tokens (listed legal) and many (listed illegal)."""
    rows = random_rows(g, B, seed=seed)
    counts = g.legal_count[rows.state.long().cpu()]
    few = counts * 2 < g.vocab_size
    assert bool(few.any()) and bool((~few).any()), "the fixture must exercise both sides"
    return rows
