"""The batched, cached Transformer against a plain float64 run.c-style reference."""

import math

import numpy as np
import pytest
import torch
from batchmask.models.checkpoint import ModelConfig, random_weights, write_checkpoint
from batchmask.models.llama import ContextOverflowError, Transformer, load_checkpoint
from batchmask.models.sampling import greedy

CONFIGS = {
    "mha_shared": ModelConfig(dim=32, hidden_dim=64, n_layers=2, n_heads=4, n_kv_heads=4, vocab_size=50, seq_len=16),
    "gqa_unshared": ModelConfig(dim=64, hidden_dim=96, n_layers=2, n_heads=8, n_kv_heads=2, vocab_size=70,
                                seq_len=20, shared_classifier=False),
    "odd_dims": ModelConfig(dim=48, hidden_dim=100, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=67, seq_len=24),
}


# -----------------------------------------------------------------------------
# reference: one token at a time, explicit loops over heads and positions, float64 (run.c's forward)

def rmsnorm(x, weight):
    return weight * (x / math.sqrt(np.mean(x * x) + 1e-5))


def softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def reference_logits(c, w, tokens):
    """tokens: list of ids from position 0 -> [len, vocab] float64 logits, one position at a time."""
    w = {k: v.double().numpy() for k, v in w.items()}
    wcls = w["token_embedding"] if c.shared_classifier else w["wcls"]
    hd, kv_dim, kv_mul = c.head_dim, c.kv_dim, c.n_heads // c.n_kv_heads
    key_cache = np.zeros((c.n_layers, c.seq_len, kv_dim))
    value_cache = np.zeros((c.n_layers, c.seq_len, kv_dim))
    out = []
    for pos, token in enumerate(tokens):
        x = w["token_embedding"][token].copy()
        for l in range(c.n_layers):
            xb = rmsnorm(x, w["rms_att"][l])
            q, k, v = w["wq"][l] @ xb, w["wk"][l] @ xb, w["wv"][l] @ xb
            for i in range(0, c.dim, 2):  # RoPE, as run.c loops it
                freq = 1.0 / 10000.0 ** ((i % hd) / hd)
                fcr, fci = math.cos(pos * freq), math.sin(pos * freq)
                for vec in ([q, k] if i < kv_dim else [q]):
                    v0, v1 = vec[i], vec[i + 1]
                    vec[i], vec[i + 1] = v0 * fcr - v1 * fci, v0 * fci + v1 * fcr
            key_cache[l, pos], value_cache[l, pos] = k, v
            att_out = np.zeros(c.dim)
            for h in range(c.n_heads):
                qh = q[h * hd:(h + 1) * hd]
                kvo = (h // kv_mul) * hd
                scores = np.array([qh @ key_cache[l, t, kvo:kvo + hd] / math.sqrt(hd) for t in range(pos + 1)])
                att = softmax(scores)
                for t in range(pos + 1):
                    att_out[h * hd:(h + 1) * hd] += att[t] * value_cache[l, t, kvo:kvo + hd]
            x = x + w["wo"][l] @ att_out
            xb = rmsnorm(x, w["rms_ffn"][l])
            h1, h3 = w["w1"][l] @ xb, w["w3"][l] @ xb
            x = x + w["w2"][l] @ (h1 / (1.0 + np.exp(-h1)) * h3)
        out.append(wcls @ rmsnorm(x, w["rms_final"]))
    return np.stack(out)


def assert_close_relative(got, want, rel=1e-4):
    want = torch.as_tensor(want, dtype=torch.float64)
    err = (got.double() - want).abs().max().item()
    assert err <= rel * want.abs().max().item(), f"max error {err} vs scale {want.abs().max().item()}"


@pytest.fixture(scope="module", params=list(CONFIGS))
def model_and_weights(request, tmp_path_factory):
    c = CONFIGS[request.param]
    w = random_weights(c, seed=7, std=0.2)  # large enough that attention is not uniform
    path = tmp_path_factory.mktemp("m") / f"{request.param}.bin"
    write_checkpoint(path, c, w, version=0)
    return load_checkpoint(path), w


# -----------------------------------------------------------------------------


def test_uncached_logits_match_reference(model_and_weights):
    model, w = model_and_weights
    c = model.config
    tokens = torch.randint(0, c.vocab_size, (2, c.seq_len), generator=torch.Generator().manual_seed(0))
    logits = model.logits(tokens)
    assert logits.shape == (2, c.seq_len, c.vocab_size) and logits.dtype == torch.float32
    for b in range(2):
        assert_close_relative(logits[b], reference_logits(c, w, tokens[b].tolist()))


def test_batched_prefill_and_decode_match_reference(model_and_weights):
    """Rows of different prompt lengths in non-contiguous slots, then decode steps fed with fixed tokens."""
    model, w = model_and_weights
    c = model.config
    g = torch.Generator().manual_seed(1)
    lengths = [5, 1, c.seq_len - 6]
    rows = [3, 0, 1]  # slot 2 stays empty
    prompts = torch.randint(0, c.vocab_size, (3, max(lengths)), generator=g)
    n_steps = 6
    fed = torch.randint(0, c.vocab_size, (n_steps, 4), generator=g)  # token fed to each slot per step
    model.setup_cache(4)
    got = {r: [] for r in rows}
    first = model.prefill(torch.tensor(rows), prompts, torch.tensor(lengths))
    for i, r in enumerate(rows):
        got[r].append(first[i])
    for step in range(n_steps):
        logits = model.decode(fed[step])
        for r in rows:
            got[r].append(logits[r])
    assert model.pos.tolist() == [lengths[1] + n_steps, lengths[2] + n_steps, 0, lengths[0] + n_steps]
    for i, r in enumerate(rows):
        seq = prompts[i, :lengths[i]].tolist() + fed[:, r].tolist()
        want = reference_logits(c, w, seq)[lengths[i] - 1:]
        assert_close_relative(torch.stack(got[r]), want)


def generate_greedy(model, prompts, n_new):
    """prompts: list of token lists -> list of generated token lists, all rows in one batch."""
    model.setup_cache(len(prompts))
    lengths = [len(p) for p in prompts]
    padded = torch.zeros(len(prompts), max(lengths), dtype=torch.long)
    for i, p in enumerate(prompts):
        padded[i, :len(p)] = torch.tensor(p)
    nxt = greedy(model.prefill(torch.arange(len(prompts)), padded, torch.tensor(lengths)))
    out = [nxt]
    for _ in range(n_new - 1):
        nxt = greedy(model.decode(nxt))
        out.append(nxt)
    return torch.stack(out, 1).tolist()


def test_batched_greedy_equals_one_at_a_time(model_and_weights):
    model, _ = model_and_weights
    c = model.config
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, c.vocab_size, (n,), generator=g).tolist() for n in (1, 4, 7, 2, 3)]
    n_new = c.seq_len - 7
    batched = generate_greedy(model, prompts, n_new)
    for prompt, row in zip(prompts, batched):
        assert generate_greedy(model, [prompt], n_new)[0] == row


