"""
`batchmask check-kernels`: compile every Triton kernel, in every specialisation its launcher uses, ahead of time
for real GPU architectures, and report what the compiler made of it. No GPU is needed: Triton lowers to PTX and
runs ptxas itself; the cubin's resource usage is read with the cuobjdump Triton ships.

    batchmask check-kernels [--arch sm_80,sm_90] [--jobs N]

One row per kernel x specialisation x architecture: registers per thread, spills (local memory bytes per thread,
which is where ptxas spills registers), shared memory bytes, cubin bytes. Exits 1 on a compile error or a spill.

Triton's interpreter (TRITON_INTERPRET=1, which the tests switch on) replaces the jitted kernels by Python: the
check then runs itself again in a fresh process with the interpreter off.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from batchmask.text import say_error

DEFAULT_ARCHS = ("sm_80", "sm_90")


class KernelCheckError(ValueError):
    """A bad --arch value, or no Triton to compile with."""


def parse_archs(text: str | None) -> list[int]:
    """'sm_80,sm_90' (or '80,90') -> [80, 90]; None -> the local GPU's architecture, else sm_80 and sm_90."""
    if text is None:
        return [_local_arch()] if _local_arch() else [int(a[3:]) for a in DEFAULT_ARCHS]
    archs = []
    for item in text.split(","):
        m = re.fullmatch(r"(?:sm_)?(\d{2,3})a?", item.strip())
        if not m:
            raise KernelCheckError(f"--arch: {item.strip()!r} is not an architecture (expected e.g. sm_80,sm_90)")
        archs.append(int(m.group(1)))
    return archs


def _local_arch() -> int | None:
    try:
        import torch
        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return major * 10 + minor
    except Exception:  # no usable torch or driver: fall back to the defaults
        return None
    return None


def _resources(cubin: bytes) -> dict:
    """REG / LOCAL / SHARED of the cubin's one function, from cuobjdump -res-usage."""
    import triton
    tool = triton.knobs.nvidia.cuobjdump.path
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    fields = dict(re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", out))
    return {k: int(v) for k, v in fields.items()}


def _compile_one(args: tuple[int, int]) -> dict:
    """Compile spec number i for sm_<arch> -> its row (error set on failure)."""
    i, arch = args
    import triton
    from batchmask.kernels import mask_triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    spec = mask_triton.launch_specs()[i]
    row = dict(kernel=spec["kernel"], label=spec["label"], arch=f"sm_{arch}", error=None)
    try:
        k = triton.compile(ASTSource(spec["fn"], spec["signature"], spec["constexprs"]),
                           target=GPUTarget("cuda", arch, 32), options=spec["options"])
        res = _resources(k.asm["cubin"])
        row.update(registers=res.get("REG"), spills=res.get("LOCAL", 0), stack=res.get("STACK", 0),
                   shared=int(k.metadata.shared), cubin_bytes=len(k.asm["cubin"]))
    except Exception as e:  # report every failure as a row, keep compiling the others
        row["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
    return row


def check(archs: list[int], jobs: int | None = None) -> list[dict]:
    """Compile every launch spec for every architecture (in parallel processes) -> rows in a stable order."""
    from batchmask.kernels import mask_triton
    n = len(mask_triton.launch_specs())
    work = [(i, a) for a in archs for i in range(n)]
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(work)))
    if jobs == 1:
        return [_compile_one(w) for w in work]
    with ProcessPoolExecutor(jobs) as pool:
        return list(pool.map(_compile_one, work))


def format_rows(rows: list[dict]) -> str:
    head = f"{'kernel':<16} {'specialisation':<36} {'arch':<6} {'regs':>5} {'spills':>6} {'shared':>7} {'cubin':>7}"
    lines = [head, "-" * len(head)]
    for r in rows:
        if r["error"]:
            lines.append(f"{r['kernel']:<16} {r['label']:<36} {r['arch']:<6} COMPILE ERROR: {r['error']}")
        else:
            lines.append(f"{r['kernel']:<16} {r['label']:<36} {r['arch']:<6} {r['registers']:>5} {r['spills']:>6} "
                         f"{r['shared']:>7} {r['cubin_bytes']:>7}")
    return "\n".join(lines)


def run(arch: str | None, jobs: int | None = None) -> int:
    """The command: print the table, return the exit status (1 on a compile error or a spill)."""
    archs = parse_archs(arch)
    if os.environ.get("TRITON_INTERPRET") == "1":  # jitted kernels are Python under the interpreter
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        cmd = [sys.executable, "-m", "batchmask.kernels.check", "--arch", ",".join(f"sm_{a}" for a in archs)]
        if jobs:
            cmd += ["--jobs", str(jobs)]
        return subprocess.run(cmd, env=env, cwd=Path(__file__).resolve().parents[1]).returncode
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, stated (silences its warning)
    try:
        import triton  # noqa: F401
    except ImportError as e:
        raise KernelCheckError(f"check-kernels needs triton ({e})") from e
    rows = check(archs, jobs)
    print(format_rows(rows), flush=True)
    errors = [r for r in rows if r["error"]]
    spills = [r for r in rows if not r["error"] and r["spills"]]
    if errors or spills:
        say_error(f"check-kernels: {len(errors)} compile error(s), {len(spills)} kernel(s) spilling registers")
        return 1
    print(f"check-kernels: {len(rows)} compiles, no errors, no spills")
    return 0


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--arch", help="comma-separated GPU architectures, e.g. sm_80,sm_90 (default: the local "
                                   "GPU's, or sm_80 and sm_90 without one)")
    ap.add_argument("--jobs", type=int, help="parallel compiles (default: the CPU count)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="batchmask check-kernels", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap)
    args = ap.parse_args(argv)
    try:
        return run(args.arch, args.jobs)
    except KernelCheckError as e:
        say_error(e)
        return 2


if __name__ == "__main__":
    sys.exit(main())
