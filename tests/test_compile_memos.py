"""What a compile keeps for the compiles after it changes no table: the tries of token rests kept per vocabulary
(tokensim.FlatVocab.rests_trie) and the block cells whose rows are computed, kept per value layout and far mask
(blocks.cells_computed). A run of compiles that share value shapes and ending bytes gives, for each schema, the
tables a compile with both memos emptied gives; and the memos were used (else the check would be empty)."""
import torch
from batchmask.models.tokenizer import load_tokenizer
from data_paths import LLAMA2

from batchmask.api import compile_json_schema
from batchmask.compiler.cache import TABLES
from batchmask.table import blocks
from batchmask.table.tokensim import prepare_vocab


def strings(n: int, cap: int) -> dict:
    """An object of n string properties of one cap: n blocks of one shape, ended by the same byte (after_stops walks
    their rests over a trie past 8 blocks)."""
    return {"type": "object", "properties": {f"p{i}": {"type": "string", "maxLength": cap} for i in range(n)},
            "required": [f"p{i}" for i in range(n)]}


SCHEMAS = [strings(10, 16), strings(12, 16),
           {"type": "array", "items": strings(9, 40), "maxItems": 3},
           {"type": "object", "properties": {"a": {"type": "string"}, "b": {"enum": ["x", "y"]},
                                             "c": {"type": "array", "items": {"type": "string", "maxLength": 16}}}}]


def tables(g) -> dict:
    return {name: getattr(g, name) for name in TABLES}


def test_memos_change_no_table():
    tok = load_tokenizer(LLAMA2 / "tokenizer.model")
    rests = prepare_vocab(tok, "cpu").vocab._rests
    blocks._COMPUTED.clear()
    rests.clear()
    kept = [tables(compile_json_schema(s, tok)) for s in SCHEMAS]
    assert len(blocks._COMPUTED) > 0 and len(rests) > 0                 # both memos were filled, so read after
    for schema, want in zip(SCHEMAS, kept):
        blocks._COMPUTED.clear()
        rests.clear()
        got = tables(compile_json_schema(schema, tok))
        for name in TABLES:
            assert torch.equal(got[name], want[name]), name


def test_a_grammar_keeps_the_tokenizers_bytes():
    tok = load_tokenizer(LLAMA2 / "tokenizer.model")
    a, b = (compile_json_schema(s, tok) for s in SCHEMAS[:2])
    assert a.token_bytes == list(tok.token_bytes) and a.token_bytes is b.token_bytes    # one copy per vocabulary
    assert a.token_bytes is not tok.token_bytes                                           # not the caller's list
