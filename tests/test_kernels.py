"""
The Triton kernels against the torch reference (bit for bit for masking, advancing and the uniforms; the same
tokens for greedy and seeded sampling), and both against plainly written per-row Python loops (the Gumbel
process in float64, from its defining formula). The CPU fast paths: tests/test_kernels_cpu.py.

Without a GPU the kernels run in Triton's interpreter, which must be switched on before triton is imported:
this module sets TRITON_INTERPRET=1 before importing kernels.mask_triton. The interpreter is slow, so sizes
stay small (V of a few thousand at most, a handful of rows, big blocks).
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np
import pytest
from batchmask.kernels import choose_cpu, mask_torch, rng
from batchmask.kernels.tables import make_tables

from batchmask.table.next_codes import decode_next
from tests.grammar_fixtures import make_random_grammar
from tests.kernel_helpers import (
    DEVICE,
    DTYPES,
    NEG_INF,
    assert_rows_equal,
    clone_rows,
    naive_legal,
    naive_pick,
    naive_process,
    random_rows,
    tables_of,
    tables_of_cpu,
)

triton = pytest.importorskip("triton")
from batchmask.kernels import mask_triton  # noqa: E402  (after TRITON_INTERPRET is set)

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
    assert torch.equal(choose_cpu.sample_(logits.cpu(), c, tables_of_cpu(g), temperature=temperature, seed=seed)[0],
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
    for mod, T in [(m, T) for m in (mask_torch, choose_cpu, mask_triton) for T in (0.0, 1.0)]:
        r = clone_rows(rows)
        tok, counts = mod.sample_(logits, r, t, temperature=T)
        assert tok.tolist() == [first_legal, g.eos_id], (mod.__name__, T)
        assert counts.tolist() == [int(g.legal_count[0]), 0]
        assert r.fault[1].tolist() == [1, g.eos_id, 1] and int(r.fault[0, 0]) == 0


# ----------------------------------------------------------------------------------------------------------
# the next-state rule: the Triton kernel's jitted copy of batchmask.table.next_codes.decode_next

def test_jitted_decode_next_agrees_on_every_code_kind():
    targets = torch.tensor([3, 9, 17, 40000, 65000, 70000], dtype=torch.int32)   # what absolute codes name
    states = torch.tensor([0, 1, 5, 7, 100, 32000, 40000, 3, 9, 65000], dtype=torch.int32)
    codes = torch.tensor([0, 4, -1, -2, -3, -1000, -20000, 5, -1, -3000], dtype=torch.int32)  # absolute,
    codes, states = codes.repeat(3), states.repeat(3)  # illegal, relative (-2: next = state), far relative
    want = decode_next(codes, states, targets)
    for dtype in (torch.int16, torch.int32):  # the table dtypes the kernels read
        c = codes.clamp(-32768, 32767).to(dtype)
        out = torch.empty(codes.numel(), dtype=torch.int32, device=DEVICE)
        zero = torch.zeros(1, dtype=torch.int32, device=DEVICE)       # one segment at 0
        mask_triton._decode_kernel[(1,)](c.to(DEVICE), states.to(DEVICE), targets.to(DEVICE), zero, zero, 1, out,
                                         codes.numel(), BLOCK=32)
        assert out.cpu().tolist() == decode_next(c, states, targets).tolist(), dtype
    assert want.tolist()[:8] == [3, 65000, -1, 7, 101, 32998, 59998, 70000]  # the rule itself, spelled out


def test_jitted_decode_reads_absolute_codes_from_the_state_segment():
    # segments: states 0..9 read targets from 0, 10..19 from 2, 20..24 from 5, 25.. from 1 (bases need not grow)
    seg_start = torch.tensor([0, 10, 20, 25], dtype=torch.int32)
    seg_base = torch.tensor([0, 2, 5, 1], dtype=torch.int32)
    targets = torch.tensor([30, 31, 32, 33, 34, 35, 36, 37], dtype=torch.int32)
    states = torch.tensor([0, 9, 10, 19, 20, 24, 25, 99, 3, 12], dtype=torch.int32)
    codes = torch.tensor([1, 0, 0, 3, 2, 0, 6, 0, -1, -4], dtype=torch.int32)
    base = [0, 0, 2, 2, 5, 5, 1, 1]
    expect = [int(targets[b + c]) for b, c in zip(base, codes[:8].tolist())] + [-1, 12 + 2]   # spelled out
    assert decode_next(codes, states, targets, seg_start, seg_base).tolist() == expect
    for G in (1, 4):           # one segment (the plain list) and four
        out = torch.empty(codes.numel(), dtype=torch.int32, device=DEVICE)
        mask_triton._decode_kernel[(1,)](codes.to(DEVICE), states.to(DEVICE), targets.to(DEVICE),
                                         seg_start[:G].to(DEVICE), seg_base[:G].to(DEVICE), G, out, codes.numel(),
                                         BLOCK=16)
        assert out.cpu().tolist() == decode_next(codes, states, targets, seg_start[:G], seg_base[:G]).tolist(), G
