"""The docs say what the project declares and measured (issue 26): README's table of extras is pyproject.toml's,
the defaults README's command-line example names are the parser's, and docs/json-schema.md's format compile
times are the ones benchmarks/formats.py recorded in benchmarks/results/formats.json (text against the record:
nothing is timed here)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from batchmask.run import cli

tomllib = pytest.importorskip("tomllib")          # Python 3.11+ reads pyproject.toml itself

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _names(requirements: list[str]) -> set[str]:
    """Distribution names of requirement strings, as README writes them: a Linux-only one as 'NAME (Linux)'."""
    out = set()
    for req in requirements:
        name = re.match(r"[A-Za-z0-9_.-]+", req).group().lower()
        out.add(f"{name} (linux)" if "sys_platform == 'linux'" in req else name)
    return out


def readme_extras() -> dict[str, set[str]]:
    """README's table of extras: extra ('' for the base requirements) -> the packages its row lists."""
    rows = {}
    for line in README.splitlines():
        m = re.match(r"^\| (\(none\)|`(\w+)`) \| ([^|]+) \|", line)
        if m:
            rows[m.group(2) or ""] = {p.strip().lower() for p in m.group(3).split(",")}
    return rows


def test_readme_lists_every_extra_with_exactly_its_packages():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {"": _names(project["dependencies"])}
    declared |= {extra: _names(reqs) for extra, reqs in project["optional-dependencies"].items()}
    assert readme_extras() == declared
    assert "triton (linux)" not in declared[""] and "triton (linux)" in declared["test"]


def test_the_extras_reader_is_not_blind():
    assert _names(["jsonschema[format-nongpl]>=4.20", "triton>=3.0; sys_platform == 'linux'"]) == {
        "jsonschema", "triton (linux)"}
    assert readme_extras()[""] >= {"torch", "tokenizers", "safetensors", "jinja2"}


def test_readmes_command_line_defaults_are_the_parsers():
    (line,) = [x for x in README.splitlines() if x.startswith("# are examples (defaults:")]
    named = dict(re.findall(r"(--[\w-]+) (\S+?)[,;)]", line.split("defaults:")[1]))
    assert set(named) == {"--batch-size", "--max-new-tokens", "--temperature"}
    generate = cli.build_parser().parse_args(["generate", "--tasks", "t"])
    assert int(named["--batch-size"]) == generate.batch_size
    assert float(named["--temperature"]) == generate.temperature
    assert generate.max_new_tokens is None and int(named["--max-new-tokens"]) == cli.DEFAULT_MAX_NEW_TOKENS


def test_format_compile_times_in_the_docs_are_the_recorded_ones():
    record = json.loads((ROOT / "benchmarks" / "results" / "formats.json").read_text())
    (llama2,) = [r for r in record["runs"] if r["tokenizer"] == "tests/data/llama2/tokenizer.model"]
    doc = re.sub(r"\s+", " ", (ROOT / "docs" / "json-schema.md").read_text(encoding="utf-8"))
    quoted = {fmt: int(ms) for ms, fmt in re.findall(r"(\d+) ms \((hostname|email|uri)\)", doc)}
    quoted |= {fmt: int(ms) for ms, fmt in re.findall(r"(\d+) ms for `(date)`", doc)}
    assert set(quoted) == {"hostname", "email", "uri", "date"}
    assert quoted == {fmt: llama2["formats"][fmt]["ms"] for fmt in quoted}
    assert f"on a loaded {record['cpus']}-core machine" in doc and record["repeats"] == 1
