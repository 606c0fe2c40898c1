"""Jump-forward: the forced text and tokens of a grammar (batchmask/table/forced.py) against plain walks of the
automaton and the table; the ragged forward pass against one token at a time; the loop against the plain loop."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from batchmask.models import load_tokenizer
from data_paths import data_dir

from batchmask.api import compile_grammar, compile_json_schema
from batchmask.automaton.form import explicit_states
from batchmask.table.forced import forced_text, forced_tokens
from batchmask.tools.registry import ToolRegistry

ROOT = Path(__file__).resolve().parents[1]
CATALOGUE = data_dir("tools") / "agent_tools.json"
QWEN2 = data_dir("qwen2") / "tokenizer.json"
needs_catalogue = pytest.mark.skipif(not CATALOGUE.exists(), reason="../shared/tools/agent_tools.json not present")
UNICODE_SCHEMA = {"type": "object", "properties": {
    "city": {"enum": ["café", "cafè", "Zürich"]}, "unit": {"const": "°C"}, "n": {"type": "integer"}},
    "required": ["city", "unit", "n"]}


def default_tokenizer():
    return load_tokenizer(ROOT / "models" / "default" / "tokenizer.bin")


def grammars(tok):
    out = [("default seed", compile_grammar(ToolRegistry.defaults(), tok)),
           ("default hermes", compile_grammar(ToolRegistry.defaults(), tok, format="hermes")),
           ("unicode schema", compile_json_schema(UNICODE_SCHEMA, tok))]
    if CATALOGUE.exists():
        cat = ToolRegistry.from_json(CATALOGUE)
        out += [(f"catalogue {f}", compile_grammar(cat, tok, format=f)) for f in ("json", "hermes", "llama3")]
    return out


def walk_reference(aut) -> dict[int, tuple[bytes, list[int]]]:
    """Per explicit state: the bytes it is forced to write, and the states passed (a plain walk of the edges)."""
    edges, explicit, accepting = reference_parts(aut)
    out = {}
    for s in explicit:
        data, path, cur = bytearray(), [s], s
        while cur in explicit and cur not in accepting and len(edges.get(cur, [])) == 1:
            byte, cur = edges[cur][0]
            data.append(byte)
            path.append(cur)
        out[s] = (bytes(data), path)
    return out


def reference_parts(aut):
    edges: dict[int, list[tuple[int, int]]] = {}
    for src, byte, dst in np.asarray(aut.edges).tolist():
        edges.setdefault(src, []).append((byte, dst))
    return edges, set(explicit_states(aut).tolist()), set(np.asarray(aut.accepting).tolist())


def complete_states(aut) -> set[int]:
    """The explicit states where the call is complete and nothing may follow: only a stop id is legal."""
    edges, explicit, accepting = reference_parts(aut)
    return {s for s in explicit & accepting if not edges.get(s)}


def test_forced_text_is_the_byte_walk():
    tok = default_tokenizer()
    for name, g in grammars(tok):
        ref = walk_reference(g.automaton)
        text = forced_text(g.automaton)
        assert sorted(ref) == text.states.tolist(), name
        for s, (data, _) in ref.items():
            assert text.text(s) == data, (name, s)
        assert (text.length > 0).sum() == sum(1 for d, _ in ref.values() if d), name
    # a grammar's forced runs include the call's frame
    g = compile_grammar(ToolRegistry.defaults(), tok, format="json")
    assert forced_text(g.automaton).text(g.start) == b'{"name":"'


def legal_lengths(g, states) -> np.ndarray:
    """The longest legal token of each state, from the plain [n, V] mask."""
    lengths = torch.tensor([len(b) for b in g.token_bytes])
    return (g.allowed(states).long() * lengths).max(1).values.numpy()


def check_forced_tokens(g, tok, encode, states=None):
    ref = walk_reference(g.automaton)
    complete = complete_states(g.automaton)
    ft = forced_tokens(g, tok)
    K = 16
    have = set(ft.states.tolist())
    assert have <= {s for s, (d, _) in ref.items() if d} | complete
    for s, (data, path) in ref.items():
        if not (data or s in complete) or (states is not None and s not in states):
            continue
        toks, after = ft.of(s)
        # the end token closes a run spelled whole that ends where only a stop id may come
        ends_call = bool(toks) and toks[-1] == g.eos_id
        text_toks = toks[:-1] if ends_call else toks
        # the plain rule: the first state of the run from which a legal token is longer than the rest
        longest = legal_lengths(g, path[:-1]) if data else []
        cut = next((i for i in range(len(data)) if longest[i] > len(data) - i), len(data))
        spelled = b"".join(tok.token_bytes[t] for t in text_toks)
        assert data.startswith(spelled) and len(spelled) <= cut, (s, data, spelled, cut)
        assert ends_call == (spelled == data and path[-1] in complete and len(text_toks) < K), (s, data, toks)
        # each token legal, the states after it as the table says (one token at a time)
        cur = s
        for t, a in zip(toks, after):
            cur = int(g.next_state([cur], [t])[0])
            assert cur == a != -1
        assert cur == (g.done_state if ends_call else path[len(spelled)])
        # the tokens are the tokenizer's own: the start of its encoding of the run, as many as fit before the cut
        try:
            canonical = encode(data.decode("utf-8"))
        except UnicodeDecodeError:
            continue
        if b"".join(tok.token_bytes[t] for t in canonical) != data or len(data) > 256:
            continue
        assert canonical[:len(text_toks)] == text_toks, (s, data)
        ends = np.cumsum([len(tok.token_bytes[t]) for t in canonical])
        assert len(text_toks) == min(K, int(np.searchsorted(ends, cut, side="right"))), (s, data, cut)
    return ft


def test_forced_tokens_sentencepiece():
    tok = default_tokenizer()
    total = 0
    for _name, g in grammars(tok):
        ft = check_forced_tokens(g, tok, lambda t: tok.encode(t, bos=False, prefix_space=False))
        total += ft.states.numel()
        assert ft.nbytes == 4 * (2 * ft.states.numel() + 1 + 2 * ft.tokens.numel())
    assert total > 100                     # the test saw forced tokens (the frames of every format)


@pytest.mark.skipif(not QWEN2.exists(), reason="../shared/qwen2/tokenizer.json not present")
def test_forced_tokens_byte_level_bpe():
    tok = load_tokenizer(QWEN2)
    reg = ToolRegistry.from_json(CATALOGUE) if CATALOGUE.exists() else ToolRegistry.defaults()
    rng = np.random.default_rng(0)
    for fmt in ("json", "hermes"):
        g = compile_grammar(reg, tok, format=fmt)
        some = set(rng.choice(explicit_states(g.automaton), 60, replace=False).tolist()) | {g.start}
        ft = check_forced_tokens(g, tok, lambda t: tok.encode(t), some)
        assert ft.states.numel() > 50
    # the catalogue's hermes frame is written as Qwen2 writes it
    toks, _ = ft.of(g.start)
    assert [tok.token_bytes[t] for t in toks][:4] == [b"<", b"tool", b"_call", b">\n"]


def test_forced_tokens_of_combined_grammars_keep_their_states():
    from batchmask.compiler.sets import combine
    tok = default_tokenizer()
    g0 = compile_grammar(ToolRegistry.defaults(), tok, format="json")
    g1 = compile_json_schema(UNICODE_SCHEMA, tok)
    table = combine([g0, g1])
    joint = table.forced_tokens(tok)
    for g, off in zip((g0, g1), table.state_offset):
        own = g.forced_tokens(tok)
        for s in own.states.tolist():
            toks, after = own.of(s)
            assert joint.of(off + s) == (toks, [a + off for a in after])
    assert joint.states.numel() == g0.forced_tokens(tok).states.numel() + g1.forced_tokens(tok).states.numel()


# ------------------------------------------------------------------------------------------------------------
# the ragged forward pass

def small_model(seed: int = 0, n_heads: int = 4, n_kv_heads: int = 2, qkv_bias: bool = True, seq_len: int = 40):
    from batchmask.models.checkpoint import ModelConfig, random_weights
    from batchmask.models.llama import Transformer
    config = ModelConfig(dim=32, hidden_dim=48, n_layers=2, n_heads=n_heads, n_kv_heads=n_kv_heads, vocab_size=61,
                         seq_len=seq_len, shared_classifier=False, qkv_bias=qkv_bias)
    model = Transformer(config)
    model.load_weights(random_weights(config, seed=seed, std=0.3))
    return model.eval()


def fed_one_by_one(model, prompt: list[int], tokens: list[int]):
    """(logits after the last token [V], K and V cache of its positions) of a batch-1 model fed one token a step."""
    model.setup_cache(1)
    logits = model.prefill([0], torch.tensor([prompt]), torch.tensor([len(prompt)]))[0]
    for t in tokens:
        logits = model.decode(torch.tensor([t]))[0]
    n = len(prompt) + len(tokens)
    return logits, model.k_cache[:, 0, :, :n].clone(), model.v_cache[:, 0, :, :n].clone()


@pytest.mark.parametrize("heads", [(4, 2), (4, 4), (2, 1)])
def test_extend_is_decode_token_by_token(heads):
    model = small_model(n_heads=heads[0], n_kv_heads=heads[1], qkv_bias=heads[0] != heads[1])
    rng = np.random.default_rng(1)
    S = model.config.seq_len
    # rows at different positions (one at the last position), each taking its own number of new tokens
    prompts = [rng.integers(3, 61, n).tolist() for n in (5, 11, S - 2, 1)]
    news = [rng.integers(3, 61, n).tolist() for n in (4, 1, 2, 7)]
    refs = [fed_one_by_one(model, p, t) for p, t in zip(prompts, news)]
    B = len(prompts)
    model.setup_cache(B)
    lengths = [len(p) for p in prompts]
    ids = torch.zeros(B, max(lengths), dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, :len(p)] = torch.tensor(p)
    model.prefill(list(range(B)), ids, torch.tensor(lengths))
    T = max(map(len, news))
    batch = torch.full((B, T), 7, dtype=torch.long)           # padding: any id
    for b, t in enumerate(news):
        batch[b, :len(t)] = torch.tensor(t)
    n = torch.tensor([len(t) for t in news])
    logits = model.extend(batch, n)
    for b, (ref_logits, k, v) in enumerate(refs):
        m = lengths[b] + len(news[b])
        torch.testing.assert_close(logits[b], ref_logits, atol=1e-5, rtol=0)
        torch.testing.assert_close(model.k_cache[:, b, :, :m], k, atol=1e-5, rtol=0)
        torch.testing.assert_close(model.v_cache[:, b, :, :m], v, atol=1e-5, rtol=0)
    assert model.pos.tolist() == [p + len(t) for p, t in zip(lengths, news)] == model.host_pos.tolist()
    # and decoding on from there is decoding on from the token-by-token cache (row 2 is full: freed first)
    model.reset([2])
    nxt = torch.tensor([3, 4, 5, 6])
    out = model.decode(nxt)
    reference = small_model(n_heads=heads[0], n_kv_heads=heads[1], qkv_bias=heads[0] != heads[1])
    for b in (0, 1, 3):
        ref, _, _ = fed_one_by_one(reference, prompts[b], news[b] + [int(nxt[b])])
        torch.testing.assert_close(out[b], ref, atol=1e-5, rtol=0)


def test_extend_refuses_what_does_not_fit():
    from batchmask.models.llama import ContextOverflowError
    model = small_model(seq_len=16)
    model.setup_cache(2)
    model.prefill([0, 1], torch.tensor([[5] * 14, [5] * 14]), torch.tensor([14, 3]))
    with pytest.raises(ContextOverflowError, match="row 0"):
        model.extend(torch.ones(2, 3, dtype=torch.long), torch.tensor([3, 3]))
    with pytest.raises(ValueError, match="lengths must be in"):
        model.extend(torch.ones(2, 3, dtype=torch.long), torch.tensor([0, 3]))
    assert model.host_pos.tolist() == [14, 3]                 # nothing moved


# ------------------------------------------------------------------------------------------------------------
# the loop

def reference_run(model, tok, registry, grammar, task, limit: int, start: int | None = None) -> list[int]:
    """Greedy jump-forward for one task, the plain way: batch 1, one token a step through decode, the forced
    tokens of a state (CompiledGrammar.forced_tokens) fed one by one after the sampled token."""
    from batchmask.tools.prompt import encode_prompt
    forced = grammar.forced_tokens(tok)
    stops = set(getattr(tok, "stop_ids", (tok.eos_id,)))
    prompt = encode_prompt(registry, task, tok)
    limit = min(limit, model.config.seq_len - len(prompt))
    model.setup_cache(1)
    logits = model.prefill([0], torch.tensor([prompt]), torch.tensor([len(prompt)]))[0]
    state = grammar.start if start is None else start
    out: list[int] = []

    def feed(tokens) -> bool:
        """Write the tokens; True once one of them ends the call."""
        nonlocal state, logits
        for t in tokens:
            out.append(t)
            state = int(grammar.next_state([state], [t])[0])
            assert state >= 0
            if t in stops:
                return True
            logits = model.decode(torch.tensor([t]))[0]
        return False

    feed([t for t in forced.of(state)[0] if t not in stops][:limit - 1])
    while True:
        legal = grammar.allowed([state])[0]
        t = int(torch.where(legal, logits[:legal.numel()], float("-inf")).argmax())     # the first maximum
        if t in stops or len(out) + 1 >= limit:
            out.append(t)
            break
        if feed([t]) or feed(forced.of(state)[0][:limit - len(out)]) or len(out) >= limit:
            break
    return out


def loop_fixture():
    from test_generation import random_model, small_tokenizer
    tok = small_tokenizer()
    return tok, random_model(tok.vocab_size, seed=3, seq_len=512)


@pytest.mark.parametrize("fmt", ["json", "hermes"])
def test_jump_forward_loop_is_the_plain_reference_with_refills(fmt):
    from batchmask.run.generation import BatchGenerator, GenerationConfig
    tok, model = loop_fixture()
    reg = ToolRegistry.defaults()
    g = compile_grammar(reg, tok, format=fmt, max_string=12)
    tasks = [f"task {i}: read notes.txt and add {i} to {2 * i}" for i in range(7)]
    limits = [60, 7, 60, 3, 19, 60, 12]              # ceilings that cut forced text, refills mid-jump
    config = GenerationConfig(batch_size=3, max_new_tokens=60, format=fmt, jump_forward=True)
    got = []
    stats = BatchGenerator(model, tok, reg, g, config).run(tasks, on_result=got.append, limits=limits)
    for r, task, limit in zip(got, tasks, limits):
        want = reference_run(model, tok, reg, g, task, limit)
        assert r.token_ids == want, (r.index, tok.decode(r.token_ids), tok.decode(want))
        assert r.tokens == len(want) and r.steps < r.tokens and r.record()["steps"] == r.steps
        assert r.call is not None or r.cut, r.error
    assert stats.tokens == sum(r.tokens for r in got) and stats.row_steps == sum(r.steps for r in got)
    assert stats.tokens_per_step > 1.3


def fn(name, props, required):
    return {"type": "function", "function": {"name": name, "description": f"does {name}",
                                             "parameters": {"type": "object", "properties": props,
                                                            "required": required}}}


TOOL_SETS = [
    [fn("get_weather", {"city": {"type": "string", "maxLength": 5}, "unit": {"type": "string", "enum": ["c", "f"]}},
        ["city", "unit"])],
    [fn("add", {"a": {"type": "integer", "minimum": 0, "maximum": 99}, "b": {"type": "integer", "minimum": -5,
                                                                              "maximum": 5}}, ["a", "b"]),
     fn("flag", {"on": {"type": "boolean"}}, ["on"])],
    {"tools": [{"name": "read_file", "description": "Read a file.", "args": [{"name": "path"}]},
               {"name": "list_dir", "description": "List a directory.", "args": [{"name": "path"}, {"name": "n"}]}]},
]


def test_jump_forward_many_tool_sets():
    from batchmask.compiler.sets import combine
    from batchmask.run.generation import BatchGenerator, GenerationConfig
    tok, model = loop_fixture()
    regs = [ToolRegistry.from_obj(t) for t in TOOL_SETS]
    grammars = [compile_grammar(r, tok, format="json", max_string=6) for r in regs]
    table = combine(grammars)
    tasks = [f"task number {i}" for i in range(8)]
    groups = [i % 3 for i in range(8)]
    config = GenerationConfig(batch_size=3, max_new_tokens=60, format="json", jump_forward=True)
    got = []
    BatchGenerator(model, tok, regs[0], table, config, registries=regs).run(tasks, on_result=got.append, groups=groups)
    for r, task, k in zip(got, tasks, groups):
        assert r.token_ids == reference_run(model, tok, regs[k], grammars[k], task, 60)
        assert r.call is not None and r.steps < r.tokens


def test_without_jump_forward_steps_are_tokens():
    from batchmask.run.generation import BatchGenerator, GenerationConfig, GenerationError
    tok, model = loop_fixture()
    reg = ToolRegistry.defaults()
    g = compile_grammar(reg, tok, format="json", max_string=12)
    got = []
    stats = BatchGenerator(model, tok, reg, g, GenerationConfig(batch_size=2, max_new_tokens=40, format="json")).run(
        ["a", "b", "c"], on_result=got.append)
    assert all(r.record()["steps"] == r.tokens for r in got) and stats.row_steps == stats.tokens
    with pytest.raises(GenerationError, match="jump-forward needs the grammar"):
        BatchGenerator(model, tok, reg, None, GenerationConfig(constrain=False, jump_forward=True))
