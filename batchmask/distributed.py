"""Scale-out with torchrun: shard the tasks across ranks, write one output in input order.

    torchrun --nproc-per-node N -m batchmask generate --tasks tasks.txt --out calls.jsonl

Rank r takes every N-th task starting at r. While it runs, each rank appends its finished
results to its own part file (`calls.jsonl.part<r>`), so a crash keeps what every rank
finished; at the end rank 0 merges the parts (and, with --resume, what was already in the
output) into the output file, sorted by task index. NCCL on GPUs, gloo on the CPU.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch


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


class Sink:
    """Where results go: a JSONL file (appended line by line), stdout, or per-rank part files."""

    def __init__(self, out_path: Path | None, dist: Dist | None, append: bool = False):
        self.out_path, self.dist, self.count, self.append = out_path, dist, 0, append
        self.held: list[dict] = []          # distributed + stdout: gathered at the end
        if dist is None:
            self.fh = open(out_path, "a" if append else "w", encoding="utf-8") if out_path else sys.stdout
        elif out_path is not None:
            self.fh = open(self.part_path(dist.rank), "w", encoding="utf-8")
        else:
            self.fh = None

    def part_path(self, rank: int) -> Path:
        return self.out_path.with_name(f"{self.out_path.name}.part{rank}")

    def write(self, record: dict) -> None:
        self.count += 1
        if self.fh is None:
            self.held.append(record)
            return
        self.fh.write(json.dumps(record, ensure_ascii=False) + "\n")
        self.fh.flush()

    def close(self) -> None:
        if self.fh is not None and self.fh is not sys.stdout:
            self.fh.close()

    def merge(self) -> None:
        """Distributed only: every rank has finished; rank 0 writes the one output in input order."""
        import torch.distributed as td
        if self.out_path is None:
            gathered = [None] * self.dist.world
            td.all_gather_object(gathered, self.held)
            if self.dist.rank == 0:
                for rec in sorted((r for part in gathered for r in part), key=lambda r: r["index"]):
                    print(json.dumps(rec, ensure_ascii=False))
            return
        td.barrier()
        if self.dist.rank == 0:
            records = []
            if self.append and self.out_path.exists():
                records += [json.loads(ln) for ln in self.out_path.read_text(encoding="utf-8").splitlines() if ln]
            for r in range(self.dist.world):
                part = self.part_path(r)
                records += [json.loads(ln) for ln in part.read_text(encoding="utf-8").splitlines() if ln]
            records.sort(key=lambda rec: rec["index"])
            tmp = self.out_path.with_name(self.out_path.name + ".tmp")
            tmp.write_text("".join(json.dumps(rec, ensure_ascii=False) + "\n" for rec in records), encoding="utf-8")
            tmp.replace(self.out_path)
            for r in range(self.dist.world):
                self.part_path(r).unlink()
        td.barrier()
