"""The run's fingerprint: one dict of everything `generate`'s results depend on (OUT.run.json, see runfiles.py).

`generate --resume` refuses to continue an output written with other settings, naming each difference.
Every flag of `generate` counts as result-changing, as given, unless it is named here: a flag added to the
command line later is fingerprinted with no further work. Name a new flag in NOT_RESULT_FLAGS only if no
result can depend on it; in FILE_FLAGS if its value is a path (then the file's content counts, not its name).
"""
from __future__ import annotations

from pathlib import Path

from .runfiles import TaskFile, file_identity

NOT_RESULT_FLAGS = {"command", "func", "batch_size", "out", "resume", "force", "show", "quiet", "tasks_format"}
FILE_FLAGS = {"tools", "grammar"}
# resolved by run_settings itself: the parsed tasks (not the file's form), the files actually loaded (defaults
# included), the device type and dtype actually used, the token ceiling after defaults
_DERIVED = {"tasks", "checkpoint", "tokenizer", "device", "dtype", "max_new_tokens", "seed"}


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
