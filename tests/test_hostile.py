"""Hostile inputs (issue 27): output paths that are not regular files, read-only and full disks.

Every writer goes through batchmask/safe_write.py; these tests drive it through the command line (generate,
compile, the checkpoint writer) and check the thing in the way survives untouched. The device node is made
with os.mknod (skipped where the kernel or the sandbox does not allow it); a FIFO always.
"""
from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

import pytest
from batchmask.models.checkpoint import ModelConfig, random_weights, write_checkpoint
from batchmask.models.export import main as export_main

from batchmask import safe_write
from batchmask.run.cli import main
from batchmask.run.grammar_store import cache_dir_of
from tests.test_runfiles import gen_args, one_error, records, tokenizer


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    tok = tokenizer()
    tok.write_bin(d / "tokenizer.bin")
    config = ModelConfig(dim=16, hidden_dim=32, n_layers=1, n_heads=2, n_kv_heads=2, vocab_size=tok.vocab_size,
                         seq_len=512)
    write_checkpoint(d / "model.bin", config, random_weights(config, seed=0, std=0.5))
    (d / "tasks.txt").write_text("".join(f"compute {i} plus {i}\n" for i in range(3)))
    return d


# --- things in the way ----------------------------------------------------------------------------------
def _fifo(p: Path) -> str:
    os.mkfifo(p)
    return "FIFO"


def _device(p: Path) -> str:
    try:
        os.mknod(p, 0o666 | stat.S_IFCHR, os.makedev(1, 3))          # a copy of /dev/null's node
    except (PermissionError, OSError) as e:
        pytest.skip(f"os.mknod not permitted here ({e.strerror})")
    return "character device"


def _directory(p: Path) -> str:
    p.mkdir()
    return "directory"


def _symlink(p: Path) -> str:
    target = p.with_name(p.name + ".target")
    target.write_text("the link's target\n")
    p.symlink_to(target)
    return "symbolic link"


MAKERS = [_fifo, _device, _directory, _symlink]


def _snapshot(p: Path):
    st = os.lstat(p)
    return st.st_mode, st.st_ino, st.st_rdev


def _refused(capsys, p: Path, kind: str) -> None:
    err = one_error(capsys)
    assert str(p) in err and kind in err, err


@pytest.mark.parametrize("make", MAKERS, ids=lambda f: f.__name__[1:])
@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
@pytest.mark.parametrize("which", ["out", "run.json", "lock", "part0"])
def test_generate_never_writes_a_non_regular_path(files, tmp_path, capsys, make, force, which):
    out = tmp_path / "o.jsonl"
    victim = out if which == "out" else out.with_name(f"{out.name}.{which}")
    kind = make(victim)
    before = _snapshot(victim)
    argv = gen_args(files, out, *(["--force"] if force else []), "--grammar-cache", "none",
                    tasks=files / "tasks.txt")
    assert main(argv) == 2
    _refused(capsys, victim, kind)
    assert _snapshot(victim) == before                      # the node (or link, or directory) survives
    if victim != out:
        assert not out.exists()
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.tmp"))


def test_a_regular_out_is_still_replaced_with_force(files, tmp_path, capsys):
    out = tmp_path / "o.jsonl"
    out.write_text("old\n")
    assert main(gen_args(files, out, "--force", "--grammar-cache", "none")) == 0
    assert [r["index"] for r in records(out)] == [0, 1, 2]
    assert stat.S_ISREG(os.lstat(out).st_mode)
    assert not list(tmp_path.glob("*.lock")) and not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize("make", MAKERS, ids=lambda f: f.__name__[1:])
def test_compile_out_is_never_a_node(files, tmp_path, capsys, make):
    out = tmp_path / "g.pt"
    kind = make(out)
    before = _snapshot(out)
    assert main(["compile", "--tokenizer", str(files / "tokenizer.bin"), "--out", str(out)]) == 2
    _refused(capsys, out, kind)
    assert _snapshot(out) == before


@pytest.mark.parametrize("make", [_fifo, _device, _symlink], ids=lambda f: f.__name__[1:])
def test_checkpoint_writer_never_replaces_a_node(files, tmp_path, capsys, make):
    dst = tmp_path / "out.bin"
    kind = make(dst)
    before = _snapshot(dst)
    assert export_main([str(files / "model.bin"), str(dst), "--version", "1"]) == 2
    assert kind in capsys.readouterr().err
    assert _snapshot(dst) == before


