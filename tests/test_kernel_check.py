"""`batchmask check-kernels`: the Triton kernels compile ahead of time, for a real GPU architecture, in every
specialisation the launchers use, without spilling registers (no GPU needed)."""
import os
import re

import pytest

from batchmask.run.cli import main

pytest.importorskip("triton")


def test_every_specialisation_compiles_without_spills(capfd):
    # the tests run Triton's interpreter (conftest): the command must step out of it by itself
    assert os.environ.get("TRITON_INTERPRET") == "1" or os.path.exists("/dev/nvidiactl")
    rc = main(["check-kernels", "--arch", "sm_90"])
    out, err = capfd.readouterr()
    assert rc == 0, out + err
    row = re.compile(r"(_\w+)\s+(.+?)\s+(sm_\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)")
    rows = [row.fullmatch(line.strip()).groups() for line in out.splitlines() if line.startswith("_")]
    seen = {(r[0], r[1]) for r in rows}
    layouts = ("", ", packed")                  # dense and packed tables (batchmask/table/packed.py)
    for logits in ("float32", "bfloat16", "float16"):
        for table in ("int16", "int32"):
            for layout in layouts:
                assert ("_mask_kernel", f"logits {logits}, table {table}{layout}") in seen
                for kind in ("greedy", "sampled"):
                    assert ("_sample_kernel", f"logits {logits}, table {table}{layout}, {kind}") in seen
    assert {r[1] for r in rows if r[0] == "_advance_kernel"} == {
        f"tokens {tok}, table {table}{layout}" for tok in ("int64", "int32") for table in ("int16", "int32")
        for layout in layouts}
    for kernel, label, arch, regs, spills, _shared, cubin in rows:
        assert arch == "sm_90" and int(regs) > 0 and int(spills) == 0 and int(cubin) > 0, (kernel, label)
    assert "no errors, no spills" in out


def test_a_bad_architecture_is_one_clear_line(capsys):
    assert main(["check-kernels", "--arch", "sm_x9"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--arch" in err[0] and "'sm_x9'" in err[0]


@pytest.mark.parametrize("bad", [{"error": "CompilationError: out of resources"}, {"spills": 64}])
def test_a_compile_error_or_a_spill_fails_the_check(monkeypatch, capsys, bad):
    from batchmask.kernels import check as kernel_check
    good = dict(kernel="_mask_kernel", label="logits float32, table int16", arch="sm_90", error=None,
                registers=30, spills=0, stack=0, shared=0, cubin_bytes=16000)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # report in this process, from the rows below
    monkeypatch.setattr(kernel_check, "check", lambda archs, jobs=None: [good, {**good, **bad}])
    assert kernel_check.run("sm_90") == 1
    out, err = capsys.readouterr()
    assert ("COMPILE ERROR: CompilationError" in out) == ("error" in bad)
    assert "1 compile error(s)" in err if "error" in bad else "1 kernel(s) spilling" in err
    monkeypatch.setattr(kernel_check, "check", lambda archs, jobs=None: [good])
    assert kernel_check.run("sm_90") == 0
