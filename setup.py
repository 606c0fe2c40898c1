"""The one part of the build pyproject.toml cannot say: the optional C extension batchmask.table._native.

It is optional: where no C compiler is present setuptools skips it with a warning and the install goes on; the
compile then runs its numpy/torch reference (batchmask/table/native.py says which is in use)."""
from setuptools import Extension, setup

SOURCES = [f"batchmask/table/native_c/{name}.c" for name in ("module", "grouping", "packing", "walk", "walked")]

setup(ext_modules=[Extension("batchmask.table._native", SOURCES, depends=["batchmask/table/native_c/native.h"],
                             optional=True, extra_compile_args=["-O2"])])
