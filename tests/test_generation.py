"""End-to-end generation: every constrained output is a valid call, whatever the model does."""
from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from batchmask.models.checkpoint import ModelConfig, random_weights, write_checkpoint
from batchmask.models.llama import Transformer
from batchmask.models.tokenizer import Tokenizer

from batchmask.compiler.compiled import compile_grammar
from batchmask.run.cli import main
from batchmask.run.generation import BatchGenerator, GenerationConfig
from batchmask.tools.prompt import parse_call
from batchmask.tools.registry import Tool, ToolArg, ToolRegistry

ROOT = Path(__file__).resolve().parents[1]
FRAGMENTS = ['{"', '":"', '","', '"}}', '"}', 'tool', 'args', 'calc', 'read', '_file', 'path', 'text', 'expr',
             'list', '_dir', 'write', 'answer', 'the', '▁the', '▁a', 'ing', 'é', '€', '中', '😀', '▁"', '1', '2',
             '+', '▁what', 'is', 'file', '.txt', 'notes', '▁of', '▁to', 'ab', 'x', '"a', 'a"', '{', '}']


def small_tokenizer() -> Tokenizer:
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    pieces += [p for p in dict.fromkeys(FRAGMENTS + list("abcdefghijklmnopqrstuvwxyz▁.:,()\"{}_0123456789ABCT?"))
               if p not in pieces]
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces) - 259)]
    return Tokenizer.from_pieces(pieces, scores)


def random_model(vocab_size: int, seed: int, seq_len: int = 512, std: float = 0.5) -> Transformer:
    rng = random.Random(seed)
    heads = rng.choice([2, 4])
    config = ModelConfig(dim=heads * 8, hidden_dim=rng.choice([24, 40]), n_layers=rng.choice([1, 2]), n_heads=heads,
                         n_kv_heads=rng.choice([1, heads]), vocab_size=vocab_size, seq_len=seq_len,
                         shared_classifier=rng.random() < 0.5)
    model = Transformer(config)
    model.load_weights(random_weights(config, seed=seed, std=std))
    return model.eval()


def random_registry(rng: random.Random) -> ToolRegistry:
    if rng.random() < 0.4:
        return ToolRegistry.defaults()
    tools = []
    for name in rng.sample(["calc", "read", "read_file", "r", "search", "get_weather", "x"], rng.randint(1, 4)):
        args = rng.sample(["q", "path", "text", "p", "unit", "city"], rng.randint(0, 3))
        tools.append(Tool(name, "does things", tuple(ToolArg(a) for a in args)))
    return ToolRegistry(tools)


def check_output(res, registry, max_string, utf8=True):
    if utf8:
        assert res.raw.decode("utf-8") == res.text                  # whole characters only
    obj = json.loads(res.text)                                      # JSON, every time
    assert res.call == obj and res.error is None
    if not utf8:
        # the seed's byte rule: bytes >= 0x80 on their own; count the value's real bytes
        obj = json.loads(res.raw.decode("latin-1"))
    assert obj["tool"] in registry
    want = [a.name for a in registry[obj["tool"]].required_args]
    assert list(obj["args"]) == want
    for v in obj["args"].values():
        n = len(v.encode("utf-8") if utf8 else v.encode("latin-1"))
        assert isinstance(v, str) and 1 <= n <= max_string
    assert parse_call(res.text, registry) == (res.call, None)


def test_two_thousand_constrained_generations_all_parse():
    tok = small_tokenizer()
    total = cut = 0
    for trial in range(8):
        rng = random.Random(trial)
        registry = random_registry(rng)
        max_string = rng.choice([1, 3, 8, 24, 256])
        utf8 = rng.random() < 0.8
        model = random_model(tok.vocab_size, seed=trial)
        grammar = compile_grammar(registry, tok, max_string=max_string, utf8=utf8)
        config = GenerationConfig(batch_size=rng.choice([7, 32, 64]), max_new_tokens=rng.choice([12, 40, 80]),
                                  temperature=rng.choice([0.0, 0.7, 1.5]), top_p=rng.choice([1.0, 0.9]),
                                  seed=trial)
        gen = BatchGenerator(model, tok, registry, grammar, config)
        tasks = [f"task {i}: " + "".join(rng.choice("abc +-") for _ in range(rng.randint(0, 30))) for i in range(260)]
        results = []
        gen.run(tasks, on_result=results.append)
        assert [r.index for r in results] == list(range(len(tasks)))      # input order
        for r in results:
            check_output(r, registry, max_string, utf8)
            cut += r.cut
        total += len(results)
    assert total >= 2000
    assert cut > 0                                    # the ceiling was hit and finish() made them parse


