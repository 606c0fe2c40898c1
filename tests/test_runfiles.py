"""Never lose or mix a result: task and result files, --resume, the run fingerprint, locks, bounds (issue 17)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from batchmask.models.checkpoint import ModelConfig, random_weights, write_checkpoint
from batchmask.models.tokenizer import Tokenizer

from batchmask.run import fingerprint, limits, runfiles
from batchmask.run.cli import main
from batchmask.run.locks import FileLock
from batchmask.run.runfiles import RunFileError, read_tasks, record_line, scan_results

ROOT = Path(__file__).resolve().parents[1]
ODD = "a\u2028b\u2029c\u0085d\re\x1cf\x1dg\x1eh\x0bi\x0cj"     # every separator str.splitlines() also splits on


def tokenizer() -> Tokenizer:
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    extra = ['{"', '":"', '","', '"}}', 'tool', 'args', 'answer', 'text', 'calc', 'expr', '▁the', 'ing']
    pieces += [p for p in dict.fromkeys(extra + list("abcdefghijklmnopqrstuvwxyz▁.:,()\"{}_0123456789"))
               if p not in pieces]
    return Tokenizer.from_pieces(pieces, [0.0] * 259 + [-float(i) for i in range(len(pieces) - 259)])


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("runfiles")
    tok = tokenizer()
    tok.write_bin(d / "tokenizer.bin")
    config = ModelConfig(dim=16, hidden_dim=32, n_layers=1, n_heads=2, n_kv_heads=2, vocab_size=tok.vocab_size,
                         seq_len=512)
    write_checkpoint(d / "model.bin", config, random_weights(config, seed=0, std=0.5))
    write_checkpoint(d / "model2.bin", config, random_weights(config, seed=1, std=0.5))   # same shape, other weights
    (d / "tasks.txt").write_text("".join(f"compute {i} plus {i}\n" for i in range(10)))
    (d / "tools.json").write_text(json.dumps({"tools": [{"name": "calc", "description": "Do sums.",
                                                         "args": [{"name": "expr", "required": True}]}]}))
    return d


def gen_args(files, out, *extra, tasks=None):
    return ["generate", "--tasks", str(tasks or files / "tasks.txt"), "--checkpoint", str(files / "model.bin"),
            "--tokenizer", str(files / "tokenizer.bin"), "--batch-size", "4", "--max-new-tokens", "16", "--quiet",
            "--out", str(out), *extra]


def records(path: Path) -> list[dict]:
    """The records of a result file without their timing (split on \\n only, as the format says)."""
    return [{k: v for k, v in json.loads(x).items() if k != "seconds"} for x in path.read_bytes().split(b"\n") if x]


def one_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error" in err[0] and "Traceback" not in err[0], err
    return err[0]


@pytest.fixture(scope="module")
def full(files, tmp_path_factory):
    """One uninterrupted run: the reference every resumed run must reproduce."""
    out = tmp_path_factory.mktemp("full") / "full.jsonl"
    assert main(gen_args(files, out)) == 0
    return out


def partial(full: Path, dest: Path, n: int, torn: int = 0) -> Path:
    """`dest` as a run of `full` interrupted after n lines (plus `torn` bytes of the next), its run file beside it."""
    lines = full.read_bytes().split(b"\n")
    dest.write_bytes(b"".join(ln + b"\n" for ln in lines[:n]) + lines[n][:torn])
    fingerprint.run_file(dest).write_bytes(fingerprint.run_file(full).read_bytes())
    return dest


# --- JSON Lines exactly ---------------------------------------------------------------------------
def test_result_lines_round_trip_every_unicode_line_separator(tmp_path):
    recs = [{"index": i, "task": ODD * i, "text": ODD, "call": {"tool": "answer", "args": {"text": ODD}},
             "error": None, "tokens": 3, "cut": False, "seconds": 0.5} for i in range(3)]
    path = tmp_path / "o.jsonl"
    path.write_bytes("".join(record_line(r) for r in recs).encode("utf-8"))
    raw = path.read_text(encoding="utf-8")
    assert "\u2028" in raw and "\u0085" in raw                      # written raw, as UTF-8, not escaped
    assert len(raw.splitlines()) > len(recs)                        # the trap: splitlines would tear records
    assert scan_results(path).records == recs                       # the reader splits on \n only


def test_task_files_jsonl_detection_bom_and_forced_format(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + (json.dumps({"task": "x" + ODD}, ensure_ascii=False) + "\n").encode()
                  + b"\n" + json.dumps({"task": "two", "max_new_tokens": 5}).encode() + b"\r\n")
    tf = read_tasks(str(p))
    assert (tf.format, tf.tasks, tf.limits, tf.lines) == ("jsonl", ["x" + ODD, "two"], [None, 5], [1, 3])
    p.write_bytes(b'{"task": "a"}\nplain words\n{"task": "c"}\n')   # one plain line inside JSONL
    with pytest.raises(RunFileError, match=r"line 2: not valid JSON"):
        read_tasks(str(p))
    p.write_bytes(b'{"task": "a"}\n["a list"]\n')
    with pytest.raises(RunFileError, match=r"line 2: expected a JSON object"):
        read_tasks(str(p))
    p.write_bytes(b'plain first\n{"task": "b"}\n')                  # a broken first line must not mean "text"
    with pytest.raises(RunFileError, match=r"line 1: not a JSON object, but line 2"):
        read_tasks(str(p))
    assert read_tasks(str(p), "text").tasks == ["plain first", '{"task": "b"}']
    with pytest.raises(RunFileError, match=r"line 1: not valid JSON"):
        read_tasks(str(p), "jsonl")
    p.write_bytes(b"\xef\xbb\xbffirst task\r\nsecond\n")
    assert read_tasks(str(p)).tasks == ["first task", "second"]
    p.write_bytes(b"ok\n\xff\xfe\n")
    with pytest.raises(RunFileError, match=r"line 2: not UTF-8"):
        read_tasks(str(p))


@pytest.mark.parametrize("end", ["\r", "\n", "\r\n"])
def test_every_line_end_splits_tasks_and_numbers_lines_as_an_editor_does(tmp_path, end):
    # An old Mac file (CR only) used to be read as ONE task holding every line. The reference is Python's
    # universal newlines (open(newline=None)), which is how editors count lines too.
    p = tmp_path / "t.txt"
    p.write_bytes(end.join(["read a.txt", "add 1 and 2", "", "list the dir", "a\u2028b\x0cc", ""]).encode())
    with open(p, encoding="utf-8", newline=None) as fh:
        want = [(n, ln.rstrip("\n")) for n, ln in enumerate(fh, 1) if ln.strip()]
    tf = read_tasks(str(p))
    assert list(zip(tf.lines, tf.tasks)) == want and len(want) == 4     # U+2028 and a form feed stay inside
    p.write_bytes(end.join(['{"task": "a"}', '{"task": "b", "max_new_tokens": 3}', "", '{"task": 7}']).encode())
    with pytest.raises(RunFileError, match=r"t.txt line 4: expected a non-empty string"):
        read_tasks(str(p))
    p.write_bytes(end.join(["ok", "fine", "bad \xff byte"]).encode("latin-1"))
    with pytest.raises(RunFileError, match=r"t.txt line 3: not UTF-8"):
        read_tasks(str(p))
    mixed = b"one\r\ntwo\rthree\nfour"                             # one file, every kind of end
    p.write_bytes(mixed)
    assert read_tasks(str(p)).tasks == ["one", "two", "three", "four"]


@pytest.mark.parametrize("line, field", [
    ('{"task": "a \\ud800 b"}', "task"),                               # a lone high surrogate
    ('{"messages": [{"role": "user", "content": "x\\udfff"}]}', "messages"),   # a lone low one, nested
    ('{"task": "ok", "tools": [{"name": "f\\udc00"}]}', "tools"),
])
def test_a_lone_surrogate_in_a_jsonl_task_names_the_line_and_field(tmp_path, line, field):
    p = tmp_path / "t.jsonl"
    p.write_text('{"task": "fine \\ud83d\\ude00"}\n' + line + "\n")   # a surrogate pair is an emoji: fine
    with pytest.raises(RunFileError) as e:
        read_tasks(str(p))
    msg = str(e.value)
    assert msg.startswith(f"{p} line 2: field '{field}' holds a lone surrogate") and "\n" not in msg, msg
    p.write_text('{"task": "fine \\ud83d\\ude00"}\n')
    assert read_tasks(str(p)).tasks == ["fine \U0001f600"]


def test_a_task_line_over_the_cap_is_refused_before_it_is_parsed(tmp_path, monkeypatch):
    import json as json_module
    monkeypatch.setattr(runfiles, "MAX_TASK_LINE", 1000)
    parsed = []
    real_loads = json_module.loads
    monkeypatch.setattr(runfiles.json, "loads", lambda text, *a, **k: parsed.append(len(text)) or real_loads(text))
    for body in ("x" * 1001, json.dumps({"task": "y" * 990})):
        p = tmp_path / "t.txt"
        p.write_text("short task\n" + body + "\nanother\n")
        with pytest.raises(RunFileError, match=r"t.txt line 2: 1,00\d characters, above the 1,000 a task line"):
            read_tasks(str(p))
    assert all(n <= 1000 for n in parsed)                     # the long line itself was never parsed
    p.write_text("short task\n" + "x" * 1000 + "\n")
    assert len(read_tasks(str(p)).tasks[1]) == 1000


def test_cli_reads_a_jsonl_task_holding_u2028_as_jsonl(files, tmp_path):
    tasks = tmp_path / "t.jsonl"
    tasks.write_text(json.dumps({"task": "say\u2028hi", "max_new_tokens": 4}, ensure_ascii=False) + "\n"
                     + json.dumps({"task": "two\u0085parts"}, ensure_ascii=False) + "\n", encoding="utf-8")
    out = tmp_path / "o.jsonl"
    assert main(gen_args(files, out, tasks=tasks)) == 0
    rows = records(out)
    assert [r["task"] for r in rows] == ["say\u2028hi", "two\u0085parts"] and rows[0]["tokens"] <= 4
    assert main(gen_args(files, out, "--resume", tasks=tasks)) == 0            # batchmask reads its own output
    assert records(out) == rows


# --- --resume checks the whole file before changing a byte -----------------------------------------
@pytest.mark.parametrize("content", [
    b"my notes\nabout this run\n",
    b"compute 1 plus 1\ncompute 2 plus 2",                                  # the tasks file given as --out
    bytes(range(256)) * 8,                                                  # a checkpoint given as --out
    b'{"index": 0, "task": "compute 0 plus 0"}\n{"ind',                      # JSON, but not result records
    b'{"a": 1}\n',
])
def test_resume_refuses_a_file_that_is_not_results_and_leaves_it_byte_identical(files, full, tmp_path, capsys,
                                                                                  content):
    out = tmp_path / "o.jsonl"
    out.write_bytes(content)
    fingerprint.run_file(out).write_bytes(fingerprint.run_file(full).read_bytes())    # even with a valid run file
    assert main(gen_args(files, out, "--resume")) == 2
    msg = one_error(capsys)
    assert "cannot --resume" in msg or "not a batchmask result" in msg, msg
    assert out.read_bytes() == content


def test_resume_a_valid_file_with_a_bad_later_line_changes_nothing(files, full, tmp_path, capsys):
    out = partial(full, tmp_path / "o.jsonl", 4, torn=9)
    before = out.read_bytes()
    lines = before.split(b"\n")
    out.write_bytes(b"\n".join(lines[:2] + [b"not json"] + lines[2:]))
    before = out.read_bytes()
    assert main(gen_args(files, out, "--resume")) == 2
    assert "line 3" in one_error(capsys)
    assert out.read_bytes() == before                                  # not even the torn tail was cut


def test_resume_cuts_only_a_torn_last_line_and_matches_an_uninterrupted_run(files, full, tmp_path):
    for n, torn in ((0, 5), (3, 30), (7, 0), (10, 0)):
        out = partial(full, tmp_path / f"o{n}.jsonl", n, torn)
        assert main(gen_args(files, out, "--resume", "--batch-size", "3")) == 0   # batch size may differ
        assert records(out) == records(full)


def test_resume_refuses_duplicate_or_foreign_records(files, full, tmp_path, capsys):
    out = partial(full, tmp_path / "o.jsonl", 3)
    first = out.read_bytes().split(b"\n")[0] + b"\n"
    out.write_bytes(out.read_bytes() + first)                          # two runs interleaved
    before = out.read_bytes()
    assert main(gen_args(files, out, "--resume")) == 2
    assert "line 4: a second result for task 0 (the first: " in one_error(capsys)
    assert out.read_bytes() == before


# --- the run's fingerprint ------------------------------------------------------------------------
@pytest.mark.parametrize("change,names", [
    (["--seed", "1"], "seed"),
    (["--max-string", "9"], "max_string"),
    (["--temperature", "0.5"], "temperature"),
    (["--no-constrain"], "no_constrain"),
    (["--checkpoint", "@model2.bin"], "checkpoint"),
    (["--tools", "@tools.json"], "tools"),
    (["--tasks", "@other.txt"], "tasks"),
    (["--max-new-tokens", "17"], "max_new_tokens"),
    (["--format", "json"], "format"),                      # flags other helpers added are fingerprinted too
    (["--max-context", "300"], "max_context"),
])
def test_resume_refuses_other_settings_naming_what_differs(files, full, tmp_path, capsys, change, names):
    (files / "other.txt").write_text("".join(f"compute {i} plus {i}\n" for i in range(11)))
    out = partial(full, tmp_path / "o.jsonl", 4, torn=3)
    before = out.read_bytes()
    args = gen_args(files, out, "--resume")
    flag, values = change[0], [str(files / v[1:]) if v.startswith("@") else v for v in change[1:]]
    if flag in args:
        args[args.index(flag) + 1] = values[0]
    else:
        args += [flag, *values]
    assert main(args) == 2
    msg = one_error(capsys)
    assert "other settings" in msg and names in msg, msg
    assert out.read_bytes() == before


def test_file_identity_follows_content_not_names(tmp_path, monkeypatch):
    a, b = tmp_path / "a.bin", tmp_path / "moved.bin"
    a.write_bytes(bytes(range(256)) * 4096)
    b.write_bytes(a.read_bytes())
    ident = fingerprint.file_identity
    assert ident(a) == ident(b)                                          # a moved checkpoint is the same model
    data = bytearray(a.read_bytes())
    data[len(data) // 2] ^= 1
    b.write_bytes(bytes(data))
    assert ident(a) != ident(b)
    monkeypatch.setattr(fingerprint, "FULL_HASH_MAX", 1 << 16)           # the sampled hash of multi-GB files:
    monkeypatch.setattr(fingerprint, "_BLOCK", 1 << 12)                  # other weights differ all over the file
    fingerprint._hash_of.cache_clear()
    data = bytearray(a.read_bytes())
    data[::4093] = bytes(x ^ 1 for x in data[::4093])
    b.write_bytes(bytes(data))
    assert ident(a) != ident(b) and ident(a) == ident(tmp_path / "a.bin")
    (tmp_path / "d1").mkdir()
    (tmp_path / "d2").mkdir()
    (tmp_path / "d1" / "x").write_bytes(b"1")
    (tmp_path / "d2" / "y").write_bytes(b"1")
    assert ident(tmp_path / "d1") != ident(tmp_path / "d2")            # a directory's file names count


def test_resume_accepts_display_flags_and_the_run_file_is_beside_the_output(files, full, tmp_path):
    out = partial(full, tmp_path / "o.jsonl", 5)
    assert main(gen_args(files, out, "--resume", "--batch-size", "7", "--show")) == 0
    assert records(out) == records(full)
    stored = json.loads(fingerprint.run_file(full).read_text())
    assert stored["settings"]["seed"] == 0 and stored["settings"]["tasks"].startswith("10 tasks")
    assert all(set(json.loads(x)) >= set(runfiles.RESULT_FIELDS) for x in full.read_text().split("\n") if x)


def test_resume_refuses_the_lines_of_a_run_that_stopped_on_an_error(files, full, tmp_path, capsys, monkeypatch):
    from batchmask.run.generation import BatchGenerator
    real, seen = BatchGenerator._result, []

    def failing(self, *a):                      # the fourth result finds something wrong (say, an illegal token)
        if len(seen) == 3:
            raise RuntimeError("row 1 was fed an illegal token")
        seen.append(1)
        return real(self, *a)
    monkeypatch.setattr(BatchGenerator, "_result", failing)
    out = tmp_path / "o.jsonl"
    assert main(gen_args(files, out)) == 2
    assert "illegal token" in one_error(capsys) and len(records(out)) <= 3         # those before it, in order
    monkeypatch.setattr(BatchGenerator, "_result", real)
    before = out.read_bytes()
    assert main(gen_args(files, out, "--resume")) == 2
    assert "stopped on an error (RuntimeError: row 1 was fed an illegal token)" in one_error(capsys)
    assert out.read_bytes() == before
    assert main(gen_args(files, out, "--force")) == 0 and records(out) == records(full)


def test_resume_without_a_run_file_is_refused(files, full, tmp_path, capsys):
    out = tmp_path / "o.jsonl"
    out.write_bytes(full.read_bytes())
    assert main(gen_args(files, out, "--resume")) == 2
    assert "run.json is missing" in one_error(capsys)


def test_resume_folds_in_part_files_left_by_an_interrupted_torchrun(files, full, tmp_path):
    out = tmp_path / "o.jsonl"
    fingerprint.run_file(out).write_bytes(fingerprint.run_file(full).read_bytes())
    lines = full.read_bytes().split(b"\n")[:-1]
    (tmp_path / "o.jsonl.part0").write_bytes(b"".join(x + b"\n" for x in lines[0:6:2]))   # rank 0 of 2
    (tmp_path / "o.jsonl.part1").write_bytes(b"".join(x + b"\n" for x in lines[1:4:2]) + lines[5][:11])
    assert main(gen_args(files, out, "--resume")) == 0
    assert records(out) == records(full)
    assert not list(tmp_path.glob("o.jsonl.part*"))


def write_lines(full: Path, dest: Path, order: list[int]) -> Path:
    """`dest` holding `full`'s result lines in `order` (an output also gets its run file beside it)."""
    lines = full.read_bytes().split(b"\n")
    dest.write_bytes(b"".join(lines[i] + b"\n" for i in order))
    if ".part" not in dest.name:
        fingerprint.run_file(dest).write_bytes(fingerprint.run_file(full).read_bytes())
    return dest


