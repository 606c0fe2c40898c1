"""The benchmarks' plots (issue 26): each script redraws its PNG from a recorded JSON in benchmarks/results/
(--plot-from), with the series its figure should hold; without matplotlib a script says so in one line; a missing
peer (xgrammar, llguidance, transformers) is skipped with a note instead of a crash.

Nothing here runs a benchmark: the plots read the recorded JSON, the peer checks stop before any compile.
matplotlib is the optional `bench` extra, which CI does not install: the plot tests skip without it.
"""
import importlib
import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _lines(fig) -> int:
    return sum(len(ax.lines) for ax in fig.axes)


def _bars(fig) -> int:
    return sum(len(ax.patches) for ax in fig.axes)


def _ticks(fig) -> int:
    return sum(len(ax.get_xticks()) for ax in fig.axes)


# script, recorded JSON, (what to count on the figure, how many the JSON says there should be)
CASES = [
    ("generate", "generate.json", _lines, lambda d: len({r["mode"] for r in d["generate"]}) + 2),
    ("jump", "jump_cpu.json", _lines,
     lambda d: 2 * len({(r["model"], r["workload"], r["format"], r["jump_forward"]) for r in d["runs"]})),
    ("mixed", "mixed.json", _bars, lambda d: 5 + 3 + 3),
    ("model", "model.json", _lines, lambda d: 2 * len(d["models"])),
    ("mask", "mask.json", _lines, lambda d: len({(r["V"], r["method"]) for r in d["results"]
                                                 if "construct" not in r["method"]
                                                 and "first step" not in r["method"]})),
    ("compile", "compile.json", _bars,
     lambda d: 2 * sum(r["engine"] == "batchmask" for r in d["rows"])
     + len({(r["engine"], r["vocab"], r["registry"]) for r in d["rows"] if (r["vocab"], r["registry"]) in
            {(q["vocab"], q["registry"]) for q in d["rows"] if q["engine"] != "batchmask"}})),
    ("formats", "formats.json", _bars, lambda d: sum(len(r["formats"]) for r in d["runs"])),
    ("hf_processor", "hf_processor.json", _lines,
     lambda d: sum(all(k in r for r in d["results"]) for k in
                   ("generate_ms", "batchmask_ms", "xgrammar_ms", "batchmask_in_processor_ms",
                    "xgrammar_in_processor_ms"))),
    ("ablation", "ablation_default.json", _bars, lambda d: 3 * sum(a in d for a in ("constrained", "free"))),
    ("schema_corpus", "schema_corpus_llama2_s30.json", _ticks,
     lambda d: sum(any(r.get("seconds") for r in recs) + any(r.get("llg", {}).get("seconds") for r in recs)
                   + any(r.get("xgr", {}).get("seconds") for r in recs) for recs in d["records"].values())),
]


@pytest.fixture
def plt():
    pytest.importorskip("matplotlib", reason="matplotlib is the optional bench extra (pip install -e '.[bench]')")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


@pytest.mark.parametrize("script, name, count, expected", CASES, ids=[c[0] for c in CASES])
def test_redraw_from_recorded_json(plt, tmp_path, capsys, monkeypatch, script, name, count, expected):
    mod = importlib.import_module(f"benchmarks.{script}")
    data = json.loads((RESULTS / name).read_text())
    counted = []

    def draw(plt, data):  # the script's own figure, its series counted before write_plot saves and closes it
        fig = mod_draw(plt, data)
        counted.append(count(fig))
        return fig
    mod_draw = mod.draw
    monkeypatch.setattr(mod, "draw", draw)
    out = tmp_path / f"{script}.png"
    assert mod.main(["--plot-from", str(RESULTS / name), "--plot", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"plot written to {out}"
    assert counted == [expected(data)] and counted[0] > 0
    assert out.read_bytes()[:8] == PNG_SIGNATURE
    image = plt.imread(out)
    assert image.ndim == 3 and min(image.shape[:2]) >= 400          # inches x 120 dpi, RGBA
    assert not plt.get_fignums()                                     # write_plot closed its figure


def test_default_plot_path_is_beside_the_json(plt, tmp_path, capsys):
    from benchmarks import formats
    recorded = tmp_path / "formats.json"
    shutil.copy(RESULTS / "formats.json", recorded)
    assert formats.main(["--plot-from", str(recorded)]) == 0
    assert (tmp_path / "formats.png").read_bytes()[:8] == PNG_SIGNATURE
    assert "formats.png" in capsys.readouterr().out


def test_startup_redraws_from_its_json(plt, tmp_path, capsys):
    # no startup JSON is recorded yet: one of the shape benchmarks/startup.py writes
    from benchmarks import startup
    one = {"median_s": 1.0, "min_s": 0.9, "runs": [1.0]}
    result = {"tokenizer": "synthetic", "tokens": 32, "runs": 1, "load_avg": 1.0, "target_s": 3.0, "aim_s": 1.5,
              "rows": dict.fromkeys(("bare interpreter", "import torch", "end to end, cold cache",
                                     "end to end, warm cache"), one),
              "warm_phases": dict.fromkeys(("import torch", "loading", "generating"), one)}
    recorded = tmp_path / "startup.json"
    recorded.write_text(json.dumps(result))
    assert startup.main(["--plot-from", str(recorded)]) == 0
    assert (tmp_path / "startup.png").read_bytes()[:8] == PNG_SIGNATURE
    fig = startup.draw(plt, result)
    try:
        assert _bars(fig) == 4 + 3 and _lines(fig) == 2         # the rows, the phases; the target and the aim
    finally:
        plt.close(fig)
    assert "startup.png" in capsys.readouterr().out


def test_every_recorded_json_has_its_png():
    missing = [p.name for p in RESULTS.glob("*.json") if not p.with_suffix(".png").is_file()]
    assert not missing, f"no PNG beside {missing}: redraw with the script's --plot-from"


def test_without_matplotlib_a_note_and_no_file(monkeypatch, tmp_path):
    from benchmarks.common import PLOT_NOTE, write_plot
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    out = tmp_path / "x.png"
    assert write_plot(lambda plt, data: pytest.fail("drawn without matplotlib"), {}, out) == PLOT_NOTE
    assert not out.exists()
    assert PLOT_NOTE == "matplotlib not installed: no plot (pip install -e '.[bench]')"


def test_compile_skips_a_missing_peer_with_a_note(monkeypatch):
    from benchmarks import compile as bench_compile
    monkeypatch.setitem(sys.modules, "xgrammar", None)
    monkeypatch.setitem(sys.modules, "llguidance", None)
    engines, notes = bench_compile.peers()
    assert engines == []
    assert notes == ["xgrammar not installed: its cases are skipped (pip install xgrammar)",
                     "llguidance not installed: its cases are skipped (pip install llguidance)"]
    assert bench_compile.peers(wanted=False)[0] == []


def test_schema_corpus_skips_a_missing_peer_with_a_note(monkeypatch):
    from benchmarks import schema_corpus
    monkeypatch.setitem(sys.modules, "xgrammar", None)
    assert schema_corpus.xgr_setup(object()) == (None, "xgrammar not installed: its column is skipped "
                                                       "(pip install xgrammar)")


def test_hf_processor_without_transformers_is_skipped_with_a_note(monkeypatch, capsys):
    from benchmarks import hf_processor
    monkeypatch.setitem(sys.modules, "transformers", None)
    assert hf_processor.main([]) == 0
    assert capsys.readouterr().out.strip() == ("transformers not installed: the benchmark is skipped "
                                               "(pip install transformers)")
