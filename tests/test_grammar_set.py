"""Many tool sets in one batch: the combined table (compiler/sets.py), per-row start states in the masker, per-task
tools in generation and the CLI, and the grammar cache (run/grammar_store.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import torch
from batchmask.models.checkpoint import ModelConfig, random_weights, write_checkpoint
from test_generation import random_model, small_tokenizer

from batchmask import compile_grammar
from batchmask.compiler import compiled as compiler_module
from batchmask.compiler.sets import GrammarSetError, combine, starts_of
from batchmask.masker import BatchMasker
from batchmask.run.cli import main
from batchmask.run.generation import BatchGenerator, GenerationConfig
from batchmask.run.grammar_store import GrammarStore
from batchmask.tools.registry import ToolRegistry

MAX_STRING = 6
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 4},
                                           "days": {"type": "integer", "minimum": 1, "maximum": 7}},
          "required": ["city", "days"], "additionalProperties": False}


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


@pytest.fixture(scope="module")
def tok():
    return small_tokenizer()


@pytest.fixture(scope="module")
def sets(tok):
    regs = [ToolRegistry.from_obj(t) for t in TOOL_SETS]
    grammars = [compile_grammar(r, tok, format="json", max_string=MAX_STRING) for r in regs]
    return regs, grammars


def to_combined(table, k, states):
    """Grammar k's own states -> the combined table's (its done state is the shared one)."""
    g = table.grammars[k]
    states = torch.as_tensor(states).long()
    return torch.where(states == g.done_state, table.done_state, states + table.state_offset[k])


# --- the combined table -------------------------------------------------------------------------
def test_combined_table_is_each_grammar_in_every_state_and_token(sets):
    _, grammars = sets
    assert combine(grammars[:1]) is grammars[0]
    check_combined(grammars)


def test_combined_seed_grammars(tok):
    """The seed's format (automaton/dfa.py's tables, native tools) combines the same way."""
    regs = [ToolRegistry.defaults(), ToolRegistry.from_obj(TOOL_SETS[2])]
    check_combined([compile_grammar(r, tok, max_string=MAX_STRING) for r in regs])


def check_combined(grammars):
    table = combine(grammars)
    assert table.num_states == sum(g.num_states - 1 for g in grammars) + 1
    tokens = torch.arange(table.vocab_size)
    for k, g in enumerate(grammars):
        states = torch.arange(g.num_states)
        mine = to_combined(table, k, states)
        assert table.starts[k] == int(mine[g.start])
        assert torch.equal(table.allowed(mine), g.allowed(states))
        want = g.next_state(states[:, None], tokens[None, :])                               # [S_g, V]
        want = torch.where(want >= 0, to_combined(table, k, want.clamp(min=0)), want)
        assert torch.equal(table.next_state(mine[:, None], tokens[None, :]), want)
        assert torch.equal(table.legal_count[mine], g.legal_count) and torch.equal(table.final[mine], g.final)
        for s in range(0, g.num_states, max(1, g.num_states // 50)):
            assert table.finish_text(int(mine[s])) == g.finish_text(s)
            assert table.describe(int(mine[s])) == g.describe(s)
    assert starts_of(table) == table.starts and starts_of(grammars[0]) == [grammars[0].start]


def test_a_grammar_given_twice_is_stored_once(sets, tok, tmp_path):
    regs, grammars = sets
    g0, g1 = grammars[0], grammars[1]
    assert combine([g0, g0]) is g0
    table = combine([g0, g1, g0])
    assert table.num_states == g0.num_states + g1.num_states - 1 and len(table.grammars) == 2
    assert table.starts[2] == table.starts[0] != table.starts[1]
    # tool sets that differ only in their descriptions share one grammar (the key is the canonical form)
    renamed = json.loads(json.dumps(TOOL_SETS[0]))
    renamed[0]["function"]["description"] = "an entirely different description"
    other = ToolRegistry.from_obj(renamed)
    store = GrammarStore(tok, format="json", max_string=MAX_STRING, cache_dir=tmp_path)
    assert store.grammar(regs[0]) is store.grammar(other) and store.compiled == 1


def test_combine_refuses_grammars_of_another_vocabulary(sets, tok):
    _, grammars = sets
    other = small_tokenizer()
    other.token_bytes = list(other.token_bytes)
    other.token_bytes[300] = b"zz-other"
    g = compile_grammar(ToolRegistry.from_obj(TOOL_SETS[2]), other, format="json", max_string=MAX_STRING)
    with pytest.raises(GrammarSetError, match="another vocabulary"):
        combine([grammars[0], g])


# --- the masker: per-row start states, Triton == torch ----------------------------------------------
def walk(backend, table, plan, steps, temperature, seed):
    """Rows start in the grammars of plan[0]; at step t, rows r in plan[t] restart in grammar plan[t][r]."""
    B = len(plan[0])
    m = BatchMasker(table, B, backend=backend, max_tokens=steps + 1)
    m.reset(starts=[table.starts[k] for k in plan[0]], keys=list(range(B)))
    gen = torch.Generator().manual_seed(seed)
    out = []
    for t in range(steps):
        if t in plan and t:
            rows = sorted(plan[t])
            m.reset(rows, keys=[100 * t + r for r in rows], starts=[table.starts[plan[t][r]] for r in rows])
        before = m.states.clone()
        logits = torch.randn(B, table.vocab_size, generator=gen) * 3
        tokens = m.sample(logits, temperature=temperature, seed=seed)
        out.append((before, tokens.clone(), m.legal_counts.clone(), m.states.clone()))
    m.check()
    return out


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_mixed_batch_triton_and_torch_agree_bit_for_bit(sets, temperature):
    _, grammars = sets
    table = combine(grammars)
    plan = {0: [0, 1, 2, 1, 0, 2], 5: {1: 2, 4: 1}, 9: {0: 1, 2: 0, 5: 0}}
    ref = walk("torch", table, plan, 14, temperature, seed=3)
    tri = walk("triton", table, plan, 14, temperature, seed=3)
    for (b0, t0, c0, s0), (b1, t1, c1, s1) in zip(ref, tri):
        assert torch.equal(b0, b1) and torch.equal(t0, t1) and torch.equal(c0, c1) and torch.equal(s0, s1)
    # every move is legal in the row's own grammar (the grammar compiled alone is the reference)
    owner = list(plan[0])
    for t, (before, tokens, _, after) in enumerate(ref):
        if t in plan and t:
            for r, k in plan[t].items():
                owner[r] = k
        for r, k in enumerate(owner):
            g = grammars[k]
            s = int(before[r])
            local = g.done_state if s == table.done_state else s - table.state_offset[k]
            assert 0 <= local < g.num_states, (t, r, s)
            nxt = int(g.next_state([local], [int(tokens[r])])[0])
            assert nxt >= 0 and int(to_combined(table, k, [nxt])[0]) == int(after[r])


def test_reset_refuses_a_state_that_is_not_a_start(sets):
    table = combine(sets[1])
    m = BatchMasker(table, 2)
    with pytest.raises(ValueError, match="not all start states"):
        m.reset([0], starts=[table.starts[1] + 1])
    with pytest.raises(ValueError, match="2 rows but 1 starts"):
        m.reset([0, 1], starts=[table.starts[1]])


# --- generation: each row in its own grammar, with refills ------------------------------------------
def check_call(res, registry):
    """The call names a tool of its own set and its arguments validate against it (jsonschema)."""
    assert res.error is None and res.call is not None, (res.text, res.error)
    obj = json.loads(res.text)
    assert obj["name"] in registry.names
    tool = registry[obj["name"]]
    if tool.parameters is not None:
        jsonschema.validate(obj["arguments"], tool.parameters)
    else:
        assert list(obj["arguments"]) == [a.name for a in tool.required_args]
        assert all(isinstance(v, str) and 1 <= len(v.encode()) <= MAX_STRING for v in obj["arguments"].values())


def test_mixed_tool_sets_with_refills_equal_one_tool_set_at_a_time(sets, tok):
    regs, grammars = sets
    table = combine(grammars)
    tasks = [f"task number {i}" for i in range(11)]
    groups = [i % 3 if i % 4 else 2 - i % 3 for i in range(11)]
    config = GenerationConfig(batch_size=4, max_new_tokens=40, temperature=1.0, seed=5, format="json")
    model = random_model(tok.vocab_size, seed=2)
    mixed = []
    BatchGenerator(model, tok, regs[0], table, config, registries=regs).run(
        tasks, on_result=mixed.append, groups=groups)
    assert [r.index for r in mixed] == list(range(11))
    for r in mixed:
        check_call(r, regs[groups[r.index]])
    assert {json.loads(r.text)["name"] for r in mixed} - {"answer"}      # not only the always-present tool
    # the same tasks, one tool set per run (their own grammar alone): the same calls
    for k in range(3):
        idx = [i for i in range(11) if groups[i] == k]
        alone = []
        BatchGenerator(model, tok, regs[k], grammars[k], config).run([tasks[i] for i in idx], indices=idx,
                                                                     on_result=alone.append)
        assert [r.text for r in alone] == [mixed[i].text for i in idx]


# --- the command line: tasks with their own tools, the grammar cache -------------------------------
@pytest.fixture(scope="module")
def files(tmp_path_factory, tok):
    d = tmp_path_factory.mktemp("multi")
    tok.write_bin(d / "tokenizer.bin")
    config = ModelConfig(dim=16, hidden_dim=32, n_layers=1, n_heads=2, n_kv_heads=2, vocab_size=tok.vocab_size,
                         seq_len=512)
    write_checkpoint(d / "model.bin", config, random_weights(config, seed=0, std=0.5))
    lines = []
    for i in range(9):
        row = {"task": f"do thing {i}"}
        if i % 3:
            row["tools"] = TOOL_SETS[i % 3 - 1] if i % 2 else {"tools": TOOL_SETS[1]} if i % 3 == 2 else TOOL_SETS[0]
        lines.append(json.dumps(row))
    lines += [json.dumps({"task": f"a record {i}", "schema": SCHEMA}) for i in range(2)]     # one JSON value each
    (d / "tasks.jsonl").write_text("\n".join(lines) + "\n")
    (d / "tools.json").write_text(json.dumps(TOOL_SETS[2]))
    return d


def cli(files, out, *extra, cache=None, tasks="tasks.jsonl"):
    args = ["generate", "--tasks", str(files / tasks), "--checkpoint", str(files / "model.bin"), "--tokenizer",
            str(files / "tokenizer.bin"), "--tools", str(files / "tools.json"), "--format", "json", "--max-string",
            str(MAX_STRING), "--batch-size", "2", "--max-new-tokens", "40", "--temperature", "1", "--seed", "7",
            "--quiet", "--out", str(out)]
    if cache is not None:
        args += ["--grammar-cache", str(cache)]
    return main(args + list(extra))


@pytest.fixture
def count_compiles(monkeypatch):
    calls = []
    real = compiler_module.compile_node

    def counting(*a, **kw):
        calls.append(kw.get("key"))
        return real(*a, **kw)
    monkeypatch.setattr(compiler_module, "compile_node", counting)
    return calls


def task_registry(row, default):
    return ToolRegistry.from_obj(row["tools"]) if "tools" in row else default


def test_cli_tasks_with_own_tools_and_a_second_run_compiles_nothing(files, tmp_path, count_compiles, capsys):
    cache = tmp_path / "cache"
    assert cli(files, tmp_path / "a.jsonl", cache=cache) == 0
    # three tool sets and one schema, compiled together into one table (one compile, one cache file)
    assert len(count_compiles) == 1 and len(list(cache.glob("*.pt"))) == 1
    assert count_compiles[0]["grammar"] == "together" and len(count_compiles[0]["grammars"]) == 4
    rows = [json.loads(x) for x in (files / "tasks.jsonl").read_text().splitlines()]
    default = ToolRegistry.from_obj(TOOL_SETS[2])
    recs = [json.loads(x) for x in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert [r["index"] for r in recs] == list(range(11))
    for rec, row in zip(recs, rows):
        if "schema" in row:                                   # one JSON value of the task's schema
            assert rec["error"] is None and json.loads(rec["text"]) == rec["call"]
            jsonschema.validate(rec["call"], row["schema"])
            continue
        reg = task_registry(row, default)
        assert rec["error"] is None and rec["call"]["name"] in reg.names
        tool = reg[rec["call"]["name"]]
        if tool.parameters is not None:
            jsonschema.validate(rec["call"]["arguments"], tool.parameters)
    count_compiles.clear()
    assert cli(files, tmp_path / "b.jsonl", cache=cache) == 0
    assert count_compiles == []                                                    # all four from the cache
    strip = lambda p: [{k: v for k, v in json.loads(x).items() if k != "seconds"} for x in p.read_text().splitlines()]
    assert strip(tmp_path / "a.jsonl") == strip(tmp_path / "b.jsonl")
    # the fingerprint holds each task's tools: other tools for one task are refused by --resume
    rows[4]["tools"] = TOOL_SETS[2]
    (files / "edited.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    capsys.readouterr()
    assert cli(files, tmp_path / "a.jsonl", "--resume", cache=cache, tasks="edited.jsonl") == 2
    assert "other settings" in capsys.readouterr().err


def test_cache_file_corrupt_or_built_for_other_tools_is_recompiled_and_replaced(files, tok, tmp_path, capsys):
    regs = [ToolRegistry.from_obj(t) for t in TOOL_SETS[:2]]
    store = GrammarStore(tok, format="json", max_string=MAX_STRING, cache_dir=tmp_path)
    first = store.grammar(regs[0])
    path_a, path_b = store.path(regs[0]), store.path(regs[1])
    assert path_a.exists() and store.compiled == 1 and store.grammar(regs[0]) is first      # memory
    again = GrammarStore(tok, format="json", max_string=MAX_STRING, cache_dir=tmp_path)
    assert torch.equal(again.grammar(regs[0]).row_next, first.row_next) and again.compiled == 0 and again.loaded == 1
    # another tool set's file under this name: refused (its key says so), compiled again, replaced
    path_b.write_bytes(path_a.read_bytes())
    fresh = GrammarStore(tok, format="json", max_string=MAX_STRING, cache_dir=tmp_path)
    g_b = fresh.grammar(regs[1])
    assert fresh.compiled == 1 and "built for another" in capsys.readouterr().err
    assert GrammarStore(tok, format="json", max_string=MAX_STRING, cache_dir=tmp_path).grammar(regs[1]).num_states \
        == g_b.num_states
    # a corrupt file: refused, compiled again, replaced by a good one
    path_a.write_bytes(b"not a torch file")
    fresh = GrammarStore(tok, format="json", max_string=MAX_STRING, cache_dir=tmp_path)
    assert torch.equal(fresh.grammar(regs[0]).row_next, first.row_next) and fresh.compiled == 1
    err = capsys.readouterr().err
    assert "not a readable grammar cache" in err and len(err.strip().splitlines()) == 1 and "pickle" not in err
    assert not list(tmp_path.glob(".*.tmp"))
    # a file of another cache version: named as such, compiled again
    payload = torch.load(path_a, weights_only=True)
    payload["meta"]["format"] = "batchmask-grammar/3"
    torch.save(payload, path_a)
    fresh = GrammarStore(tok, format="json", max_string=MAX_STRING, cache_dir=tmp_path)
    assert torch.equal(fresh.grammar(regs[0]).row_next, first.row_next) and fresh.compiled == 1
    assert "another batchmask version (batchmask-grammar/3" in capsys.readouterr().err
    # other options are another file (max_string is part of the key)
    other = GrammarStore(tok, format="json", max_string=MAX_STRING + 1, cache_dir=tmp_path)
    assert other.path(regs[0]) != path_a


def test_bad_tools_of_one_task_end_the_run_naming_it_before_anything_is_written(files, tmp_path, capsys):
    rows = [{"task": "fine"}, {"task": "broken", "tools": [{"type": "function", "function": {"name": "x y\""}}]}]
    (files / "bad.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "o.jsonl"
    assert cli(files, out, tasks="bad.jsonl", cache=tmp_path) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bad.jsonl line 2 (task 1)" in err[0]
    assert not out.exists() and not Path(str(out) + ".run.json").exists()
    (files / "bad2.jsonl").write_text(json.dumps({"task": "t", "tools": "get_weather"}) + "\n")
    assert cli(files, out, tasks="bad2.jsonl", cache=tmp_path) == 2
    assert "bad2.jsonl line 1: \"tools\" must be" in capsys.readouterr().err and not out.exists()
    bad = [{"task": "t"}, {"task": "u", "schema": {"type": "object", "properties": {"a": {"type": "string",
                                                                                        "minLength": -1}}}}]
    (files / "bad3.jsonl").write_text("\n".join(json.dumps(r) for r in bad) + "\n")
    assert cli(files, out, tasks="bad3.jsonl", cache=tmp_path) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bad3.jsonl line 2 (task 1) \"schema\"" in err[0] and not out.exists()


def test_torchrun_ranks_with_per_task_tools_write_what_one_process_writes(files, tmp_path):
    single = tmp_path / "single.jsonl"
    assert cli(files, single, cache=tmp_path / "c") == 0
    multi = tmp_path / "multi.jsonl"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
           str(29600 + os.getpid() % 1000), "-m", "batchmask", "generate", "--tasks", str(files / "tasks.jsonl"),
           "--checkpoint", str(files / "model.bin"), "--tokenizer", str(files / "tokenizer.bin"), "--tools",
           str(files / "tools.json"), "--format", "json", "--max-string", str(MAX_STRING), "--batch-size", "2",
           "--max-new-tokens", "40", "--temperature", "1", "--seed", "7", "--quiet", "--device", "cpu",
           "--grammar-cache", str(tmp_path / "c"), "--out", str(multi)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    strip = lambda p: [{k: v for k, v in json.loads(x).items() if k != "seconds"} for x in p.read_text().splitlines()]
    assert strip(multi) == strip(single)


def test_the_runs_own_tools_are_not_compiled_when_no_task_uses_them(files, tmp_path, count_compiles):
    (files / "own.jsonl").write_text("\n".join(json.dumps({"task": f"t{i}", "tools": TOOL_SETS[1]})
                                               for i in range(3)) + "\n")
    assert cli(files, tmp_path / "o.jsonl", tasks="own.jsonl", cache="none") == 0
    assert len(count_compiles) == 1
    names = {json.loads(x)["call"]["name"] for x in (tmp_path / "o.jsonl").read_text().splitlines()}
    assert names <= {"answer", "add", "flag"}