@pytest.mark.parametrize("parts,out_order", [
    ({0: [0, 2, 4], 1: [1]}, []),                         # torchrun stopped with gaps (task 3 unfinished)
    ({}, [0, 1, 2, 4, 7, 3, 5]),                          # a resume of those gaps, itself stopped: its tail
    ({1: [9]}, [0, 2, 1, 3]),                             # both at once
])
def test_resume_fills_gaps_and_leaves_the_output_in_input_order(files, full, tmp_path, parts, out_order):
    out = write_lines(full, tmp_path / "o.jsonl", out_order)
    for rank, order in parts.items():
        write_lines(full, tmp_path / f"o.jsonl.part{rank}", order)
    assert main(gen_args(files, out, "--resume")) == 0
    assert records(out) == records(full)                              # sorted, each task once, as one run
    assert not list(tmp_path.glob("o.jsonl.part*"))


@pytest.mark.parametrize("name,order,line", [
    ("o.jsonl", [0, 3, 1, 4], 3),            # a tail after the step back that is not the block's first gaps
    ("o.jsonl", [0, 2, 1, 4, 3], 5),         # two steps back: no run writes that
    ("o.jsonl.part0", [2, 0], 2),            # a rank's part file is in order
])
def test_resume_refuses_results_in_an_order_no_run_writes(files, full, tmp_path, capsys, name, order, line):
    out = write_lines(full, tmp_path / "o.jsonl", [])
    path = write_lines(full, tmp_path / name, order)
    before = path.read_bytes()
    assert main(gen_args(files, out, "--resume")) == 2
    msg = one_error(capsys)
    assert f"{name} line {line}: the result for task {order[line - 1]} comes after task" in msg, msg
    assert path.read_bytes() == before


