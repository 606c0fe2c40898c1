"""The files of a run: task files in, result JSON Lines out, the run's fingerprint beside them, and locks.

    tasks.txt / tasks.jsonl    one task per line, or one {"task": ..., "max_new_tokens": ...} object per line
    OUT.jsonl                  one result record per line, in input order (`json.dumps` + "\\n")
    OUT.jsonl.run.json         the settings that made those results (checked by --resume; run/fingerprint.py)
    OUT.jsonl.lock             held (flock) for the whole run, so two runs never write one file (run/locks.py)

JSON Lines exactly: lines end with "\\n" and are split on "\\n" only, so strings holding U+2028, U+2029 or
U+0085 (which `str.splitlines` would also split on) round-trip. Reading never changes a file: `scan_results`
checks a whole result file first, and only `cut_torn_tail` (after every check passed) drops a torn last line.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import RunFileError  # noqa: F401  (run.runfiles.RunFileError: where the run's modules import it)
from ..safe_write import write_atomic
from ..tools import bfcl
from . import openai_batch


# --- JSON Lines -----------------------------------------------------------------------------------
def record_line(record: dict) -> str:
    if "custom_id" in record:                    # a Batch API output line: its own fields only (not "index")
        record = {k: record[k] for k in openai_batch.BATCH_KEYS}
    """One result record as one JSON Lines line (UTF-8 kept as is; JSON escapes every control character)."""
    return json.dumps(record, ensure_ascii=False) + "\n"


def split_lines(data: bytes) -> tuple[list[bytes], bytes]:
    """Complete lines (without their "\\n") and what follows the last "\\n" (b"" when the file ends cleanly)."""
    parts = data.split(b"\n")
    return parts[:-1], parts[-1]


# A task file's line ends: "\r\n" (Windows), "\n" (Unix) and a lone "\r" (classic Mac OS, some exporters) alike,
# as editors count lines. Not str.splitlines: a task may hold U+2028, U+0085 or a form feed.
_LINE_BREAK = re.compile("\r\n|\r|\n")
_LINE_BREAK_BYTES = re.compile(b"\r\n|\r|\n")


def task_lines(text: str) -> list[str]:
    """The lines of a task file's text, without their ends (a final line end makes no empty last line)."""
    lines = _LINE_BREAK.split(text)
    return lines[:-1] if len(lines) > 1 and lines[-1] == "" else lines


def _decode(raw: bytes, name: str) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = len(_LINE_BREAK_BYTES.findall(raw, 0, e.start)) + 1
        raise RunFileError(f"{name} line {line}: not UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start})") from None
    return text.removeprefix("\ufeff")          # a UTF-8 byte order mark (Windows editors) is not content


# --- task files -----------------------------------------------------------------------------------
TASK_FORMATS = ("auto", "text", "jsonl", "openai-batch", "bfcl")
CHOICE_FIELDS = ("tool_choice", "parallel_tool_calls")   # a task's own tool choice (batchmask.tools.choice)
MAX_TASK_LINE = 4 << 20                          # characters in one task line (4 Mi: a prompt far past any context
                                                # we run, a tool list of large schemas): a longer line is refused
                                                # before it is parsed, so a stray blob never grows a run's memory
MAX_TASK_TOKENS = 1 << 31                       # sanity cap of a JSONL "max_new_tokens"; the model's context
                                                # is checked once it is loaded (check_task_limits)


