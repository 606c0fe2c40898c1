"""Several tool sets compiled together (api.compile_grammars, GrammarStore.together): one automaton, a start state
per set. Checked against each set compiled alone (for the seed format that is automaton/dfa.py's construction, another
code path), token by token on random walks, and for the cache file and the run's table."""
from __future__ import annotations

import json
import random

import pytest
import torch
from data_paths import CATALOGUE as CATALOGUE_FILE
from test_generation import small_tokenizer
from test_grammar_set import MAX_STRING, SCHEMA, TOOL_SETS

from batchmask import compile_grammar, compile_grammars
from batchmask.api import load_grammars
from batchmask.compiler.compiled import GrammarCacheError
from batchmask.masker import BatchMasker
from batchmask.run.grammar_store import GrammarStore
from batchmask.run.schema_task import SchemaTask
from batchmask.tools.registry import ToolRegistry

CATALOGUE = json.loads((CATALOGUE_FILE)
                       .read_text())["tools"]


@pytest.fixture(scope="module")
def tok():
    return small_tokenizer()


def walk_both(together, start, alone, rng, steps=120):
    """A random walk from `start` in `together` and from alone's start: the same legal ids at every step."""
    a, b = start, alone.start
    for _ in range(steps):
        legal_a, legal_b = together.allowed([a])[0], alone.allowed([b])[0]
        assert torch.equal(legal_a, legal_b)
        assert bool(together.is_final([a])[0]) == bool(alone.is_final([b])[0])
        assert len(together.finish_bytes(a)) == len(alone.finish_bytes(b))     # a shortest completion each
        ids = torch.nonzero(legal_a).flatten().tolist()
        tok_id = rng.choice(ids)
        a, b = int(together.next_state([a], [tok_id])[0]), int(alone.next_state([b], [tok_id])[0])
        if b == alone.done_state:
            assert a == together.done_state
            return


@pytest.mark.parametrize("fmt", ["json", "seed"])
def test_each_set_together_is_the_set_alone(tok, fmt):
    sets = [[TOOL_SETS[0][0], TOOL_SETS[1][0]], TOOL_SETS[1], [TOOL_SETS[1][1], TOOL_SETS[0][0]]]
    if fmt == "seed":                        # native tools alone: the seed's construction (automaton/dfa.py)
        native = TOOL_SETS[2]["tools"]
        sets = [[native[0]], [native[1], native[0]], native]
    regs = [ToolRegistry.from_obj(s if fmt == "json" else {"tools": s}) for s in sets]
    together = compile_grammars(regs, tok, format=fmt, max_string=MAX_STRING)
    assert len(together.starts) == len(regs)
    assert (together.starts[1] == together.starts[2]) == (fmt == "seed")   # the same tools in another order
    rng = random.Random(5)
    for reg, start in zip(regs, together.starts):
        alone = compile_grammar(reg, tok, format=fmt, max_string=MAX_STRING)
        for _ in range(6):
            walk_both(together, start, alone, rng)


def test_shared_tools_are_compiled_once(tok):
    """Sets drawn from one catalogue share their tools' states: together is far smaller than the sets apart."""
    rng = random.Random(0)
    regs = [ToolRegistry.from_obj({"tools": rng.sample(CATALOGUE, 4)}) for _ in range(6)]
    together = compile_grammars(regs, tok, format="json")
    apart = [compile_grammar(r, tok, format="json") for r in regs]
    names = {n for reg in regs for n in reg.names}
    every = compile_grammar(ToolRegistry.from_obj({"tools": [t for t in CATALOGUE if t["function"]["name"] in names]}),
                            tok, format="json")                       # each tool used, once
    assert together.num_states < 1.05 * every.num_states < 0.8 * sum(g.num_states for g in apart)
    assert together.nbytes < 0.8 * sum(g.nbytes for g in apart)
    walk_both(together, together.starts[3], apart[3], random.Random(1), steps=400)


def test_a_schema_task_together_with_tool_sets(tok):
    task = SchemaTask(SCHEMA, "<task 0>")
    reg = ToolRegistry.from_obj(TOOL_SETS[1])
    together = compile_grammars([reg, task], tok, format="json", max_string=MAX_STRING)
    walk_both(together, together.starts[1], task.compile(tok), random.Random(2))
    with pytest.raises(ValueError, match="a schema task is UTF-8"):
        compile_grammars([reg, task], tok, format="json", max_string=MAX_STRING, utf8=False)
    with pytest.raises(ValueError, match="item 1 is a dict, not a ToolRegistry"):
        compile_grammars([reg, {"tools": []}], tok, format="json")
    with pytest.raises(ValueError, match="no tool sets given"):
        compile_grammars([], tok)


def test_the_masker_starts_rows_in_their_own_set(tok):
    regs = [ToolRegistry.from_obj(t) for t in TOOL_SETS[:2]]
    together = compile_grammars(regs, tok, format="json", max_string=MAX_STRING)
    m = BatchMasker(together, 4, backend="torch")
    m.reset(starts=[together.starts[i % 2] for i in range(4)])
    assert m.states.tolist() == [together.starts[i % 2] for i in range(4)]
    with pytest.raises(ValueError, match="not all start states"):
        m.reset([0], starts=[together.done_state])


def test_cache_file_of_sets_together(tok, tmp_path, capsys):
    regs = [ToolRegistry.from_obj(t) for t in TOOL_SETS]
    store = GrammarStore(tok, format="json", max_string=MAX_STRING, cache_dir=tmp_path)
    first = store.together(regs)
    assert store.compiled == 1 and len(list(tmp_path.glob("*.pt"))) == 1 and store.together(regs) is first
    again = GrammarStore(tok, format="json", max_string=MAX_STRING, cache_dir=tmp_path)
    loaded = again.together(regs)
    assert again.compiled == 0 and again.loaded == 1 and loaded.starts == first.starts
    assert torch.equal(loaded.row_next, first.row_next) and torch.equal(loaded.targets, first.targets)
    path = next(tmp_path.glob("*.pt"))
    with pytest.raises(GrammarCacheError, match="built for another grammars"):       # other sets, same file
        load_grammars(path, regs[::-1], tok, format="json", max_string=MAX_STRING)
    # the same tools in another form are one set: compiled once, each form starting where the other does
    same = [regs[0], ToolRegistry.from_obj({"tools": TOOL_SETS[0]}), regs[1]]
    view = GrammarStore(tok, format="json", max_string=MAX_STRING, cache_dir=None).together(same)
    assert view.starts[0] == view.starts[1] != view.starts[2]
