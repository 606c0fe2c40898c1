"""A run in waves (batchmask/run/waves.py): at most N distinct tool sets per table. Checked against the same run in one
wave: the same records, whether later waves are read back from the grammar cache or kept in host memory."""
from __future__ import annotations

import json
import random

import jsonschema
import pytest
from test_grammar_set import cli, files, tok  # noqa: F401  (fixtures)

from batchmask.run import waves
from batchmask.run.waves import cut_waves


@pytest.mark.parametrize("seed", range(30))
def test_waves_are_consecutive_bounded_and_greedy(seed):
    rng = random.Random(seed)
    groups = [rng.randrange(rng.randint(1, 9)) for _ in range(rng.randint(0, 40))]
    max_sets = rng.randint(1, 4)
    ranges = cut_waves(groups, max_sets)
    assert ranges[0][0] == 0 and ranges[-1][1] == len(groups)
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))                        # consecutive, in order
    for k, (lo, hi) in enumerate(ranges):
        assert len(set(groups[lo:hi])) <= max_sets
        if k + 1 < len(ranges):                          # greedy: the next task would be one set too many
            assert len(set(groups[lo:hi + 1])) == max_sets + 1
    with pytest.raises(ValueError, match="max-sets-per-table must be >= 1"):
        cut_waves(groups, 0)


def records(path):
    return [{k: v for k, v in json.loads(x).items() if k != "seconds"} for x in path.read_text().splitlines()]


@pytest.mark.parametrize("cache", ["dir", "none"])
def test_a_run_in_waves_gives_the_records_of_one_wave(files, tmp_path, cache, monkeypatch):  # noqa: F811
    where = tmp_path / "cache" if cache == "dir" else "none"
    assert cli(files, tmp_path / "one.jsonl", cache=where) == 0
    tables = []
    real = waves.run_grammars

    def counting(*a):
        out = real(*a)
        tables.append(out[0])
        return out
    monkeypatch.setattr(waves, "run_grammars", counting)
    assert cli(files, tmp_path / "waves.jsonl", "--max-sets-per-table", "1", cache=where) == 0
    # a wave each time the task's set changes (the run's own tools, two other tool sets, a schema); every wave's
    # table compiled before the first token, the later ones read back from the cache when they run
    rows = [json.loads(x) for x in (files / "tasks.jsonl").read_text().splitlines()]
    sets = [json.dumps([r.get("tools"), r.get("schema")]) for r in rows]
    n = 1 + sum(a != b for a, b in zip(sets, sets[1:]))
    assert n >= 6 and len(tables) == (2 * n - 1 if cache == "dir" else n)
    assert all(len(t.starts) == 1 for t in tables)
    one, cut = records(tmp_path / "one.jsonl"), records(tmp_path / "waves.jsonl")
    assert [r["index"] for r in cut] == list(range(11)) and cut == one
    assert sum(r["call"] is not None for r in one) >= 9


def test_schema_tasks_beside_byte_rule_tool_sets(files, tmp_path):  # noqa: F811
    """--bytes compiles the tool sets by the seed's byte rule; the schema tasks (UTF-8) get a table of their own,
    joined with the tool sets' in one batch: every record is a valid call or value of its own task."""
    assert cli(files, tmp_path / "b.jsonl", "--bytes", cache="none") == 0
    rows = [json.loads(x) for x in (files / "tasks.jsonl").read_text().splitlines()]
    recs = records(tmp_path / "b.jsonl")
    assert [r["index"] for r in recs] == list(range(len(rows)))
    for row, rec in zip(rows, recs):
        assert rec["error"] is None, rec
        if "schema" in row:
            jsonschema.validate(rec["call"], row["schema"])