def test_existing_output_or_part_files_need_resume_or_force(files, full, tmp_path, capsys):
    out = tmp_path / "o.jsonl"
    (tmp_path / "o.jsonl.part1").write_text("left by a crash\n")
    assert main(gen_args(files, out)) == 2
    assert "o.jsonl.part1 exists" in one_error(capsys)
    assert (tmp_path / "o.jsonl.part1").read_text() == "left by a crash\n" and not out.exists()
    assert main(gen_args(files, out, "--force")) == 0
    assert records(out) == records(full) and not (tmp_path / "o.jsonl.part1").exists()


# --- locks ----------------------------------------------------------------------------------------
def test_a_second_run_on_a_locked_output_is_refused_at_once(files, full, tmp_path, capsys):
    out = partial(full, tmp_path / "o.jsonl", 4)
    before = out.read_bytes()
    with FileLock(out):                                         # another run holds it (flock is per open file)
        t = time.perf_counter()
        assert main(gen_args(files, out, "--resume")) == 2
        assert time.perf_counter() - t < 5
        msg = one_error(capsys)
        assert str(out) in msg and "in use by another batchmask run" in msg
        with pytest.raises(RunFileError, match="in use"):
            FileLock(out).acquire()
    assert out.read_bytes() == before
    assert main(gen_args(files, out, "--resume")) == 0           # released: the run goes ahead
    assert records(out) == records(full) and not (tmp_path / "o.jsonl.lock").exists()


