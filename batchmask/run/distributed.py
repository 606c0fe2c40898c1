"""Where a run's results go, on one process or sharded by torchrun: locks, --resume, one output in input order.

    torchrun --nproc-per-node N -m batchmask generate --tasks tasks.txt --out calls.jsonl

Rank r takes every N-th task starting at r. While it runs, each rank appends its finished
results to its own part file (`calls.jsonl.part<r>`), so a crash keeps what every rank
finished; at the end rank 0 merges the parts (and, with --resume, what was already in the
output) into the output file, sorted by task index. NCCL on GPUs, gloo on the CPU.

`Output` is the same sequence of steps on every rank (one process: the same, without the messages):

    open()     rank 0 locks OUT and checks it once, before any rank writes (exists and neither --resume nor
               --force: refused); then each rank locks its part file
    plan()     rank 0 reads and checks OUT, its part files and OUT.run.json (read only) -> the finished tasks
    commit()   rank 0 makes the first change: cuts a torn line, folds leftover part files into OUT (--resume) or
               removes the old output (--force), and writes OUT.run.json
    sink()     where this rank's results go;  finish(): rank 0 merges the parts;  close(): locks released
An error on rank 0 in a step reaches every rank as the same error, and rank 0 alone says it (one line; torchrun
then adds its own report of the ranks' exit statuses).
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from ..safe_write import check_target, open_append, unlink_regular
from . import fingerprint, runfiles
from .locks import FileLock
from .runfiles import RunFileError


@dataclass
class Dist:
    rank: int
    world: int
    device: torch.device


def setup(device_arg: str | None) -> Dist | None:
    """Join the process group if launched by torchrun with more than one process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return None
    import torch.distributed as td
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() and device_arg not in ("cpu",)
    if use_cuda:
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if not td.is_initialized():
        td.init_process_group("nccl" if use_cuda else "gloo")
    return Dist(rank, world, device)


def teardown() -> None:
    import torch.distributed as td
    if td.is_initialized():
        td.destroy_process_group()


# --- collective steps -----------------------------------------------------------------------------
class EveryRankError(RunFileError):
    """An error every rank raises alike (rank 0's, or the first failing rank's, shared): said once, by rank 0."""


def said_by_rank0(error: BaseException) -> bool:
    """Whether this process should keep `error` to itself because rank 0 says it: under torchrun, an error
    every rank shares, or one raised before the ranks joined (they read the same inputs: the same error)."""
    rank = os.environ.get("RANK", "0").strip()
    if rank in ("", "0") or os.environ.get("WORLD_SIZE", "1").strip() in ("", "1"):
        return False
    import torch.distributed as td
    if isinstance(error, EveryRankError):
        return True
    if td.is_initialized():
        return False
    import time
    time.sleep(1.0)      # an input error every rank meets: give rank 0 time to say it before torchrun stops it
    return True


def error_said(error: BaseException) -> None:
    """Every rank, after rank 0 has said an error they share: wait for each other, so no rank exits (and has
    torchrun stop the others) before rank 0's line is out."""
    if isinstance(error, EveryRankError):
        import torch.distributed as td
        if td.is_initialized():
            td.barrier()


def on_rank0(dist: Dist | None, fn):
    """fn() on rank 0 (the only process without torchrun); its result, or its error, reaches every rank."""
    result = error = None
    if dist is None or dist.rank == 0:
        try:
            result = fn()
        except (ValueError, OSError) as e:
            if dist is None:
                raise
            error = str(e) or type(e).__name__
    if dist is not None:
        import torch.distributed as td
        box = [(result, error)]
        td.broadcast_object_list(box, src=0)
        result, error = box[0]
        if error is not None:
            raise EveryRankError(error)
    return result


def gathered(dist: Dist | None, value) -> list:
    """Every rank's `value`, in rank order, on every rank ([value] on one process)."""
    if dist is None:
        return [value]
    import torch.distributed as td
    out = [None] * dist.world
    td.all_gather_object(out, value)
    return out


def agree(dist: Dist | None, fn):
    """fn() on every rank; if any rank fails, every rank raises the first rank's error (no rank is left waiting)."""
    if dist is None:
        return fn()
    result = error = None
    try:
        result = fn()
    except (ValueError, OSError, RuntimeError) as e:
        error = f"rank {dist.rank}: {e}"
    errors = gathered(dist, error)
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise EveryRankError(first)
    return result