@dataclass
class TaskFile:
    """The tasks of a run, in order; `limits[i]` is task i's own token ceiling (None: the command's)."""
    name: str
    format: str                                  # "text" or "jsonl"
    tasks: list[str]
    limits: list[int | None]
    lines: list[int]                             # the line each task came from (for error messages)
    # JSONL "messages" (a conversation for the chat template) per task, None where the task is its text;
    # empty when no line has any. tasks[i] is then the conversation's last user message (batchmask.tools.prompt)
    messages: list = field(default_factory=list)
    # JSONL "tools" per task (its own tool set, any form --tools accepts, as read; batchmask.run.grammar_store),
    # None where the task uses the run's --tools; empty when no line has any
    tools: list = field(default_factory=list)
    # JSONL "schema" per task (its answer is one JSON value of that schema; batchmask.run.schema_task), None elsewhere;
    # empty when no line has any
    schemas: list = field(default_factory=list)
    # JSONL "tool_choice" / "parallel_tool_calls" per task ({field: value} of those it gives; None where it gives
    # neither, batchmask.tools.choice.resolve_choice); empty when no line has any
    choices: list = field(default_factory=list)
    # format "openai-batch": each request's own settings (custom_id, model, temperature, top_p, seed, stop, and
    # why it is refused, if it is: batchmask.run.openai_batch), one per task; empty for other formats
    requests: list = field(default_factory=list)

    def key(self) -> str:
        """sha256 of the tasks, their ceilings and their messages, in order (what the results depend on, not the
        file's form)."""
        rows = [[t, n] for t, n in zip(self.tasks, self.limits)]
        if any(m is not None for m in self.messages):
            rows = [[t, n, m] for (t, n), m in zip(rows, self.messages)]
        if any(x is not None for x in self.tools):     # a task's own tools change its prompt and grammar
            rows = [[*r, x] for r, x in zip(rows, self.tools)]
        if any(x is not None for x in self.schemas):
            rows = [[*r, {"schema": x}] for r, x in zip(rows, self.schemas)]
        if any(x is not None for x in self.choices):
            rows = [[*r, {"choice": x}] for r, x in zip(rows, self.choices)]
        if self.requests:
            rows = [[*r, {"request": x}] for r, x in zip(rows, self.requests)]
        blob = json.dumps(rows, ensure_ascii=False)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def task_input(self, i: int):
        """What the prompt is built from: task i's messages if it has them, else its text."""
        return self.messages[i] if self.messages and self.messages[i] is not None else self.tasks[i]

    def own_system_lines(self) -> list[int]:
        """The lines of the tasks whose own "messages" hold a system message (--system would come before it)."""
        return [line for m, line in zip(self.messages, self.lines)
                if m is not None and any(isinstance(x, dict) and x.get("role") == "system" for x in m)]

    def check_limits(self, ceiling: int, what: str) -> None:
        """Refuse a task's max_new_tokens above `ceiling` (the model's context, named by `what`)."""
        for limit, line in zip(self.limits, self.lines):
            if limit is not None and limit > ceiling:
                raise RunFileError(f"{self.name} line {line}: \"max_new_tokens\" {limit} is above {what} ({ceiling})")