# --- numbers --------------------------------------------------------------------------------------
@pytest.mark.parametrize("extra,match", [
    (["--max-new-tokens", "1e20"], "--max-new-tokens: expected a whole number"),
    (["--batch-size", "1e20"], "--batch-size: expected a whole number"),
    (["--batch-size", "100000000000000000000000"], "--batch-size: expected a whole number from 1 to"),
    (["--max-string", "10000000"], f"from 1 to {limits.MAX_STRING}"),
    (["--max-new-tokens", "513"], "above the model's context (seq_len 512)"),
    (["--temperature", "nan"], "--temperature: expected a finite number"),
    (["--top-p", "0"], "--top-p: expected a finite number in (0, 1]"),
    (["--seed", "1.5"], "--seed: expected a whole number"),
])
def test_out_of_range_numbers_are_one_clear_line(files, tmp_path, capsys, extra, match):
    out = tmp_path / "o.jsonl"
    assert main(gen_args(files, out, *extra)) == 2
    assert match in one_error(capsys)
    assert not out.exists() and not list(tmp_path.iterdir())


@pytest.mark.parametrize("argv,match", [
    (["ablate", "--n", "1e20"], "--n: expected a whole number"),
    (["ablate", "--n", str(10 ** 12)], f"from 1 to {limits.MAX_ABLATE_N}"),
    (["compile", "--max-string", "10000000"], f"from 1 to {limits.MAX_STRING}"),
])
def test_ablate_and_compile_numbers_are_bounded(capsys, argv, match):
    t = time.perf_counter()
    assert main(argv) == 2
    assert match in one_error(capsys) and time.perf_counter() - t < 5


