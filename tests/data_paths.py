"""
Where the tests find their data.

tests/data/ is vendored and always there (a bare clone passes its tests): the Llama 2 and GPT-2 vocabularies and
the 12-tool catalogue, each with its README and licence (tests/data/README.md). ../shared/ beside the checkout
holds what is too large to vendor (the 6 MB Qwen2 vocabulary); a test that needs it skips with a reason when the
folder is absent, so CI (which has it) runs it and a user's clone still passes.
"""
from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
SHARED = ROOT.parent / "shared"

CATALOGUE = DATA / "tools" / "agent_tools.json"     # 12 typed tools, OpenAI's function-calling form
LLAMA2 = DATA / "llama2"                            # tokenizer.model + tokenizer.bin (SentencePiece, 32000)
GPT2 = DATA / "gpt2"                                # tokenizer.json + tokenizer_config.json (byte-level BPE, 50257)
QWEN2 = SHARED / "qwen2"                            # tokenizer.json + tokenizer_config.json (151936): not vendored

QWEN2_MISSING = f"needs the Qwen2 vocabulary at {QWEN2} (6 MB, not vendored; CI has ../shared beside the checkout)"
needs_qwen2 = pytest.mark.skipif(not (QWEN2 / "tokenizer.json").exists(), reason=QWEN2_MISSING)


def data_dir(name: str) -> Path:
    """The test data folder `name` (llama2, gpt2, qwen2, tools): tests/data/NAME where it is vendored, else
    ../shared/NAME (which may be absent: pair with `needs_qwen2` or `shared_or_skip`)."""
    vendored = DATA / name
    return vendored if vendored.exists() else SHARED / name


def shared_or_skip(path: Path) -> Path:
    """`path` (under ../shared) when it exists; otherwise skip the calling test, saying what is missing."""
    if not path.exists():
        pytest.skip(f"needs {path} (large shared data, not vendored; CI has ../shared beside the checkout)")
    return path
