"""The command line's help and output (issue 26): --version from the package metadata, every flag with help text
and its true default in --help, choices checked by argparse, one error prefix on every path, an illegal token in
a whole batch as one line with its count, and a warning when --system meets a task's own system message."""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from data_paths import GPT2

import batchmask
from batchmask.masker import BatchMasker, IllegalTokenError
from batchmask.run import cli
from batchmask.run.cli_format import Parser

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "examples" / "tasks.txt"


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """prog -> parser, the top one and every subcommand's."""
    out = {parser.prog: parser}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out.update(_subparsers(sub))
    return out


def _help_blocks(parser: argparse.ArgumentParser) -> dict[str, str]:
    """option string -> the text --help prints for it (its invocation and help, wrapped lines joined)."""
    blocks, current = {}, None
    for line in parser.format_help().splitlines():
        m = re.match(r"^  (-[^ ]+)", line)
        if m:
            current = m.group(1).rstrip(",")
            blocks[current] = line
        elif current is not None and line.startswith("    "):
            blocks[current] += " " + line.strip()
        else:
            current = None
    return {k: re.sub(r"\s+", " ", v).strip() for k, v in blocks.items()}


def help_problems(parser: argparse.ArgumentParser) -> list[str]:
    """Flags without help text, and flags whose --help does not show their actual default after 'default'."""
    problems = []
    for prog, p in _subparsers(parser).items():
        blocks = _help_blocks(p)
        for action in p._actions:
            if not action.option_strings or isinstance(action, argparse._HelpAction):
                continue
            name = f"{prog} {action.option_strings[-1]}"
            if not action.help or action.help == argparse.SUPPRESS:
                problems.append(f"{name}: no help text")
                continue
            d = action.default
            if d is None or d is False or d == argparse.SUPPRESS:
                continue
            block = blocks.get(action.option_strings[0], "")
            if not re.search(rf"default:? {re.escape(str(d))}(?![\w.])", block):
                problems.append(f"{name}: default {d!r} not shown in {block!r}")
    return problems


