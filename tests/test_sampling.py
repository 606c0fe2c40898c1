"""Sampling: greedy ties, run.c top-p, top-k, per-row seeding, and the drawn distribution."""

import pytest
import torch
from batchmask.models.sampling import greedy, sample, uniform


def run_c_sample_topp(probs, topp, coin):
    """A plain port of run.c's sample_topp on a float64 probability list."""
    n = len(probs)
    cutoff = (1.0 - topp) / (n - 1)
    candidates = sorted(((p, i) for i, p in enumerate(probs) if p >= cutoff), key=lambda pi: (-pi[0], pi[1]))
    cumulative, last = 0.0, len(candidates) - 1
    for j, (p, _) in enumerate(candidates):
        cumulative += p
        if cumulative > topp:
            last = j
            break
    r = coin * cumulative
    cdf = 0.0
    for j in range(last + 1):
        cdf += candidates[j][0]
        if r < cdf:
            return candidates[j][1]
    return candidates[last][1]


def test_greedy_takes_first_maximum():
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0], [5.0, 5.0, 5.0, 5.0], [-1.0, -2.0, -1.0, float("-inf")]])
    assert greedy(logits).tolist() == [1, 0, 0]


def test_uniform_is_keyed_by_seed_and_step_only():
    seeds = torch.tensor([1, 1, 2, 2**40 + 1, 1])
    steps = torch.tensor([0, 1, 0, 0, 0])
    u = uniform(seeds, steps)
    assert ((u >= 0) & (u < 1)).all()
    assert u[0] == u[4]  # same key, same coin
    assert len(set(u[:4].tolist())) == 4  # different step / seed / high seed bits -> different coins
    many = uniform(torch.full((20000,), 123), torch.arange(20000))
    assert abs(many.mean().item() - 0.5) < 0.01 and abs(many.var().item() - 1 / 12) < 0.005


def test_temperature_zero_is_greedy_per_row():
    logits = torch.randn(4, 30, generator=torch.Generator().manual_seed(0))
    t = torch.tensor([0.0, 1.0, 0.0, 1.0])
    out = sample(logits, seeds=torch.arange(4), steps=0, temperature=t)
    assert out[0] == greedy(logits)[0] and out[2] == greedy(logits)[2]


def test_row_draw_does_not_depend_on_batch_company():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 100, generator=g)
    seeds, steps = torch.arange(6) * 17, torch.arange(6) + 3
    kw = dict(temperature=torch.tensor([0.7, 1.0, 1.3, 1.0, 0.9, 1.1]),
              top_p=torch.tensor([0.9, 1.0, 0.5, 0.95, 1.0, 0.8]),
              top_k=torch.tensor([0, 5, 0, 20, 0, 3]))
    together = sample(logits, seeds, steps, **kw)
    for b in range(6):
        alone = sample(logits[b:b + 1], seeds[b:b + 1], steps[b:b + 1], **{k: v[b:b + 1] for k, v in kw.items()})
        assert alone.item() == together[b].item()
    perm = torch.tensor([5, 3, 0, 1, 4, 2])
    shuffled = sample(logits[perm], seeds[perm], steps[perm], **{k: v[perm] for k, v in kw.items()})
    assert shuffled.tolist() == together[perm].tolist()


@pytest.mark.parametrize("topp", [0.1, 0.5, 0.9, 0.99])
def test_top_p_matches_run_c(topp):
    g = torch.Generator().manual_seed(int(topp * 100))
    B, V = 200, 50
    logits = 2.0 * torch.randn(B, V, generator=g)
    seeds, steps = torch.arange(B), torch.zeros(B, dtype=torch.long)
    got = sample(logits, seeds, steps, temperature=1.0, top_p=topp)
    coins = uniform(seeds, steps).double()
    probs = torch.softmax(logits.double(), -1)
    want = [run_c_sample_topp(probs[b].tolist(), topp, coins[b].item()) for b in range(B)]
    assert got.tolist() == want


def test_draws_follow_the_distribution():
    """20k rows of one distribution, one coin each: frequencies within 5 sigma of the probabilities."""
    probs = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05])
    N = 20000
    logits = probs.log().expand(N, -1)
    out = sample(logits, seeds=torch.full((N,), 9), steps=torch.arange(N), temperature=1.0)
    freq = torch.bincount(out, minlength=5).double() / N
    sigma = (probs.double() * (1 - probs.double()) / N).sqrt()
    assert ((freq - probs.double()).abs() <= 5 * sigma).all(), freq
    # temperature 2 flattens: p^(1/2) renormalised
    hot = sample(logits, seeds=torch.full((N,), 9), steps=torch.arange(N), temperature=2.0)
    want = probs.double().sqrt() / probs.double().sqrt().sum()
    freq = torch.bincount(hot, minlength=5).double() / N
    assert ((freq - want).abs() <= 5 * (want * (1 - want) / N).sqrt()).all(), freq


def test_top_k_keeps_only_k_best():
    g = torch.Generator().manual_seed(4)
    N, V, k = 3000, 40, 3
    logits = torch.randn(V, generator=g).expand(N, -1)
    out = sample(logits, seeds=torch.arange(N), steps=0, top_k=k)
    best = set(torch.topk(logits[0], k).indices.tolist())
    assert set(out.tolist()) == best  # all k show up over 3000 draws, nothing else does
    assert (sample(logits[:50], seeds=torch.arange(50), steps=0, top_k=1) == greedy(logits[:50])).all()


def test_masked_tokens_are_never_drawn():
    g = torch.Generator().manual_seed(5)
    N, V = 2000, 64
    logits = torch.randn(N, V, generator=g)
    legal = torch.rand(N, V, generator=g) < 0.1
    legal[:, 0] = True  # every row has a legal token
    masked = logits.masked_fill(~legal, float("-inf"))
    for kw in (dict(), dict(top_p=0.9), dict(top_k=5), dict(temperature=3.0, top_p=0.5)):
        out = sample(masked, seeds=torch.arange(N), steps=1, **kw)
        assert legal[torch.arange(N), out].all(), kw
    assert legal[torch.arange(N), greedy(masked)].all()


def test_same_seed_and_step_reproduce():
    logits = torch.randn(8, 1000, generator=torch.Generator().manual_seed(6))
    a = sample(logits, seeds=torch.arange(8), steps=torch.full((8,), 4), top_p=0.9)
    b = sample(logits, seeds=torch.arange(8), steps=torch.full((8,), 4), top_p=0.9)
    assert torch.equal(a, b)
    draws = {tuple(sample(logits, seeds=torch.arange(8), steps=s, temperature=1.5).tolist()) for s in range(10)}
    assert len(draws) > 1
