"""Ctrl-C swept across a run's first moments (issue 27): from the first line batchmask runs, every stop is
"batchmask: interrupted" and 130, never a traceback, and nothing half-written is left.

Before that line only the interpreter runs (its start-up, site-packages' .pth files, the launcher's own
imports): a Ctrl-C there is Python's default KeyboardInterrupt, which no program can change. batchmask's part
of the window is its package's first import (batchmask/__init__.py, light by design) and batchmask/console.py
(or __main__.py), which installs the handler before anything else is imported. The sweep checks that order:
an outcome may be the interpreter's own only before the first of ours, and it never names a batchmask file.
"""
from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_hostile import files  # noqa: F401  (the fixture: a tiny model, tokenizer and tasks)
from tests.test_runfiles import _env, gen_args

# a frame in batchmask's own code (the package's folders in this checkout), other than __main__.py's one line
# (importing console.py, which installs the handler: `python -m` runs that line before anything of ours can). A
# folder named batchmask above the checkout (a clone at .../batchmask, its .venv inside) is not ours
ROOT = Path(__file__).resolve().parents[1]
OURS = re.compile(r'File "' + re.escape(str(ROOT)) + r'[/\\](?:batchmask|kernels|models)[/\\](?!__main__\.py")')


def _outcome(cmd, delay: float, out) -> tuple[str, int, str]:
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    rc = proc.returncode
    if rc == 130 and err.strip().splitlines()[-1:] == ["batchmask: interrupted"] and "Traceback" not in err:
        return "ours", rc, err
    if rc == -signal.SIGINT and not err:                   # before Python's own handler: killed by the signal
        return "before python", rc, err
    if rc in (1, -signal.SIGINT) and "KeyboardInterrupt" in err and not OURS.search(err):
        return "interpreter", rc, err                      # Python's default handler, in its own start-up
    if rc == 0:
        return "finished", rc, err
    return "wrong", rc, err


@pytest.mark.parametrize("launch", ["python -m", "console script"])
def test_sigint_swept_over_start_up_is_ours_from_batchmasks_first_line(files, tmp_path, launch):  # noqa: F811
    out = tmp_path / "o.jsonl"
    script = Path(sys.executable).with_name("batchmask")                # pip's wrapper, beside the interpreter
    if launch == "console script" and not script.is_file():
        pytest.skip(f"no console script at {script} (batchmask not pip-installed in this environment)")
    cmd = [*([str(script)] if launch == "console script" else [sys.executable, "-m", "batchmask"]),
           *gen_args(files, out)]
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], env=_env(), check=True)
    bare = time.perf_counter() - t                         # a bare interpreter's start-up on this machine
    delays = [bare * k / 8 for k in range(20)] + [bare * (3 + k) for k in range(6)]   # 0 to ~8x that
    seen = []                                              # (delay, outcome)
    for delay in delays:
        kind, rc, err = _outcome(cmd, delay, out)
        assert kind != "wrong", (delay, rc, err[-4000:])
        assert not (tmp_path / "o.jsonl.lock").exists() and not list(tmp_path.glob("*.tmp"))
        if out.exists():                                   # only complete lines, if any were written
            assert all(line.startswith('{"index": ') for line in out.read_text().split("\n") if line)
            out.unlink()
        for p in tmp_path.glob("o.jsonl*"):
            p.unlink()
        seen.append((round(delay, 4), kind))
    # the interpreter's window comes first; once batchmask's handler is in place it stays ours (allowing for the
    # spread of process start-up between tries: half a bare start-up)
    first_ours = next(d for d, kind in seen if kind == "ours")
    assert all(kind in ("ours", "finished") for d, kind in seen if d >= first_ours + bare / 2), seen