@pytest.fixture(autouse=True)
def _wide_help(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")


# --- --help ---------------------------------------------------------------------------------------------
def test_every_flag_of_every_command_has_help_with_its_real_default():
    parser = cli.build_parser()
    subs = _subparsers(parser)
    assert {"batchmask generate", "batchmask ablate", "batchmask compile", "batchmask check-kernels"} <= set(subs)
    assert help_problems(parser) == []
    # the defaults the help shows are the ones a run gets (ablate's --batch-size is 30, not generate's 16)
    gen, abl = _help_blocks(subs["batchmask generate"]), _help_blocks(subs["batchmask ablate"])
    assert "default 16" in gen["--batch-size"] and "default 30" in abl["--batch-size"]
    assert subs["batchmask ablate"].parse_args([]).batch_size == 30
    for flag, value in (("--seed", "0"), ("--top-p", "1.0"), ("--temperature", "0.0"), ("--format", "seed")):
        assert f"(default: {value})" in gen[flag], gen[flag]
        assert str(getattr(subs["batchmask generate"].parse_args(["--tasks", "t"]), flag[2:].replace("-", "_"))) \
            == value


def test_the_help_checker_is_not_blind():
    p = Parser(prog="x")
    p.add_argument("--quiet", action="store_true")                       # no help
    p.add_argument("--n", type=int, default=5, help="count (default 3)")  # says the wrong default
    p.add_argument("--m", type=int, default=7, help="count")             # the formatter adds the default
    p.add_argument("--k", type=float, default=1.0, help="(default 1.05)")   # 1.0 is not 1.05
    assert help_problems(p) == ["x --quiet: no help text", "x --n: default 5 not shown in "
                                "'--n N count (default 3)'", "x --k: default 1.0 not shown in '--k K (default 1.05)'"]
    assert "count (default: 7)" in _help_blocks(p)["--m"]


def test_help_runs_as_a_program():
    for argv in (["--help"], ["generate", "--help"], ["ablate", "--help"], ["compile", "--help"]):
        proc = subprocess.run([sys.executable, "-m", "batchmask", *argv], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and proc.stderr == "" and proc.stdout.startswith("usage: batchmask"), proc


# --- --version --------------------------------------------------------------------------------------------
def test_version_is_the_installed_distributions():
    proc = subprocess.run([sys.executable, "-m", "batchmask", "--version"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    installed = importlib.metadata.version("batchmask")
    assert proc.stdout == f"batchmask {installed}\n"
    # the metadata, the package's __version__ and pyproject.toml agree (a release bumps them together)
    declared = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert installed == declared == batchmask.__version__


# --- choices --------------------------------------------------------------------------------------------
def test_a_bad_dtype_is_refused_by_argparse_before_anything_is_read(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "batchmask", "generate", "--tasks", str(tmp_path / "absent.txt"),
                           "--dtype", "bogus"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    # one line, from argparse (the tasks file, which does not exist, was never opened)
    assert proc.stderr.splitlines() == [
        "batchmask: error: argument --dtype: invalid choice: 'bogus' (choose from 'auto', 'float32', 'fp32', "
        "'bfloat16', 'bf16', 'float16', 'fp16') (see batchmask generate --help)"]


def test_every_dtype_choice_loads_as_that_torch_dtype():
    from batchmask.run.loading import _dtype
    parser = _subparsers(cli.build_parser())["batchmask generate"]
    (action,) = [a for a in parser._actions if "--dtype" in a.option_strings]
    cpu = torch.device("cpu")
    names = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
    for choice in action.choices:
        want = torch.float32 if choice == "auto" else getattr(torch, names.get(choice, choice))
        assert _dtype(choice, cpu) is want, choice


# --- one error prefix -------------------------------------------------------------------------------------
def _err_lines(capsys) -> list[str]:
    return capsys.readouterr().err.strip().splitlines()


def test_every_error_path_prints_one_line_with_the_same_prefix(tmp_path, capsys, monkeypatch):
    cases = [["generate", "--tasks", str(TASKS), "--seed", "x"],              # argparse
             ["generate", "--tasks", str(tmp_path / "absent.txt")],            # a ValueError of the run
             ["compile", "--tokenizer", str(tmp_path / "absent.model")],       # compile's own check
             ["check-kernels", "--arch", "bogus"],                             # the kernels' checker
             ["frobnicate"]]                                                   # no such command
    for argv in cases:
        assert cli.main(argv) == 2, argv
        lines = _err_lines(capsys)
        assert len(lines) == 1 and lines[0].startswith("batchmask: error: "), (argv, lines)

    def boom(args):
        raise MemoryError
    monkeypatch.setattr(cli, "cmd_compile", boom)
    assert cli.main(["compile"]) == 2
    (line,) = _err_lines(capsys)
    assert line.startswith("batchmask: error: out of memory in `batchmask compile`")
    # the kernels' checker as its own program says it the same way
    proc = subprocess.run([sys.executable, "-m", "batchmask.kernels.check", "--arch", "bogus"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        "batchmask: error: --arch: 'bogus' is not an architecture (expected e.g. sm_80,sm_90)"]


SPELLED = re.compile(r"""["']batchmask: (error|warning)|\{self\.prog\}: error""")


def test_no_module_spells_the_prefix_itself():
    # one function writes the prefix (batchmask.text.say_error / say_warning): no other module spells it
    assert SPELLED.search('        print(f"batchmask: error: {e}", file=sys.stderr)')     # the finder sees one
    hits = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
            for folder in ("batchmask", "kernels", "models") for path in sorted((ROOT / folder).rglob("*.py"))
            if path != ROOT / "batchmask" / "text.py"
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if SPELLED.search(line)]
    assert hits == []


# --- an illegal token in a whole batch: one line, with the count -------------------------------------------
def _illegal_sample(self, logits, temperature=0.0, top_p=1.0, seed=0):
    """Every row takes its first token the mask forbids (a sampler that ignored the mask)."""
    masked = logits.clone()
    self.apply_(masked)
    tokens = torch.isinf(masked).to(torch.int8).argmax(-1)
    self.advance(tokens, check=False)
    return tokens


def test_illegal_tokens_of_a_whole_batch_are_one_line_with_their_count(monkeypatch, capsys, tmp_path):
    n_tasks = sum(1 for line in TASKS.read_text().splitlines() if line.strip())
    monkeypatch.setattr(BatchMasker, "sample", _illegal_sample)
    out = tmp_path / "calls.jsonl"
    argv = ["generate", "--tasks", str(TASKS), "--batch-size", str(n_tasks), "--max-new-tokens", "3", "--quiet",
            "--grammar-cache", "none", "--out", str(out)]
    assert cli.main(argv) == 2
    lines = _err_lines(capsys)
    assert len(lines) == 1, lines
    assert re.fullmatch(rf"batchmask: error: {n_tasks} rows advanced by a token the grammar does not allow -- was "
                        r"the mask applied\? \(first: row 0: token \d+ \(.*\) is not legal in state \d+\)", lines[0])
    # the run is marked failed: --resume refuses its lines
    assert "IllegalTokenError" in (tmp_path / "calls.jsonl.run.json").read_text()


def test_illegal_token_error_names_every_row_after_its_summary():
    from batchmask.models.tokenizer import load_tokenizer

    from batchmask import ToolRegistry, compile_grammar
    from batchmask.run.loading import DEFAULT_DIR
    tok = load_tokenizer(DEFAULT_DIR / "tokenizer.model")
    g = compile_grammar(ToolRegistry.defaults(), tok)
    m = BatchMasker(g, batch_size=64, device="cpu")
    logits = torch.zeros(64, g.vocab_size)
    _illegal_sample(m, logits)
    with pytest.raises(IllegalTokenError) as err:
        m.check()
    head, *rows = str(err.value).splitlines()
    assert head.startswith("64 rows advanced by a token the grammar does not allow")
    assert [int(r.split(":")[0].removeprefix("row ")) for r in rows] == list(range(64))
    assert [f[0] for f in err.value.faults] == list(range(64))
    m.reset()
    _illegal_sample(m, torch.zeros(64, g.vocab_size))
    m.rows.fault[1:] = 0                                  # one row only: singular
    with pytest.raises(IllegalTokenError, match=r"^1 row advanced by"):
        m.check()


# --- --system beside a task's own system message ----------------------------------------------------------
CHAT = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}{% if tools %}<|tools|>{{ tools | length }}{% endif %}")


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny random llama2.c checkpoint over GPT-2's vocabulary and that tokenizer with a chat template."""
    from batchmask.models.checkpoint import ModelConfig, random_weights, write_checkpoint
    base = tmp_path_factory.mktemp("chat")
    tok = base / "tok"
    tok.mkdir()
    shutil.copy(GPT2 / "tokenizer.json", tok / "tokenizer.json")
    cfg = json.loads((GPT2 / "tokenizer_config.json").read_text())
    (tok / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": CHAT}))
    config = ModelConfig(16, 32, 1, 2, 1, 50304, 512)
    write_checkpoint(base / "model.bin", config, random_weights(config, seed=0))
    return base / "model.bin", tok


def test_system_beside_a_tasks_own_system_message_is_a_warning(chat_model, tmp_path, capsys):
    ckpt, tok = chat_model
    tasks = tmp_path / "tasks.jsonl"
    own = [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "read a.txt"}]
    tasks.write_text("\n".join(json.dumps(x) for x in (
        {"task": "what is 2+2"}, {"messages": own}, {"messages": [{"role": "user", "content": "hi"}]})) + "\n")
    argv = ["generate", "--checkpoint", str(ckpt), "--tokenizer", str(tok), "--tasks", str(tasks), "--quiet",
            "--max-new-tokens", "4", "--grammar-cache", "none"]
    assert cli.main(argv + ["--system", "Be brief.", "--show"]) == 0
    err = capsys.readouterr().err.splitlines()
    warnings = [line for line in err if line.startswith("batchmask: warning:")]
    assert warnings == [f"batchmask: warning: --system comes before the task's own system message in 1 task(s) "
                        f"({tasks} line 2): the prompt holds both"]
    prompts = [json.loads(line[len("prompt: "):]) for line in err if line.startswith("prompt: ")]
    assert prompts[1].startswith("<|system|>Be brief.\n<|system|>Answer in French.\n<|user|>read a.txt\n")
    # without --system, or with no task of its own system message: nothing to warn about
    assert cli.main(argv) == 0
    assert "warning" not in capsys.readouterr().err
    tasks.write_text(json.dumps({"messages": own[1:]}) + "\n")
    assert cli.main(argv + ["--system", "Be brief."]) == 0
    assert "warning" not in capsys.readouterr().err