def test_output_in_a_missing_directory_or_a_directory_is_one_line(files, tmp_path, capsys):
    assert main(gen_args(files, tmp_path / "nowhere" / "o.jsonl")) == 2
    assert "does not exist" in one_error(capsys)
    assert main(gen_args(files, tmp_path)) == 2
    assert "is a directory" in one_error(capsys)
    assert main(gen_args(files, tmp_path / "o.jsonl", "--resume", "--force")) == 2
    assert "pick one" in one_error(capsys)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("flag", ["--tasks", "--checkpoint", "--tools"])
def test_out_naming_an_input_file_is_refused_even_with_force(files, tmp_path, capsys, flag):
    victim = tmp_path / "input"
    victim.write_bytes((files / {"--tasks": "tasks.txt", "--checkpoint": "model.bin", "--tools": "tools.json"}[flag])
                       .read_bytes())
    before = victim.read_bytes()
    args = gen_args(files, victim, "--force")
    if flag in args:
        args[args.index(flag) + 1] = str(victim)
    else:
        args += [flag, str(victim)]
    assert main(args) == 2
    assert f"is the {flag} file" in one_error(capsys)
    assert victim.read_bytes() == before


def test_jsonl_max_new_tokens_above_the_context_names_the_line(files, tmp_path, capsys):
    tasks = tmp_path / "t.jsonl"
    tasks.write_text('{"task": "a"}\n{"task": "b", "max_new_tokens": 100000}\n')
    assert main(gen_args(files, tmp_path / "o.jsonl", tasks=tasks)) == 2
    assert "line 2" in (msg := one_error(capsys)) and "100000" in msg and "context" in msg


