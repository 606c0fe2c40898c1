"""The automaton's C helpers (automaton/native_c/: the subset construction, a Lit's NFA states) against the Python
they replace (tree.py run_python, nfa.py's Lit loop): the same NFA and the same automaton, state for state, on
every schema of the vendored JSON Schema Test Suite, on BFCL's and the catalogue's tools, on generated schemas and
on node trees that exercise the lockstep merge, loops and runs; the same refusal at each limit; and clear errors on
bad arguments."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from data_paths import DATA
from hypothesis import given, settings
from schema_strategies import schemas

from batchmask.api import call_node
from batchmask.automaton import extension, tree
from batchmask.automaton.nfa import GrammarBuildError
from batchmask.errors import SchemaError
from batchmask.grammar.nodes import Alt, ByteSet, JsonStr, Lit, Repeat, Seq
from batchmask.schema.build import SchemaOptions, schema_node
from batchmask.tools.bfcl import openai_tools
from batchmask.tools.registry import ToolRegistry

needs_native = pytest.mark.skipif(extension.helpers is None, reason="automaton/native_c/ is not built here")
pytestmark = needs_native


def both(node, monkeypatch):
    """(the C construction's automaton, the Python one's), each from a fresh NFA."""
    got = tree.build_node_automaton(node)
    with monkeypatch.context() as m:
        m.setattr(extension, "helpers", None)
        want = tree.build_node_automaton(node)
    return got, want


def differences(a, b) -> list[str]:
    """Where two automata differ (empty: the same states, ids, edges, blocks and elements)."""
    out = []
    for f in ("num_states", "start", "starts"):
        if getattr(a, f) != getattr(b, f):
            out.append(f)
    for f in ("edges", "accepting", "byte_class", "edge_cell"):
        if not np.array_equal(getattr(a, f), getattr(b, f)):
            out.append(f)
    if len(a.blocks) != len(b.blocks):
        out.append("blocks")
    for x, y in zip(a.blocks, b.blocks):
        if (x.label, x.base, x.min, x.max, x.entry_depth, x.saturates) != (y.label, y.base, y.min, y.max,
                                                                          y.entry_depth, y.saturates) \
                or not np.array_equal(x.exits, y.exits):
            out.append(f"block {x.label}")
    sa, sb = a.source.states, b.source.states
    if len(sa) != len(sb) or any(sa[i] != sb[i] for i in range(len(sb))):
        out.append("state elements")
    na, nb = a.source.nfa, b.source.nfa
    if (na.kind, na.next, na.arg) != (nb.kind, nb.next, nb.arg):
        out.append("NFA (the lockstep merge's states)")
    return out


def test_the_comparison_sees_a_difference(monkeypatch):
    # the companion: a changed edge, a changed element and a changed block are each reported
    node = schema_node({"type": "object", "properties": {"a": {"type": "string"}, "b": {"enum": [1, 2]}}})
    got, want = both(node, monkeypatch)
    assert differences(got, want) == []
    got.edges[0, 2] += 1
    assert differences(got, want) == ["edges"]
    got.edges[0, 2] -= 1
    got.blocks[0].exits[0] = 7
    assert differences(got, want) == [f"block {got.blocks[0].label}"]
    got.blocks[0].exits[0] = want.blocks[0].exits[0]
    monkeypatch.setattr(got.source, "states", list(want.source.states)[:-1] + [(0,)])
    assert differences(got, want) == ["state elements"]


def suite_schemas():
    for path in sorted((DATA / "json-schema-test-suite").rglob("*.json")):
        for k, group in enumerate(json.loads(path.read_text(encoding="utf-8"))):
            yield f"{path.stem}[{k}]", group["schema"]


def tool_sets():
    """(name, registry) for each vendored tool file: BFCL's function docs and the 12-tool catalogue."""
    yield "agent_tools", ToolRegistry.from_json(DATA / "tools" / "agent_tools.json")
    yield "math_api", ToolRegistry.from_json(DATA / "bfcl" / "math_api.json")
    for path in sorted((DATA / "bfcl").glob("BFCL_*.json")):         # each question's tool set
        lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
        for k, q in enumerate(lines):
            if isinstance(q.get("function"), list) and q["function"]:
                tools = openai_tools(q["function"], f"{path.name}:{k + 1}")
                try:
                    yield f"{path.stem}:{k + 1}", ToolRegistry.from_obj({"tools": tools}, source=path.name)
                except SchemaError:
                    continue                             # a tool no value satisfies (BFCL has a few): no grammar


def compare_schemas(named, monkeypatch) -> int:
    """Each schema both ways; returns how many compiled (a refusal must be the same refusal)."""
    built = 0
    for name, schema in named:
        try:
            node = schema_node(schema, SchemaOptions())
        except (ValueError, TypeError, KeyError, RecursionError):
            continue                                     # not in the supported subset: no automaton to compare
        try:
            got, want = both(node, monkeypatch)
        except GrammarBuildError as e:
            with monkeypatch.context() as m:
                m.setattr(extension, "helpers", None)
                with pytest.raises(GrammarBuildError) as ref:
                    tree.build_node_automaton(node)
            assert str(ref.value) == str(e), name
            continue
        assert differences(got, want) == [], name
        built += 1
    return built


def test_the_schema_test_suite_builds_the_same_automata(monkeypatch):
    assert compare_schemas(suite_schemas(), monkeypatch) > 300


