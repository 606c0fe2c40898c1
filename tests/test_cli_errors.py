"""Bad input a new user gives the CLI and the converter: one clear line, exit 2, no file touched (QA findings)."""
from __future__ import annotations

import ast
import io
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from batchmask.models.checkpoint import ModelConfig, random_weights, write_checkpoint
from batchmask.models.export import main as export_main
from batchmask.models.tokenizer import load_tokenizer
from data_paths import data_dir
from hypothesis import given, settings
from hypothesis import strategies as st

from batchmask import compile_json_schema
from batchmask.run import cli
from batchmask.run.cli import main
from batchmask.schema.base import ITEMS_CEILING, LENGTH_CEILING
from batchmask.schema.build import SchemaError, SchemaOptions

ROOT = Path(__file__).resolve().parents[1]


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


@pytest.fixture
def one_task(tmp_path) -> Path:
    p = tmp_path / "tasks.txt"
    p.write_text("what is 2+2\n")
    return p


# --- the CLI ------------------------------------------------------------------------------------
def test_missing_checkpoint_is_named(one_task, capsys):
    # it used to say "no --tokenizer given and no tokenizer.model/.bin beside nope.bin"
    assert main(["generate", "--tasks", str(one_task), "--checkpoint", str(one_task.parent / "nope.bin")]) == 2
    assert "checkpoint not found" in _one_error_line(capsys)


@pytest.mark.parametrize("device", ["tpu", "meta"])
def test_unknown_device(one_task, capsys, device):
    assert main(["generate", "--tasks", str(one_task), "--device", device, "--quiet"]) == 2
    assert f"--device {device}: expected" in _one_error_line(capsys)


def test_tokenizer_json_as_checkpoint(tmp_path, one_task, capsys):
    tj = tmp_path / "tok" / "tokenizer.json"
    tj.parent.mkdir()
    shutil.copy(data_dir("gpt2") / "tokenizer.json", tj)
    assert main(["generate", "--tasks", str(one_task), "--checkpoint", str(tj), "--quiet"]) == 2
    line = _one_error_line(capsys)
    assert str(tj) in line and "--tokenizer" in line            # not "config.json: found nothing at this path"
    other = tmp_path / "tok" / "notes.json"
    other.write_text('{"a": 1}')
    assert main(["generate", "--tasks", str(one_task), "--checkpoint", str(other), "--quiet"]) == 2
    assert "no config.json beside it" in _one_error_line(capsys)


def test_a_json_document_is_not_a_tasks_file(tmp_path, capsys):
    tools = tmp_path / "tools.json"                              # a pretty-printed tools file given as --tasks
    shutil.copy(data_dir("tools") / "agent_tools.json", tools)
    assert main(["generate", "--tasks", str(tools), "--quiet"]) == 2
    assert "one JSON object" in _one_error_line(capsys)
    arr = tmp_path / "tasks.json"
    arr.write_text('["read a.txt", "add 1 and 2"]\n')
    assert main(["generate", "--tasks", str(arr), "--quiet"]) == 2
    assert "one JSON array" in _one_error_line(capsys)
    from batchmask.run.runfiles import read_tasks
    assert read_tasks(str(arr), "text").tasks == ['["read a.txt", "add 1 and 2"]']   # forcing text still reads it


def test_broken_pipe_is_quiet(monkeypatch, capsys):
    def gone(args):
        raise BrokenPipeError(32, "Broken pipe")
    monkeypatch.setattr(cli, "cmd_generate", gone)   # `batchmask generate ... | head`: the reader left early
    assert main(["generate", "--tasks", "x"]) == 141
    assert capsys.readouterr().err == ""


def test_memory_error_is_one_line(monkeypatch, capsys):
    def huge(args):
        raise MemoryError
    monkeypatch.setattr(cli, "cmd_compile", huge)
    assert main(["compile"]) == 2
    assert "out of memory" in _one_error_line(capsys)


