"""
The CPU fast paths (kernels/mask_cpu.py, kernels/choose_cpu.py: short token lists, blocked first maximum, the
block search of the sampler, the nucleus from sorted values) against the reference (kernels/mask_torch.py) and
the plain per-row loops; non-finite logits on every backend; the free draw against the masked draw.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import math

import pytest
from batchmask.kernels import choose_cpu, gumbel, mask_cpu, mask_torch
from batchmask.kernels.tables import Rows, make_tables

from tests.grammar_fixtures import make_random_grammar
from tests.kernel_helpers import (
    DEVICE,
    DTYPES,
    NEG_INF,
    assert_rows_equal,
    clone_rows,
    mixed_rows,
    naive_legal,
    naive_pick,
    random_rows,
    tables_of,
    tables_of_cpu,
)

triton = pytest.importorskip("triton")
from batchmask.kernels import mask_triton  # noqa: E402  (after TRITON_INTERPRET is set)


@pytest.mark.parametrize("layout", ["scattered", "contiguous"])
def test_short_sides_list_the_shorter_side_exactly(layout):
    g = make_random_grammar(num_states=40, num_classes=12, vocab_size=900, hole_frac=0.5, seed=21)
    if layout == "contiguous":  # each class a run of ids: whole noise blocks are illegal in many-legal states
        g.token_class = g.token_class.sort().values
    t = tables_of(g)
    sides = mask_cpu.sides_of(t)
    assert sides.num_groups == 0  # nothing is listed before a step asks
    order = torch.randperm(g.num_states, generator=torch.Generator().manual_seed(20))
    for chunk in order.split(7):  # rows are listed a few at a time, as steps meet them
        groups = sides.groups(chunk.int().numpy())
        for s, grp in zip(chunk.tolist(), groups.tolist()):
            legal = naive_legal(g, s)
            start, n = int(sides.start[grp]), int(sides.length[grp])
            listed = sides.tokens[start:start + n].tolist()
            few = sum(legal) * 2 < g.vocab_size
            assert bool(sides.few_legal[grp]) == few
            expect = [v for v, ok in enumerate(legal) if ok == few]  # ascending ids of the shorter side
            assert listed == expect, s
            blocks = sorted({v // gumbel.NOISE_BLOCK for v, ok in enumerate(legal) if ok})
            assert sides.block_legal[grp].nonzero()[0].tolist() == blocks, s
    # states whose rows allow the same classes share one group, and each distinct class set has one
    sets = {tuple((g.class_next[s] >= 0).tolist()) for s in range(g.num_states)}
    assert sides.num_groups == len(sets) and sides.resets == 0
    assert sides.nbytes > 0


def test_short_sides_within_a_tiny_budget_give_the_same_masks_and_tokens():
    """A budget smaller than one step's lists: the store is emptied and refilled on (nearly) every call, and masks
    and greedy / sampled tokens still equal the reference's; memory stays within max(budget, one call's lists)."""
    g = make_random_grammar(num_states=60, num_classes=14, vocab_size=1000, hole_frac=0.5, seed=28)
    t, ref = tables_of_cpu(g), tables_of_cpu(g)
    sides = mask_cpu.sides_of(t)
    sides.budget = 64  # bytes: 16 ids
    gen = torch.Generator().manual_seed(29)
    batches = [torch.randint(0, g.num_states, (10,), generator=gen).int() for _ in range(3)]
    for step, k in enumerate([0, 1, 0, 2, 1, 0, 0]):  # batches met again after the store was emptied
        state = batches[k]
        logits = torch.randn(10, 1000, generator=gen)
        a, b = logits.clone(), logits.clone()
        assert torch.equal(mask_cpu.mask_logits_(a, state, t), mask_torch.mask_logits_(b, state, ref))
        assert torch.equal(a, b)
        for temperature in (0.0, 1.0):
            got = choose_cpu.choose_tokens(logits, state, torch.full((10,), step), t, temperature, 1.0, seed=3)
            want = mask_torch.choose_tokens(logits, state, torch.full((10,), step), ref, temperature, 1.0, seed=3)
            assert torch.equal(got, want), (step, temperature)
        # what stays: the row -> group map and the class layout, then at most this call's 10 groups (int32 ids,
        # at most V / 2 each; flags, start, length, noise blocks), arrays allocated with >= 16 items
        per_group = 1 + 8 + 8 + gumbel.num_blocks(1000)
        fixed = sides.row_group.nbytes + 4 * 1000 + 16 * 14
        assert sides.nbytes <= fixed + 10 * (4 * 500 + per_group) + 16 * (4 + per_group), step
    assert sides.resets >= 3


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
    best, idx = choose_cpu.first_max(x)
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
    tok_cpu, _ = choose_cpu.sample_(logits.cpu(), clone_rows(rows), tables_of_cpu(g), temperature=0.0)
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
            tok, _ = choose_cpu.sample_(logits, r, t, temperature=temperature, seed=3, rows_per_chunk=chunk)
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
    for backend in (mask_torch, choose_cpu, mask_triton):
        a, _ = backend.sample_(logits, clone_rows(base), t, temperature=1.0, seed=9)
        b, _ = backend.sample_(logits.flip(0).contiguous(), clone_rows(swapped), t, temperature=1.0, seed=9)
        assert torch.equal(a, b.flip(0)), backend.__name__


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
    for mod in (mask_torch, choose_cpu, mask_triton):
        t = tables_of_cpu(g) if mod is choose_cpu else tables_of(g)
        r = clone_rows(base if mod is not choose_cpu else Rows(*(v.cpu() for v in (base.state, base.step,
                                                                                     base.history, base.fault))))
        logits = x.cpu() if mod is choose_cpu else x.to(DEVICE)
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
    B = 10
    base = random_rows(g, B, seed=46)
    base.key = torch.arange(100, 100 + B, device=DEVICE)
    legal_free = same = 0
    for trial in range(2):
        logits = 2 * torch.randn(B, V, generator=torch.Generator().manual_seed(trial))
        for mod in (mask_torch, choose_cpu, mask_triton):
            dev = "cpu" if mod is choose_cpu else DEVICE
            kw = {"block_v": 256} if mod is mask_triton else {}
            ct, ft = (make_tables(*(x.to(dev) for x in (tt.token_class, tt.row_next, tt.row_legal)),
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
    assert same == legal_free and 0 < legal_free < 2 * 3 * B  # both cases occur


# ----------------------------------------------------------------------------------------------------------
# top-p on the CPU: the nucleus from sorted values, the search inside it

@pytest.mark.parametrize("ties", [False, True])
def test_cpu_nucleus_is_the_reference_nucleus(ties):
    gen = torch.Generator().manual_seed(47)
    p = torch.randn(20, 900, generator=gen) * 2
    if ties:  # many equal probabilities, the boundary inside a run of them
        p = p.round()
    p[3, 100:] = NEG_INF
    for top_p in (0.05, 0.5, 0.9, 0.999):
        assert torch.equal(choose_cpu.top_p_keep(p, top_p), mask_torch.top_p_keep(p, top_p)), top_p


@pytest.mark.parametrize("top_p", [0.3, 0.9])
def test_cpu_top_p_sample_equals_the_reference(top_p):
    g = make_random_grammar(num_states=40, num_classes=12, vocab_size=1500, hole_frac=0.5, seed=48)
    t = tables_of_cpu(g)
    rows = mixed_rows(g, 16, seed=49)
    logits = torch.randn(16, 1510, generator=torch.Generator().manual_seed(50)) * 2
    logits[2, 5] = float("nan")
    for seed in range(3):
        want = mask_torch.choose_tokens(logits, rows.state.cpu(), rows.step.cpu(), t, 0.8, top_p, seed)
        got = choose_cpu.choose_tokens(logits, rows.state.cpu(), rows.step.cpu(), t, 0.8, top_p, seed)
        assert torch.equal(got, want), seed


# ----------------------------------------------------------------------------------------------------------
# the distribution of the block process: legal tokens spread over several noise blocks, illegal ones strong

def spread_tables(V: int, legal: list[int], device):
    """One state (0, looping) in which exactly the ids `legal` may be emitted; no done state (-1), so every step
    advances the rows' step counters and draws afresh."""
    token_class = torch.zeros(V, dtype=torch.int32)
    token_class[legal] = 1
    return make_tables(token_class.to(device), torch.tensor([[-1, 0]], dtype=torch.int32, device=device),
                       torch.tensor([len(legal)], dtype=torch.int32, device=device), -1, legal[0])


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    return float(torch.special.gammaincc(torch.tensor((counts.numel() - 1) / 2, dtype=torch.float64),
                                         torch.tensor(chi2 / 2, dtype=torch.float64)))


