"""benchmarks/scripted_model.py, the model jump-forward's figures are measured with: it writes its reference calls
exactly, with and without jump-forward (the loop then writes the same bytes in fewer steps), and its reference
calls are valid for their tools (jsonschema)."""
from __future__ import annotations

import json
import sys

import jsonschema
import pytest
from data_paths import CATALOGUE, GPT2, LLAMA2, ROOT

sys.path.append(str(ROOT))  # last: see tests/conftest.py
from batchmask.models import load_tokenizer  # noqa: E402

from batchmask.api import compile_grammar  # noqa: E402
from batchmask.run.generation import BatchGenerator, GenerationConfig  # noqa: E402
from batchmask.tools.envelope import get_envelope  # noqa: E402
from batchmask.tools.registry import ToolRegistry  # noqa: E402
from benchmarks.scripted_model import ScriptedModel, reference_calls  # noqa: E402

VOCABS = {"llama2": LLAMA2 / "tokenizer.model", "gpt2": GPT2}


@pytest.fixture(scope="module")
def catalogue():
    return ToolRegistry.from_json(CATALOGUE)


def test_reference_calls_are_valid_for_their_tools(catalogue):
    params = {t.name: t.parameters for t in catalogue.tools if t.parameters is not None}
    for fmt in ("json", "hermes"):
        for _, text in reference_calls(catalogue, get_envelope(fmt), 40, seed=5):
            call = json.loads(text[text.index("{"):text.rindex("}") + 1])
            if call["name"] in params:
                jsonschema.validate(call["arguments"], params[call["name"]])


@pytest.mark.parametrize("vocab,fmt,tools", [("llama2", "json", "catalogue"), ("gpt2", "hermes", "built-in")])
def test_scripted_model_writes_its_calls_with_and_without_jump_forward(catalogue, vocab, fmt, tools):
    tok = load_tokenizer(VOCABS[vocab])
    registry = catalogue if tools == "catalogue" else ToolRegistry.defaults()
    g = compile_grammar(registry, tok, format=fmt)
    calls = reference_calls(registry, get_envelope(fmt), 10, seed=2)
    runs = {}
    for jump in (False, True):
        model = ScriptedModel(tok.token_bytes, dict(calls), eos_id=tok.eos_id, seq_len=2048, decode_text=tok.decode)
        got = []
        config = GenerationConfig(batch_size=4, max_new_tokens=200, format=fmt, jump_forward=jump)
        BatchGenerator(model, tok, registry, g, config).run([t for t, _ in calls], on_result=got.append)
        got.sort(key=lambda r: r.index)
        assert [r.text for r in got] == [c for _, c in calls]            # every reference call, byte for byte
        assert not any(r.cut for r in got) and model.off_script == 0
        runs[jump] = got
    tokens = sum(r.tokens for r in runs[True])
    steps = sum(r.record()["steps"] for r in runs[True])
    assert all(r.record()["steps"] == r.tokens for r in runs[False])
    assert steps < tokens      # the forced text cost no step