@pytest.mark.parametrize("make", [_fifo, _device, _symlink], ids=lambda f: f.__name__[1:])
def test_a_grammar_cache_file_that_is_a_node_is_refused(files, tmp_path, capsys, make):
    """The cache file's name is the tool set's hash: find it from a first run, then put a node there."""
    cache = tmp_path / "cache"
    out = tmp_path / "o.jsonl"
    assert main(gen_args(files, out, "--grammar-cache", str(cache))) == 0
    (entry,) = cache.glob("*.pt")
    entry.unlink()
    kind = make(entry)
    before = _snapshot(entry)
    assert main(gen_args(files, out, "--force", "--grammar-cache", str(cache))) == 2
    _refused(capsys, entry, kind)
    assert _snapshot(entry) == before


# --- file-system errors ---------------------------------------------------------------------------------
# chmod 0o555 does not stop root, and a read-only mount needs privileges the test cannot count on: these tests
# make the file system's own calls fail as a read-only or full disk would (monkeypatched os.open / open).
def _failing_open(monkeypatch, err: int, match: str):
    real_open, real_os_open = open, os.open

    def fake_open(file, *a, **k):
        if match in str(file):
            raise OSError(err, os.strerror(err), str(file))
        return real_open(file, *a, **k)

    def fake_os_open(file, *a, **k):
        if match in str(file):
            raise OSError(err, os.strerror(err), str(file))
        return real_os_open(file, *a, **k)

    monkeypatch.setattr("builtins.open", fake_open)
    monkeypatch.setattr(os, "open", fake_os_open)


def test_a_read_only_cache_directory_falls_back_to_no_cache(files, tmp_path, capsys, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    _failing_open(monkeypatch, errno.EROFS, str(cache))
    out = tmp_path / "o.jsonl"
    assert main(gen_args(files, out, "--grammar-cache", str(cache))) == 0
    err = capsys.readouterr().err
    assert "warning" in err and "not caching" in err and "Read-only file system" in err and "enforce" not in err
    assert [r["index"] for r in records(out)] == [0, 1, 2]
    assert list(cache.iterdir()) == []


def test_compile_out_on_a_read_only_path_is_one_line(files, tmp_path, capsys, monkeypatch):
    out = tmp_path / "g.pt"
    _failing_open(monkeypatch, errno.EROFS, str(tmp_path / ".g.pt"))
    assert main(["compile", "--tokenizer", str(files / "tokenizer.bin"), "--out", str(out)]) == 2
    err = one_error(capsys)
    assert str(out) in err and "read-only" in err and "enforce" not in err
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_a_full_disk_names_the_file(tmp_path):
    def fill(tmp):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    target = tmp_path / "results.jsonl"
    with pytest.raises(safe_write.OutputPathError, match=r"results\.jsonl: cannot write \(No space left"):
        safe_write.write_atomic(target, fill, "--out")
    assert list(tmp_path.iterdir()) == []


def test_grammar_cache_empty_is_refused_not_the_current_directory(files, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="--grammar-cache ''"):
        cache_dir_of("")
    assert main(gen_args(files, tmp_path / "o.jsonl", "--grammar-cache", "")) == 2
    assert "--grammar-cache ''" in one_error(capsys)
    assert list(tmp_path.iterdir()) == []


def test_run_json_that_is_a_directory_leaves_no_tmp(files, tmp_path, capsys):
    out = tmp_path / "o.jsonl"
    (tmp_path / "o.jsonl.run.json").mkdir()
    assert main(gen_args(files, out, "--force", "--grammar-cache", "none")) == 2
    assert "o.jsonl.run.json" in one_error(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.jsonl.run.json"]


def test_symlinked_out_is_refused_and_the_target_kept(files, tmp_path, capsys):
    target = tmp_path / "real.jsonl"
    target.write_text(json.dumps({"x": 1}) + "\n")
    link = tmp_path / "o.jsonl"
    link.symlink_to(target)
    assert main(gen_args(files, link, "--force", "--grammar-cache", "none")) == 2
    assert "symbolic link" in one_error(capsys)
    assert link.is_symlink() and target.read_text() == json.dumps({"x": 1}) + "\n"