def test_seeds_of_any_size_are_reduced_to_63_bits(files, tmp_path):
    base = ["--temperature", "0.9", "--max-new-tokens", "8"]
    outs = {}
    for seed in ("3", str(3 + 2 ** 63), str(3 - 2 ** 63), "10000000000000", str(2 ** 200)):
        out = tmp_path / f"s{len(outs)}.jsonl"
        assert main(gen_args(files, out, *base, "--seed", seed)) == 0
        outs[seed] = [r["text"] for r in records(out)]
        assert json.loads(fingerprint.run_file(out).read_text())["settings"]["seed"] == int(seed) % 2 ** 63
    assert outs["3"] == outs[str(3 + 2 ** 63)] == outs[str(3 - 2 ** 63)]
    assert limits.task_seed(2 ** 63 - 1, 10 ** 6) < 2 ** 63


def test_batch_size_is_clamped_to_the_tasks_and_refused_when_the_kv_cache_cannot_fit(files, full, tmp_path,
                                                                                    capsys, monkeypatch):
    import torch
    from batchmask.models.llama import load_checkpoint
    out = tmp_path / "big.jsonl"
    assert main(gen_args(files, out, "--batch-size", "100000")) == 0          # 10 tasks: 10 slots, not 100000
    assert records(out) == records(full)
    # the estimate's KV part is what setup_cache really allocates
    model = load_checkpoint(files / "model.bin")
    model.setup_cache(5)
    total, kv = limits.generation_bytes(model.config, 5, 16, torch.float32)
    assert kv == model.k_cache.nbytes + model.v_cache.nbytes and total > kv
    # a device with room for about 3 rows: 4 are refused before anything is allocated or written
    monkeypatch.setattr(limits, "available_memory", lambda device: int(total / 5 * 3.5))
    out2 = tmp_path / "o2.jsonl"
    assert main(gen_args(files, out2)) == 2
    msg = one_error(capsys)
    assert "batch size 4" in msg and "at most 3 rows fit" in msg and not out2.exists()


