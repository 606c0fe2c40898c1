"""
BatchMasker behaviour: masking, advancing, sampling and the bookkeeping around them, on synthetic grammars
(tests/grammar_fixtures.py) and, when the compiler and the Llama 2 tokenizer are present, on the real one.
Most tests run the torch backend; those marked with BACKENDS also run the Triton kernels (in the interpreter
when there is no GPU -- set before triton is imported, see tests/test_kernels.py).
"""
import os
from types import SimpleNamespace

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


import pytest
from data_paths import data_dir

from batchmask.masker import BatchMasker, GrammarTableError, IllegalTokenError
from batchmask.table.next_codes import decode_next
from tests.grammar_fixtures import make_loop_grammar, make_random_grammar
from tests.kernel_helpers import BACKENDS, DEVICE, HAVE_TRITON, NEG_INF  # noqa: F401

LLAMA2 = data_dir("llama2")


def legal_matrix(g, states) -> torch.Tensor:
    """bool [B, V] from a plain Python walk over the tables (the independent reference)."""
    table, cls = g.class_next.long().tolist(), g.token_class.tolist()
    return torch.tensor([[table[s][c] >= 0 for c in cls] for s in states.tolist()])


def masker_at(g, states: list[int], backend="torch", **kw) -> BatchMasker:
    """A masker whose rows sit in the given states (reached by walking there would take long)."""
    m = BatchMasker(g, len(states), device=DEVICE, backend=backend, **kw)
    m.rows.state.copy_(torch.tensor(states, dtype=torch.int32))
    return m


