"""`batchmask generate --format json` on random checkpoints: every sampled call is valid for jsonschema.

Random llama2.c models (T=1, short token ceilings, so that many calls are cut and completed by
finish()) on the Llama 2 vocabulary, with the shared typed catalogue and the built-in registry;
each output line's call must parse, equal its text, and validate against the call's JSON Schema
with jsonschema's format checker: 100%, over more than 2,000 calls.
"""
from __future__ import annotations

import json

import jsonschema
import pytest
from batchmask.models.checkpoint import ModelConfig, random_weights, write_checkpoint
from data_paths import data_dir
from schema_strategies import closed

from batchmask.run.cli import main
from batchmask.tools.envelope import call_schema
from batchmask.tools.registry import ToolRegistry

LLAMA = data_dir("llama2") / "tokenizer.model"
CATALOGUE = data_dir("tools") / "agent_tools.json"
CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER


def _runs():
    # (checkpoint seed, tools file or None for the built-in registry, tasks, token ceiling)
    return [(0, CATALOGUE, 640, 40), (1, CATALOGUE, 640, 64), (2, CATALOGUE, 448, 24), (3, None, 384, 32)]


@pytest.mark.skipif(not (LLAMA.exists() and CATALOGUE.exists()), reason="../shared not present")
def test_sampled_json_calls_all_validate(tmp_path):
    total = cut = 0
    tools_seen: set[str] = set()
    for seed, tools, n, ceiling in _runs():
        config = ModelConfig(dim=16, hidden_dim=32, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=32000,
                             seq_len=1024)
        ckpt = tmp_path / f"model{seed}.bin"
        write_checkpoint(ckpt, config, random_weights(config, seed=seed, std=0.8))
        tasks = tmp_path / f"tasks{seed}.txt"
        tasks.write_text("\n".join(f"do thing {i} now" for i in range(n)) + "\n")
        out = tmp_path / f"out{seed}.jsonl"
        args = ["generate", "--tasks", str(tasks), "--checkpoint", str(ckpt), "--tokenizer", str(LLAMA),
                "--format", "json", "--batch-size", "64", "--max-new-tokens", str(ceiling), "--temperature", "1",
                "--seed", str(seed), "--device", "cpu", "--quiet", "--out", str(out)]
        if tools is not None:
            args += ["--tools", str(tools)]
        assert main(args) == 0
        registry = ToolRegistry.defaults() if tools is None else ToolRegistry.from_json(tools)
        validator = jsonschema.Draft202012Validator(closed(call_schema(registry, "json")), format_checker=CHECKER)
        # lines split on "\n" only: str.splitlines would also cut at a U+2028 inside a value
        rows = [json.loads(line) for line in out.read_text(encoding="utf-8").split("\n") if line]
        assert [r["index"] for r in rows] == list(range(n))
        for r in rows:
            assert r["error"] is None and r["call"] is not None, r
            assert json.loads(r["text"]) == r["call"]
            errors = sorted(validator.iter_errors(r["call"]), key=str)
            assert not errors, (r["text"], errors[0].message)
            tools_seen.add(r["call"]["name"])
            cut += r["cut"]
        total += len(rows)
    assert total >= 2000
    assert cut > 0                               # ceilings were hit: finish() completions validate too
    assert len(tools_seen) >= 8                  # the random models reach most of the catalogue


@pytest.fixture(scope="module")
def model_files(tmp_path_factory):
    if not (LLAMA.exists() and CATALOGUE.exists()):
        pytest.skip("../shared not present")
    d = tmp_path_factory.mktemp("fmt")
    config = ModelConfig(dim=16, hidden_dim=32, n_layers=1, n_heads=2, n_kv_heads=2, vocab_size=32000, seq_len=1024)
    write_checkpoint(d / "model.bin", config, random_weights(config, seed=7, std=0.8))
    (d / "tasks.txt").write_text("\n".join(f"task {i}" for i in range(6)) + "\n")
    return d


def _generate(d, out, *extra):
    return main(["generate", "--tasks", str(d / "tasks.txt"), "--checkpoint", str(d / "model.bin"), "--tokenizer",
                 str(LLAMA), "--tools", str(CATALOGUE), "--batch-size", "6", "--max-new-tokens", "30",
                 "--temperature", "1", "--quiet", "--device", "cpu", "--out", str(out), *extra])


def test_compile_format_json_cache_is_reused_and_refused_for_another_format(model_files, tmp_path, capsys):
    d = model_files
    cache = tmp_path / "g.pt"
    assert main(["compile", "--tools", str(CATALOGUE), "--tokenizer", str(LLAMA), "--format", "json",
                 "--out", str(cache)]) == 0
    fresh, cached = tmp_path / "fresh.jsonl", tmp_path / "cached.jsonl"
    assert _generate(d, fresh, "--format", "json") == 0
    assert _generate(d, cached, "--format", "json", "--grammar", str(cache)) == 0
    rows = lambda p: [{k: v for k, v in json.loads(x).items() if k != "seconds"}
                      for x in p.read_text(encoding="utf-8").split("\n") if x]
    assert rows(fresh) == rows(cached)                            # the same table, compiled or loaded
    assert all(r["call"] is not None and set(r["call"]) == {"name", "arguments"} for r in rows(cached))
    capsys.readouterr()
    assert _generate(d, tmp_path / "seed.jsonl", "--grammar", str(cache)) == 2      # a json cache, seed asked
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("batchmask: error:") and "g.pt" in err[0], err


def test_free_arm_parses_in_the_format_asked(model_files, tmp_path):
    out = tmp_path / "free.jsonl"
    assert _generate(model_files, out, "--format", "json", "--no-constrain") == 0
    registry = ToolRegistry.from_json(CATALOGUE)
    from batchmask.tools.prompt import parse_call
    for line in out.read_text(encoding="utf-8").split("\n"):
        if line:
            r = json.loads(line)
            assert (r["call"], r["error"]) == parse_call(r["text"], registry, format="json")
