"""The compiled-grammar cache file, and the JSON form of a grammar tree it stores.

A cache file (torch.save of plain tensors, strings and numbers: it loads with weights_only) holds
the tables, the vocabulary's bytes and stop ids, and `meta`: the format, the caller's `key` (what
the grammar was built from, e.g. the registry and max_string), utf8, the vocabulary hash and the
grammar tree as JSON. Loading checks the file against what the caller expects (field by field,
one line naming the field that differs) and rebuilds the automaton (describe/finish) from the tree,
so a file works on its own.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from ..grammar.nodes import Alt, ByteSet, JsonStr, Lit, Repeat, Seq, Str, Word
from ..safe_write import write_atomic
from ..table.tokensim import hash_vocab

CACHE_FORMAT = "batchmask-grammar/5"      # 4: absolute codes index a target list; legal count and final per row
#                                           5: ... from the base of the state's segment (value blocks share rows)
TABLES = ("token_class", "state_row", "row_next", "row_legal", "row_final", "targets", "segment_start",
          "segment_base")
PACKED = ("row_base", "row_check")        # a packed table's layout (table/packed.py), saved beside num_classes;
#                                           a file without them (every file before packing) is dense


class GrammarCacheError(ValueError):
    """A compiled-grammar cache file is corrupt or was built for something else."""


# --- grammar trees as JSON ---------------------------------------------------------------------------
def node_to_json(node):
    """A JSON-able form of a grammar tree (bytes as latin-1 text: one code point per byte)."""
    if isinstance(node, Lit):
        return {"lit": bytes(node.text).decode("latin-1")}
    if isinstance(node, Seq):
        return {"seq": [node_to_json(x) for x in node.items]}
    if isinstance(node, Alt):
        return {"alt": [node_to_json(x) for x in node.options]}
    if isinstance(node, ByteSet):
        return {"byteset": bytes(node.mask).hex()}
    if isinstance(node, Repeat):
        return {"repeat": node_to_json(node.item), "min": node.min, "max": node.max}
    if isinstance(node, Str):
        return {"str": [node.min, node.max]}
    if isinstance(node, JsonStr):
        return {"jsonstr": [node.min, node.max]}
    if isinstance(node, Word):
        return {"word": [bytes(node.start).hex(), bytes(node.body).hex(), bytes(node.end).hex(), node.min, node.max]}
    raise TypeError(f"not a grammar node: {type(node).__name__}")


def _bound(x) -> int | None:
    """A Repeat's or JsonStr's max as saved (null: no max)."""
    return None if x is None else int(x)


def node_from_json(obj):
    kind = next(iter(obj)) if isinstance(obj, dict) and obj else None
    if kind == "lit":
        return Lit(obj["lit"].encode("latin-1"))
    if kind == "seq":
        return Seq(tuple(node_from_json(x) for x in obj["seq"]))
    if kind == "alt":
        return Alt(tuple(node_from_json(x) for x in obj["alt"]))
    if kind == "byteset":
        return ByteSet(bytes.fromhex(obj["byteset"]))
    if kind == "repeat":
        return Repeat(node_from_json(obj["repeat"]), int(obj["min"]), _bound(obj["max"]))
    if kind == "str":
        return Str(int(obj["str"][0]), int(obj["str"][1]))
    if kind == "jsonstr":
        return JsonStr(int(obj["jsonstr"][0]), _bound(obj["jsonstr"][1]))
    if kind == "word":
        s, b, e, lo, hi = obj["word"]
        return Word(bytes.fromhex(s), bytes.fromhex(b), bytes.fromhex(e), int(lo), int(hi))
    raise ValueError(f"not a grammar node in JSON form: {str(obj)[:60]}")


def plain(x):
    """x as JSON would give it back (tuples become lists), for comparing keys."""
    return json.loads(json.dumps(x))


# --- save / load ----------------------------------------------------------------------------------------
def save_grammar(g, path) -> None:
    node = getattr(g, "node", None)
    if node is None and "node" not in g.meta:
        raise GrammarCacheError("this grammar has no grammar tree to store (only compiled grammars can be saved)")
    tree = None if node is None else [node_to_json(n) for n in node] if isinstance(node, list) else node_to_json(node)
    meta = dict(g.meta, bytes_hash=hash_vocab(g.token_bytes, g.eos_id, g.stop_ids))
    if tree is not None:
        meta["node"] = json.dumps(tree)
    payload = {"meta": meta, "start": g.start, "eos_id": g.eos_id, "done_state": g.done_state,
               "stop_ids": list(g.stop_ids), "starts": list(g.starts)}
    payload.update({k: getattr(g, k).cpu() for k in TABLES})
    if getattr(g, "row_base", None) is not None:
        payload.update({k: getattr(g, k).cpu() for k in PACKED}, num_classes=int(g.num_classes))
    # the vocabulary's bytes too (as tensors: the file loads with weights_only), so that a cache file
    # is usable on its own; with a tokenizer given, load checks it against the recorded hash instead
    lengths = np.fromiter((len(b) for b in g.token_bytes), dtype=np.int64, count=len(g.token_bytes))
    payload["token_lengths"] = torch.from_numpy(lengths)
    payload["token_data"] = torch.frombuffer(bytearray(b"".join(g.token_bytes) or b"\0"), dtype=torch.uint8)
    def fill(tmp):                # opened by Python, so a read-only or full disk is an OSError naming the file
        with open(tmp, "xb") as fh:
            torch.save(payload, fh)
    write_atomic(Path(path), fill, "grammar cache")


def read_payload(path) -> dict:
    path = Path(path)
    try:
        with warnings.catch_warnings():          # torch warns (a paragraph about pickles) before it fails
            warnings.simplefilter("ignore")
            payload = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise GrammarCacheError(f"{path}: grammar cache not found") from None
    except Exception as e:  # torch raises many kinds on a corrupt zip/pickle; its message is pages long
        raise GrammarCacheError(f"{path}: not a readable grammar cache ({type(e).__name__})") from None
    fmt = payload.get("meta", {}).get("format") if isinstance(payload, dict) and \
        isinstance(payload.get("meta"), dict) else None
    if isinstance(fmt, str) and fmt.startswith("batchmask-grammar/") and fmt != CACHE_FORMAT:
        raise GrammarCacheError(f"{path}: a grammar cache of another batchmask version ({fmt}, this one reads "
                                f"{CACHE_FORMAT}): compile it again")
    if fmt != CACHE_FORMAT:
        raise GrammarCacheError(f"{path}: not a batchmask grammar cache (expected format {CACHE_FORMAT!r})")
    return payload


def check_meta(path, meta: dict, expect: dict) -> None:
    """Refuse a file whose key, options or vocabulary differ from `expect` (one line naming the field)."""
    want_key, got_key = plain(expect["key"]), plain(meta.get("key"))
    if not isinstance(got_key, dict):
        raise GrammarCacheError(f"{path}: corrupt grammar cache (no key)")
    for f in sorted(set(want_key) | set(got_key)):
        if got_key.get(f) != want_key.get(f):
            raise GrammarCacheError(f"{path}: built for another {f}: file has {_short(got_key.get(f))}, "
                                    f"expected {_short(want_key.get(f))}")
    for f in ("utf8", "vocab_hash", "vocab_size", "stop_ids"):
        got, want = plain(meta.get(f)), plain(expect[f])
        if got != want:
            if f == "vocab_hash":
                got, want = str(got)[:12] + "...", str(want)[:12] + "..."
            raise GrammarCacheError(f"{path}: built for another {f}: file has {got!r}, expected {want!r}")


def _short(x) -> str:
    r = repr(x)
    return r if len(r) <= 80 else r[:77] + "..."


def packed_fields(t: dict) -> dict:
    """The CompiledGrammar keyword arguments of a packed table read by check_tables (empty: dense)."""
    return {k: t[k] for k in PACKED + ("num_classes",) if k in t}


def check_tables(path, payload: dict, vocab_size: int) -> dict:
    try:
        t = {k: payload[k] for k in TABLES}
        S, T = t["state_row"].shape[0], t["targets"].numel()
        if "row_base" in payload:                                      # packed (table/packed.py)
            t.update({k: payload[k] for k in PACKED}, num_classes=int(payload["num_classes"]))
            R, C, N = t["row_base"].numel(), t["num_classes"], t["row_next"].numel()
            base, check = t["row_base"], t["row_check"]
            layout_ok = (t["row_next"].dim() == 1 and base.dim() == 1 and base.dtype == torch.int32
                         and check.dtype == torch.int16 and check.shape == t["row_next"].shape
                         and (R == 0 or (int(base.min()) >= 0 and int(base.max()) + C <= N))
                         and int(check.max()) < C and int(torch.unique(base).numel()) == R)
        else:
            (R, C), layout_ok = t["row_next"].shape, True
        start, base = t["segment_start"], t["segment_base"]
        ok = (layout_ok and t["token_class"].shape == (vocab_size,) and t["row_legal"].shape == (R,)
              and t["row_final"].shape == (R,) and t["targets"].dim() == 1
              and 0 <= int(t["token_class"].min()) and int(t["token_class"].max()) < C
              and 0 <= int(t["state_row"].min()) and int(t["state_row"].max()) < R
              and int(t["row_next"].max()) < T and (T == 0 or 0 <= int(t["targets"].min()))
              and (T == 0 or int(t["targets"].max()) < S)
              and start.dim() == 1 and start.shape == base.shape and start.numel() >= 1 and int(start[0]) == 0
              and bool((start[1:] > start[:-1]).all()) and int(start[-1]) < S
              and 0 <= int(base.min()) and int(base.max()) <= T)
    except (KeyError, AttributeError, ValueError, RuntimeError, TypeError):
        ok = False
    if not ok:
        raise GrammarCacheError(f"{path}: corrupt grammar cache (tables missing or of inconsistent shapes)")
    return t


def stored_vocab(payload: dict, meta: dict, path):
    """The vocabulary saved in a cache file, checked against the hash recorded beside it."""
    try:
        lengths = payload["token_lengths"].numpy()
        data = payload["token_data"].numpy().tobytes()
        ends = np.cumsum(lengths)
        starts = ends - lengths
        token_bytes = [data[a:b] for a, b in zip(starts.tolist(), ends.tolist())]
        stop_ids = tuple(int(s) for s in payload["stop_ids"])
        eos_id = int(payload["eos_id"])
    except (KeyError, AttributeError, ValueError, TypeError):
        raise GrammarCacheError(f"{path}: corrupt grammar cache (no readable vocabulary)") from None
    vocab = SimpleNamespace(token_bytes=token_bytes, eos_id=eos_id, stop_ids=stop_ids)
    if hash_vocab(token_bytes, eos_id, stop_ids) != meta.get("bytes_hash"):
        raise GrammarCacheError(f"{path}: corrupt grammar cache (its vocabulary does not match its hash)")
    vocab.vocab_hash = lambda: meta.get("vocab_hash")     # the tokenizer's own hash, recorded at compile time
    return vocab


def stored_node(path, meta: dict):
    """The grammar tree of a cache file (a list of trees for grammars compiled together)."""
    try:
        tree = json.loads(meta["node"])
        return [node_from_json(t) for t in tree] if isinstance(tree, list) else node_from_json(tree)
    except (KeyError, ValueError, TypeError, AttributeError, IndexError):
        raise GrammarCacheError(f"{path}: corrupt grammar cache (no readable grammar tree)") from None
