"""The run's fingerprint: one dict of everything `generate`'s results depend on, stored in OUT.run.json.

`generate --resume` refuses to continue an output written with other settings, naming each difference.
Every flag of `generate` counts as result-changing, as given, unless it is named here: a flag added to the
command line later is fingerprinted with no further work. Name a new flag in NOT_RESULT_FLAGS only if no
result can depend on it; in FILE_FLAGS if its value is a path (then the file's content counts, not its name).
"""
from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

from ..safe_write import write_text_atomic
from .runfiles import RunFileError, TaskFile

# --- the settings ---------------------------------------------------------------------------------
NOT_RESULT_FLAGS = {"command", "func", "batch_size", "out", "resume", "force", "show", "quiet", "tasks_format",
                    "grammar_cache"}   # a cached grammar is checked to be the one compiling would give
FILE_FLAGS = {"tools", "grammar"}
# resolved by run_settings itself: the parsed tasks (not the file's form), the files actually loaded (defaults
# included), the device type and dtype actually used, the token ceiling after defaults
_DERIVED = {"tasks", "checkpoint", "tokenizer", "device", "dtype", "max_new_tokens", "seed"}


def run_file_fields(args, taskfile: TaskFile, tokenizer, device, dtype, max_new_tokens: int) -> tuple[dict, dict]:
    """(settings, info) of a `generate` run's OUT.run.json: what its results depend on (run_settings, and the
    chat template that shapes its prompts), and what it records for a person (versions, files, start time)."""
    import time

    from .. import __version__
    from ..tools.chat_template import pick_template
    from .loading import resolve_model_paths
    checkpoint, tokenizer_path = resolve_model_paths(args.checkpoint, args.tokenizer)
    settings = run_settings(args, taskfile, checkpoint, tokenizer_path, device, dtype, max_new_tokens)
    template = pick_template(tokenizer, tools=True)     # the prompt's form (its file may sit beside --tokenizer)
    if template is not None:
        settings["chat_template"] = "sha256:" + hashlib.sha256(template.encode("utf-8")).hexdigest()
    info = {"batchmask": __version__, "tasks": str(taskfile.name), "checkpoint": str(checkpoint),
            "tokenizer": str(tokenizer_path), "tools": args.tools, "batch_size": args.batch_size,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    return settings, info


def run_settings(args, taskfile: TaskFile, checkpoint: Path, tokenizer_path: Path, device, dtype,
                 max_new_tokens: int) -> dict:
    """The settings of a `generate` run, JSON-able and sorted by name."""
    settings = {}
    for name, value in vars(args).items():
        if name in NOT_RESULT_FLAGS or name in _DERIVED or value is None:
            continue
        if name in FILE_FLAGS:
            value = file_identity(value)
        settings[name] = value if isinstance(value, (str, int, float, bool)) else str(value)
    settings.update({
        "tasks": f"{len(taskfile.tasks)} tasks, sha256:{taskfile.key()}",
        "checkpoint": file_identity(checkpoint),
        "tokenizer": file_identity(tokenizer_path),
        "device": device.type,                      # cpu and cuda kernels round differently; cuda:0 vs :1 do not
        "dtype": str(dtype).removeprefix("torch."),
        "max_new_tokens": max_new_tokens,
        "seed": args.seed,                          # already reduced to 63 bits by its parser
    })
    if getattr(args, "tools", None) is None:
        settings["tools"] = "built-in"
    return dict(sorted(settings.items()))


# --- OUT.run.json and file identities -----------------------------------------------------------
RUN_FORMAT = "batchmask-run-v1"
FULL_HASH_MAX = 1 << 30          # files up to 1 GiB are hashed whole; larger ones by size + 64 spread 1 MiB blocks
_BLOCK, _BLOCKS = 1 << 20, 64


def run_file(out: Path) -> Path:
    return out.with_name(out.name + ".run.json")


def file_identity(path) -> str:
    """A content hash of a file (or of a directory's files, names included): "sha256:<hex>"."""
    p = Path(path)
    h = hashlib.sha256()
    if p.is_dir():
        for f in sorted(q for q in p.rglob("*") if q.is_file()):
            h.update(f.relative_to(p).as_posix().encode() + b"\0" + _file_hash(f).encode() + b"\0")
        return "sha256:" + h.hexdigest()
    return "sha256:" + _file_hash(p)


def _file_hash(p: Path) -> str:
    st = p.stat()
    return _hash_of(str(p.resolve()), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=256)       # a HF directory is both the checkpoint and the tokenizer: hash it once
def _hash_of(path: str, size: int, mtime_ns: int) -> str:
    p = Path(path)
    h = hashlib.sha256(size.to_bytes(8, "little"))
    with open(p, "rb") as fh:
        if size <= FULL_HASH_MAX:
            while chunk := fh.read(1 << 24):
                h.update(chunk)
        else:   # multi-GB weights: header, tail and blocks spread over the file (a retrained model differs in all)
            for k in range(_BLOCKS):
                fh.seek((size - _BLOCK) * k // (_BLOCKS - 1))
                h.update(fh.read(_BLOCK))
    return h.hexdigest()


def write_run_file(out: Path, settings: dict, info: dict) -> None:
    """OUT.run.json: the result-changing `settings` (compared by --resume) and `info` (shown, never compared)."""
    write_text_atomic(run_file(out), json.dumps({"format": RUN_FORMAT, "settings": settings, "info": info},
                                                indent=1, ensure_ascii=False) + "\n", "run file")


def read_run_file(out: Path) -> dict | None:
    """The run file stored beside `out` ({"format", "settings", "info"[, "failed"]}), None if there is none."""
    path = run_file(out)
    if not path.exists():
        return None
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RunFileError(f"{path}: not a batchmask run file ({e})") from None
    if not isinstance(obj, dict) or obj.get("format") != RUN_FORMAT or not isinstance(obj.get("settings"), dict):
        raise RunFileError(f"{path}: not a batchmask run file (expected format {RUN_FORMAT!r})")
    return obj


def mark_run_failed(out: Path, reason: str) -> None:
    """Record in OUT.run.json that the run stopped on an error: its lines may be wrong, so --resume refuses them."""
    obj = read_run_file(out)
    if obj is None:
        return
    obj["failed"] = reason[:300]
    # ranks may fail at once: write_atomic's temporary file is per process
    write_text_atomic(run_file(out), json.dumps(obj, indent=1, ensure_ascii=False) + "\n", "run file")


def setting_differences(old: dict, new: dict) -> list[str]:
    """One phrase per setting that differs: 'seed 1 -> 2'."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key, "(unset)"), new.get(key, "(unset)")
        if a != b:
            short = lambda v: (v[:19] + "...") if isinstance(v, str) and v.startswith("sha256:") else json.dumps(v)
            out.append(f"{key} {short(a)} -> {short(b)}")
    return out


def check_run_settings(out: Path, settings: dict) -> None:
    """--resume: refuse unless OUT.run.json holds exactly these settings (naming every difference)."""
    stored = read_run_file(out)
    if stored is None:
        raise RunFileError(f"{run_file(out)} is missing, so the settings that wrote {out} are unknown; "
                           f"cannot --resume (rerun with --force to start over)")
    if "failed" in stored:
        raise RunFileError(f"the run that wrote {out} stopped on an error ({stored['failed']}), so its lines cannot "
                           f"be trusted; cannot --resume (rerun with --force to start over)")
    old = stored["settings"]
    diff = setting_differences(old, settings)
    if diff:
        raise RunFileError(f"{out} was written with other settings ({'; '.join(diff)}); --resume needs the same "
                           f"settings (or --force to start over)")
