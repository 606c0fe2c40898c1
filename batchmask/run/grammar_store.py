"""Per-task tool sets: each distinct one validated, compiled once, and cached in memory and on disk.

    store = GrammarStore(tokenizer, format="json", cache_dir=default_cache_dir())
    g = store.grammar(registry)            # memory, else a checked cache file, else compile (and save)
    g = store.together([reg0, reg1, ...])  # several tool sets compiled into one table, a start each
    plan = plan_tasks(taskfile, registry)  # which tool set each task uses; every one validated up front

A cache file is named by the sha256 of what its grammar depends on (the registry's canonical form,
the call format, max_string, utf8, the schema options, the vocabulary hash, size and stop ids), and
still holds and checks that key itself (CompiledGrammar.load): a file that is corrupt or was built
for something else is never trusted: it is recompiled and replaced, with a warning. Files are written
atomically (a temporary file beside it, then os.replace), so ranks of one torchrun run, or two runs,
may share a directory. The default directory is $BATCHMASK_CACHE_DIR, else $XDG_CACHE_HOME/batchmask,
else ~/.cache/batchmask; `--grammar-cache none` keeps the cache in memory only.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from .. import api
from ..compiler.cache import CACHE_FORMAT
from ..compiler.compiled import GrammarCacheError
from ..safe_write import NotRegularFileError, OutputPathError, check_target
from ..table.tokensim import stop_ids_of, vocab_hash_of
from ..text import say_warning
from ..tools.registry import RegistryError, ToolRegistry
from .schema_task import SchemaTask

NO_CACHE = "none"


def default_cache_dir() -> Path:
    """$BATCHMASK_CACHE_DIR, else $XDG_CACHE_HOME/batchmask, else ~/.cache/batchmask."""
    if os.environ.get("BATCHMASK_CACHE_DIR"):
        return Path(os.environ["BATCHMASK_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "batchmask"


def cache_dir_of(value: str | None) -> Path | None:
    """The --grammar-cache flag: None -> the default directory, "none" -> no disk cache, else that path."""
    if value is None:
        return default_cache_dir()
    if value.strip().lower() == NO_CACHE:
        return None
    if not value.strip():             # Path("") is the current directory: an empty value is a slip, not a choice
        raise ValueError("--grammar-cache '': empty; give a directory, or 'none' for no disk cache")
    return Path(value)


def _warn(message: str) -> None:
    say_warning(message)


# --- the store ------------------------------------------------------------------------------------
class GrammarStore:
    """Compiled call grammars of one tokenizer and one set of options, by tool set."""

    def __init__(self, tokenizer, *, format: str = "seed", max_string: int = 256, utf8: bool = True,
                 options=None, device="cpu", cache_dir: Path | None = None, warn=_warn):
        self.tokenizer, self.format, self.max_string, self.utf8 = tokenizer, format, max_string, bool(utf8)
        self.options, self.device, self.warn = options, device, warn
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.memory: dict[str, object] = {}
        self.compiled = 0                 # grammars compiled by this store (the rest came from memory or disk)
        self.loaded = 0                   # grammars read from cache files
        self._vocab = {"vocab_hash": vocab_hash_of(tokenizer), "vocab_size": len(tokenizer.token_bytes),
                       "stop_ids": list(stop_ids_of(tokenizer))}
        self._unwritable = False

    def key(self, registry) -> dict:
        """Everything the grammar of `registry` (a ToolRegistry, or a task's SchemaTask) depends on (JSON-able)."""
        if isinstance(registry, SchemaTask):
            return {"cache": CACHE_FORMAT, "grammar": registry.grammar_key(), **self._vocab}
        return {"cache": CACHE_FORMAT, "grammar": api.call_grammar_key(registry, self.format, self.max_string,
                                                                        self.utf8, self.options), **self._vocab}

    def key_hash(self, registry: ToolRegistry) -> str:
        blob = json.dumps(self.key(registry), ensure_ascii=False, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def path(self, registry: ToolRegistry) -> Path | None:
        return None if self.cache_dir is None else self.cache_dir / f"{self.key_hash(registry)}.pt"

    def grammar(self, registry: ToolRegistry):
        """The compiled grammar of `registry`: from memory, a checked cache file, or compiled now (and saved)."""
        h = self.key_hash(registry)
        if h in self.memory:
            return self.memory[h]
        path = self.path(registry)
        g = self._load(path, registry) if path is not None and path.exists() else None
        if g is None:
            g = registry.compile(self.tokenizer, self.device) if isinstance(registry, SchemaTask) else \
                api.compile_grammar(registry, self.tokenizer, format=self.format, max_string=self.max_string,
                                    utf8=self.utf8, options=self.options, device=self.device)
            self.compiled += 1
            if path is not None:
                self._save(g, path)
        self.memory[h] = g
        return g

    def together(self, registries: list, where: list | None = None, utf8: bool | None = None):
        """Several tool sets (or schema tasks) in one table, `starts[i]` for registries[i]: from memory, a
        checked cache file, or compiled together now (api.compile_grammars: what they share is compiled once)
        and saved. One set is store.grammar's. A set the compiler refuses is named by `where` (its task)."""
        where = where or [None] * len(registries)
        hashes = [self.key_hash(r) for r in registries]
        first = {h: i for i, h in reversed(list(enumerate(hashes)))}       # equal tool sets (another form of
        if len(first) < len(registries):                                     # the same tools): compiled once
            keep = sorted(first.values())
            g = self.together([registries[i] for i in keep], [where[i] for i in keep], utf8)
            view = copy.copy(g)
            view.starts = [g.starts[keep.index(first[h])] for h in hashes]
            return view
        if len(registries) == 1:
            return self.grammar(registries[0])
        utf8 = self.utf8 if utf8 is None else bool(utf8)
        args = dict(format=self.format, max_string=self.max_string, utf8=utf8, options=self.options)
        keys = [self.key(r) for r in registries]
        blob = json.dumps({"together": keys, "utf8": utf8}, ensure_ascii=False, sort_keys=True,
                          separators=(",", ":"))
        h = hashlib.sha256(blob.encode("utf-8")).hexdigest()
        if h in self.memory:
            return self.memory[h]
        path = None if self.cache_dir is None else self.cache_dir / f"{h}.pt"
        g = None
        if path is not None and path.exists():
            try:
                g = api.load_grammars(path, registries, self.tokenizer, device=self.device, **args)
                self.loaded += 1
            except GrammarCacheError as e:
                self.warn(f"{e}; compiling it again and replacing the file")
        if g is None:
            try:
                g = api.compile_grammars(registries, self.tokenizer, device=self.device, **args)
            except ValueError:
                for reg, w in zip(registries, where):      # the set refused (its task named), if one alone is
                    _named(w, api.compile_grammars, [reg], self.tokenizer, device=self.device, **args)
                raise
            self.compiled += 1
            if path is not None:
                self._save(g, path)
        self.memory[h] = g
        return g

    def _load(self, path: Path, registry: ToolRegistry):
        check_target(path, "grammar cache file")      # a FIFO would hang the read; a node is never replaced
        try:
            if isinstance(registry, SchemaTask):
                g = registry.load(path, self.tokenizer, self.device)
            else:
                g = api.load_grammar(path, registry, self.tokenizer, format=self.format, max_string=self.max_string,
                                     utf8=self.utf8, options=self.options, device=self.device)
        except GrammarCacheError as e:
            self.warn(f"{e}; compiling it again and replacing the file")
            return None
        self.loaded += 1
        return g

    def _save(self, g, path: Path) -> None:
        if self._unwritable:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            self._cannot_cache(path, e.strerror or str(e))
            return
        try:
            g.save(path)                  # through a temporary file beside it (batchmask/safe_write.py)
        except NotRegularFileError:
            raise                         # a node or link where a cache file goes: refused, never replaced
        except OutputPathError as e:
            self._cannot_cache(path, str(e).partition(": ")[2])

    def _cannot_cache(self, path: Path, reason: str) -> None:
        self._unwritable = True           # one warning per run; the grammars stay in memory
        self.warn(f"grammar cache {path.parent} is not writable ({reason}); not caching grammars "
                  f"(--grammar-cache DIR or none)")


# --- which tool set each task uses ----------------------------------------------------------------
@dataclass
class TaskPlan:
    """The distinct tool sets of a run and which one each task uses (0: the run's --tools / default)."""
    registries: list[ToolRegistry]
    groups: list[int]                                  # per task, an index into registries
    where: list = field(default_factory=list)          # per registry, the task line it came from (None: --tools)

    def for_tasks(self, indices: list[int]) -> tuple[list[ToolRegistry], list[int]]:
        """The tool sets the tasks at `indices` use (in order of `registries`: the run's own first, if any task
        uses it), and each task's index into them."""
        used = sorted({self.groups[i] for i in indices}) or [0]
        new = {g: k for k, g in enumerate(used)}
        return [self.registries[g] for g in used], [new[self.groups[i]] for i in indices]


def run_choice(args):
    """The run's ToolChoice from --tool-choice, --parallel-tool-calls, --max-calls (None: none of them given)."""
    from ..tools.choice import DEFAULT_MAX_CALLS, ToolChoice
    if args.tool_choice is None and args.parallel_tool_calls is None and args.max_calls is None:
        return None
    return ToolChoice.from_cli(args.tool_choice, parallel=args.parallel_tool_calls != "false",
                               max_calls=args.max_calls or DEFAULT_MAX_CALLS)


def plan_tasks(taskfile, registry: ToolRegistry, options=None, choice=None, format: str = "seed") -> TaskPlan:
    """Parse every task's own "tools" (any form --tools accepts) or "schema" (batchmask.run.schema_task) once per
    distinct value, under the run's tool `choice` (batchmask.tools.choice.ToolChoice; None: one call) and the
    task's own "tool_choice" / "parallel_tool_calls" (`taskfile.choices`); a bad one is refused naming its task
    file line and task number."""
    from ..tools.choice import check_choice
    check_choice(choice, registry, format, getattr(registry, "source", "--tools"))
    plan = TaskPlan([registry.with_choice(choice)], [], [None])
    seen: dict[str, int] = {}
    n = len(taskfile.tasks)
    tools = getattr(taskfile, "tools", None) or [None] * n
    schemas = getattr(taskfile, "schemas", None) or [None] * n
    choices = getattr(taskfile, "choices", None) or [None] * n
    requests = getattr(taskfile, "requests", None) or []          # a Batch API file's requests (run/openai_batch.py)
    for i, (obj, schema, fields) in enumerate(zip(tools, schemas, choices)):
        fields = {} if schema is not None or fields is None else fields     # a schema task makes no calls
        if obj is None and schema is None and not fields:
            plan.groups.append(0)
            continue
        text = json.dumps([obj, schema, fields], ensure_ascii=False, sort_keys=True, separators=(",", ":"))
        if text not in seen:
            what = "tools" if obj is not None else "schema" if schema is not None else "tool_choice"
            where = f"{taskfile.name} line {taskfile.lines[i]} (task {i}) \"{what}\""
            try:
                reg = _task_registry(registry, obj, schema, fields, choice, format, options, where)
            except (RegistryError, ValueError) as e:
                if not requests:                       # a Batch API file answers it (status 400); others stop
                    raise
                seen[text] = (getattr(e, "param", None) or ("response_format" if what == "schema" else what), str(e))
            else:
                seen[text] = len(plan.registries)
                plan.registries.append(reg)
                plan.where.append(where)
        if isinstance(seen[text], tuple):              # a request that cannot run: refused, never scheduled
            requests[i]["refused"] = seen[text]
            plan.groups.append(0)
            continue
        plan.groups.append(seen[text])
    return plan


def _task_registry(registry, obj, schema, fields, choice, format, options, where):
    """One task's own tool set (or schema task) under its tool choice."""
    from ..tools.choice import check_choice, resolve_choice
    if obj is not None and schema is not None:
        raise RegistryError(f"{where}: a task has \"tools\" or a \"schema\", not both")
    if schema is not None:
        return SchemaTask(schema, where, options)
    base = registry if obj is None else ToolRegistry.from_obj(obj, source=where, options=options)
    try:
        own = resolve_choice(choice, fields, where)
        check_choice(own, base, format, where)
    except (RegistryError, ValueError) as e:
        e.param = "parallel_tool_calls" if "parallel_tool_calls" in str(e) else "tool_choice"   # a 400's field
        raise
    return base.with_choice(own)


# --- a run's table ----------------------------------------------------------------------------------
def run_grammars(args, plan: TaskPlan, todo: list[int], tokenizer, device):
    """(table or None for the free arm, tool sets, group per task) for the tasks at `todo`, every grammar
    compiled or loaded before the first token: the `generate` command's options (`args`) say how."""
    from ..compiler.sets import combine
    regs, groups = plan.for_tasks(todo)
    where = [plan.where[plan.registries.index(r)] for r in regs]
    if args.no_constrain:            # the free arm compiles nothing: check the format and the schemas here
        for k, reg in enumerate(regs):
            if not isinstance(reg, SchemaTask):          # a schema was checked when its task was read
                _named(where[k], api.call_node, reg, args.format, args.max_string)
        return None, regs, groups
    from .loading import schema_options
    options = schema_options(args)
    store = GrammarStore(tokenizer, format=args.format, max_string=args.max_string, utf8=not args.bytes,
                         options=options, device=device, cache_dir=cache_dir_of(getattr(args, "grammar_cache", None)))
    pieces, rest = [], []                    # (indices into regs, the grammar holding them)
    for k, reg in enumerate(regs):
        if reg is plan.registries[0] and getattr(args, "grammar", None):     # --grammar FILE: the run's tools
            pieces.append(([k], api.load_grammar(args.grammar, reg, tokenizer, format=args.format,
                                                 max_string=args.max_string, utf8=not args.bytes, options=options,
                                                 device=device)))
        else:
            rest.append(k)
    # the other sets compiled together (one table: what they share is compiled once); schema tasks are UTF-8,
    # so with --bytes they are a table of their own
    utf8_of = {k: isinstance(regs[k], SchemaTask) or not args.bytes for k in rest}
    for flag in dict.fromkeys(utf8_of.values()):
        ks = [k for k in rest if utf8_of[k] == flag]
        pieces.append((ks, store.together([regs[k] for k in ks], [where[k] for k in ks], utf8=flag)))
    table = combine([g for _, g in pieces])
    if len(pieces) > 1:                      # the combined table's start states, in the order of regs
        starts = [0] * len(regs)
        for (ks, _), own in zip(pieces, table.grammar_starts):
            for k, s in zip(ks, own):
                starts[k] = s
        table.starts = starts
    return table, regs, groups


def _named(where: str | None, fn, *fn_args):
    """fn(*fn_args); an error about a task's own tools names the task line they came from."""
    try:
        return fn(*fn_args)
    except ValueError as e:
        if where is None or where in str(e):
            raise
        raise RegistryError(f"{where}: {e}") from None