# --- Ctrl-C at any moment -------------------------------------------------------------------------
def _env():
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def test_sigint_during_imports_and_model_load_exits_130_without_a_traceback(files, tmp_path):
    out = tmp_path / "o.jsonl"
    cmd = [sys.executable, "-m", "batchmask", *gen_args(files, out)]
    # Before batchmask's first line runs, a Ctrl-C is Python's own: start after twice a bare interpreter's startup
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], env=_env(), check=True)
    start = 2 * (time.perf_counter() - t)
    for delay in (start, start + 0.2, start + 0.5, start + 1.0):
        proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        if proc.returncode == 0:        # the machine was fast enough to finish first: nothing to check
            continue
        assert proc.returncode == 130 and "Traceback" not in err and "interrupted" in err, (delay, err)
        assert not out.exists() or all(json.loads(x) for x in out.read_text().split("\n") if x)
        assert not (tmp_path / "o.jsonl.lock").exists()
        for p in tmp_path.glob("o.jsonl*"):
            p.unlink()


def test_torchrun_checks_the_output_once_and_never_overwrites_without_force(files, full, tmp_path):
    out = tmp_path / "o.jsonl"
    out.write_bytes(full.read_bytes())
    before = out.read_bytes()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
           str(29700 + os.getpid() % 1000), "-m", "batchmask", *gen_args(files, out), "--device", "cpu"]
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    # rank 0 alone says why, in one line (torchrun then reports the failed ranks in its own words)
    ours = [ln for ln in done.stderr.splitlines() if ln.startswith("batchmask:")]
    assert len(ours) == 1 and "o.jsonl exists; pass --resume" in ours[0], done.stderr[-3000:]
    assert out.read_bytes() == before and not list(tmp_path.glob("o.jsonl.part*"))
    # an input every rank reads alike and refuses before they join: said once too
    bad = tmp_path / "tasks.jsonl"
    bad.write_text('{"task": "fine"}\n{"task": 3}\n')
    cmd[cmd.index(str(files / "tasks.txt"))] = str(bad)
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    ours = [ln for ln in done.stderr.splitlines() if ln.startswith("batchmask:")]
    assert done.returncode != 0 and len(ours) == 1 and "tasks.jsonl line 2" in ours[0], done.stderr[-3000:]
    assert not list(tmp_path.glob("*.lock"))