# --- the output of a run --------------------------------------------------------------------------
class Output:
    """The --out file of a run (None: stdout) and everything around it; see the module docstring."""

    def __init__(self, out_path: Path | None, dist: Dist | None, resume: bool = False, force: bool = False):
        self.out_path, self.dist, self.resume, self.force = out_path, dist, resume, force
        self.locks: list[FileLock] = []
        self.scans: list[runfiles.ResultScan] = []
        self.sort_at_end = False
        self.custom_ids: list[str] | None = None
        self.rank0 = dist is None or dist.rank == 0

    def part_path(self, rank: int) -> Path:
        return self.out_path.with_name(f"{self.out_path.name}.part{rank}")

    def open(self) -> Output:
        if self.out_path is None:
            return self
        try:
            on_rank0(self.dist, self._claim)
            if self.dist is not None:
                self.locks.append(FileLock(self.part_path(self.dist.rank)).acquire())
        except BaseException:                  # a refused run lets go of what it took (__exit__ will not run)
            self.close()
            raise
        return self

    def _claim(self) -> None:
        out = self.out_path
        # every path of the run that exists must be a regular file, --force or not (batchmask/safe_write.py)
        check_target(out, "--out")
        for p in [fingerprint.run_file(out), out.with_name(out.name + ".lock"), *runfiles.part_files(out)]:
            check_target(p)
        if not out.parent.is_dir():
            raise RunFileError(f"--out {out}: the directory {out.parent} does not exist")
        self.locks.append(FileLock(out).acquire())
        if self.resume or self.force:
            return
        for p in [out, *runfiles.part_files(out)]:
            if p.exists():
                raise RunFileError(f"{p} exists; pass --resume to continue it or --force to overwrite")

    def plan(self, settings: dict | None, tasks: list[str], custom_ids: list[str] | None = None) -> set[int]:
        """The indices already finished (--resume), after checking every file involved; nothing is changed.
        `custom_ids`: a Batch API file's, by which its output lines are matched to requests."""
        self.custom_ids = custom_ids
        if self.out_path is None or not self.resume:
            return set()
        return set(on_rank0(self.dist, lambda: sorted(self._scan(settings, tasks))))

    def _scan(self, settings: dict, tasks: list[str]) -> set[int]:
        out = self.out_path
        files = [p for p in [out, *runfiles.part_files(out)] if p.exists()]
        if files or fingerprint.run_file(out).exists():
            fingerprint.check_run_settings(out, settings)
        self.scans = [runfiles.scan_results(p) for p in files]
        return runfiles.check_against_tasks(self.scans, tasks, out, self.custom_ids)

    def commit(self, settings: dict | None, info: dict) -> None:
        """The run's first change to the file system (every input has been checked by now)."""
        if self.out_path is not None:
            on_rank0(self.dist, lambda: self._commit(settings, info))

    def _commit(self, settings: dict, info: dict) -> None:
        out = self.out_path
        if self.resume:
            parts = [s for s in self.scans if s.path != out]
            found = [r for s in self.scans for r in s.records]
            records = sorted(found, key=lambda r: r["index"])
            if parts or records != found:   # leftover parts of a torchrun run, or a resumed tail: one sorted file
                runfiles.write_records(out, records)
                for s in parts:
                    unlink_regular(s.path)
            else:
                for s in self.scans:
                    runfiles.cut_torn_tail(s)
            # finished tasks with gaps between them: this run's results, appended, come before some of them
            self.sort_at_end = [r["index"] for r in records] != list(range(len(records)))
        else:
            for p in [out, *runfiles.part_files(out)]:
                unlink_regular(p)
        fingerprint.write_run_file(out, settings, info)

    def mark_failed(self, error: BaseException) -> None:
        """The run stopped on an error after writing: --resume must not continue from its lines."""
        if self.out_path is not None:
            msg = str(error).strip().splitlines()[0] if str(error).strip() else ""
            fingerprint.mark_run_failed(self.out_path, f"{type(error).__name__}: {msg}")

    def sink(self) -> Sink:
        if self.dist is None:
            return Sink(self.out_path, append=self.resume)
        return Sink(self.part_path(self.dist.rank) if self.out_path else None, append=False, hold=True)

    def finish(self, sink: Sink) -> None:
        """Every rank has finished; rank 0 writes the one output in input order."""
        if self.dist is None:
            if self.sort_at_end:                       # a --resume that filled gaps: its lines are at the end
                runfiles.write_records(self.out_path, self._sorted_records([self.out_path]))
            return
        import torch.distributed as td
        if self.out_path is None:
            gathered = [None] * self.dist.world
            td.all_gather_object(gathered, sink.held)
            if self.rank0:
                for rec in sorted((r for part in gathered for r in part), key=lambda r: r["index"]):
                    sys.stdout.write(runfiles.record_line(rec))
                sys.stdout.flush()
            return
        td.barrier()
        if self.rank0:
            parts = [self.part_path(r) for r in range(self.dist.world)]
            runfiles.write_records(self.out_path, self._sorted_records([self.out_path, *parts]))
            for p in parts:
                unlink_regular(p)
        td.barrier()

    def _sorted_records(self, paths: list[Path]) -> list[dict]:
        """Every record of these files, by task index (a Batch API line's: its request's place in the file)."""
        records = [r for p in paths for r in runfiles.scan_results(p).records]
        place = {c: i for i, c in enumerate(self.custom_ids or [])}
        return sorted(records, key=lambda rec: place[rec["custom_id"]] if "custom_id" in rec else rec["index"])

    def close(self) -> None:
        for lock in reversed(self.locks):
            lock.release()
        self.locks.clear()

    def __enter__(self) -> Output:
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()


class Sink:
    """Where one process's results go: a JSONL file (appended and flushed line by line), stdout, or (torchrun
    without --out) a list gathered at the end."""

    def __init__(self, path: Path | None, append: bool = False, hold: bool = False):
        self.count = 0
        self.held: list[dict] = []
        if path is not None:
            self.fh = open_append(path, append, "--out")
        else:
            self.fh = None if hold else sys.stdout

    def write(self, record: dict) -> None:
        self.count += 1
        if self.fh is None:
            self.held.append(record)
            return
        self.fh.write(runfiles.record_line(record))
        self.fh.flush()

    def close(self) -> None:
        if self.fh is not None and self.fh is not sys.stdout:
            self.fh.close()
