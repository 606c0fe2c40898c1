"""The signature's stop cells (kept per tokenizer) are exactly the cells torch.nonzero finds in ev_of."""
from __future__ import annotations

import random
from types import SimpleNamespace

import torch

from batchmask.grammar.values import value_type
from batchmask.table.tokensim import prepare_vocab


def test_stop_cells_match_nonzero():
    rng = random.Random(0)
    alphabet = [b'"', b"\\", b"a", b"b", b" ", b"u", b"0", b"}", b",", "é".encode(), b"\xe2\x82", b"\xac"]
    words = sorted({b"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6))) for _ in range(400)})
    tok = SimpleNamespace(token_bytes=[b""] + [bytes([b]) for b in range(256)] + words, eos_id=0)
    prep = prepare_vocab(tok, "cpu")
    for kind in ("json", "seed"):
        for utf8 in (True, False):
            sig = prep.signature(value_type(kind, utf8))
            qi, ti = torch.nonzero(sig.ev_of >= 0, as_tuple=True)
            assert len(qi) > 0
            assert torch.equal(sig.stop_q, qi) and torch.equal(sig.stop_t, ti)
            assert torch.equal(sig.stop_ev, sig.ev_of[qi, ti])
