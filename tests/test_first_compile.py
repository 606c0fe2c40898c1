"""A first compile in a fresh process pays for nothing it does not use: numpy.ma, which numpy's hash-based
np.unique imports on its first call (12-16 ms, a fifth of a cold default-registry compile), is never loaded.

Checked in a child process (the test session itself may have imported numpy.ma through another library), on a
catalogue and on a schema whose values end in many ways (the after_stops path that once called np.unique)."""
import json
import subprocess
import sys

from data_paths import CATALOGUE, LLAMA2

CHILD = """
import json, sys
from batchmask.api import compile_grammar, compile_json_schema
from batchmask.models.tokenizer import load_tokenizer
from batchmask.tools.registry import ToolRegistry
assert "numpy.ma" not in sys.modules, "imported before any compile"
tok = load_tokenizer(sys.argv[1])
compile_grammar(ToolRegistry.from_json(sys.argv[2]), tok, format="json")
compile_json_schema(json.loads(sys.argv[3]), tok)
print(json.dumps("numpy.ma" in sys.modules))
"""

SCHEMA = {"type": "object", "properties": {
    "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]+(-[a-z0-9]+)*$"}},
    "score": {"type": "number"}, "when": {"type": "string", "format": "date-time"}}}


def test_first_compile_does_not_load_numpy_ma():
    proc = subprocess.run([sys.executable, "-c", CHILD, str(LLAMA2 / "tokenizer.model"), str(CATALOGUE),
                           json.dumps(SCHEMA)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) is False