def legal_prefix(grammar, ids: list[int]) -> int:
    """How many of ids the grammar accepts in turn from its start state (the index of the first it forbids)."""
    state = torch.tensor([int(grammar.start)])
    for i, t in enumerate(ids):
        state = grammar.next_state(state, torch.tensor([t]))
        if int(state[0]) < 0:
            return i
    return len(ids)


def both_arms(model, tok, registry, grammar, tasks, **config):
    arms = []
    for constrain in (True, False):
        gen = BatchGenerator(model, tok, registry, grammar if constrain else None,
                             GenerationConfig(constrain=constrain, **config))
        res = []
        gen.run(tasks, on_result=res.append)
        arms.append([r.token_ids for r in res])
    return arms


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_free_arm_draws_the_constrained_tokens_until_it_leaves_the_grammar(temperature):
    """The ablation's arms differ only by the mask: the same sampler, noise and keys (task, step), so with the
    same seed the free arm emits exactly the constrained arm's tokens up to its first token the grammar
    forbids (and from there on they differ). The embedded model stays in the grammar for long stretches."""
    from batchmask.models.llama import load_checkpoint
    from batchmask.models.tokenizer import load_tokenizer

    from batchmask.run.cli import DEFAULT_DIR
    tok = load_tokenizer(str(DEFAULT_DIR / "tokenizer.model"))
    model = load_checkpoint(DEFAULT_DIR / "model.bin")
    registry = ToolRegistry.defaults()
    grammar = compile_grammar(registry, tok, max_string=24)
    tasks = ["read the file notes.txt", "what is 12 plus 30", "list the folder docs", "say hello to Ann",
             "compute 7 times 8", "write hi to out.txt"]
    constrained, free = both_arms(model, tok, registry, grammar, tasks, batch_size=3, max_new_tokens=40,
                                  temperature=temperature, seed=11)
    compared = 0
    for c, f in zip(constrained, free):
        k = legal_prefix(grammar, f)
        assert c[:k] == f[:k]
        if k < len(f):
            assert legal_prefix(grammar, c) == len(c) and c[k] != f[k]
        compared += k
    assert compared >= 60, compared  # long stretches compared, not a vacuous check


def test_free_arm_of_a_random_model_leaves_the_grammar_at_once_and_agrees_before():
    """A random model's free arm writes illegal tokens early: the arms agree exactly up to there."""
    tok = small_tokenizer()
    registry = ToolRegistry.defaults()
    model = random_model(tok.vocab_size, seed=3)
    grammar = compile_grammar(registry, tok, max_string=8)
    constrained, free = both_arms(model, tok, registry, grammar, [f"t{i}" for i in range(6)], batch_size=4,
                                  max_new_tokens=10, temperature=0.8, seed=2)
    cut = [legal_prefix(grammar, f) for f in free]
    assert any(k < len(f) for k, f in zip(cut, free))  # the free arm did leave the grammar
    for k, c, f in zip(cut, constrained, free):
        assert c[:k] == f[:k] and legal_prefix(grammar, c) == len(c)


def test_continuous_and_static_batching_give_the_same_greedy_calls():
    tok = small_tokenizer()
    registry = ToolRegistry.defaults()
    model = random_model(tok.vocab_size, seed=5)
    grammar = compile_grammar(registry, tok, max_string=16)
    outs = []
    for continuous in (True, False):
        gen = BatchGenerator(model, tok, registry, grammar,
                             GenerationConfig(batch_size=3, max_new_tokens=30, continuous=continuous))
        res = []
        gen.run([f"t{i}" for i in range(7)], on_result=res.append)
        outs.append([(r.text, r.tokens) for r in res])
    assert outs[0] == outs[1]