def test_reset_and_refill_leaves_other_rows_unchanged(model_and_weights):
    model, w = model_and_weights
    c = model.config
    g = torch.Generator().manual_seed(3)
    prompts = torch.randint(0, c.vocab_size, (3, 4), generator=g)
    fed = torch.randint(0, c.vocab_size, (6, 3), generator=g)

    def run(refill_at=None):
        model.setup_cache(3)
        model.prefill(torch.arange(3), prompts, torch.tensor([4, 2, 3]))
        logits = []
        for step in range(6):
            if step == refill_at:
                model.reset([1])
                model.prefill(torch.tensor([1]), torch.tensor([[5, 6, 7, 8, 9]]), torch.tensor([5]))
            logits.append(model.decode(fed[step]))
        return torch.stack(logits)  # [steps, 3, V]

    plain, refilled = run(), run(refill_at=3)
    for r in (0, 2):
        torch.testing.assert_close(refilled[:, r], plain[:, r], rtol=0, atol=1e-6)
    # the refilled row continues the new prompt as if it had always been alone
    want = reference_logits(c, w, [5, 6, 7, 8, 9] + fed[3:, 1].tolist())[5:]
    assert_close_relative(refilled[3:, 1], want)
    assert model.pos.tolist() == [4 + 6, 5 + 3, 3 + 6]


def test_reset_rows_stay_inactive(model_and_weights):
    model, _ = model_and_weights
    model.setup_cache(2)
    model.prefill(torch.tensor([0, 1]), torch.tensor([[1, 2], [3, 4]]), torch.tensor([2, 2]))
    model.reset(torch.tensor([0]))
    for _ in range(3):
        model.decode(torch.tensor([1, 1]))
    assert model.pos.tolist() == [0, 5] and model.host_pos.tolist() == [0, 5]


