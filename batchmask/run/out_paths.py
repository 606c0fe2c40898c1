"""Output paths checked before any work: `--out` must not be one of the run's own inputs or another run's side
file, and `compile --out` / `ablate --json` must be a writable regular file's place (batchmask/safe_write.py)."""
from __future__ import annotations

import os
from pathlib import Path

from ..safe_write import check_target


def check_not_an_input(out_path: Path, args) -> None:
    """--out naming one of the run's own input files is a slip (--force would destroy it): refused."""
    from .fingerprint import FILE_FLAGS
    for name in sorted({"tasks", "checkpoint", "tokenizer", *FILE_FLAGS}):
        value = getattr(args, name, None)
        try:
            same = value not in (None, "-") and out_path.exists() and os.path.samefile(out_path, value)
        except OSError:
            same = False
        if same:
            raise ValueError(f"--out {out_path} is the --{name.replace('_', '-')} file; write the results elsewhere")
    for side in (".run.json", ".lock", ".run.json.tmp"):   # another run's own files (run/fingerprint.py, run/locks.py)
        owner = out_path.with_name(out_path.name.removesuffix(side))
        if out_path.name.endswith(side) and owner.name and owner.is_file():
            raise ValueError(f"--out {out_path} is the {side} file of the run that wrote {owner}; "
                             "write the results elsewhere")


def check_output_file(path, flag: str, inputs: dict) -> None:
    """An output path (`compile --out`, `ablate --json`) checked before any work: a directory, a missing folder or
    one of the command's own input files (writing would destroy it) is refused, naming the flag."""
    if path is None:
        return
    p = Path(path)
    check_target(p, flag)                          # a device, FIFO, directory or link is never written
    if not p.parent.is_dir():
        raise ValueError(f"{flag} {p}: the directory {p.parent} does not exist")
    for name, value in inputs.items():
        try:
            same = value is not None and p.exists() and os.path.samefile(p, value)
        except OSError:
            same = False
        if same:
            raise ValueError(f"{flag} {p} is the {name} file; write it elsewhere")
