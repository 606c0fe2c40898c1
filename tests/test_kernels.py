"""
The Triton kernels against the torch reference (bit for bit for masking, advancing and the uniforms; the same
tokens for greedy and seeded sampling), and both against plainly written per-row Python loops (the Gumbel
process in float64, from its defining formula). The CPU fast paths (kernels/mask_cpu.py: short token lists,
blocked first maximum, the block search of the sampler) are checked against the reference.

Without a GPU the kernels run in Triton's interpreter, which must be switched on before triton is imported:
this module sets TRITON_INTERPRET=1 before importing kernels.mask_triton. The interpreter is slow, so sizes
stay small (V of a few thousand at most, a handful of rows, big blocks).
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import math

import numpy as np
import pytest
from batchmask.kernels import gumbel, mask_cpu, mask_torch, rng
from batchmask.kernels.tables import Rows, make_tables

from batchmask.next_codes import decode_next
from tests.grammar_fixtures import make_random_grammar

triton = pytest.importorskip("triton")
from batchmask.kernels import mask_triton  # noqa: E402  (after TRITON_INTERPRET is set)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
NEG_INF = float("-inf")


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


# ----------------------------------------------------------------------------------------------------------
# the counter hash

def numpy_mix32(x: np.ndarray) -> np.ndarray:
    """The mixer in genuine uint32 arithmetic (numpy wraps multiplies mod 2**32)."""
    x = x.astype(np.uint32)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint32(16)
        x *= np.uint32(rng.MIX_MUL_1)
        x ^= x >> np.uint32(15)
        x *= np.uint32(rng.MIX_MUL_2)
        x ^= x >> np.uint32(16)
    return x


def test_mix32_matches_uint32_arithmetic():
    x = np.random.default_rng(0).integers(0, 2**32, size=5000, dtype=np.uint64)
    ours = rng.mix32(torch.from_numpy(x.astype(np.int64))).numpy()
    assert np.array_equal(ours, numpy_mix32(x).astype(np.int64))
    assert rng.mix32(int(x[7])) == int(numpy_mix32(x[7:8])[0])  # the Python-int form agrees too
    assert len(np.unique(ours)) == len(np.unique(x))  # a bijection: no collisions


@pytest.mark.parametrize("seed", [0, 1, 12345, 2**32 + 5, -7])
def test_uniforms_bit_identical(seed):
    step = torch.tensor([0, 1, 2, 1000, 2**31 - 1], dtype=torch.int32, device=DEVICE)
    u_triton = mask_triton.uniforms(seed, step, 3000, block_v=1024)
    u_torch = rng.uniforms(rng.row_keys(seed, torch.arange(5, device=DEVICE), step), 3000)
    assert torch.equal(u_triton, u_torch)
    assert float(u_torch.min()) > 0 and float(u_torch.max()) < 1
    # roughly uniform: the mean of 15000 draws is within 5 standard errors of 1/2
    assert abs(float(u_torch.mean()) - 0.5) < 5 * (1 / 12 / u_torch.numel()) ** 0.5


def test_uniforms_depend_on_every_counter():
    base = rng.uniforms(rng.row_keys(3, torch.tensor([2]), torch.tensor([5])), 64)
    for seed, row, step in [(4, 2, 5), (3, 1, 5), (3, 2, 6)]:
        other = rng.uniforms(rng.row_keys(seed, torch.tensor([row]), torch.tensor([step])), 64)
        assert not torch.equal(base, other), (seed, row, step)


# ----------------------------------------------------------------------------------------------------------
# mask

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index_dtype", [torch.int16, torch.int32])
def test_mask_triton_equals_torch_and_naive(dtype, index_dtype):
    g = make_random_grammar(num_states=30, num_classes=10, vocab_size=1500, seed=1, index_dtype=index_dtype)
    t = tables_of(g)
    B, V_padded = 5, 1500 + 37  # the model's logits are wider than the vocabulary: padded ids are illegal
    rows = random_rows(g, B)
    logits = torch.randn(B, V_padded, generator=torch.Generator().manual_seed(2)).to(dtype).to(DEVICE)

    a, b = logits.clone(), logits.clone()
    counts_torch = mask_torch.mask_logits_(a, rows.state, t)
    counts_triton = mask_triton.mask_logits_(b, rows.state, t, block_v=1024)
    assert torch.equal(a, b)
    assert torch.equal(counts_torch, counts_triton)

    for r, s in enumerate(rows.state.tolist()):
        legal = torch.tensor(naive_legal(g, s) + [False] * 37)
        row_in, row_out = logits[r].cpu(), a[r].cpu()
        assert torch.equal(row_out[legal], row_in[legal])  # legal values kept bit for bit
        assert bool((row_out[~legal] == NEG_INF).all())
        assert int(counts_torch[r]) == int(legal.sum())


def test_mask_strided_rows():
    """Logits that are a slice of a wider buffer (row stride != width) are masked in place, others untouched."""
    g = make_random_grammar(vocab_size=700, seed=3)
    t = tables_of(g)
    rows = random_rows(g, 3)
    buf = torch.randn(3, 900, device=DEVICE)
    a, b = buf.clone(), buf.clone()
    mask_torch.mask_logits_(a[:, :750], rows.state, t)
    mask_triton.mask_logits_(b[:, :750], rows.state, t, block_v=512)
    assert torch.equal(a, b)
    assert torch.equal(a[:, 750:], buf[:, 750:])


# ----------------------------------------------------------------------------------------------------------
# advance

def test_advance_triton_equals_torch_and_naive():
    g = make_random_grammar(num_states=25, num_classes=9, vocab_size=400, seed=4)
    t = tables_of(g)
    B = 40
    rows = random_rows(g, B, H=8, seed=5)
    gen = torch.Generator().manual_seed(6)
    tokens = torch.randint(0, g.vocab_size, (B,), generator=gen)
    tokens[:3] = torch.tensor([-1, g.vocab_size, g.vocab_size + 100])  # never legal, never an index error
    tokens[3] = g.eos_id
    rows.state[3] = g.done_state  # a finished row repeating EOS stays put and records nothing
    # make about half the rows legal so both branches run
    for r in range(4, B, 2):
        legal = [v for v, ok in enumerate(naive_legal(g, int(rows.state[r]))) if ok]
        if legal:
            tokens[r] = legal[int(torch.randint(0, len(legal), (1,), generator=gen))]
    tokens = tokens.to(DEVICE)

    a, b = clone_rows(rows), clone_rows(rows)
    mask_torch.advance_(tokens, a, t)
    mask_triton.advance_(tokens, b, t, block_b=16)
    assert_rows_equal(a, b)

    table, cls = g.class_next.long().tolist(), g.token_class.tolist()
    for r in range(B):
        s, tok, step = int(rows.state[r]), int(tokens[r]), int(rows.step[r])
        nxt = table[s][cls[tok]] if 0 <= tok < g.vocab_size else -1
        if nxt < 0:
            assert int(a.state[r]) == s and a.fault[r].tolist() == [1, tok, s]
            assert int(a.step[r]) == step
        else:
            assert int(a.state[r]) == nxt and a.fault[r].tolist() == [0, 0, 0]
            moved = s != g.done_state
            assert int(a.step[r]) == step + moved
            if moved and step < 8:
                assert int(a.history[r, step]) == tok
        assert torch.equal(a.history[r, :step], rows.history[r, :step])  # earlier history is never rewritten


def test_advance_keeps_first_fault():
    g = make_random_grammar(vocab_size=200, seed=7)
    t = tables_of(g)
    rows = random_rows(g, 2, seed=8)
    rows.state.fill_(g.start)
    for mod in (mask_torch, mask_triton):
        r = clone_rows(rows)
        mod.advance_(torch.tensor([0, 1], device=DEVICE), r, t)  # unk, BOS: never legal
        mod.advance_(torch.tensor([1, -5], device=DEVICE), r, t)
        assert r.fault.tolist() == [[1, 0, g.start], [1, 1, g.start]]


# ----------------------------------------------------------------------------------------------------------
# fused sample

@pytest.mark.parametrize("dtype", DTYPES)
def test_greedy_sample_triton_equals_torch_and_naive(dtype):
    g = make_random_grammar(num_states=30, num_classes=10, vocab_size=2000, seed=9)
    t = tables_of(g)
    B = 6
    rows = random_rows(g, B, seed=10)
    # few distinct values: many exact ties, which must go to the lowest legal id
    logits = torch.randint(-3, 3, (B, 2050), generator=torch.Generator().manual_seed(11)).to(dtype).to(DEVICE)
    a, b = clone_rows(rows), clone_rows(rows)
    before = logits.clone()
    tok_torch, counts_torch = mask_torch.sample_(logits, a, t, temperature=0.0)
    tok_triton, counts_triton = mask_triton.sample_(logits, b, t, temperature=0.0, block_v=1024)
    assert torch.equal(logits, before)  # sample does not modify the logits
    assert torch.equal(tok_torch, tok_triton)
    assert torch.equal(counts_torch, counts_triton)
    assert_rows_equal(a, b)
    for r in range(B):
        assert int(tok_torch[r]) == naive_pick(g, int(rows.state[r]), logits[r, :2000].float().tolist())


@pytest.mark.parametrize("seed", [0, 99])
@pytest.mark.parametrize("temperature", [0.5, 1.0, 3.0])
def test_seeded_sample_triton_equals_torch_and_naive(seed, temperature):
    g = make_random_grammar(num_states=30, num_classes=10, vocab_size=1200, hole_frac=0.3, seed=12)
    t = tables_of(g)
    B = 5
    rows = random_rows(g, B, seed=13)
    logits = torch.randn(B, 1200, generator=torch.Generator().manual_seed(14)).to(DEVICE)
    a, b = clone_rows(rows), clone_rows(rows)
    tok_torch, _ = mask_torch.sample_(logits, a, t, temperature=temperature, seed=seed)
    tok_triton, _ = mask_triton.sample_(logits, b, t, temperature=temperature, seed=seed, block_v=1024)
    assert torch.equal(tok_torch, tok_triton)
    assert_rows_equal(a, b)
    c = clone_rows(rows)
    assert torch.equal(mask_cpu.sample_(logits.cpu(), c, tables_of_cpu(g), temperature=temperature, seed=seed)[0],
                       tok_torch.cpu())
    # the definition: the first maximum among legal ids of the Gumbel process, computed from its formulas
    keys = rng.row_keys(seed, torch.arange(B), rows.step.cpu())
    for r in range(B):
        z = naive_process(logits[r].cpu(), temperature, int(keys[r]))
        assert int(tok_torch[r]) == naive_pick(g, int(rows.state[r]), z)


def test_sample_fallbacks():
    """All legal logits -inf -> the first legal id; a state with no legal id -> EOS, reported as a fault."""
    g = make_random_grammar(num_states=10, num_classes=6, vocab_size=300, seed=15)
    dead = g.class_next.clone()
    dead[1] = -1  # state 1 becomes a dead end
    legal_count = g.legal_count.clone()
    legal_count[1] = 0
    t = make_tables(g.token_class.to(DEVICE), dead.to(DEVICE), legal_count.to(DEVICE), g.done_state, g.eos_id)
    rows = random_rows(g, 2, seed=16)
    rows.state.copy_(torch.tensor([0, 1], dtype=torch.int32, device=DEVICE))
    logits = torch.full((2, 300), NEG_INF, device=DEVICE)
    first_legal = naive_legal(g, 0).index(True)
    for mod, T in [(m, T) for m in (mask_torch, mask_cpu, mask_triton) for T in (0.0, 1.0)]:
        r = clone_rows(rows)
        tok, counts = mod.sample_(logits, r, t, temperature=T)
        assert tok.tolist() == [first_legal, g.eos_id], (mod.__name__, T)
        assert counts.tolist() == [int(g.legal_count[0]), 0]
        assert r.fault[1].tolist() == [1, g.eos_id, 1] and int(r.fault[0, 0]) == 0


# ----------------------------------------------------------------------------------------------------------
# the CPU fast paths (mask_cpu.py): short token lists, blocked first maximum, the block search

def tables_of_cpu(g):
    return make_tables(g.token_class, g.class_next.contiguous(), g.legal_count, g.done_state, g.eos_id)


def mixed_rows(g, B, seed):
    """Rows over all states, with both kinds present: few legal tokens (listed legal) and many (listed illegal)."""
    rows = random_rows(g, B, seed=seed)
    counts = g.legal_count[rows.state.long().cpu()]
    few = counts * 2 < g.vocab_size
    assert bool(few.any()) and bool((~few).any()), "the fixture must exercise both sides"
    return rows


def test_short_sides_list_the_shorter_side_exactly():
    g = make_random_grammar(num_states=40, num_classes=12, vocab_size=900, hole_frac=0.5, seed=21)
    t = tables_of(g)
    sides = mask_cpu.sides_of(t)
    for s in range(g.num_states):
        legal = naive_legal(g, s)
        grp = int(sides.state_group[s])
        start, n = int(sides.start[grp]), int(sides.length[grp])
        listed = sides.tokens[start:start + n].tolist()
        few = sum(legal) * 2 < g.vocab_size
        assert bool(sides.few_legal[grp]) == few
        expect = [v for v, ok in enumerate(legal) if ok == few]  # ascending ids of the shorter side
        assert listed == expect, s
        blocks = sorted({v // gumbel.NOISE_BLOCK for v, ok in enumerate(legal) if ok})
        assert sides.block_legal[grp].nonzero()[:, 0].tolist() == blocks, s
    assert sides.nbytes > 0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pad", [0, 29])
def test_sparse_mask_equals_dense_mask_and_naive(dtype, pad):
    g = make_random_grammar(num_states=40, num_classes=12, vocab_size=1100, hole_frac=0.5, seed=22)
    t = tables_of_cpu(g)  # the sparse form is the CPU's (it sizes its index lists on the host)
    rows = mixed_rows(g, 12, seed=23)  # row 0 is finished (done_state: EOS only)
    logits = torch.randn(12, 1100 + pad, generator=torch.Generator().manual_seed(24)).to(dtype)
    a, b = logits.clone(), logits.clone()
    counts_sparse = mask_cpu.mask_logits_(a, rows.state.cpu(), t)
    counts_dense = mask_torch.mask_logits_(b, rows.state.cpu(), t)
    assert torch.equal(a, b) and torch.equal(counts_sparse, counts_dense)
    for r, s in enumerate(rows.state.tolist()):
        legal = torch.tensor(naive_legal(g, s) + [False] * pad)
        assert torch.equal(a[r][legal], logits[r][legal])
        assert bool((a[r][~legal] == NEG_INF).all())


def test_sparse_mask_on_a_strided_column_slice():
    """Logits that are a transposed buffer (no unit stride at all) are masked like a contiguous copy."""
    g = make_random_grammar(num_states=40, num_classes=12, vocab_size=500, hole_frac=0.5, seed=25)
    t = tables_of_cpu(g)
    rows = mixed_rows(g, 6, seed=26)
    buf = torch.randn(520, 6, generator=torch.Generator().manual_seed(27))
    a = buf.t()  # [6, 520], strides (1, 6)
    b = a.contiguous()
    mask_cpu.mask_logits_(a, rows.state.cpu(), t)
    mask_torch.mask_logits_(b, rows.state.cpu(), t)
    assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("V", [5, 255, 256, 1000, 1024, 1030])
def test_first_max_is_max_and_first_argmax(dtype, V):
    gen = torch.Generator().manual_seed(V)
    x = torch.randint(-3, 3, (7, V), generator=gen).to(dtype)  # many ties
    x[1] = NEG_INF  # all -inf: index 0
    x[2, V - 1] = 10.0  # the maximum in the last (possibly short) block
    x[3, V // 2:] = 7.0  # tie across many blocks: the first one wins
    best, idx = mask_cpu.first_max(x)
    assert torch.equal(idx, torch.tensor([int(torch.argmax(row.float())) for row in x]))  # plain per-row argmax
    assert torch.equal(best, x.amax(1))


@pytest.mark.parametrize("dtype", DTYPES)
def test_sparse_greedy_when_the_maximum_is_illegal(dtype):
    """Illegal ids carry the largest logits, so every many-legal row takes the masked-copy path."""
    g = make_random_grammar(num_states=40, num_classes=12, vocab_size=1500, hole_frac=0.5, seed=28)
    t = tables_of(g)
    rows = mixed_rows(g, 8, seed=29)
    gen = torch.Generator().manual_seed(30)
    logits = torch.randint(-3, 3, (8, 1510), generator=gen).float()
    for r, s in enumerate(rows.state.tolist()):
        legal = torch.tensor(naive_legal(g, s) + [False] * 10)
        logits[r][~legal] = 50.0
    logits = logits.to(dtype).to(DEVICE)
    a, b = clone_rows(rows), clone_rows(rows)
    tok_torch, _ = mask_torch.sample_(logits, a, t, temperature=0.0)
    tok_triton, _ = mask_triton.sample_(logits, b, t, temperature=0.0, block_v=1024)
    tok_cpu, _ = mask_cpu.sample_(logits.cpu(), clone_rows(rows), tables_of_cpu(g), temperature=0.0)
    assert torch.equal(tok_torch, tok_triton) and torch.equal(tok_cpu, tok_torch.cpu())
    assert_rows_equal(a, b)
    for r in range(8):
        assert int(tok_torch[r]) == naive_pick(g, int(rows.state[r]), logits[r, :1500].float().tolist())


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_sparse_sample_equals_dense_sample(temperature):
    """The CPU sample path (short lists, blocked maximum, block search) picks the tokens of the dense reference,
    chunked or not, on rows of both kinds, finished rows included."""
    g = make_random_grammar(num_states=40, num_classes=12, vocab_size=2000, hole_frac=0.5, seed=31)
    t = tables_of_cpu(g)
    rows = mixed_rows(g, 24, seed=32)
    rows = Rows(rows.state.cpu(), rows.step.cpu(), rows.history.cpu(), rows.fault.cpu())
    few = (g.legal_count[rows.state.long()] * 2 < g.vocab_size).tolist()
    logits = torch.randn(24, 2000, generator=torch.Generator().manual_seed(33))
    logits[5, :] = NEG_INF  # every legal score -inf: the first legal token
    # batches where most rows have many legal tokens, and where most have few (the greedy path differs)
    for mostly_few in (False, True):
        fill = rows.state[few.index(mostly_few)]
        state = rows.state.clone()
        state[4:20] = fill
        dense = torch.cat([mask_torch.choose_tokens(logits[r:r + 5], state[r:r + 5], rows.step[r:r + 5], t,
                                                    temperature, 1.0, seed=3,
                                                    ids=torch.arange(r, min(r + 5, 24)))
                           for r in range(0, 24, 5)])
        for chunk in (None, 7):
            r = clone_rows(rows)
            r.state.copy_(state)
            tok, _ = mask_cpu.sample_(logits, r, t, temperature=temperature, seed=3, rows_per_chunk=chunk)
            assert torch.equal(tok, dense), (mostly_few, chunk)


def test_draws_follow_the_row_key_not_the_slot():
    """A sequence keyed by k samples the same tokens in any slot, on both backends."""
    g = make_random_grammar(num_states=30, num_classes=9, vocab_size=300, seed=11)
    t = tables_of(g)
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(4, g.vocab_size, generator=gen)
    base = random_rows(g, 4, seed=2)
    base.state.fill_(int(g.start))
    base.step.fill_(3)
    base.key = torch.tensor([70, 71, 72, 73])
    swapped = clone_rows(base)
    swapped.key = base.key.flip(0).clone()
    for backend in (mask_torch, mask_cpu, mask_triton):
        a, _ = backend.sample_(logits, clone_rows(base), t, temperature=1.0, seed=9)
        b, _ = backend.sample_(logits.flip(0).contiguous(), clone_rows(swapped), t, temperature=1.0, seed=9)
        assert torch.equal(a, b.flip(0)), backend.__name__


# ----------------------------------------------------------------------------------------------------------
# the next-state rule: the Triton kernel's jitted copy of batchmask.next_codes.decode_next

def test_jitted_decode_next_agrees_on_every_code_kind():
    states = torch.tensor([0, 1, 5, 7, 100, 32000, 40000, 3, 9, 65000], dtype=torch.int32)
    codes = torch.tensor([0, 4, -1, -2, -3, -1000, -20000, 12, -1, -3000], dtype=torch.int32)  # absolute,
    codes, states = codes.repeat(3), states.repeat(3)  # illegal, relative (-2: next = state), far relative
    want = decode_next(codes, states)
    for dtype in (torch.int16, torch.int32):  # the table dtypes the kernels read
        c = codes.clamp(-32768, 32767).to(dtype)
        out = torch.empty(codes.numel(), dtype=torch.int32, device=DEVICE)
        mask_triton._decode_kernel[(1,)](c.to(DEVICE), states.to(DEVICE), out, codes.numel(), BLOCK=32)
        assert out.cpu().tolist() == decode_next(c, states).tolist(), dtype
    assert want.tolist()[:7] == [0, 4, -1, 7, 101, 32998, 59998]  # the rule itself, spelled out


# ----------------------------------------------------------------------------------------------------------
# non-finite logits (fp16 overflow): NaN counts as -inf; no finite legal logit -> the first legal token

def non_finite_logits(g, states: list[int], dtype) -> torch.Tensor:
    """Rows that break in different ways: NaN on legal ids, every legal logit NaN / -inf / +inf mixed,
    one legal +inf among finite ones, +inf and NaN on illegal ids only, and a clean row."""
    V = g.vocab_size
    x = torch.randn(len(states), V, generator=torch.Generator().manual_seed(40)).to(dtype)
    legal = [torch.tensor(naive_legal(g, s)) for s in states]
    l0 = legal[0].nonzero()[:, 0]
    x[0, l0[::2]] = float("nan")                      # half the legal logits NaN
    l1 = legal[1].nonzero()[:, 0]
    x[1, l1] = torch.tensor([float("nan"), float("inf"), float("-inf")]).repeat(len(l1))[:len(l1)].to(dtype)
    x[2, legal[2]] = float("nan")                     # every legal logit NaN
    l3 = legal[3].nonzero()[:, 0]
    x[3, l3[len(l3) // 2]] = float("inf")             # one legal +inf among finite logits
    x[4, ~legal[4]] = torch.tensor([float("inf"), float("nan")]).repeat(V)[:int((~legal[4]).sum())].to(dtype)
    return x


def expected_non_finite(g, states, x, temperature: float) -> list[int | None]:
    """The rule per row where it fixes the token (None: an ordinary draw among the finite legal logits)."""
    out = []
    for r, s in enumerate(states):
        legal = naive_legal(g, s)
        y = x[r].float().tolist()
        finite = [v for v, ok in enumerate(legal) if ok and math.isfinite(y[v])]
        if not finite:
            out.append(legal.index(True))
        elif any(ok and y[v] == float("inf") for v, ok in enumerate(legal)):
            out.append(next(v for v, ok in enumerate(legal) if ok and y[v] == float("inf")))
        else:
            out.append(None)
    return out


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_non_finite_logits_never_choose_an_illegal_token(dtype, temperature):
    g = make_random_grammar(num_states=30, num_classes=10, vocab_size=700, hole_frac=0.4, seed=41)
    few = [s for s in range(g.num_states - 4) if 3 <= int(g.legal_count[s]) and int(g.legal_count[s]) < 350]
    many = [s for s in range(g.num_states - 4) if int(g.legal_count[s]) >= 350]
    states = [many[0], few[0], many[1 % len(many)], few[1 % len(few)], many[0], few[0]]
    x = non_finite_logits(g, states, dtype)
    want = expected_non_finite(g, states, x, temperature)
    assert want[:4] != [None] * 4 and want[4] is None and want[5] is None
    base = random_rows(g, len(states), seed=42)
    base.state.copy_(torch.tensor(states, dtype=torch.int32))
    results = []
    for mod in (mask_torch, mask_cpu, mask_triton):
        t = tables_of_cpu(g) if mod is mask_cpu else tables_of(g)
        r = clone_rows(base if mod is not mask_cpu else Rows(*(v.cpu() for v in (base.state, base.step,
                                                                                     base.history, base.fault))))
        logits = x.cpu() if mod is mask_cpu else x.to(DEVICE)
        if mod is mask_triton:
            tok, _ = mod.sample_(logits, r, t, temperature=temperature, seed=7, block_v=256)
        else:
            tok, _ = mod.sample_(logits, r, t, temperature=temperature, seed=7)
        tok = tok.cpu().tolist()
        assert int(r.fault[:, 0].sum()) == 0, mod.__name__  # every token legal
        for row, (got, rule) in enumerate(zip(tok, want)):
            assert naive_legal(g, states[row])[got]
            if rule is not None:
                assert got == rule, (mod.__name__, row)
        results.append(tok)
    assert results[0] == results[1] == results[2]
    if temperature == 0:  # a NaN never wins: the greedy token is the first maximum of the finite legal ones
        for row in (0, 4, 5):
            legal = naive_legal(g, states[row])
            y = x[row].float().tolist()
            assert results[0][row] == naive_pick(g, states[row], [v if v == v else NEG_INF for v in y])
            assert legal[results[0][row]]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_mask_turns_legal_nan_into_minus_inf(dtype):
    g = make_random_grammar(num_states=30, num_classes=10, vocab_size=700, hole_frac=0.4, seed=43)
    states = list(range(0, 24, 2))
    x = torch.randn(len(states), 720, generator=torch.Generator().manual_seed(44)).to(dtype)
    x[:, ::3] = float("nan")
    x[1, :] = float("nan")
    a, b, c = x.clone(), x.clone().to(DEVICE), x.clone()
    state = torch.tensor(states, dtype=torch.int32)
    mask_torch.mask_logits_(a, state, tables_of_cpu(g))
    mask_triton.mask_logits_(b, state.to(DEVICE), tables_of(g), block_v=256)
    mask_cpu.mask_logits_(c, state, tables_of_cpu(g))
    assert not bool(torch.isnan(a).any())
    assert torch.equal(a, b.cpu()) and torch.equal(a, c)
    for r, s in enumerate(states):
        legal = torch.tensor(naive_legal(g, s) + [False] * 20)
        keep = legal & ~torch.isnan(x[r])
        assert torch.equal(a[r][keep], x[r][keep]) and bool((a[r][~keep] == NEG_INF).all())


# ----------------------------------------------------------------------------------------------------------
# the free draw and the masked draw are one process: equal wherever the free token is legal

def test_free_draw_equals_the_masked_draw_where_it_is_legal():
    g = make_random_grammar(num_states=30, num_classes=10, vocab_size=1000, hole_frac=0.2, seed=45)
    V = g.vocab_size
    free = make_tables(torch.zeros(V, dtype=torch.int32), torch.zeros(1, 1, dtype=torch.int32),
                       torch.tensor([V], dtype=torch.int32), 0, g.eos_id)
    B = 12
    base = random_rows(g, B, seed=46)
    base.key = torch.arange(100, 100 + B, device=DEVICE)
    legal_free = same = 0
    for trial in range(3):
        logits = 2 * torch.randn(B, V, generator=torch.Generator().manual_seed(trial))
        for mod in (mask_torch, mask_cpu, mask_triton):
            dev = "cpu" if mod is mask_cpu else DEVICE
            kw = {"block_v": 256} if mod is mask_triton else {}
            ct, ft = (make_tables(*(x.to(dev) for x in (tt.token_class, tt.row_next, tt.legal_count)),
                                  tt.done_state, tt.eos_id) for tt in (tables_of_cpu(g), free))
            c_rows, f_rows = clone_rows(base), clone_rows(base)
            for r in (c_rows, f_rows):
                for name in ("state", "step", "history", "fault", "key"):
                    setattr(r, name, getattr(r, name).to(dev))
            f_rows.state.zero_()
            masked, _ = mod.sample_(logits.to(dev), c_rows, ct, temperature=1.0, seed=trial, **kw)
            drawn, _ = mod.sample_(logits.to(dev), f_rows, ft, temperature=1.0, seed=trial, **kw)
            for row in range(B):
                tok = int(drawn[row])
                if naive_legal(g, int(base.state[row]))[tok]:
                    legal_free += 1
                    same += int(masked[row]) == tok
    assert same == legal_free and 0 < legal_free < 3 * 3 * B  # both cases occur