def test_seeded_sampling_does_not_depend_on_batch_size_or_slot():
    """A task's draws are keyed by (seed, task, step), whichever slot and batch it runs in."""
    tok = small_tokenizer()
    registry = ToolRegistry.defaults()
    model = random_model(tok.vocab_size, seed=8)
    grammar = compile_grammar(registry, tok, max_string=12)
    tasks = [f"t{i}" for i in range(9)]
    outs = []
    for constrain in (True, False):
        arm = []
        for B in (1, 4, 9):
            gen = BatchGenerator(model, tok, registry, grammar if constrain else None,
                                 GenerationConfig(batch_size=B, max_new_tokens=20, temperature=0.9, seed=4,
                                                  constrain=constrain))
            res = []
            gen.run(tasks, on_result=res.append)
            arm.append([r.text for r in res])
        assert arm[0] == arm[1] == arm[2]
        outs.append(arm[0])
    assert len(set(outs[0])) > 1                       # the draws are random, not all alike


# --- the command line ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    tok = small_tokenizer()
    tok.write_bin(d / "tokenizer.bin")
    config = ModelConfig(dim=16, hidden_dim=32, n_layers=1, n_heads=2, n_kv_heads=2, vocab_size=tok.vocab_size,
                         seq_len=512)
    write_checkpoint(d / "model.bin", config, random_weights(config, seed=0, std=0.5))
    short = ModelConfig(dim=16, hidden_dim=32, n_layers=1, n_heads=2, n_kv_heads=2, vocab_size=tok.vocab_size,
                        seq_len=64)
    write_checkpoint(d / "short.bin", short, random_weights(short, seed=0))
    other = ModelConfig(dim=16, hidden_dim=32, n_layers=1, n_heads=2, n_kv_heads=2, vocab_size=300, seq_len=64)
    write_checkpoint(d / "other.bin", other, random_weights(other, seed=0))
    (d / "tasks.txt").write_text("\n".join(f"compute {i} plus {i}" for i in range(12)) + "\n")
    return d


def run_cli(files, *extra, out=None):
    args = ["generate", "--tasks", str(files / "tasks.txt"), "--checkpoint", str(files / "model.bin"),
            "--tokenizer", str(files / "tokenizer.bin"), "--batch-size", "4", "--max-new-tokens", "24", "--quiet"]
    if out:
        args += ["--out", str(out)]
    return main(args + list(extra))


def test_cli_generate_writes_jsonl_in_input_order(files, tmp_path):
    out = tmp_path / "o.jsonl"
    assert run_cli(files, out=out) == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["index"] for r in lines] == list(range(12))
    assert all(json.loads(r["text"]) == r["call"] for r in lines)
    assert set(lines[0]) >= {"task", "text", "call", "error", "tokens", "cut", "seconds"}