def walk(m: BatchMasker, steps: int, seed: int = 0, temperature: float = 1.0, top_p: float = 1.0) -> list[torch.Tensor]:
    """Sample `steps` steps from random logits; returns the tokens of each step."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        logits = torch.randn(m.batch_size, m.tables.vocab_size, generator=gen).to(DEVICE)
        out.append(m.sample(logits, temperature=temperature, top_p=top_p, seed=seed))
    return out


# ----------------------------------------------------------------------------------------------------------
# apply_

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_apply_masks_exactly(backend, dtype):
    g = make_random_grammar(num_states=30, num_classes=10, vocab_size=800, seed=1)
    states = [0, 5, 11, g.done_state, 26, 27]  # ordinary, final (26, 27) and finished rows
    m = masker_at(g, states, backend)
    pad = 50  # model vocabulary wider than the tokenizer's
    logits = torch.randn(len(states), 800 + pad, generator=torch.Generator().manual_seed(2)).to(dtype).to(DEVICE)
    masked = logits.clone()
    counts = m.apply_(masked)

    legal = torch.cat([legal_matrix(g, torch.tensor(states)), torch.zeros(len(states), pad, dtype=torch.bool)], 1)
    masked, logits = masked.cpu(), logits.cpu()
    assert torch.equal(masked[legal], logits[legal])  # legal logits keep their exact value
    assert bool((masked[~legal] == NEG_INF).all())
    assert counts.dtype == torch.int32 and counts.device.type == torch.device(DEVICE).type
    assert counts.tolist() == legal.sum(1).tolist()
    assert torch.equal(m.legal_counts, counts)
    # a final state and a finished row allow EOS and nothing else
    for r in (3, 4, 5):
        assert legal[r].nonzero()[:, 0].tolist() == [g.eos_id]


def test_apply_rejects_bad_logits():
    g = make_random_grammar(vocab_size=300)
    m = BatchMasker(g, 2, device=DEVICE)
    with pytest.raises(ValueError, match=r"\[2, >= 300\]"):
        m.apply_(torch.zeros(2, 299, device=DEVICE))
    with pytest.raises(ValueError, match=r"\[2, >= 300\]"):
        m.apply_(torch.zeros(3, 300, device=DEVICE))
    with pytest.raises(ValueError, match="float32, bfloat16 or float16"):
        m.apply_(torch.zeros(2, 300, dtype=torch.float64, device=DEVICE))


# ----------------------------------------------------------------------------------------------------------
# advance, check, reset, text, finish

@pytest.mark.parametrize("backend", BACKENDS)
def test_illegal_advance_names_row_token_and_text(backend):
    g = make_random_grammar(num_states=30, num_classes=10, vocab_size=400, seed=3)
    m = masker_at(g, [0, 0, 0, 0], backend)
    legal0 = legal_matrix(g, torch.tensor([0]))[0]
    good = int(legal0.nonzero()[0, 0])
    bad = int((~legal0).nonzero()[-1, 0])  # an illegal id with text
    tokens = torch.tensor([good, good, good, bad], device=DEVICE)
    m.advance(tokens, check=False)  # deferred: no error yet, the fault is recorded on the device
    assert m.rows.fault[3, 0] == 1
    with pytest.raises(IllegalTokenError) as err:
        m.check()
    text = g.token_bytes[bad].decode()
    assert f"row 3: token {bad} ({text!r}) is not legal in state 0" in str(err.value)
    assert err.value.faults == [(3, bad, 0)]
    nxt = int(g.class_next[0, g.token_class[good]])
    assert m.states.tolist() == [nxt, nxt, nxt, 0]  # the offending row did not move
    assert m.steps.tolist() == [1, 1, 1, 0]
    # on the CPU the default is to check at once
    if DEVICE == "cpu":
        with pytest.raises(IllegalTokenError, match=r"row 0: token 5000 \('<not in the vocabulary of 400>'\)"):
            m.reset(3)
            m.advance(torch.tensor([5000, 2, 2, good]))
    m.reset()
    m.check()  # reset clears the faults
    assert m.states.tolist() == [g.start] * 4 and m.steps.tolist() == [0] * 4


def test_advance_rejects_bad_tokens():
    m = BatchMasker(make_random_grammar(), 3, device=DEVICE)
    with pytest.raises(ValueError, match=r"shape \[3\]"):
        m.advance(torch.zeros(2, dtype=torch.int64, device=DEVICE))
    with pytest.raises(ValueError, match="integer"):
        m.advance(torch.zeros(3, device=DEVICE))


@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_run_to_completion(backend):
    """Sampling walks every row through the grammar: text is the emitted tokens' bytes, finished rows only
    emit EOS and never change, finish() is the grammar's completion of each row's state."""
    g = make_random_grammar(num_states=20, num_classes=8, vocab_size=300, hole_frac=0.5, seed=4)
    m = BatchMasker(g, 4, device=DEVICE, backend=backend, max_tokens=64)
    steps = walk(m, 26, seed=5)
    tokens = torch.stack(steps, 1).cpu()  # [B, 26]
    assert bool(m.done.all()), "forward edges: every row finishes within S + 1 steps"
    eos_col = (tokens == g.eos_id).int().argmax(1)  # first EOS per row
    for r in range(4):
        n = int(eos_col[r]) + 1
        assert bool((tokens[r, n:] == g.eos_id).all())  # finished rows emit EOS only
        assert m.tokens(r) == tokens[r, :n].tolist()
        assert m.text(r) == b"".join(g.token_bytes[t] for t in tokens[r, :n - 1].tolist()).decode()
        assert int(m.steps[r]) == n
    assert m.finish() == [""] * 4
    # finish() of rows that are mid-way is the fixture's shortest completion
    m.reset([1, 2])
    walk(m, 1, seed=6)
    assert m.finish([1, 2]) == [g.finish_text(int(s)) for s in m.states[1:3].tolist()]
    assert len(m.tokens(1)) == 1


def test_history_overflow_is_reported():
    g = make_loop_grammar(vocab_size=64)
    m = BatchMasker(g, 1, device=DEVICE, max_tokens=4)
    walk(m, 6)
    assert m.states.tolist() == [0]
    with pytest.raises(ValueError, match="row 0 emitted 6 tokens but the history holds 4"):
        m.text(0)


# ----------------------------------------------------------------------------------------------------------
# sample

@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_sample_is_first_legal_maximum(backend):
    g = make_random_grammar(num_states=30, num_classes=10, vocab_size=900, hole_frac=0.4, seed=7)
    states = [0, 3, 8, 14, 22, 27]
    m = masker_at(g, states, backend)
    logits = torch.randint(-2, 2, (6, 920), generator=torch.Generator().manual_seed(8)).float().to(DEVICE)
    masked = logits.clone()
    masker_at(g, states).apply_(masked)
    tokens = m.sample(logits, temperature=0.0)
    assert tokens.dtype == torch.int64
    assert tokens.tolist() == torch.argmax(masked, 1).tolist()  # argmax: first maximum, i.e. lowest id on ties
    expect = [int(g.class_next[s, g.token_class[t]]) for s, t in zip(states, tokens.tolist())]
    assert m.states.tolist() == expect


@pytest.mark.parametrize("backend", BACKENDS)
def test_draw_does_not_depend_on_other_rows(backend):
    g = make_random_grammar(num_states=30, num_classes=10, vocab_size=600, hole_frac=0.3, seed=9)
    gen = torch.Generator().manual_seed(10)
    small = masker_at(g, [0, 4, 7], backend)
    big = masker_at(g, [0, 4, 7, 1, 2, 3], backend)
    logits_small = torch.randn(3, 600, generator=gen)
    logits_big = torch.cat([logits_small, torch.randn(3, 600, generator=gen)])
    a = small.sample(logits_small.to(DEVICE), temperature=1.3, seed=11)
    b = big.sample(logits_big.to(DEVICE), temperature=1.3, seed=11)
    assert torch.equal(a, b[:3])
    c = masker_at(g, [0, 4, 7], backend).sample(logits_small.to(DEVICE), temperature=1.3, seed=12)
    d = masker_at(g, [0, 4, 7], backend).sample(logits_small.to(DEVICE), temperature=1.3, seed=11)
    assert torch.equal(a, d) and not torch.equal(a, c)  # the seed matters, and reproduces


def test_sample_rejects_bad_arguments():
    m = BatchMasker(make_random_grammar(vocab_size=300), 2, device=DEVICE)
    logits = torch.zeros(2, 300, device=DEVICE)
    with pytest.raises(ValueError, match="temperature"):
        m.sample(logits, temperature=-1.0)
    with pytest.raises(ValueError, match="top_p"):
        m.sample(logits, temperature=1.0, top_p=0.0)


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square goodness of fit p-value (upper regularised incomplete gamma)."""
    expected = probs * counts.sum()
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    dof = counts.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(chi2 / 2, dtype=torch.float64)))