# --- the converter ------------------------------------------------------------------------------
@pytest.fixture
def small_checkpoint(tmp_path) -> Path:
    config = ModelConfig(dim=16, hidden_dim=32, n_layers=1, n_heads=2, n_kv_heads=2, vocab_size=300, seq_len=32)
    p = tmp_path / "m.bin"
    write_checkpoint(p, config, random_weights(config, seed=0))
    return p


def test_export_onto_itself_is_refused(small_checkpoint, capsys):
    before = small_checkpoint.read_bytes()
    assert export_main([str(small_checkpoint), str(small_checkpoint), "--version", "1"]) == 2
    assert "is the input checkpoint" in capsys.readouterr().err
    assert small_checkpoint.read_bytes() == before


def test_export_into_a_directory_leaves_nothing(small_checkpoint, tmp_path, capsys):
    d = tmp_path / "out"
    d.mkdir()
    assert export_main([str(small_checkpoint), str(d), "--version", "1"]) == 2
    assert "a directory" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.tmp")) and list(d.iterdir()) == []


# --- schema bounds too large to hold ------------------------------------------------------------
@pytest.fixture(scope="module")
def default_tok():
    return load_tokenizer(cli.DEFAULT_DIR / "tokenizer.model")


def _same_grammar(a, b) -> bool:
    return (a.num_states, a.num_rows, a.num_classes) == (b.num_states, b.num_rows, b.num_classes) \
        and bool((a.row_next == b.row_next).all()) and bool((a.token_class == b.token_class).all())


def test_huge_max_length_is_lowered_to_the_ceiling(default_tok):
    # maxLength 10^8 used to exhaust memory (a string of every length up to it); every string the ceiling
    # allows is still valid, so the grammar is the ceiling's
    huge = compile_json_schema({"type": "string", "maxLength": 10 ** 8}, default_tok)
    capped = compile_json_schema({"type": "string", "maxLength": LENGTH_CEILING}, default_tok)
    assert _same_grammar(huge, capped)
    with pytest.raises(SchemaError, match=r"#/minLength: minLength 100000 is above the supported maximum"):
        compile_json_schema({"type": "string", "minLength": 100000}, default_tok)


def test_huge_max_items_and_repeats(default_tok):
    item = {"type": "integer", "minimum": 0, "maximum": 9}
    huge = compile_json_schema({"type": "array", "items": item, "maxItems": 10 ** 8}, default_tok)
    capped = compile_json_schema({"type": "array", "items": item, "maxItems": ITEMS_CEILING}, default_tok)
    assert _same_grammar(huge, capped)
    with pytest.raises(SchemaError, match=r"#/minItems: minItems 2000 is above"):
        compile_json_schema({"type": "array", "items": item, "minItems": 2000}, default_tok)
    rep = compile_json_schema({"type": "string", "pattern": "^a{0,100000000}$"}, default_tok)
    assert _same_grammar(rep, compile_json_schema({"type": "string", "pattern": f"^a{{0,{LENGTH_CEILING}}}$"},
                                                  default_tok))
    with pytest.raises(SchemaError, match=r"at least 100000 characters"):
        compile_json_schema({"type": "string", "pattern": "^a{100000}$"}, default_tok)
    with pytest.raises(SchemaError, match=r"must start a quantifier"):   # int('²') raised a bare ValueError
        compile_json_schema({"type": "string", "pattern": "^a{²}$"}, default_tok,
                            options=SchemaOptions(mode="strict"))
    assert compile_json_schema({"type": "string", "pattern": "^a{²}$"}, default_tok).relaxations[0]["keyword"] == \
        "pattern"                                        # lenient: any string, said


# --- tokenizer.json ids far past its tokens -----------------------------------------------------
def test_stray_added_token_id_is_refused(tmp_path, capsys):
    import json
    spec = json.loads((data_dir("gpt2") / "tokenizer.json").read_text(encoding="utf-8"))
    stray = dict(spec["added_tokens"][0], id=10 ** 8, content="<stray>")
    spec["added_tokens"].append(stray)       # every per-token table would have had 10^8 entries (out of memory)
    p = tmp_path / "tokenizer.json"
    p.write_text(json.dumps(spec), encoding="utf-8")
    assert main(["compile", "--tokenizer", str(p)]) == 2
    line = _one_error_line(capsys)
    assert str(p) in line and "ids run to 100000000" in line