def test_cli_jsonl_tasks_with_their_own_token_ceilings(files, tmp_path):
    tasks = tmp_path / "t.jsonl"
    tasks.write_text('{"task": "short one", "max_new_tokens": 3}\n{"task": "long one"}\n'
                     '{"task": "longer", "max_new_tokens": 40}\n')
    out = tmp_path / "o.jsonl"
    assert main(["generate", "--tasks", str(tasks), "--checkpoint", str(files / "model.bin"), "--tokenizer",
                 str(files / "tokenizer.bin"), "--max-new-tokens", "24", "--quiet", "--out", str(out)]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert rows[0]["tokens"] <= 3 and rows[0]["cut"] and json.loads(rows[0]["text"]) == rows[0]["call"]
    assert rows[1]["tokens"] <= 24 and rows[2]["tokens"] <= 40
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task": "x", "max_new_tokens": 0}\n')
    assert main(["generate", "--tasks", str(bad), "--checkpoint", str(files / "model.bin"), "--quiet"]) == 2


def test_cli_resume_skips_finished_tasks_and_mends_a_torn_line(files, tmp_path):
    full = tmp_path / "full.jsonl"
    assert run_cli(files, out=full) == 0
    part = tmp_path / "part.jsonl"
    lines = full.read_text().splitlines(keepends=True)
    part.write_text("".join(lines[:5]) + lines[5][:17])           # a crash mid-line
    Path(f"{part}.run.json").write_bytes(Path(f"{full}.run.json").read_bytes())   # the settings that wrote it
    assert run_cli(files, "--resume", out=part) == 0
    strip = lambda p: [{k: v for k, v in json.loads(x).items() if k != "seconds"} for x in p.read_text().splitlines()]
    assert strip(part) == strip(full)


@pytest.mark.parametrize("change,match", [
    (["--checkpoint", "/nonexistent/model.bin"], "not found"),
    (["--checkpoint", "other.bin"], "vocab_size"),
    (["--tasks", "empty.txt"], "no tasks"),
    (["--tools", "bad_tools.json"], "not valid JSON"),
    (["--checkpoint", "short.bin", "--tasks", "long.txt"], "context"),
])
def test_cli_bad_inputs_end_with_one_clear_line(files, tmp_path, capsys, change, match):
    (files / "empty.txt").write_text("\n\n")
    (files / "bad_tools.json").write_text("{nope")
    (files / "long.txt").write_text("word " * 200 + "\n")
    change = [str(files / c) if c.endswith((".bin", ".txt", ".json")) and not c.startswith("/") else c
              for c in change]
    out = tmp_path / "o.jsonl"
    args = ["generate", "--tasks", str(files / "tasks.txt"), "--checkpoint", str(files / "model.bin"),
            "--tokenizer", str(files / "tokenizer.bin"), "--out", str(out), "--quiet"]
    for i in range(0, len(change), 2):
        if change[i] in args:
            args[args.index(change[i]) + 1] = change[i + 1]
        else:
            args += change[i:i + 2]
    rc = main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0
    assert len(err) == 1 and err[0].startswith("batchmask: error:") and match in err[0], err
    assert not out.exists()                                          # no partial garbage


def _env():
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


@pytest.mark.parametrize("sig, status, word",
                         [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")],
                         ids=["sigint", "sigterm"])
def test_a_stop_keeps_finished_lines_and_resume_completes(files, tmp_path, sig, status, word):
    tasks = tmp_path / "many.txt"
    tasks.write_text("\n".join(f"task number {i}" for i in range(400)) + "\n")
    out = tmp_path / "o.jsonl"
    cmd = [sys.executable, "-m", "batchmask", "generate", "--tasks", str(tasks), "--checkpoint",
           str(files / "model.bin"), "--tokenizer", str(files / "tokenizer.bin"), "--batch-size", "2",
           "--max-new-tokens", "24", "--out", str(out), "--quiet"]
    # a runner may start us with SIGINT ignored (background jobs of a non-interactive shell are), which the
    # child would inherit, and Python then installs no Ctrl-C handler: give the child the default back
    def defaults():
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    proc = subprocess.Popen(cmd, env=_env(), stderr=subprocess.PIPE, text=True, preexec_fn=defaults)
    deadline = time.time() + 120
    while time.time() < deadline and (not out.exists() or out.read_text().count("\n") < 3):
        time.sleep(0.2)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == status, err
    kept = out.read_text().splitlines()
    assert 3 <= len(kept) < 400 and "--resume" in err
    assert err.startswith(f"batchmask: {word}; ") and err.count("\n") == 1 and "Traceback" not in err
    assert not list(tmp_path.glob("*.lock"))
    assert [json.loads(x)["index"] for x in kept] == list(range(len(kept)))
    done = subprocess.run(cmd + ["--resume"], env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert [json.loads(x)["index"] for x in out.read_text().splitlines()] == list(range(400))


@pytest.mark.parametrize("extra", [[], ["--jump-forward"]], ids=["plain", "jump-forward"])
def test_torchrun_two_gloo_ranks_write_one_output_in_order(files, tmp_path, extra):
    single = tmp_path / "single.jsonl"
    assert run_cli(files, *extra, out=single) == 0
    multi = tmp_path / "multi.jsonl"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
           str(29500 + os.getpid() % 1000), "-m", "batchmask", "generate", "--tasks", str(files / "tasks.txt"),
           "--checkpoint", str(files / "model.bin"), "--tokenizer", str(files / "tokenizer.bin"), "--batch-size", "4",
           "--max-new-tokens", "24", "--device", "cpu", "--out", str(multi), *extra]
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    strip = lambda p: [{k: v for k, v in json.loads(x).items() if k != "seconds"} for x in p.read_text().splitlines()]
    assert strip(multi) == strip(single)
    assert not list(tmp_path.glob("multi.jsonl.part*"))
    # one summary for the whole run, from rank 0: every rank's tasks and tokens added up
    said = [ln for ln in done.stderr.splitlines() if ln.startswith("batchmask: ")]
    tokens = sum(r["tokens"] for r in strip(single))
    assert len(said) == 1 and said[0].startswith(f"batchmask: {len(strip(single))} tasks (constrained)"), said
    assert f" {tokens} tokens in " in said[0] and "2 ranks on cpu" in said[0], said


# --- progress: on a terminal only, never under --quiet (a pseudo-terminal stands in for the person) ---------
def _stderr_on_a_terminal(cmd: list[str]) -> tuple[int, str]:
    """Run `cmd` with its stderr on a pseudo-terminal (stdout and stdin not); (exit status, what the terminal got)."""
    import fcntl
    import pty
    import struct
    import termios
    main_fd, child_fd = pty.openpty()
    fcntl.ioctl(child_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))   # a window: 24 x 120
    proc = subprocess.Popen(cmd, env=_env(), stderr=child_fd, stdout=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL)
    os.close(child_fd)
    chunks = []
    while True:
        try:
            data = os.read(main_fd, 65536)
        except OSError:                                   # EIO: the child closed its end
            break
        if not data:
            break
        chunks.append(data)
    os.close(main_fd)
    return proc.wait(timeout=120), b"".join(chunks).decode("utf-8", "replace")


@pytest.mark.parametrize("quiet", [False, True], ids=["terminal", "quiet"])
def test_every_long_phase_shows_progress_on_a_terminal_and_nothing_under_quiet(files, tmp_path, quiet):
    out = tmp_path / "o.jsonl"
    cmd = [sys.executable, "-m", "batchmask", "generate", "--tasks", str(files / "tasks.txt"), "--checkpoint",
           str(files / "model.bin"), "--tokenizer", str(files / "tokenizer.bin"), "--batch-size", "4",
           "--max-new-tokens", "24", "--out", str(out), *(["--quiet"] if quiet else [])]
    status, seen = _stderr_on_a_terminal(cmd)
    assert status == 0, seen
    if quiet:
        assert seen == ""
    else:
        for name in ("loading the model and tokenizer", "compiling the grammars, encoding the prompts"):
            assert f"batchmask: {name}: 00:" in seen, seen            # each phase, with how long it took
        assert re.search(r"generating: +\d+%\|.*\| *\d+/12 ", seen), seen   # tqdm's bar, with the count
        assert "12 tasks (constrained)" in seen
    # a finished run resumed: said to be complete, not a run of nothing
    status, seen = _stderr_on_a_terminal(cmd + ["--resume"])
    assert status == 0
    assert ("" if quiet else f"batchmask: {out} is already complete (12 of 12 tasks); nothing to do") in seen
    assert "tok/s" not in seen


def test_progress_is_quiet_when_stderr_is_not_a_terminal(files, tmp_path):
    cmd = [sys.executable, "-m", "batchmask", "generate", "--tasks", str(files / "tasks.txt"), "--checkpoint",
           str(files / "model.bin"), "--tokenizer", str(files / "tokenizer.bin"), "--batch-size", "4",
           "--max-new-tokens", "24", "--out", str(tmp_path / "o.jsonl")]
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("\n") == 1 and "12 tasks (constrained)" in done.stderr, done.stderr


def test_ablate_shows_its_phases_on_a_terminal(files, tmp_path):
    cmd = [sys.executable, "-m", "batchmask", "ablate", "--n", "4", "--checkpoint", str(files / "model.bin"),
           "--tokenizer", str(files / "tokenizer.bin"), "--max-new-tokens", "16"]
    status, seen = _stderr_on_a_terminal(cmd)
    assert status == 0, seen
    assert "batchmask: loading the model and tokenizer: 00:" in seen and "batchmask: compiling the grammar: 00:" in seen
    for arm in ("constrained", "free"):
        assert re.search(rf"ablate, {arm}: +\d+%\|", seen), seen
    status, seen = _stderr_on_a_terminal(cmd + ["--quiet"])
    assert (status, seen) == (0, "")
