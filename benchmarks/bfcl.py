"""BFCL v4 coverage: how many of the Berkeley Function Calling Leaderboard's distinct tool sets load and compile.

    python benchmarks/bfcl.py [--repo GIT_DIR] [--commit REV] [--tokenizer FILE] [--format json]
                              [--limit N] [--json benchmarks/results/bfcl.json]

--repo is a git directory holding github.com/ShishirPatil/gorilla (default: the mirror this project keeps,
read with `git show`; nothing is downloaded). Every BFCL_v4_*.json file under
berkeley-function-call-leaderboard/bfcl_eval/data/ is read as JSON Lines of questions; each question's
function docs are converted as BFCL's OpenAI handlers read them (batchmask.tools.bfcl.question_task), the
distinct tool sets kept (by the canonical JSON of the converted tools), and each loaded
(ToolRegistry.from_obj) and compiled (batchmask.api.compile_grammar) once. Questions that name their
functions by class (multi-turn, memory, web search) are counted apart; the function-doc files they name
(data/multi_turn_func_doc/, JSON Lines of docs) are read each as one tool set, as `--tools FILE` reads them.

A set that fails is a data error of BFCL's (a required name that is no property, an enum none of whose
values has the declared type, ...) or a gap of ours: each is printed in one line, `file:id: reason`.
--limit N compiles the first N distinct sets only (a quick run); loading is still checked for all.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # runnable as a script from anywhere (last: see tests/conftest.py)

from batchmask.models.tokenizer import load_tokenizer  # noqa: E402

from batchmask.api import compile_grammar  # noqa: E402
from batchmask.errors import RegistryError  # noqa: E402
from batchmask.tools.bfcl import function_docs_tools, is_question, question_task  # noqa: E402
from batchmask.tools.registry import ToolRegistry  # noqa: E402
from benchmarks.common import add_plot_options, finish_plot, replot  # noqa: E402

MIRROR = Path("/work/.mirror/ShishirPatil+gorilla/repo")
DATA = "berkeley-function-call-leaderboard/bfcl_eval/data"
# ../shared beside the checkout (a git worktree sits deeper: the nearest ancestor that has one), else vendored
TOKENIZER = next((d / "shared" / "llama2" / "tokenizer.model" for d in ROOT.parents
                  if (d / "shared" / "llama2" / "tokenizer.model").is_file()),
                 ROOT / "tests" / "data" / "llama2" / "tokenizer.model")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", f"--git-dir={repo}", *args], check=True, capture_output=True,
                          text=True).stdout


def data_files(repo: Path, commit: str, folder: str) -> list[str]:
    return [p for p in git(repo, "ls-tree", "--name-only", commit, f"{folder}/").split("\n") if p.endswith(".json")]


def read_sets(repo: Path, commit: str):
    """(rows, sets): per file its counts and the keys of its sets; sets: key -> {tools, where, files}."""
    rows, sets = [], {}

    def add(key: str, tools, where: str, file: str, error: str | None = None):
        s = sets.setdefault(key, {"tools": tools, "where": where, "files": set(), "error": error})
        s["files"].add(file)
        return key

    for path in data_files(repo, commit, DATA):
        name = path.rsplit("/", 1)[1]
        row = {"file": name, "questions": 0, "by_class": 0, "keys": []}
        rows.append(row)
        for n, line in enumerate(git(repo, "show", f"{commit}:{path}").splitlines(), 1):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:            # format_sensitivity: one JSON object of ids, no questions
                row["note"] = "not question lines"
                break
            if not is_question(obj):
                continue
            row["questions"] += 1
            if "function" not in obj:               # multi-turn, memory, web search: functions by class
                row["by_class"] += 1
                continue
            short = f"{name}:{obj.get('id')}"
            try:
                task = question_task(obj, f"{name}:{n}")
            except RegistryError as e:              # a data error met converting: a set of its own
                row["keys"].append(add(f"error:{short}", None, short, name, str(e)))
                continue
            key = json.dumps(task["tools"], ensure_ascii=False, sort_keys=True, separators=(",", ":"))
            row["keys"].append(add(key, task["tools"], short, name))
    for path in data_files(repo, commit, f"{DATA}/multi_turn_func_doc"):
        name = "multi_turn_func_doc/" + path.rsplit("/", 1)[1]
        row = {"file": name, "questions": 0, "by_class": 0, "keys": []}
        rows.append(row)
        raw = git(repo, "show", f"{commit}:{path}")
        try:
            tools = function_docs_tools(None, raw, name)
        except RegistryError as e:
            row["keys"].append(add(f"error:{name}", None, name, name, str(e)))
            continue
        key = json.dumps(tools, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
        row["keys"].append(add(key, tools, name, name))
    return rows, sets


def check(sets: dict, tokenizer, fmt: str, limit: int | None) -> None:
    """Load every set and compile (up to `limit` of) them: each set gets `loaded`, `compiled`, `error`, `ms`."""
    compiled = 0
    for i, s in enumerate(sets.values()):
        s["loaded"] = s["compiled"] = False
        if s["error"] is not None:
            continue
        try:
            reg = ToolRegistry.from_obj(s["tools"], source=s["where"])
            s["loaded"] = True
            if limit is not None and compiled >= limit:
                s["skipped"] = True
                continue
            t0 = time.perf_counter()
            compile_grammar(reg, tokenizer, format=fmt)
            s["ms"] = (time.perf_counter() - t0) * 1000
            s["compiled"] = True
            compiled += 1
        except (RegistryError, ValueError) as e:
            s["error"] = f"{s['where']}: {e}" if s["where"] not in str(e) else str(e)
        if (i + 1) % 100 == 0:
            print(f"  ... {i + 1}/{len(sets)} sets", file=sys.stderr, flush=True)


def table(rows: list, sets: dict) -> dict:
    print(f"{'file':44} {'questions':>9} {'by class':>8} {'sets':>6} {'loaded':>6} {'compiled':>8} {'failed':>6}")
    for row in rows:
        own = [sets[k] for k in dict.fromkeys(row["keys"])]
        row.update(sets=len(own), loaded=sum(s["loaded"] for s in own), compiled=sum(s["compiled"] for s in own),
                   failed=sum(s["error"] is not None for s in own))
        print(f"{row['file']:44} {row['questions']:9} {row['by_class']:8} {row['sets']:6} {row['loaded']:6} "
              f"{row['compiled']:8} {row['failed']:6}" + (f"  ({row['note']})" if "note" in row else ""))
        del row["keys"]
    every = list(sets.values())
    total = {"sets": len(every), "loaded": sum(s["loaded"] for s in every),
             "compiled": sum(s["compiled"] for s in every), "failed": sum(s["error"] is not None for s in every),
             "skipped": sum(bool(s.get("skipped")) for s in every)}
    tried = total["sets"] - total["skipped"]
    total["fraction"] = total["compiled"] / tried if tried else 0.0
    print(f"{'all files (distinct sets)':44} {'':9} {'':8} {total['sets']:6} {total['loaded']:6} "
          f"{total['compiled']:8} {total['failed']:6}")
    print(f"overall: {total['compiled']} of {tried} distinct tool sets load and compile "
          f"({100 * total['fraction']:.2f}%)"
          + (f"; {total['skipped']} loaded, not compiled (--limit)" if total["skipped"] else ""))
    errors = [s["error"] for s in every if s["error"] is not None]
    for e in errors:
        print(f"  failed: {e}")
    ms = sorted(s["ms"] for s in every if "ms" in s)
    if ms:
        total["compile_ms"] = {"median": ms[len(ms) // 2], "max": ms[-1], "sum": sum(ms)}
        print(f"compile ms per set: median {ms[len(ms) // 2]:.0f}, max {ms[-1]:.0f}, total {sum(ms) / 1000:.0f} s")
    total["errors"] = errors
    return total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repo", type=Path, default=MIRROR, help=f"gorilla's git directory (default {MIRROR})")
    ap.add_argument("--commit", default="HEAD")
    ap.add_argument("--tokenizer", type=Path, default=TOKENIZER)
    ap.add_argument("--format", default="json", help="call format (batchmask.tools.envelope; default json)")
    ap.add_argument("--limit", type=int, help="compile only the first N distinct sets")
    ap.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "bfcl.json")
    add_plot_options(ap)
    a = ap.parse_args(argv)
    if a.plot_from:
        return replot(a, draw)
    commit = git(a.repo, "rev-parse", a.commit).strip()
    tokenizer = load_tokenizer(str(a.tokenizer))
    t0 = time.perf_counter()
    rows, sets = read_sets(a.repo, commit)
    print(f"# BFCL v4 at {commit[:12]}; {len(sets)} distinct tool sets; format {a.format}; tokenizer {a.tokenizer}; "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    check(sets, tokenizer, a.format, a.limit)
    total = table(rows, sets)
    wall = time.perf_counter() - t0
    print(f"wall {wall:.0f} s")
    out = {"commit": commit, "format": a.format, "tokenizer": str(a.tokenizer), "limit": a.limit,
           "machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "wall_s": round(wall, 1),
           "files": rows, "total": total}
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(out, indent=1) + "\n")
    finish_plot(a, draw, out, a.json)
    return 0


def draw(plt, data: dict):
    """Per BFCL file, its distinct tool sets: compiled, and failed (errors in the data)."""
    rows = [r for r in data["files"] if r["sets"]]
    names = [r["file"].removeprefix("BFCL_v4_").removesuffix(".json") for r in rows]
    fig, ax = plt.subplots(figsize=(10, 0.35 * len(rows) + 1.5))
    ax.barh(names, [r["compiled"] for r in rows], color="#4c72b0", label="compiled")
    ax.barh(names, [r["failed"] for r in rows], left=[r["compiled"] for r in rows], color="#c44e52",
            label="failed (data errors)")
    t = data["total"]
    ax.set_xlabel("distinct tool sets")
    ax.set_title(f"BFCL v4: {t['compiled']:,} of {t['sets']:,} distinct tool sets compile ({t['fraction']:.1%}); "
                 f"median {t['compile_ms']['median']:.0f} ms")
    ax.invert_yaxis()
    ax.legend(loc="lower right")
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    raise SystemExit(main())
