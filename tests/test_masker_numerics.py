"""
BatchMasker on hostile numbers and against its own free draw: logits that overflowed (fp16 +-inf, NaN from
inf - inf) never yield an illegal token, on both backends; sample_unmasked (the free arm's sampler) draws what
the masker draws wherever that token is legal.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


import pytest

from batchmask.masker import BatchMasker, sample_unmasked
from tests.grammar_fixtures import make_random_grammar
from tests.kernel_helpers import BACKENDS, DEVICE, HAVE_TRITON, NEG_INF  # noqa: F401


def legal_ids(g, state: int) -> list[int]:
    table, cls = g.class_next.long().tolist(), g.token_class.tolist()
    return [v for v, c in enumerate(cls) if table[state][c] >= 0]


def overflowed(g, B: int, step: int) -> torch.Tensor:
    """fp16 logits of a model that blew up: huge activations overflow to +-inf, their differences to NaN."""
    gen = torch.Generator().manual_seed(100 + step)
    big = torch.randn(B, g.vocab_size, generator=gen) * 1e5  # most entries beyond fp16's 65504
    x = big.half()
    x[1::3] = (x[1::3] - x[1::3].flip(1))  # inf - inf = NaN where both overflowed
    x[2::3, ::2] = float("nan")
    return x.to(DEVICE)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_overflowed_logits_walk_the_grammar_legally(backend, temperature):
    g = make_random_grammar(num_states=30, num_classes=10, vocab_size=600, hole_frac=0.4, seed=60)
    B = 6
    m = BatchMasker(g, B, device=DEVICE, backend=backend, max_tokens=40)
    for step in range(12):
        states = m.states.tolist()
        x = overflowed(g, B, step)
        tokens = m.sample(x, temperature=temperature, seed=3).tolist()
        m.check()  # no row was advanced by an illegal token
        for r, (s, tok) in enumerate(zip(states, tokens)):
            legal = legal_ids(g, s)
            assert tok in legal
            y = x[r].float()
            if not any(bool(torch.isfinite(y[v])) for v in legal):
                assert tok == legal[0], (r, step)  # no finite legal logit: the first legal token


@pytest.mark.parametrize("backend", BACKENDS)
def test_apply_reads_nan_as_minus_inf(backend):
    g = make_random_grammar(num_states=30, num_classes=10, vocab_size=600, hole_frac=0.4, seed=61)
    m = BatchMasker(g, 4, device=DEVICE, backend=backend)
    m.rows.state.copy_(torch.tensor([0, 3, 7, 11], dtype=torch.int32))
    x = overflowed(g, 4, 0)
    masked = x.clone()
    counts = m.apply_(masked)
    assert not bool(torch.isnan(masked).any())
    for r, s in enumerate([0, 3, 7, 11]):
        legal = torch.zeros(g.vocab_size, dtype=torch.bool)
        legal[legal_ids(g, s)] = True
        kept = legal & ~torch.isnan(x[r].cpu())
        assert torch.equal(masked[r].cpu()[kept], x[r].cpu()[kept])
        assert bool((masked[r].cpu()[~kept] == NEG_INF).all())
        assert int(counts[r]) == int(legal.sum())


@pytest.mark.parametrize("backend", BACKENDS)
def test_sample_unmasked_draws_the_masked_token_where_legal(backend):
    g = make_random_grammar(num_states=30, num_classes=10, vocab_size=900, hole_frac=0.15, seed=62)
    B = 8
    keys = torch.arange(500, 500 + B)
    m = BatchMasker(g, B, device=DEVICE, backend=backend)
    m.reset(keys=keys)
    agree = legal = total = 0
    for step in range(8):
        x = 2 * torch.randn(B, g.vocab_size, generator=torch.Generator().manual_seed(step)).to(DEVICE)
        states, steps = m.states.tolist(), m.steps.clone()
        free = sample_unmasked(x, keys.to(DEVICE), steps, temperature=1.0, seed=9, backend=backend)
        masked = m.sample(x, temperature=1.0, seed=9)
        for r in range(B):
            total += 1
            if int(free[r]) in legal_ids(g, states[r]):
                legal += 1
                agree += int(masked[r]) == int(free[r])
        if bool(m.done.all()):
            break
    assert 0 < legal < total and agree == legal  # one process: the masked draw is the free one where legal
    # ids past the vocabulary (a model wider than its tokenizer) are never drawn, however large their logits
    wide = torch.cat([x, torch.full((B, 40), 50.0, device=DEVICE)], dim=1)
    for T in (0.0, 1.0):
        free = sample_unmasked(wide, keys.to(DEVICE), m.steps, temperature=T, seed=9, vocab_size=g.vocab_size,
                               backend=backend)
        assert bool((free < g.vocab_size).all())
