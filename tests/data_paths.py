"""
Where the tests find their data: tests/data/, vendored, so that a bare clone passes its tests.

The Llama 2 and GPT-2 vocabularies and the 12-tool catalogue are kept as they are; the Qwen2 vocabulary (a 6 MB
tokenizer.json) is kept xz-compressed (1.4 MB) and unpacked once per machine into the temporary directory, named
by its hash, the first time a test asks for it. tests/data/README.md lists each file with its source and licence;
tests/test_vendored_data.py checks the copies against their published hashes (and against ../shared/, the copy
CI keeps beside the checkout, when it is there). Tests name data only through this module.
"""
from __future__ import annotations

import hashlib
import lzma
import os
import shutil
import tempfile
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
SHARED = ROOT.parent / "shared"          # only to compare the vendored copies with CI's

CATALOGUE = DATA / "tools" / "agent_tools.json"     # 12 typed tools, OpenAI's function-calling form
BFCL = DATA / "bfcl"                                # a sample of BFCL v4 question lines and one function-doc file
LLAMA2 = DATA / "llama2"                            # tokenizer.model + tokenizer.bin (SentencePiece, 32000)
GPT2 = DATA / "gpt2"                                # tokenizer.json + tokenizer_config.json (byte-level BPE, 50257)
QWEN2_PACKED = DATA / "qwen2"                       # tokenizer.json.xz + tokenizer_config.json (151936 ids)
SCHEMA_SUITE = DATA / "json-schema-test-suite"        # the JSON Schema Test Suite, draft2020-12 (+ SKIPPED.md)
QWEN2_MD5 = "26b68c25ffd2e24736333e4ae0d39bb9"      # of the unpacked tokenizer.json (as in ../shared/qwen2)


@cache
def qwen2_dir() -> Path:
    """A folder holding Qwen2's tokenizer.json and tokenizer_config.json, unpacked from tests/data/qwen2 once
    (checked against QWEN2_MD5; written to a temporary name, then renamed, so a concurrent run never reads half)."""
    out = Path(tempfile.gettempdir()) / f"batchmask-tests-qwen2-{QWEN2_MD5[:12]}"
    target = out / "tokenizer.json"
    if not (target.is_file() and hashlib.md5(target.read_bytes()).hexdigest() == QWEN2_MD5):
        out.mkdir(parents=True, exist_ok=True)
        raw = lzma.decompress((QWEN2_PACKED / "tokenizer.json.xz").read_bytes())
        if hashlib.md5(raw).hexdigest() != QWEN2_MD5:
            raise RuntimeError(f"{QWEN2_PACKED / 'tokenizer.json.xz'} does not unpack to the Qwen2 vocabulary")
        tmp = out / f".tokenizer.json.{os.getpid()}"
        tmp.write_bytes(raw)
        os.replace(tmp, target)
    shutil.copyfile(QWEN2_PACKED / "tokenizer_config.json", out / "tokenizer_config.json")
    return out


def data_dir(name: str) -> Path:
    """The folder of test data `name`: llama2, gpt2, qwen2 (unpacked) or tools."""
    if name == "qwen2":
        return qwen2_dir()
    path = DATA / name
    if not path.is_dir():
        raise FileNotFoundError(f"no test data folder {path}")
    return path


QWEN2 = qwen2_dir()                                 # unpacked: tokenizer.json + tokenizer_config.json

# Kept for tests that mark their Qwen2 cases: every vocabulary is vendored now, so this skips only in a checkout
# that lost tests/data/qwen2 (and says so) - and shared_or_skip for data that only ../shared holds.
needs_qwen2 = pytest.mark.skipif(not (QWEN2_PACKED / "tokenizer.json.xz").is_file(),
                                 reason=f"{QWEN2_PACKED / 'tokenizer.json.xz'} is missing from this checkout")


def shared_or_skip(path: Path) -> Path:
    """`path` (under ../shared) when it exists; otherwise skip the calling test, saying what is missing."""
    if not path.exists():
        pytest.skip(f"needs {path} (shared data, not vendored; CI has ../shared beside the checkout)")
    return path