# --- config.json fields named in config.json's words --------------------------------------------
def _llama_config(**changes) -> dict:
    from transformers import LlamaConfig
    cfg = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64).to_dict()
    cfg["architectures"] = ["LlamaForCausalLM"]
    cfg.update(changes)
    return {k: v for k, v in cfg.items() if v is not ...}


@pytest.mark.parametrize("changes, field, words", [
    ({"head_dim": 7}, "head_dim", "head_dim to be even"),                 # it blamed hidden_size
    ({"architectures": ..., "model_type": "gpt_neox"}, "architectures", "no such field (and model_type 'gpt_neox'"),
    ({"vocab_size": ...}, "vocab_size", "expected an integer (the field is required)"),
])
def test_hf_config_fields_are_named(changes, field, words):
    from batchmask.models.config import CheckpointError
    from batchmask.models.hf_config import parse_hf_config
    with pytest.raises(CheckpointError) as e:
        parse_hf_config(_llama_config(**changes), "m/config.json", 64)
    assert e.value.field == field and words in str(e.value)


# --- output paths of compile and ablate, checked before any work ---------------------------------
def test_compile_out_never_overwrites_its_inputs(tmp_path, capsys):
    tools = tmp_path / "tools.json"
    tools.write_text('{"tools": [{"name": "f", "description": "d", "args": [{"name": "a", "type": "string"}]}]}')
    tok = tmp_path / "tokenizer.model"
    shutil.copy(cli.DEFAULT_DIR / "tokenizer.model", tok)
    before = {p: p.read_bytes() for p in (tools, tok)}
    for out, flag in ((tools, "--tools"), (tok, "--tokenizer")):      # both were replaced by the grammar file
        assert main(["compile", "--tools", str(tools), "--tokenizer", str(tok), "--out", str(out)]) == 2
        assert f"is the {flag} file" in _one_error_line(capsys)
    assert {p: p.read_bytes() for p in before} == before
    assert main(["compile", "--out", str(tmp_path / "no" / "g.pt")]) == 2
    assert "does not exist" in _one_error_line(capsys)


def test_ablate_json_checked_before_the_run(tmp_path, capsys, monkeypatch):
    import batchmask.evaluation.ablation
    monkeypatch.setattr(batchmask.evaluation.ablation, "run_ablation", None)     # the run must not start
    assert main(["ablate", "--n", "2", "--json", str(tmp_path)]) == 2
    assert "--json" in _one_error_line(capsys)


# --- tools files ----------------------------------------------------------------------------------
def test_tools_file_with_bom_and_deep_nesting(tmp_path, capsys):
    from batchmask.tools.registry import RegistryError, ToolRegistry
    plain = (ROOT / "examples" / "tools.json").read_text(encoding="utf-8")
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + plain.encode("utf-8"))        # as the task files, a BOM is skipped
    assert ToolRegistry.from_json(bom).names == ToolRegistry.from_json(ROOT / "examples" / "tools.json").names
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100000 + "]" * 100000)                    # RecursionError, without the file's name
    with pytest.raises(RegistryError, match=r"deep\.json: JSON nested too deeply"):
        ToolRegistry.from_json(deep)


def test_out_is_never_another_runs_own_file(tmp_path, one_task, capsys):
    out = tmp_path / "calls.jsonl"
    out.write_text("")
    run = tmp_path / "calls.jsonl.run.json"
    run.write_text('{"format": 1}')
    for side in (run, tmp_path / "calls.jsonl.lock"):     # --force overwrote calls.jsonl's settings with results
        assert main(["generate", "--tasks", str(one_task), "--out", str(side), "--force", "--quiet"]) == 2
        assert "of the run that wrote" in _one_error_line(capsys)
    assert run.read_text() == '{"format": 1}' and not (tmp_path / "calls.jsonl.lock").exists()


