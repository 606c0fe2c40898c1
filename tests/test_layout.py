"""The tree is the pipeline: no import cycle among batchmask's modules, a docstring on every package, small modules.

The import graph is read from the source with `ast` (every import, deferred ones inside functions included;
imports under `if TYPE_CHECKING:` aside), not from what Python happened to load: a deferred import that
closes a cycle is a layering problem even when it never runs at import time.
"""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"batchmask": "batchmask", "kernels": "batchmask.kernels", "models": "batchmask.models"}


def _modules() -> dict[str, Path]:
    mods = {}
    for folder, pkg in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            if "default" in path.relative_to(ROOT / folder).parts:
                continue
            parts = [pkg, *path.relative_to(ROOT / folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join(parts)] = path
    return mods


def _type_checking_lines(tree) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            lines |= {n.lineno for n in ast.walk(node) if hasattr(n, "lineno")}
    return lines


def _edges(mods: dict[str, Path]) -> dict[str, set[str]]:
    edges = {m: set() for m in mods}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = _type_checking_lines(tree)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in skip:
                continue
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:       # `from pkg import mod` is an edge to the module, not the package
                    sub = f"{target}.{alias.name}"
                    edges[name].add(sub if sub in mods else target)
            elif isinstance(node, ast.Import):
                edges[name] |= {a.name for a in node.names}
        edges[name] = {t for t in edges[name] if t in mods and t != name}
    return edges


def _reach(edges: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), list(edges[start])
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(edges.get(m, ()))
    return seen


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The modules on a cycle, grouped: each group is the modules that reach each other."""
    reach = {m: _reach(edges, m) for m in edges}
    groups = {frozenset(n for n in reach[m] if m in reach[n]) | {m} for m in edges if m in reach[m]}
    return sorted(sorted(g) for g in groups)


def test_no_import_cycle():
    assert _cycles(_edges(_modules())) == []


def test_cycle_finder_catches_a_cycle():
    # The companion: the finder is not blind (a -> b -> c -> a, plus a module outside the cycle).
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(edges) == [["a", "b", "c"]]


def test_few_modules_at_the_top():
    top = [p.name for p in (ROOT / "batchmask").glob("*.py")]
    assert len(top) <= 16, sorted(top)


def test_every_package_says_its_job():
    for init in (ROOT / "batchmask").rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        assert doc and len(doc.split()) >= 10, f"{init.relative_to(ROOT)} has no docstring that says its job"


def test_no_module_is_long():
    for path in _modules().values():
        lines = len(path.read_text(encoding="utf-8").splitlines())
        assert lines <= 450, f"{path.relative_to(ROOT)}: {lines} lines"


def test_lower_layers_do_not_import_the_run():
    # grammar, automaton, table and schema sit below the tools and the run: none imports them.
    edges = _edges(_modules())
    low = ("batchmask.grammar", "batchmask.automaton", "batchmask.table", "batchmask.schema", "batchmask.compiler")
    high = ("batchmask.tools", "batchmask.run", "batchmask.evaluation", "batchmask.api", "batchmask.masker")
    for mod, targets in edges.items():
        if mod.startswith(low):
            bad = [t for t in targets if t.startswith(high)]
            assert not bad, f"{mod} imports {bad}"
