"""Packaging: one import package (batchmask) in the wheel, no recipe in it, and a user's own `models` and
`kernels` packages neither break batchmask nor are hidden by it."""
import ast
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "examples" / "tasks.txt"
# Where each repository folder installs (pyproject's package-dir), and what must never be installed.
INSTALLS_AS = {"batchmask": "batchmask", "kernels": "batchmask/kernels", "models": "batchmask/models"}


def project_files(folder: str = ".") -> list[str]:
    """The project's files under `folder`, relative to the root: tracked ones and new ones git does not ignore
    (what a commit of the working tree holds), that exist."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", folder], cwd=ROOT,
                         capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("not a git checkout: cannot tell which files are the project's")
    return [f for f in out.stdout.split("\0") if f and (ROOT / f).is_file()]


def user_packages(tmp: Path) -> Path:
    """A user's own top-level `models` and `kernels` packages, each failing loudly when imported."""
    for name in ("models", "kernels"):
        (tmp / name).mkdir(parents=True)
        (tmp / name / "__init__.py").write_text(f"raise ImportError('the user\\'s own {name} package')\n")
    return tmp


def run(cmd: list[str], cwd: Path, pythonpath: list[Path]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join(map(str, pythonpath))
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def assert_every_task_gets_a_call(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    n_tasks = sum(1 for line in TASKS.read_text().splitlines() if line.strip())
    assert len(records) == n_tasks
    assert all(r["call"] is not None for r in records), [r for r in records if r["call"] is None][:2]


# --- the runtime does not depend on the recipes or the grammar side -------------------------------
def test_models_and_kernels_import_no_recipe_and_models_nothing_of_the_grammar_side():
    for folder in ("models", "kernels"):
        for path in sorted((ROOT / folder).glob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    # a relative import stays inside its own package (models/ or kernels/)
                    names = [node.module or ""] if node.level == 0 else []
                for name in names:
                    where = f"{path.relative_to(ROOT)}:{node.lineno} imports {name}"
                    assert name.split(".")[0] not in ("recipes", "models", "kernels"), where
                    if folder == "models" and name.startswith("batchmask"):
                        assert name == "batchmask.models" or name.startswith("batchmask.models."), where


# --- the wheel --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel `pip wheel .` builds from the project's files (without build isolation: no network needed).

    Built from a copy of what a commit would hold (tracked and new unignored files), so no build/ folder is
    left in the checkout and none left there by an earlier build (setuptools reuses build/lib, stale files
    included) can leak into this wheel.
    """
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    for f in project_files():
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, src / f)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
                           "-q", "-w", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (whl,) = out.glob("batchmask-*.whl")
    return whl


def test_wheel_holds_one_top_level_package_with_everything_it_needs(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"batchmask"}
    # every module of the three folders, at its import path; no recipe, no test
    for folder, target in INSTALLS_AS.items():
        for f in project_files(folder):
            if f.endswith(".py"):
                assert f"{target}/{f[len(folder) + 1:]}" in names, f
    for f in project_files("models/default"):
        assert f"batchmask/models/default/{Path(f).name}" in names, f
    assert "batchmask/py.typed" in names
    assert not [n for n in names if n.startswith(("recipes", "tests", "batchmask/recipes"))]
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    metadata = zipfile.ZipFile(wheel).read(meta).decode()
    assert "License-Expression: Apache-2.0" in metadata
    license_file = next(n for n in names if n.endswith(".dist-info/licenses/LICENSE"))
    assert zipfile.ZipFile(wheel).read(license_file) == (ROOT / "LICENSE").read_bytes()


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler here")
def test_wheel_holds_the_compiled_helpers_where_a_compiler_is(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    for ext in ("batchmask/table/_native.", "batchmask/automaton/_native."):
        assert [n for n in names if n.startswith(ext) and n.endswith((".so", ".pyd"))], (ext, names)


def test_a_machine_without_a_compiler_installs_and_compiles_on_the_reference(tmp_path):
    """setup.py marks the C extension optional: with no working compiler (CC=/bin/false) the wheel still builds,
    holds no extension, and the installed package compiles a grammar on the numpy/torch path."""
    src, out, site = tmp_path / "src", tmp_path / "wheel", tmp_path / "site"
    for f in project_files():
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, src / f)
    env = {**os.environ, "CC": "/bin/false", "LDSHARED": "/bin/false"}
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(out)], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (whl,) = out.glob("batchmask-*.whl")
    assert not [n for n in zipfile.ZipFile(whl).namelist() if n.endswith((".so", ".pyd"))]
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "-q", "--target",
                           str(site), str(whl)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    probe = ("from batchmask.table.native import helpers\n"
             "from batchmask.automaton.extension import helpers as subsets\n"
             "from batchmask import compile_json_schema\n"
             "from types import SimpleNamespace\n"
             "tok = SimpleNamespace(token_bytes=[bytes([b]) for b in range(256)] + [b''], eos_id=256)\n"
             "g = compile_json_schema({'type': 'object', 'properties': {'a': {'type': 'integer'}}}, tok)\n"
             "print(helpers is None, subsets is None, g.num_states > 0)\n")
    proc = run([sys.executable, "-c", probe], tmp_path, [site])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["True", "True", "True"]


def test_installed_wheel_generates_with_the_users_models_and_kernels_first(wheel, tmp_path):
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "-q", "--target",
                           str(site), str(wheel)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    user = user_packages(tmp_path / "user")
    # the copy that runs is the installed one, not the repository's, and it does not hide the user's packages
    probe = ("import batchmask, batchmask.kernels, batchmask.models, pathlib\n"
             "print(pathlib.Path(batchmask.models.__file__).resolve())\n"
             "try:\n    import models\nexcept ImportError as e:\n    print(e)\n")
    proc = run([sys.executable, "-c", probe], tmp_path, [user, site])
    assert proc.returncode == 0, proc.stderr[-2000:]
    where, users_error = proc.stdout.splitlines()
    assert Path(where).is_relative_to(site.resolve()) and users_error == "the user's own models package"
    assert_every_task_gets_a_call(run([sys.executable, "-m", "batchmask", "generate", "--tasks", str(TASKS)],
                                      tmp_path, [user, site]))


# --- the editable install (the README's set-up) -----------------------------------------------
def test_console_script_generates_with_the_users_models_and_kernels_first(tmp_path):
    script = Path(sys.executable).with_name("batchmask")
    if not script.exists():
        pytest.skip(f"no console script beside {sys.executable} (batchmask is not pip-installed here)")
    user = user_packages(tmp_path / "user")
    assert_every_task_gets_a_call(run([str(script), "generate", "--tasks", str(TASKS)], tmp_path, [user]))


# --- triton is the cuda extra's, not a base requirement ---------------------------------------------
def _requirements(wheel: Path, extra: str) -> set[str]:
    """The distributions pip installs for `batchmask[extra]` ("" for none) on Linux, from the wheel's METADATA."""
    from packaging.requirements import Requirement
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    names = set()
    for line in meta.splitlines():
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.partition(":")[2].strip())
            env = {"extra": extra, "sys_platform": "linux", "platform_system": "Linux"}
            if req.marker is None or req.marker.evaluate(env):
                names.add(req.name.lower())
    return names


def test_a_cpu_install_needs_no_triton(wheel):
    base = _requirements(wheel, "")
    assert {"torch", "numpy", "sentencepiece", "tokenizers", "safetensors", "jinja2"} <= base
    assert "triton" not in base
    assert "triton" in _requirements(wheel, "cuda") and "triton" in _requirements(wheel, "test")
    assert "matplotlib" in _requirements(wheel, "bench") and "matplotlib" not in base


# Run in a fresh interpreter in which triton cannot be found, as on a CPU machine that never installed it:
# every finder on sys.meta_path answers "no such module" for triton (importlib.util.find_spec gives None).
WITHOUT_TRITON = r'''
import importlib, json, os, pkgutil, sys

class Hidden:
    def __init__(self, inner):
        self.inner = inner
    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            return None
        find = getattr(self.inner, "find_spec", None)
        return find(name, path, target) if find else None
    def __getattr__(self, name):
        return getattr(self.inner, name)

sys.meta_path[:] = [Hidden(f) for f in sys.meta_path]
report = {}
try:
    import triton  # noqa: F401
    report["hidden"] = False
except ModuleNotFoundError:
    report["hidden"] = importlib.util.find_spec("triton") is None

import batchmask, batchmask.kernels, batchmask.models
failed = {}
# kernels/ and models/ install as batchmask.kernels and batchmask.models from folders of their own: walked apart
modules = [m for pkg in (batchmask, batchmask.kernels, batchmask.models)
           for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".")]
for m in modules:
    if m.name.endswith("__main__"):          # `python -m batchmask` itself: importing it runs the command line
        continue
    try:
        importlib.import_module(m.name)
    except Exception as e:
        failed[m.name] = f"{type(e).__name__}: {e}"
report["failed_imports"] = failed
report["modules"] = len(modules)

from batchmask.run.cli import main
report["generate"] = main(["generate", "--tasks", sys.argv[1], "--out", sys.argv[2], "--quiet",
                           "--grammar-cache", "none"])

import torch
from batchmask import BatchMasker, ToolRegistry, compile_grammar
from batchmask.models import load_tokenizer
from batchmask.run.loading import DEFAULT_DIR
g = compile_grammar(ToolRegistry.defaults(), load_tokenizer(DEFAULT_DIR / "tokenizer.model"))
m = BatchMasker(g, batch_size=2, device="cpu")
report["backend"] = m.backend
report["legal"] = m.apply_(torch.zeros(2, g.vocab_size)).tolist()
try:
    BatchMasker(g, batch_size=2, device="cpu", backend="triton")
except ValueError as e:
    report["triton_backend"] = str(e)
report["loaded"] = sorted(n for n in sys.modules if n == "triton" or n.startswith("triton."))
print(json.dumps(report))
'''


def test_generate_compile_and_mask_run_without_triton(tmp_path):
    out = tmp_path / "calls.jsonl"
    env = {**os.environ, "TRITON_INTERPRET": "1"}     # the triton backend's first check passes: the second speaks
    proc = subprocess.run([sys.executable, "-c", WITHOUT_TRITON, str(TASKS), str(out)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.splitlines()[-1])
    assert report["hidden"] is True                            # the interpreter really has no triton
    # every module imports without it but the Triton kernels themselves
    n_modules = sum(1 for folder in INSTALLS_AS for f in project_files(folder)
                    if f.endswith(".py") and not f.endswith(("__init__.py", "__main__.py")))
    assert report["modules"] >= n_modules           # every module was tried (packages count too)
    assert list(report["failed_imports"]) == ["batchmask.kernels.mask_triton"], report["failed_imports"]
    assert "No module named 'triton'" in report["failed_imports"]["batchmask.kernels.mask_triton"]
    assert report["generate"] == 0
    assert_every_task_gets_a_call(subprocess.CompletedProcess([], 0, out.read_text(), ""))
    assert report["backend"] == "torch" and all(n > 0 for n in report["legal"])
    assert "needs triton, and none is installed: pip install 'batchmask[cuda]'" in report["triton_backend"]
    assert report["loaded"] == []