# --- text printed to a terminal: control characters escaped ---------------------------------------
def _no_controls(text: str) -> bool:
    """No character a terminal would act on (Unicode category Cc, or the line/paragraph separators)."""
    import unicodedata
    return all(c == "\n" or (unicodedata.category(c) != "Cc" and c not in "\u2028\u2029") for c in text)


@given(st.text(st.characters(blacklist_characters='\\"'), max_size=40))
@settings(max_examples=200, deadline=None)
def test_printable_is_what_python_reads_back(text):
    from batchmask.text import printable
    shown = printable(text)
    assert _no_controls(shown.replace("\n", "")) and "\n" not in shown
    assert ast.literal_eval('"' + shown + '"') == text        # Python's own reading of the escapes: lossless


def test_show_call_and_ablation_samples_escape_control_bytes():
    from types import SimpleNamespace

    from batchmask.evaluation.ablation import AblationReport, ArmResult
    from batchmask.run.display import show_call
    tok = SimpleNamespace(token_bytes=[b"\x00", b"\x1b[2J", b"ok\r", b"</s>"], eos_id=3, stop_ids=(3,))
    res = SimpleNamespace(token_ids=[0, 1, 2, 3], legal_counts=[1, 5, 200, 1], task="clear\x1b[H\x07 it",
                          call=None, error="bad \x00 byte", cut=False)
    out = io.StringIO()
    show_call(res, tok, stream=out)
    text = out.getvalue()
    assert _no_controls(text) and r"\x00[1] \x1b[2J[5] ok\r[200] <eos>[1]" in text and r"clear\x1b[H\x07" in text
    arm = ArmResult(trials=1, samples=[("t", 'out\x1b]0;title\x07 \x9b31m')])
    assert _no_controls(AblationReport({"constrained": arm, "free": arm}).table())


def test_compile_prints_names_escaped(tmp_path, capsys):
    tools = tmp_path / "tools.json"          # DEL and U+009B (CSI on some terminals) are legal in a name
    tools.write_text(json.dumps({"tools": [{"name": "f\x7f\x9b2J", "args": [{"name": "a"}]}]}))
    assert main(["compile", "--tools", str(tools)]) == 0
    out = capsys.readouterr().out
    assert _no_controls(out) and r"f\x7f\x9b2J" in out


def test_tools_flag_given_json_text_is_one_short_line(capsys):
    text = (data_dir("tools") / "agent_tools.json").read_text()       # pasted where the path belongs
    assert main(["compile", "--tools", text]) == 2
    line = _one_error_line(capsys)
    assert "--tools takes the path of a tools file" in line and len(line) < 200, line
    assert main(["compile", "--tools", str(data_dir("tools") / "nope.json")]) == 2
    assert _one_error_line(capsys) == f"batchmask: error: tools file not found: {data_dir('tools') / 'nope.json'}"


# --- compile --out: never into a model directory, never over a file of another kind ---------------
def _compile(out, *extra) -> int:
    return main(["compile", "--out", str(out), *extra])


def test_compile_out_refuses_files_that_are_not_grammar_caches(tmp_path, capsys):
    import zipfile

    import torch
    from safetensors.torch import save_file
    src = tmp_path / "src"
    src.mkdir()
    data = {"vocab.json": (data_dir("gpt2") / "tokenizer.json").read_bytes(), "tasks.txt": b"what is 2+2\n",
            "empty.pt": b""}
    for name, raw in data.items():
        (src / name).write_bytes(raw)
    save_file({"w": torch.zeros(2, 2)}, str(src / "weights.st"))            # safetensors under another name
    torch.save({"w": torch.zeros(2)}, src / "weights.pt")                    # a torch zip, but not ours
    with zipfile.ZipFile(src / "other.zip", "w") as z:
        z.writestr("a.txt", "hello")
    before = {}
    for k, name in enumerate(sorted(p.name for p in src.iterdir())):
        target = tmp_path / f"out{k}" / name                               # each alone in a plain folder
        target.parent.mkdir()
        target.write_bytes((src / name).read_bytes())
        before[target] = target.read_bytes()
        assert _compile(target) == 2, name
        line = _one_error_line(capsys)
        assert "exists and is not a batchmask grammar cache" in line and "weights_only" not in line, line
    assert {p: p.read_bytes() for p in before} == before
    cache = tmp_path / "g.pt"                                                # a grammar cache is replaced
    assert _compile(cache) == 0 and _compile(cache, "--max-string", "32") == 0
    from batchmask import CompiledGrammar
    assert CompiledGrammar.load(cache).meta["key"]["max_string"] == 32