def test_torchrun_stopped_mid_run_keeps_its_parts_without_locks_and_resumes_to_one_run(files, tmp_path):
    tasks = tmp_path / "tasks.txt"
    tasks.write_text("".join(f"compute {i} plus {i}\n" for i in range(300)))
    one = tmp_path / "one.jsonl"
    assert main(gen_args(files, one, tasks=tasks)) == 0                    # the reference: one process
    out = tmp_path / "o.jsonl"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
           str(29800 + os.getpid() % 100), "-m", "batchmask", *gen_args(files, out, tasks=tasks), "--device", "cpu"]
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    part = tmp_path / "o.jsonl.part1"
    deadline = time.monotonic() + 240
    while not (part.exists() and part.stat().st_size > 0) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)                                       # a scheduler stops the job
    _, err = proc.communicate(timeout=120)
    assert "Traceback" not in "".join(ln for ln in err.splitlines() if ln.startswith("batchmask"))
    assert not list(tmp_path.glob("*.lock")), sorted(p.name for p in tmp_path.iterdir())
    kept = [r for p in tmp_path.glob("o.jsonl.part*") for r in records(p)]
    assert proc.returncode != 0 and 0 < len(kept) < 300, (proc.returncode, len(kept))     # stopped mid-run
    assert main(gen_args(files, out, "--resume", tasks=tasks)) == 0        # one process finishes what is left
    assert records(out) == records(one) and not list(tmp_path.glob("o.jsonl.part*"))