@pytest.mark.parametrize("mod", [mask_torch, choose_cpu])
def test_block_process_samples_softmax_over_legal_tokens(mod):
    """Sampling at T follows softmax(logit / T) over the legal ids when they sit in different noise blocks,
    next to illegal ids with larger logits (chi-square, p > 1e-3); the same draws fail against the softmax
    without the temperature (the test has teeth). The Triton kernel gives the reference's tokens (test_kernels)."""
    rows = 6000
    V, legal = 700, [5, 60, 131, 300, 301, 560, 699]  # blocks 0, 0, 1, 2, 2, 4, 5
    weights = torch.tensor([0.3, -0.4, 1.1, 0.0, 0.5, -0.9, 0.8])
    T = 0.7
    logits = torch.full((rows, V), 4.0)  # illegal ids dominate every block they share
    logits[:, legal] = weights
    dev = "cpu" if mod is choose_cpu else DEVICE
    t = spread_tables(V, legal, dev)
    r = Rows(torch.zeros(rows, dtype=torch.int32, device=dev), torch.zeros(rows, dtype=torch.int32, device=dev),
             torch.zeros(rows, 1, dtype=torch.int32, device=dev), torch.zeros(rows, 3, dtype=torch.int64, device=dev))
    tok = mod.sample_(logits.to(dev), r, t, temperature=T, seed=21)[0].cpu()
    assert bool(torch.isin(tok, torch.tensor(legal)).all())
    counts = torch.tensor([(tok == v).sum() for v in legal]).float()
    assert chi_square_p(counts, torch.softmax(weights / T, 0)) > 1e-3
    assert chi_square_p(counts, torch.softmax(weights, 0)) < 1e-6


def test_numpy_advance_equals_the_reference():
    g = make_random_grammar(num_states=25, num_classes=9, vocab_size=400, seed=51)
    t = tables_of_cpu(g)
    rows = random_rows(g, 40, H=8, seed=52)
    rows = Rows(*(x.cpu() for x in (rows.state, rows.step, rows.history, rows.fault)))
    tokens = torch.randint(-3, g.vocab_size + 5, (40,), generator=torch.Generator().manual_seed(53))
    for r in range(0, 40, 2):  # half the rows legal, so both branches run
        legal = [v for v, ok in enumerate(naive_legal(g, int(rows.state[r]))) if ok]
        tokens[r] = legal[r % len(legal)] if legal else tokens[r]
    a, b = clone_rows(rows), clone_rows(rows)
    for _ in range(2):  # the second step meets the first one's faults
        mask_torch.advance_(tokens, a, t)
        mask_cpu.advance_(tokens, b, t)
        assert_rows_equal(a, b)
    assert 0 < int(a.fault[:, 0].sum()) < 40