def test_compile_out_refuses_tokenizer_and_model_directories(tmp_path, capsys):
    tok_dir = tmp_path / "tok"
    tok_dir.mkdir()
    shutil.copy(cli.DEFAULT_DIR / "tokenizer.model", tok_dir / "tokenizer.model")
    assert _compile(tok_dir / "g.pt", "--tokenizer", str(tok_dir / "tokenizer.model")) == 2
    assert "inside the --tokenizer's directory" in _one_error_line(capsys)
    hf = tmp_path / "hf"                                 # a HF model directory, whatever the tokenizer
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / "model.safetensors").write_bytes(b"")
    assert _compile(hf / "g.pt") == 2
    assert "inside a tokenizer/model directory (it holds model.safetensors)" in _one_error_line(capsys)
    assert sorted(p.name for p in hf.iterdir()) == ["config.json", "model.safetensors"]
    assert not (tok_dir / "g.pt").exists()


# --- --grammar FILE: what it is, and which flag it was built for ------------------------------------
@pytest.fixture(scope="module")
def seed_cache(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("grammar") / "g.pt"
    assert main(["compile", "--out", str(out)]) == 0                # the embedded model's tokenizer
    return out


@pytest.mark.parametrize("extra,words", [
    (["--format", "json"], "compiled for another --format: the file's is 'seed', this run's 'json'"),
    (["--max-string", "64"], "compiled for another --max-string: the file's is 256, this run's 64"),
    (["--bytes"], "compiled without --bytes, this run has --bytes"),
    (["--tools", str(data_dir("tools") / "agent_tools.json")], "compiled for other tools (--tools): the file's are "
     "answer, calc, read_file, list_dir, write_file, this run's answer, get_weather"),
])
def test_grammar_built_for_other_flags_names_the_flag_before_the_model_loads(seed_cache, one_task, capsys,
                                                                             monkeypatch, extra, words):
    def no_model(*a, **k):
        raise AssertionError("the model must not load")
    monkeypatch.setattr(cli, "load_model_and_tokenizer", no_model)
    assert main(["generate", "--tasks", str(one_task), "--grammar", str(seed_cache), "--quiet", *extra]) == 2
    line = _one_error_line(capsys)
    assert words in line and len(line) < 300, line


def test_grammar_for_another_tokenizer_names_the_flag(tmp_path, one_task, capsys):
    other = tmp_path / "g32k.pt"
    assert main(["compile", "--tokenizer", str(data_dir("llama2") / "tokenizer.model"), "--out", str(other)]) == 0
    capsys.readouterr()
    argv = ["generate", "--tasks", str(one_task), "--grammar", str(other), "--quiet", "--grammar-cache", "none",
            "--max-new-tokens", "2"]
    assert main(argv) == 2
    line = _one_error_line(capsys)
    assert "compiled for another tokenizer (--tokenizer): the file's has 32000 tokens" in line, line


def test_grammar_that_is_not_a_cache_file_is_one_line_without_torch_words(tmp_path, one_task, capsys):
    import warnings
    import zipfile

    import torch
    files = {"tasks.txt": b"what is 2+2\n", "tools.json": b'{"tools": []}', "noise.bin": bytes(range(256)) * 4}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    with zipfile.ZipFile(tmp_path / "a.zip", "w") as z:
        z.writestr("x", "y")
    torch.save({"meta": {"format": "something else"}}, tmp_path / "foreign.pt")
    torch.save({"meta": {"format": "batchmask-grammar/1"}}, tmp_path / "old.pt")
    for name in [*files, "a.zip", "foreign.pt", "old.pt"]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert main(["generate", "--tasks", str(one_task), "--grammar", str(tmp_path / name), "--quiet"]) == 2
        line = _one_error_line(capsys)
        assert not caught and not any(w in line.lower() for w in ("pickle", "weights_only", "torch.load")), line
        assert (("another batchmask version" in line) if name == "old.pt" else
                ("not a batchmask grammar cache" in line)), line


# --- ablate --format / --system, as generate's ---------------------------------------------------
def test_ablate_system_without_a_template_is_refused_before_any_compile(capsys, monkeypatch):
    import batchmask.evaluation.ablation
    def no_compile(*a, **k):
        raise AssertionError("nothing may compile")
    monkeypatch.setattr(batchmask.evaluation.ablation, "compile_grammar", no_compile)
    assert main(["ablate", "--n", "2", "--system", "be brief"]) == 2
    assert "--system needs a chat template" in _one_error_line(capsys)


@pytest.mark.parametrize("fmt", ["json", "llama3"])
def test_ablate_format_judges_calls_in_that_format(fmt, tmp_path, capsys):
    from batchmask.evaluation.ablation import _judge
    from batchmask.evaluation.taskgen import judge, make_examples
    from batchmask.tools.envelope import get_envelope
    from batchmask.tools.registry import ToolRegistry
    reg, env = ToolRegistry.defaults(), get_envelope(fmt)
    for ex in make_examples(6, seed=1, split="eval"):           # the same verdict as the seed text of that call
        body = json.dumps({env.name_key: ex.tool, env.args_key: ex.args})
        seed = json.dumps({"tool": ex.tool, "args": ex.args}, separators=(",", ":"))
        assert _judge(ex, env.prefix + body + env.suffix, reg, fmt) == judge(ex, seed, reg)
        assert not _judge(ex, seed, reg, fmt)["parsed"]          # a seed call is no call in another format
    out = tmp_path / "a.json"
    assert main(["ablate", "--n", "2", "--format", fmt, "--max-new-tokens", "60", "--max-string", "16",
                 "--json", str(out)]) == 0
    capsys.readouterr()
    assert json.loads(out.read_text())["constrained"]["parsed"] == 2       # the grammar writes `fmt` calls


# --- Ctrl-C during start-up (the console script) ---------------------------------------------------
def _child(code: str, tmp_path) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter with SIGINT at its default (a shell's background job would ignore it)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def test_console_script_entry_installs_the_handler_before_importing_the_cli(tmp_path):
    import tomllib
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["batchmask"] == "batchmask.console:main"
    # what pip's script does first (`from batchmask.console import main`), then a Ctrl-C while the CLI and its
    # modules are still being imported: it used to be a KeyboardInterrupt traceback from inside that import
    proc = _child("import os, signal, sys\nfrom batchmask.console import main\n"
                  "assert 'batchmask.run.cli' not in sys.modules and 'torch' not in sys.modules\n"
                  "os.kill(os.getpid(), signal.SIGINT)\nimport batchmask.run.cli, torch\nprint('not interrupted')\n",
                  tmp_path)
    assert (proc.returncode, proc.stderr, proc.stdout) == (130, "batchmask: interrupted\n", "")


@pytest.mark.parametrize("sig, status, word", [("SIGINT", 130, "interrupted"), ("SIGTERM", 143, "terminated")])
def test_console_script_stop_during_model_load_is_one_line(tmp_path, sig, status, word):
    (tmp_path / "t.txt").write_text("what is 2+2\n")
    proc = _child(f"import os, signal, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_DFL)\n"
                  f"from batchmask.console import main\nimport batchmask.run.cli as cli\n"
                  f"def load(*a, **k):\n    os.kill(os.getpid(), signal.{sig})\n    time.sleep(30)\n"
                  "cli.load_model_and_tokenizer = load\n"
                  "sys.argv = ['batchmask', 'generate', '--tasks', 't.txt', '--out', 'o.jsonl', '--quiet']\n"
                  "sys.exit(main())\n", tmp_path)
    assert (proc.returncode, proc.stderr) == (status, f"batchmask: {word}\n")
    assert not (tmp_path / "o.jsonl.lock").exists()                   # the held lock is let go