def test_context_overflow(model_and_weights):
    model, _ = model_and_weights
    S = model.config.seq_len
    model.setup_cache(3)
    with pytest.raises(ContextOverflowError, match=f"row 2.*{S + 1}.*seq_len={S}"):
        model.prefill(torch.tensor([0, 2]), torch.zeros(2, S + 1, dtype=torch.long), torch.tensor([3, S + 1]))
    with pytest.raises(ContextOverflowError):
        model.logits(torch.zeros(1, S + 1, dtype=torch.long))
    model.prefill(torch.tensor([1, 2]), torch.zeros(2, S - 2, dtype=torch.long), torch.tensor([S - 2, 3]))
    model.decode(torch.zeros(3, dtype=torch.long))
    model.decode(torch.zeros(3, dtype=torch.long))  # row 1 is now at position S: full
    with pytest.raises(ContextOverflowError, match=f"row 1.*{S + 1}.*seq_len={S}") as info:
        model.decode(torch.zeros(3, dtype=torch.long))
    assert (info.value.row, info.value.length, info.value.seq_len) == (1, S + 1, S)
    model.reset([1])  # freeing the full row lets the batch continue
    model.decode(torch.zeros(3, dtype=torch.long))


def test_prefill_rejects_bad_arguments(model_and_weights):
    model, _ = model_and_weights
    model.setup_cache(2)
    with pytest.raises(ValueError, match="distinct"):
        model.prefill(torch.tensor([0, 0]), torch.zeros(2, 3, dtype=torch.long), torch.tensor([3, 3]))
    with pytest.raises(ValueError, match="length 0"):
        model.prefill(torch.tensor([0]), torch.zeros(1, 3, dtype=torch.long), torch.tensor([0]))
    with pytest.raises(ValueError, match="shape"):
        model.decode(torch.zeros(3, dtype=torch.long))


def test_checkpoint_weights_round_trip_and_training_step():
    c = CONFIGS["gqa_unshared"]
    w = random_weights(c, seed=4)
    model = Transformer(c).load_weights(w)
    back = model.checkpoint_weights()
    assert back.keys() == w.keys()
    for name in w:
        assert torch.equal(back[name], w[name]), name
    tokens = torch.randint(0, c.vocab_size, (2, 9))
    loss = torch.nn.functional.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_shared_classifier_is_tied():
    model = Transformer(CONFIGS["mha_shared"])
    assert model.output.weight is model.tok_embeddings.weight
    assert Transformer(CONFIGS["gqa_unshared"]).output.weight is not None


def test_v2_checkpoint_loads_close_to_float(tmp_path):
    c = CONFIGS["odd_dims"]
    w = random_weights(c, seed=5)
    write_checkpoint(tmp_path / "f.bin", c, w, version=1)
    write_checkpoint(tmp_path / "q.bin", c, w, version=2)
    tokens = torch.randint(0, c.vocab_size, (1, 8))
    full, quant = load_checkpoint(tmp_path / "f.bin").logits(tokens), load_checkpoint(tmp_path / "q.bin").logits(tokens)
    assert (full - quant).abs().max() < 0.05 * full.abs().max()


def test_half_precision_needs_cuda(tmp_path):
    c = CONFIGS["mha_shared"]
    write_checkpoint(tmp_path / "m.bin", c, random_weights(c))
    with pytest.raises(ValueError, match="CUDA"):
        load_checkpoint(tmp_path / "m.bin", dtype=torch.bfloat16)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_decode_matches_eager(tmp_path):
    c = CONFIGS["gqa_unshared"]
    write_checkpoint(tmp_path / "m.bin", c, random_weights(c, seed=6))
    model = load_checkpoint(tmp_path / "m.bin", device="cuda")
    prompts = torch.randint(0, c.vocab_size, (3, 5), device="cuda")
    lengths = torch.tensor([5, 2, 4])
    fed = torch.randint(0, c.vocab_size, (4, 3), device="cuda")
    model.setup_cache(3)
    model.prefill(torch.arange(3), prompts, lengths)
    eager = [model.decode(fed[i]).clone() for i in range(4)]
    model.setup_cache(3)
    model.prefill(torch.arange(3), prompts, lengths)
    model.capture_decode()
    graphed = [model.decode_graphed(fed[i]).clone() for i in range(4)]
    torch.testing.assert_close(torch.stack(graphed), torch.stack(eager), rtol=1e-4, atol=1e-4)
    assert model.pos.tolist() == (lengths + 4).tolist()


def test_cache_in_another_dtype(model_and_weights):
    """A float64 cache under the float32 model: same logits to float32 precision."""
    model, w = model_and_weights
    c = model.config
    tokens = torch.randint(0, c.vocab_size, (1, 6), generator=torch.Generator().manual_seed(8))
    model.setup_cache(1, dtype=torch.float64)
    assert model.k_cache.dtype == torch.float64
    got = [model.prefill(torch.tensor([0]), tokens[:, :3], torch.tensor([3]))[0]]
    got += [model.decode(tokens[0, i:i + 1])[0] for i in range(3, 6)]
    assert_close_relative(torch.stack(got), reference_logits(c, w, tokens[0].tolist())[2:])