@pytest.mark.parametrize("fmt", ["json", "llama3", "hermes", "seed"])
def test_tool_sets_build_the_same_automata(fmt, monkeypatch):
    built = 0
    for name, registry in tool_sets():
        node = call_node(registry, fmt, 64)
        got, want = both(node, monkeypatch)
        assert differences(got, want) == [], (name, fmt)
        built += 1
    assert built >= 30


@settings(max_examples=60, deadline=None)
@given(schemas())
def test_generated_schemas_build_the_same_automata(schema):
    with pytest.MonkeyPatch.context() as monkeypatch:
        assert compare_schemas([("generated", schema)], monkeypatch) == 1


def lockstep_tree():
    """anyOf of objects that differ only after a shared string: positions that move in lockstep (merged); two
    strings of different bounds open side by side (parallel states); a loop (an unbounded repeat), a run (a wide
    byte repeat) and a bounded repeat of a string."""
    word = ByteSet(bytes(1 if chr(b).isalnum() else 0 for b in range(256)))
    key = Seq([Lit(b'{"k":"'), JsonStr(0, 40), Lit(b'"')])
    parallel = Alt([Seq([Lit(b'"'), JsonStr(0, 5), Lit(b'"a')]), Seq([Lit(b'"'), JsonStr(2, 9), Lit(b'"b')])])
    return Seq([Alt([Seq([key, Lit(b',"a":1}')]), Seq([key, Lit(b',"b":2}')]), Seq([key, Lit(b"}")])]), parallel,
                Repeat(Seq([Lit(b","), word]), 0, None), Lit(b";"), Repeat(word, 0, 12),
                Repeat(Seq([Lit(b'"'), JsonStr(0, 3), Lit(b'"')]), 1, 3)])


def test_trees_with_merges_loops_and_runs_build_the_same_automata(monkeypatch):
    node = lockstep_tree()
    before = []
    init = tree._Subsets.__init__
    monkeypatch.setattr(tree._Subsets, "__init__", lambda self, nfa, starts: (before.append(len(nfa.kind)),
                                                                                  init(self, nfa, starts))[1])
    got, want = both(node, monkeypatch)
    assert differences(got, want) == []
    assert len(got.source.nfa.kind) > before[0]                  # the merge made NFA states (and the same ones)
    other = Seq([Lit(b'{"'), JsonStr(0, 4), Lit(b'"}')])
    assert differences(*both([node, other], monkeypatch)) == []                  # two trees, one NFA


def refusals(node, monkeypatch) -> str:
    """The error building `node` raises with the C helpers, checked to be the Python path's, word for word."""
    with pytest.raises(GrammarBuildError) as got:
        tree.build_node_automaton(node)
    with monkeypatch.context() as m:
        m.setattr(extension, "helpers", None)
        with pytest.raises(GrammarBuildError) as want:
            tree.build_node_automaton(node)
    assert str(got.value) == str(want.value)
    return str(got.value)


@pytest.mark.parametrize("limit, value", [("MAX_EXPLICIT", 20), ("MAX_PARALLEL", 0), ("MAX_NFA", 40)])
def test_the_same_refusal_at_each_limit(limit, value, monkeypatch):
    monkeypatch.setattr(tree, limit, value)
    got = refusals(lockstep_tree(), monkeypatch)
    assert {"MAX_EXPLICIT": "more than 20 explicit states", "MAX_PARALLEL": "side by side",
            "MAX_NFA": "states before determinising"}[limit] in got


def test_bad_arguments_are_named():
    z, run = np.zeros(1, dtype=np.int64), extension.helpers.run
    with pytest.raises(TypeError, match="btab"):
        run([3], [-1], [None], z[:0], 10, 0, z, np.zeros(4, dtype=np.int32), z, z, z, z, z, z, z, 1, z, 10, 10)
    with pytest.raises(ValueError, match="byte classes"):
        run([3], [-1], [None], z[:0], 10, 0, z, z, z, z, z, z, z, z, z, 0, z, 10, 10)
    with pytest.raises(TypeError, match="one length"):
        run([3, 3], [-1], [None], z[:0], 10, 0, z, z, z, z, z, z, z, z, z, 1, z, 10, 10)


def test_the_switch_turns_it_off():
    env = {**os.environ, "BATCHMASK_NATIVE": "0"}
    probe = "from batchmask.automaton import extension; print(extension.helpers is None)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env,
                         cwd=Path(__file__).resolve().parents[1], timeout=120)
    assert out.stdout.split() == ["True"], out.stderr


def test_nodes_the_c_build_hands_back_build_the_same(monkeypatch):
    """build_node takes Lit, Seq, Alt and ByteSet and hands NFA._build the rest and the odd cases: a bytearray text
    or mask, a byte whose mask is not made yet, an Alt whose options collapse to one; the same NFA either way."""
    digits = ByteSet(bytes(1 if 48 <= b < 58 else 0 for b in range(256)))
    node = Seq([Lit(bytearray(b"{")), ByteSet(bytearray(digits.mask)), Alt([Lit(b"ab"), Lit(b"ab"), digits]),
                Alt([Seq([Lit(b"x"), digits]), Seq([Lit(b"x"), digits])]), Repeat(digits, 0, 3), Lit(b"\xff}")])
    assert differences(*both(node, monkeypatch)) == []


@pytest.mark.parametrize("node", [Seq([Lit(b"a"), Alt([])]), Seq([Lit("text"), Lit(b"b")]),
                                  Seq([ByteSet(b"\x02" * 256)]), Seq([Lit(b"a"), 7])])
def test_bad_nodes_are_refused_alike(node, monkeypatch):
    assert refusals(node, monkeypatch)
