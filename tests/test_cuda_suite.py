"""
The GPU suite's CPU rehearsal: `benchmarks/cuda_suite.py --smoke` runs every section at tiny sizes (Triton
interpreted) and must produce a complete JSON report with no failed section, so that the rare GPU session
cannot be lost to a mistake a CPU would have caught. Also the suite's tokenizer fallback, and the
synthetic vocabulary against a plain reading of what it promises.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest
from data_paths import data_dir

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ["bandwidth", "compile", "correctness", "kernels", "generation", "jump", "hf_model", "hf_processor"]

pytest.importorskip("triton")


@pytest.fixture(scope="module")
def smoke_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("suite") / "smoke.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cuda_suite.py"), "--smoke", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"suite exited {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return json.loads(out.read_text()), proc.stdout


def test_smoke_has_every_section_and_no_errors(smoke_report):
    report, stdout = smoke_report
    assert report["meta"]["smoke"] is True
    assert list(report["sections"]) == SECTIONS
    for name, sec in report["sections"].items():
        assert "error" not in sec, f"{name} failed:\n{sec['error']}"
    assert "SUMMARY" in stdout and stdout.rstrip().splitlines()[-1].startswith("# wrote")


def test_smoke_figures_are_complete(smoke_report):
    report, _ = smoke_report
    s = report["sections"]
    assert s["bandwidth"]["gbs"] > 0
    assert s["correctness"]["ok"] and len(s["correctness"]["checked"]) >= 3 * 2
    # every kernel step at every size of the plan, each with a positive time and a GB/s figure
    steps = {(k["B"], k["V"], k["step"]) for k in s["kernels"]["results"]}
    assert len(steps) == len(s["kernels"]["results"]) >= 3
    assert all(k["median_ms"] > 0 and k["gbs"] > 0 for k in s["kernels"]["results"])
    gen = s["generation"]
    assert not gen["skipped"]
    modes = {(r["B"], r["graphs"], r["mode"]) for r in gen["runs"]}
    assert {(g, m) for _, g, m in modes} == {(False, "constrained"), (False, "free"), (True, "constrained"),
                                             (True, "free")}
    for r in gen["runs"]:
        assert r["tokens"] > 0 and r["tasks"] == r["lengths"]["n"]
        if r["mode"] == "constrained":  # whatever the random model does, the grammar makes every call valid
            assert r["valid_calls"] == 1.0
    assert {l["graphs"] for l in gen["loop"]} == {False, True}
    jump = s["jump"]    # both arms for both models; the scripted model writes valid calls, in fewer steps with jump
    assert {(r["model"], r["jump_forward"]) for r in jump["runs"]} == {(m, j) for m in ("random", "scripted")
                                                                      for j in (False, True)}
    for r in jump["runs"]:
        assert r["row_steps"] <= r["tokens"] and (r["jump_forward"] or r["row_steps"] == r["tokens"])
        if r["model"] == "scripted":
            assert r["valid_calls"] == 1.0 and (not r["jump_forward"] or r["tokens_per_step"] > 1.0)
    hf = s["hf_model"]  # the HF-directory model: loaded, checked against eager, timed at every batch size
    assert not hf["skipped"] and hf["graph_vs_eager_rel"] < 2e-2 and hf["load_s"] > 0
    assert [r["B"] for r in hf["runs"]] == [2] and all(r["tokens_per_s"] > 0 for r in hf["runs"])
    proc = s["hf_processor"]  # model.generate with batchmask's logits processor, next to generate without it
    assert [r["B"] for r in proc["runs"]] == [2]
    assert all(r["generate_ms"] > 0 and r["batchmask_ms"] > 0 and r["in_processor_ms"] > 0 for r in proc["runs"])


def test_tokenizer_falls_back_to_a_synthetic_vocabulary(tmp_path):
    from benchmarks import common
    missing = tmp_path / "no_such_tokenizer.model"
    real = common.TOKENIZER
    try:
        common.TOKENIZER = tmp_path / "also_missing.model"
        tok, note = common.find_tokenizer(missing, vocab_size=400)
    finally:
        common.TOKENIZER = real
    assert tok.vocab_size == 400
    assert "SYNTHETIC" in note and str(missing) in note


def test_tokenizer_found_at_the_given_path():
    from benchmarks import generate
    path = data_dir("llama2") / "tokenizer.model"
    if not path.exists():
        pytest.skip("no Llama 2 tokenizer beside the checkout")
    tok, note = generate.find_tokenizer(path)
    spm = pytest.importorskip("sentencepiece").SentencePieceProcessor(model_file=str(path))
    assert tok.vocab_size == spm.vocab_size() and str(path) in note
    text = "read the file notes.txt"
    assert tok.encode(text, bos=False) == spm.encode(text)


def test_synthetic_vocabulary_is_complete_and_keeps_prompts_short():
    from batchmask.tools.prompt import render_prompt
    from batchmask.tools.registry import ToolRegistry
    from benchmarks.common import make_tasks, synthetic_tokenizer
    tok = synthetic_tokenizer(32000)
    assert tok.vocab_size == 32000 and len(set(tok.pieces)) == 32000
    registry = ToolRegistry.defaults()
    for task in make_tasks(20, seed=5):
        prompt = render_prompt(registry, task)
        ids = tok.encode(prompt)
        assert tok.decode(ids) == prompt  # lossless (byte fallback covers anything the pieces miss)
        # whole words are pieces, so a prompt takes far fewer tokens than characters (the model has 256)
        assert len(ids) < len(prompt) / 3


def test_a_kernel_mismatch_stops_the_run(tmp_path):
    """A Triton kernel that disagrees with torch stops the suite before any timing, naming the mismatch."""
    out = tmp_path / "broken.json"
    script = f"""
import sys
sys.argv = ["cuda_suite.py", "--smoke", {str(out)!r}]
sys.path.append({str(ROOT)!r})
from benchmarks import cuda_suite
from batchmask.kernels import mask_triton
real = mask_triton.sample_
def off_by_one(*args, **kwargs):  # greedy picks the right token, then reports its neighbour
    tokens, counts = real(*args, **kwargs)
    return tokens + 1, counts
cuda_suite.mask_triton.sample_ = off_by_one
cuda_suite.main()
"""
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "STOPPED: correctness failed" in proc.stdout
    report = json.loads(out.read_text())
    assert "tokens differ" in report["sections"]["correctness"]["error"]
    assert "kernels" not in report["sections"] and "generation" not in report["sections"]