def loop_logits(g, rows: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits that favour illegal ids heavily, with k legal loop ids of distinct weights."""
    logits = torch.full((rows, g.vocab_size), 5.0)  # illegal ids would win everything if leaked
    weights = torch.linspace(-1.0, 1.5, k)
    logits[:, 3:3 + k] = weights
    logits[:, 3 + k] = -30.0  # the 'end' id: legal but negligible
    return logits, weights


@pytest.mark.parametrize("backend,k,rows,steps", [
    ("torch", 8, 20000, 1),
    # the interpreter runs ~40 ms per program: fewer draws over fewer tokens (expected counts stay >= 40)
    pytest.param("triton", 4, 16, 20, marks=BACKENDS[1].marks),
])
def test_masked_sampling_keeps_relative_probabilities(backend, k, rows, steps):
    """Among legal tokens, sampling at temperature T follows softmax(logit / T) (chi-square, p > 1e-3)."""
    T = 0.8
    g = make_loop_grammar(logit_classes=k, vocab_size=64)
    m = BatchMasker(g, rows, device=DEVICE, backend=backend, max_tokens=8)
    logits, weights = loop_logits(g, rows, k)
    logits = logits.to(DEVICE)
    counts = torch.zeros(k)
    for _ in range(steps):
        tok = m.sample(logits, temperature=T, seed=123).cpu()
        assert bool(((tok >= 3) & (tok <= 3 + k)).all())  # never an illegal id
        counts += torch.bincount(tok - 3, minlength=k + 1)[:k].float()
    probs = torch.softmax(torch.cat([weights, torch.tensor([-30.0])]) / T, 0)[:k]
    assert chi_square_p(counts, probs / probs.sum()) > 1e-3


def test_chi_square_detects_a_wrong_distribution():
    """The test above has teeth: the same draws fail against a distribution without the temperature."""
    k, T = 8, 0.8
    g = make_loop_grammar(logit_classes=k, vocab_size=64)
    m = BatchMasker(g, 20000, device=DEVICE, max_tokens=1)
    logits, weights = loop_logits(g, 20000, k)
    tok = m.sample(logits.to(DEVICE), temperature=T, seed=123).cpu()
    counts = torch.bincount(tok - 3, minlength=k + 1)[:k].float()
    assert chi_square_p(counts, torch.softmax(weights, 0)) < 1e-6


@pytest.mark.parametrize("backend", BACKENDS)
def test_top_p_samples_only_the_nucleus(backend):
    k, T, top_p = 8, 1.0, 0.7
    g = make_loop_grammar(logit_classes=k, vocab_size=64)
    rows = 4000 if backend == "torch" else 64
    m = BatchMasker(g, rows, device=DEVICE, backend=backend, max_tokens=1)
    logits, weights = loop_logits(g, rows, k)
    tok = m.sample(logits.to(DEVICE), temperature=T, top_p=top_p, seed=5).cpu()
    # nucleus by hand: most likely first, keep while the mass before a token is below top_p
    probs = torch.softmax(torch.cat([weights, torch.tensor([-30.0])]) / T, 0)
    order = sorted(range(k + 1), key=lambda i: -float(probs[i]))
    nucleus, mass = [], 0.0
    for i in order:
        if mass >= top_p:
            break
        nucleus.append(3 + i)
        mass += float(probs[i])
    assert set(tok.tolist()) <= set(nucleus)
    if backend == "torch":
        counts = torch.tensor([(tok == t).sum() for t in nucleus]).float()
        p = probs[[t - 3 for t in nucleus]]
        assert chi_square_p(counts, p / p.sum()) > 1e-3


@pytest.mark.skipif(not HAVE_TRITON, reason="triton missing")
def test_backends_sample_the_same_tokens():
    g = make_random_grammar(num_states=30, num_classes=10, vocab_size=700, hole_frac=0.4, seed=13)
    a = BatchMasker(g, 4, device=DEVICE, backend="torch")
    b = BatchMasker(g, 4, device=DEVICE, backend="triton")
    for T, top_p in [(0.0, 1.0), (1.0, 1.0), (0.7, 0.9), (1.0, 1.0)]:
        walk_a = walk(a, 3, seed=14, temperature=T, top_p=top_p)
        walk_b = walk(b, 3, seed=14, temperature=T, top_p=top_p)
        assert all(torch.equal(x, y) for x, y in zip(walk_a, walk_b))
    assert torch.equal(a.states, b.states) and [a.text(r) for r in range(4)] == [b.text(r) for r in range(4)]


# ----------------------------------------------------------------------------------------------------------
# construction

def test_bad_backend_and_tables():
    g = make_random_grammar()
    with pytest.raises(ValueError, match="backend"):
        BatchMasker(g, 2, backend="cuda")
    g.class_next = g.class_next.clone()
    g.class_next[3, 2] = g.num_states  # points past the last state
    with pytest.raises(GrammarTableError, match=r"class_next values must be in \[-1, 40\)"):
        BatchMasker(g, 2)


@pytest.mark.parametrize("dtype", [torch.int16, torch.int32])
def test_factored_tables_refused_where_a_code_leaves_the_states(dtype):
    """The factored check against the decoded [S, C] table: a table is refused exactly when some state's next
    state is >= S (an absolute code past the target list, or naming a target >= S, in any row; a relative code
    by the highest state reading its row), rows in either of the blocks the CPU check reads at a time."""
    S, R, C, V = 700, 600, 500, 600
    gen = torch.Generator().manual_seed(30)
    base = torch.randint(-1, 200, (R, C), generator=gen)
    state_row = torch.cat([torch.arange(R), torch.randint(0, R, (S - R,), generator=gen)])  # every row used

    def build(row_next, targets=None):
        targets = torch.arange(S) if targets is None else targets
        g = SimpleNamespace(token_class=torch.arange(V) % C, state_row=state_row, row_next=row_next.to(dtype),
                            row_legal=torch.ones(R, dtype=torch.int32), targets=targets, start=0, done_state=S - 1,
                            eos_id=0, vocab_size=V)
        return BatchMasker(g, 1)

    def highest_state(row):
        return int((state_row == row).nonzero().max())

    cases = [(599, S - 1), (599, S), (3, S), (3, S - 1)]  # absolute codes, in both blocks of rows
    for r in (5, 598):  # relative moves to the last state from the highest state reading the row, then past it
        cases += [(r, -2 - (S - 1 - highest_state(r))), (r, -2 - (S - highest_state(r)))]
    refused = []
    for r, code in cases:
        rows = base.clone()
        rows[r, 7] = code
        expect_ok = code < S and int(decode_next(rows[state_row], torch.arange(S)[:, None], torch.arange(S)).max()) < S
        try:
            build(rows)
            refused.append(False)
        except GrammarTableError as e:
            assert ("row_next values must be in [-1, 700)" if code < 0 else
                    "row_next absolute codes must read the target list inside [0, 700) (from their state's "
                    "segment base), got 700") in str(e), str(e)
            refused.append(True)
        assert refused[-1] == (not expect_ok), (r, code)
    assert refused == [False, True, True, False, False, True, False, True]
    build(base)
    targets = torch.arange(S)
    targets[150] = S                                            # a target that is not a state
    with pytest.raises(GrammarTableError, match=r"row_next values must be in \[-1, 700\), got \[-1, 700\]"):
        build(base, targets)


def test_target_segments_checked_against_the_list_they_read():
    """Absolute codes read the target list from their state's segment base (table/next_codes.py): a table is refused
    where some state's code + base passes the list, and a malformed segment list is refused, naming the field."""
    S, R, C, V = 40, 4, 3, 6
    state_row = torch.arange(S) % R
    row_next = torch.tensor([[0, -1, 2], [-1, -1, 1], [-3, 0, -1], [-1, -1, -1]], dtype=torch.int16)

    def build(start, base, T=10):
        g = SimpleNamespace(token_class=torch.arange(V) % C, state_row=state_row, row_next=row_next,
                            row_legal=torch.ones(R, dtype=torch.int32), targets=torch.arange(T) % S,
                            segment_start=torch.tensor(start), segment_base=torch.tensor(base), start=0,
                            done_state=S - 1, eos_id=0, vocab_size=V)
        return BatchMasker(g, 1)

    build([0, 20], [0, 7])              # the highest code (2) read from 7: index 9 < 10
    with pytest.raises(GrammarTableError, match=r"read the target list inside \[0, 10\).*got 10"):
        build([0, 20], [0, 8])
    build([0, 37], [0, 8])              # states 37..39 read from 8: their rows (1, 2, 3) reach code 1 at most
    with pytest.raises(GrammarTableError, match="segment_start must rise from 0"):
        build([1, 20], [0, 0])
    with pytest.raises(GrammarTableError, match="segment_start must rise from 0"):
        build([0, 20, 20], [0, 0, 0])
    with pytest.raises(GrammarTableError, match=r"segment_base values must be in \[0, 10\]"):
        build([0, 20], [0, 11])
    with pytest.raises(GrammarTableError, match="one length"):
        build([0, 20], [0])


def test_int32_tables_work_like_int16():
    a = make_random_grammar(seed=20, index_dtype=torch.int16)
    b = make_random_grammar(seed=20, index_dtype=torch.int32)
    ma, mb = BatchMasker(a, 3, device=DEVICE), BatchMasker(b, 3, device=DEVICE)
    assert all(torch.equal(x, y) for x, y in zip(walk(ma, 10, seed=21), walk(mb, 10, seed=21)))


# ----------------------------------------------------------------------------------------------------------
# the real compiler and tokenizer, when they exist

def real_grammar():
    try:
        from batchmask.models.tokenizer import load_tokenizer

        from batchmask.compiler.compiled import compile_grammar
        from batchmask.tools.registry import ToolRegistry
    except ImportError as e:
        pytest.skip(f"real compiler / tokenizer not available yet: {e}")
    if not (LLAMA2 / "tokenizer.model").exists():
        pytest.skip(f"{LLAMA2 / 'tokenizer.model'} is absent")
    return compile_grammar(ToolRegistry.defaults(), load_tokenizer(str(LLAMA2 / "tokenizer.model")), device=DEVICE)


@pytest.fixture(scope="module")
def llama_grammar():
    return real_grammar()


def test_real_grammar_walk(llama_grammar):
    g = llama_grammar
    m = BatchMasker(g, 8, device=DEVICE, max_tokens=512)
    gen = torch.Generator().manual_seed(0)
    for _ in range(400):
        logits = torch.randn(8, g.vocab_size, generator=gen).to(DEVICE)
        masked = logits.clone()
        counts = m.apply_(masked)
        legal = masked > NEG_INF
        assert torch.equal(legal.cpu(), g.allowed(m.states).cpu())
        assert counts.tolist() == legal.sum(1).tolist()
        m.sample(logits, temperature=1.0, seed=1)
        if bool(m.done.all()):
            break
    for r in range(8):
        if bool(m.done[r]):
            assert m.finish([r]) == [""]
        else:
            assert m.finish([r]) == [g.finish_text(int(m.states[r]))]
        m.text(r)  # decodes


def test_real_grammar_sparse_paths_match_dense(llama_grammar):
    """On the CPU the torch backend masks and samples through its fast paths (short token lists, the block
    search); at rows inside string values (few illegal tokens) and at literal rows (few legal ones) it must give
    the dense reference's results."""
    from batchmask.kernels import mask_torch
    g = llama_grammar
    legal = g.legal_count.cpu().long()
    value = (legal * 2 >= g.vocab_size).nonzero()[:, 0]
    literal = ((legal * 2 < g.vocab_size) & (legal > 0)).nonzero()[:, 0]
    gen = torch.Generator().manual_seed(3)
    states = torch.cat([value[torch.randint(0, len(value), (10,), generator=gen)],
                        literal[torch.randint(0, len(literal), (5,), generator=gen)],
                        torch.tensor([g.done_state])]).tolist()
    m = masker_at(g, states)
    t = m.tables
    logits = torch.randn(len(states), g.vocab_size + 8, generator=gen).to(DEVICE)
    logits[:3, :200] = 30.0  # large logits on low ids, many of them illegal in value states
    a, b = logits.clone(), logits.clone()
    m.apply_(a)
    mask_torch.mask_logits_(b, m.states, t)
    assert torch.equal(a, b)
    for T in (0.0, 0.9):
        st = m.states.clone()
        dense = mask_torch.choose_tokens(logits, st, m.steps, t, T, 1.0, seed=4)
        tokens = m.sample(logits, temperature=T, seed=4)
        assert torch.equal(tokens, dense), T
        m.rows.state.copy_(st)
        m.rows.step.zero_()


def test_real_grammar_keeps_its_factored_table_on_the_device(llama_grammar):
    """The masker reads the compiler's shared rows, not an [S, C] expansion, and decodes them exactly."""
    m = BatchMasker(llama_grammar, 4, device=DEVICE)
    assert m.tables.row_next.shape == llama_grammar.row_next.shape          # R rows, not S
    assert m.tables.row_next.shape[0] < llama_grammar.num_states // 4
    assert torch.equal(m.tables.class_next, llama_grammar.class_next.long())
