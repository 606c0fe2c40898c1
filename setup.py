"""The one part of the build pyproject.toml cannot say: the optional C extensions batchmask.table._native (the table
build's hot loops) and batchmask.automaton._native (the subset construction).

They are optional: where no C compiler is present setuptools skips them with a warning and the install goes on; the
compile then runs its numpy/torch and Python references (batchmask/table/native.py and batchmask/automaton/native.py
say which is in use)."""
from setuptools import Extension, setup

SOURCES = [f"batchmask/table/native_c/{name}.c" for name in ("module", "grouping", "packing", "walk", "walked",
                                                               "signature")]
SUBSETS = [f"batchmask/automaton/native_c/{name}.c" for name in ("module", "pools", "moves", "construct", "nfa")]

setup(ext_modules=[Extension("batchmask.table._native", SOURCES, depends=["batchmask/table/native_c/native.h"],
                             optional=True, extra_compile_args=["-O2"]),
                   Extension("batchmask.automaton._native", SUBSETS,
                             depends=["batchmask/automaton/native_c/native.h"], optional=True,
                             extra_compile_args=["-O2"])])
