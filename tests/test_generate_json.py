"""`batchmask generate --format json` on random checkpoints: every sampled call is valid for jsonschema.

Random llama2.c models (T=1, short token ceilings, so that many calls are cut and completed by
finish()) on the Llama 2 vocabulary, with the shared typed catalogue and the built-in registry;
each output line's call must parse, equal its text, and validate against the call's JSON Schema
with jsonschema's format checker: 100%, over more than 2,000 calls.
"""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from batchmask.models.checkpoint import ModelConfig, random_weights, write_checkpoint
from schema_strategies import closed

from batchmask.cli import main
from batchmask.envelope import call_schema
from batchmask.registry import ToolRegistry

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
LLAMA = SHARED / "llama2" / "tokenizer.model"
CATALOGUE = SHARED / "tools" / "agent_tools.json"
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