def _json_object(line: str):
    try:
        obj = json.loads(line)
    except (json.JSONDecodeError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def _refuse_json_document(text: str, name: str) -> None:
    """A file that is one JSON object or array (a tools file, a pretty-printed task list) is no task file: read as
    lines, each fragment of it would become a task."""
    if text.lstrip()[:1] not in ("{", "["):
        return
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return
    kind = "object" if isinstance(doc, dict) else "array"
    raise RunFileError(f"{name}: the whole file is one JSON {kind}, not a tasks file (text: one task per line; "
                       "JSONL: one {\"task\": ...} object per line); --tasks-format text reads its lines as tasks")


def read_tasks(path: str, fmt: str = "auto") -> TaskFile:
    """Read a task file ('-' is stdin). fmt "auto": JSONL when the first non-blank line is a JSON object, and
    then every non-blank line must be one; otherwise one task per line. "text"/"jsonl" force either."""
    if fmt not in TASK_FORMATS:
        raise RunFileError(f"--tasks-format {fmt}: expected one of {', '.join(TASK_FORMATS)}")
    if path == "-":
        raw, name = sys.stdin.buffer.read(), "<stdin>"
    else:
        p = Path(path)
        if not p.exists():
            raise RunFileError(f"tasks file not found: {p}")
        if p.is_dir():
            raise RunFileError(f"{p}: is a directory, not a tasks file")
        try:
            raw = p.read_bytes()
        except OSError as e:
            raise RunFileError(f"{p}: cannot read tasks file: {e.strerror or e}") from None
        name = str(p)
    text = _decode(raw, name)
    lines = list(enumerate(task_lines(text), 1))
    lines = [(n, ln) for n, ln in lines if ln.strip()]
    if not lines:
        raise RunFileError(f"{name}: no tasks (the file is empty)")
    for n, ln in lines:
        if len(ln) > MAX_TASK_LINE:
            raise RunFileError(f"{name} line {n}: {len(ln):,} characters, above the {MAX_TASK_LINE:,} a task line "
                               f"may hold (batchmask.run.runfiles.MAX_TASK_LINE)")
    if fmt == "auto":
        first = _json_object(lines[0][1])
        fmt = "text" if first is None else "openai-batch" if openai_batch.is_request(first) else \
            "bfcl" if bfcl.is_question(first) else "jsonl"
        if fmt == "text":
            _refuse_json_document(text, name)
            if lines[0][1].lstrip().startswith('{"'):         # a JSON object's start, broken (a truncated file)
                raise RunFileError(f"{name} line {lines[0][0]}: starts like a JSON object but is not valid JSON "
                                   f"(truncated?); fix the line or pass --tasks-format text")
            # a JSONL file whose first line is broken must not silently become plain tasks
            for n, ln in lines[1:]:
                obj = _json_object(ln)
                if obj is not None and ("task" in obj or "messages" in obj):
                    raise RunFileError(f"{name} line {lines[0][0]}: not a JSON object, but line {n} is a JSONL task; "
                                       f"fix the line or pass --tasks-format text|jsonl")
    if fmt == "text":
        return TaskFile(name, "text", [ln.strip() for _, ln in lines], [None] * len(lines), [n for n, _ in lines])
    tasks, limits, convos, tools, schemas, choices, requests = [], [], [], [], [], [], []
    seen_ids: dict[str, int] = {}
    for n, ln in lines:
        try:
            obj = json.loads(ln)
        except json.JSONDecodeError as e:
            raise RunFileError(f"{name} line {n}: not valid JSON ({e.msg} at column {e.colno})") from None
        except RecursionError:
            raise RunFileError(f"{name} line {n}: JSON nested too deeply") from None
        if not isinstance(obj, dict):
            raise RunFileError(f"{name} line {n}: expected a JSON object, got {type(obj).__name__}")
        _check_unicode(obj, name, n)
        if fmt == "openai-batch":                  # a request line: read as the task fields it stands for
            obj, settings = openai_batch.request_task(obj, f"{name} line {n}")
            if settings["custom_id"] in seen_ids:
                raise RunFileError(f"{name} line {n}: custom_id {settings['custom_id']!r:.60} is also line "
                                   f"{seen_ids[settings['custom_id']]}'s; each request needs its own")
            seen_ids[settings["custom_id"]] = n
            requests.append(settings)
        elif fmt == "bfcl":                        # a BFCL question: its first turn and its functions
            try:
                obj = bfcl.question_task(obj, f"{name} line {n}")
            except ValueError as e:
                raise RunFileError(str(e)) from None
        task = obj.get("task")
        convo = _messages(obj, name, n)
        if convo is not None:
            from ..tools.prompt import task_text
            task = task_text(convo)
        elif not isinstance(task, str) or not task.strip():
            raise RunFileError(f"{name} line {n}: expected a non-empty string \"task\" (or \"messages\"), "
                               f"got {task!r:.60}")
        limit = obj.get("max_new_tokens")
        if limit is not None and (type(limit) is not int or not 1 <= limit <= MAX_TASK_TOKENS):
            raise RunFileError(f"{name} line {n}: \"max_new_tokens\" must be a positive integer, got {limit!r:.40}")
        tasks.append(task)
        limits.append(limit)
        convos.append(convo)
        tools.append(obj.get("tools"))
        if tools[-1] is not None and not isinstance(tools[-1], (list, dict)):
            raise RunFileError(f"{name} line {n}: \"tools\" must be a list of tools or an object with \"tools\" "
                               f"(any form --tools accepts), got {type(tools[-1]).__name__}")
        schemas.append(obj.get("schema"))
        if schemas[-1] is not None and not isinstance(schemas[-1], dict):
            raise RunFileError(f"{name} line {n}: \"schema\" must be a JSON Schema object, got "
                               f"{type(schemas[-1]).__name__}")
        own = {k: obj[k] for k in CHOICE_FIELDS if obj.get(k) is not None}      # checked by plan_tasks
        choices.append(own or None)
    return TaskFile(name, fmt, tasks, limits, [n for n, _ in lines],
                    convos if any(c is not None for c in convos) else [],
                    tools if any(x is not None for x in tools) else [],
                    schemas if any(x is not None for x in schemas) else [],
                    choices if any(x is not None for x in choices) else [], requests)


def _check_unicode(obj: dict, name: str, n: int) -> None:
    """JSON may spell a lone surrogate (`"\\ud800"`), which is no Unicode text: it could be neither tokenized
    nor written back as UTF-8. Refused here, naming the line and the field, instead of deep inside a run."""
    try:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
        return
    except UnicodeEncodeError:
        pass
    for key, value in obj.items():
        try:
            json.dumps({key: value}, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as e:
            bad = e.object[e.start:e.end]
            raise RunFileError(f"{name} line {n}: field {key!r:.40} holds a lone surrogate "
                               f"({bad.encode('unicode_escape').decode()}), which is not Unicode text") from None


def _messages(obj: dict, name: str, n: int) -> list | None:
    """A JSONL task's "messages" (a non-empty list of objects with a string "role"), None if it has none."""
    convo = obj.get("messages")
    if convo is None:
        return None
    if "task" in obj:
        raise RunFileError(f"{name} line {n}: has both \"task\" and \"messages\"; give one")
    if not isinstance(convo, list) or not convo:
        raise RunFileError(f"{name} line {n}: \"messages\" must be a non-empty list of messages, got {convo!r:.60}")
    for k, m in enumerate(convo):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RunFileError(f"{name} line {n}: \"messages\"[{k}] must be an object with a string \"role\", "
                               f"got {m!r:.60}")
    return convo


# --- result files ---------------------------------------------------------------------------------
# The fields every batchmask result record has, with their JSON types (records may carry more).
RESULT_FIELDS = {"index": (int,), "task": (str,), "text": (str,), "call": (dict, type(None)),
                 "error": (str, type(None)), "tokens": (int,), "cut": (bool,)}
_RECORD_STARTS = (b'{"index": ', b'{"id": ')     # how record_line() begins a record, or a Batch API line


def check_record(obj, where: str) -> dict:
    """`obj` if it is a batchmask result record (or a Batch API output line), else RunFileError naming `where`."""
    if isinstance(obj, dict) and "custom_id" in obj:
        return openai_batch.check_output_line(obj, where)
    if not isinstance(obj, dict):
        raise RunFileError(f"{where}: not a batchmask result record (a JSON {type(obj).__name__})")
    for key, types in RESULT_FIELDS.items():
        if key not in obj:
            raise RunFileError(f"{where}: not a batchmask result record (no \"{key}\")")
        value = obj[key]
        if not isinstance(value, types) or (types == (int,) and isinstance(value, bool)):
            raise RunFileError(f"{where}: not a batchmask result record (\"{key}\" is {type(value).__name__})")
    if obj["index"] < 0:
        raise RunFileError(f"{where}: not a batchmask result record (index {obj['index']})")
    return obj


@dataclass
class ResultScan:
    """A result file read and checked, not changed: its records and how many bytes to keep."""
    path: Path
    records: list[dict] = field(default_factory=list)
    keep: int = 0                                # bytes of complete records (the file is cut here if torn)
    size: int = 0                                # the file's size when read

    @property
    def torn(self) -> bool:
        return self.keep != self.size


def scan_results(path: Path) -> ResultScan:
    """Read a whole result file and check every line (a missing file holds no records).

    Refuses (RunFileError, the file untouched) anything but result records; a last line without its "\\n"
    is a torn write only if it starts like a record, and then it is reported for `cut_torn_tail`.
    """
    path = Path(path)
    scan = ResultScan(path)
    if not path.exists():
        return scan
    if not path.is_file():
        raise RunFileError(f"{path}: not a regular file; cannot --resume from it")
    data = path.read_bytes()
    scan.size = len(data)
    complete, tail = split_lines(data)
    for n, raw in enumerate(complete, 1):
        where = f"{path} line {n}"
        try:
            obj = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise RunFileError(f"{where}: not UTF-8; not a batchmask result file, cannot --resume from it") from None
        except (json.JSONDecodeError, RecursionError):
            raise RunFileError(f"{where}: not JSON; not a batchmask result file, cannot --resume from it") from None
        scan.records.append(check_record(obj, where))
    if tail and not any(tail.startswith(p) or p.startswith(tail) for p in _RECORD_STARTS):
        raise RunFileError(f"{path} line {len(complete) + 1}: not a batchmask result record (and no final newline); "
                           f"cannot --resume from it")
    scan.keep = len(data) - len(tail)
    return scan


def check_order(scan: ResultScan, resumed_tail: bool) -> None:
    """Refuse (naming file and line) result lines in an order no batchmask run writes.

    A run writes its results in input order, so a part file (one rank's) is strictly increasing by index. The
    output itself may also be a sorted block (a run, or parts merged by rank 0) followed by what a --resume of it
    appended before it was stopped: the earliest tasks the block lacked, in order (`resumed_tail`).
    """
    idx = [r["index"] for r in scan.records]
    cut = next((k for k in range(1, len(idx)) if idx[k] <= idx[k - 1]), len(idx))     # the first step back
    if cut == len(idx):
        return
    tail = idx[cut:]
    step = next((k for k in range(1, len(tail)) if tail[k] <= tail[k - 1]), None)
    if resumed_tail and step is None:
        have = set(idx[:cut])
        missing = (i for i in itertools.count() if i not in have)
        expect = [next(missing) for _ in tail]
        if expect == tail:
            return
    n = cut + 1 if not resumed_tail or step is None else cut + step + 1
    raise RunFileError(f"{scan.path} line {n}: the result for task {idx[n - 1]} comes after task {idx[n - 2]}; a "
                       f"batchmask run writes its results in input order (hand-edited?), cannot --resume from it")


def check_against_tasks(scans: list[ResultScan], tasks: list[str], out: Path | None = None,
                        custom_ids: list[str] | None = None) -> set[int]:
    """The task indices these result files finish; refuses (naming file and line) lines out of order
    (`check_order`: only `out` may hold a resumed tail), an index out of range, one task twice (across all the
    files), or a record whose task is not the task at its index. With `custom_ids` (a Batch API file), each
    output line's index is its request's place in the file."""
    done: dict[int, str] = {}
    index_of = {c: i for i, c in enumerate(custom_ids or [])}
    for scan in scans:
        for n, rec in enumerate(scan.records, 1):
            where = f"{scan.path} line {n}"
            if custom_ids is not None:
                if "custom_id" not in rec or rec["custom_id"] not in index_of:
                    raise RunFileError(f"{where}: not an output line of a request in the tasks file (custom_id "
                                       f"{str(rec.get('custom_id'))[:40]!r}); cannot --resume from it")
                rec["index"], rec["task"] = index_of[rec["custom_id"]], tasks[index_of[rec["custom_id"]]]
            elif "custom_id" in rec:
                raise RunFileError(f"{where}: a Batch API output line, but the tasks file is not a Batch API "
                                   f"file; cannot --resume from it")
            i = rec["index"]
            if i >= len(tasks):
                raise RunFileError(f"{where}: result for task {i}, but the tasks file has {len(tasks)} tasks")
            if i in done:
                raise RunFileError(f"{where}: a second result for task {i} (the first: {done[i]}; mixed runs?); "
                                   f"cannot --resume from it")
            if rec["task"] != tasks[i]:
                raise RunFileError(f"{where}: the result for task {i} is for {rec['task'][:40]!r}, but task {i} is "
                                   f"now {tasks[i][:40]!r}")
            done[i] = where
        check_order(scan, resumed_tail=out is not None and Path(scan.path) == Path(out))
    return set(done)


def cut_torn_tail(scan: ResultScan) -> None:
    """Drop the torn last line found by `scan_results` (only if the file is still the size it was read at)."""
    if not scan.torn:
        return
    with open(scan.path, "r+b") as fh:
        if os.fstat(fh.fileno()).st_size != scan.size:
            raise RunFileError(f"{scan.path}: changed while it was being checked; not touching it")
        fh.truncate(scan.keep)


def write_records(path: Path, records: list[dict]) -> None:
    """Write `records` as the whole of `path`, atomically (a temporary file beside it, then rename)."""
    def fill(tmp: Path) -> None:
        with open(tmp, "x", encoding="utf-8", newline="\n") as fh:
            fh.writelines(record_line(r) for r in records)
    write_atomic(path, fill, "--out")


def part_files(out: Path) -> list[Path]:
    """Per-rank part files of `out` (OUT.part<r>) left by a torchrun run, in rank order."""
    prefix = out.name + ".part"
    found = [p for p in out.parent.glob(glob_escape(prefix) + "*") if p.name[len(prefix):].isdigit()]
    return sorted(found, key=lambda p: int(p.name[len(prefix):]))


def glob_escape(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)
