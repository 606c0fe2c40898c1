"""Grammar tree x vocabulary -> CompiledGrammar: the table everything stands on, and its API.

    compile_node(node, tokenizer, key=...)    any tree of grammar/nodes.py's nodes
    compile_grammar(registry, tokenizer)      the seed's tool-call grammar of a registry

The pipeline, one module per job:
    grammar/nodes.py          the node types
    grammar/values.py           the value rules: which bytes a value may hold, its cap, when it may close
    automaton/dfa.py              the seed's linear paths -> automaton (keeps the seed's describe/finish)
    automaton/tree.py   any node tree -> automaton (NFA, subset construction, shortest finish)
    automaton/form.py        the common automaton form and its byte table
    table/tokensim.py         tokens through the automaton; the vocabulary-only work, cached per tokenizer
    table/build.py            token classes, rows shared by shift, the factored table
    compiler/cache.py    the cache file format
A tree made only of linear Lit/Str paths (the seed's form) goes through automaton/dfa.py, so the seed's
table, describe() and finish() are exactly as they were; any other tree through automaton/tree.py.
"""
from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:                       # the seed path reads a registry's names only: no import of the tool side
    from ..tools.registry import ToolRegistry

from ..automaton.dfa import build_byte_dfa
from ..automaton.form import Automaton, gc_paused
from ..automaton.tree import build_node_automaton
from ..grammar.nodes import Alt, Lit, Segment, Seq, Str, tool_path
from ..table.build import build_tables, far_mask
from ..table.forced import MAX_TOKENS, ForcedTokens, forced_tokens
from ..table.next_codes import decode_next
from ..table.packed import codes_at, row_codes
from ..table.tokensim import prepare_vocab, stop_ids_of, vocab_hash_of
from . import cache as cache
from .cache import CACHE_FORMAT, TABLES, GrammarCacheError

__all__ = ["CompiledGrammar", "GrammarCacheError", "compile_grammar", "compile_node", "compile_seed", "CACHE_FORMAT"]

# The table builder asks this for the cells that share rows by shift (a module global, so a test can
# swap in "none" and compare the factored table with the plain one).
_far_mask = far_mask


def seed_paths(node) -> list | None:
    """The seed's paths if `node` is an Alt of Seqs of Lit/Str (one Str bound for all), else None."""
    if not isinstance(node, Alt):
        return None
    paths, bounds = [], set()
    for opt in node.options:
        items = opt.items if isinstance(opt, Seq) else None
        if not items or not isinstance(items[0], Lit) or not all(isinstance(x, (Lit, Str)) for x in items):
            return None
        for a, b in zip(items, items[1:]):
            if isinstance(a, Str) and not (isinstance(b, Lit) and b.text[:1] == b'"'):
                return None
        if isinstance(items[-1], Str) or any(isinstance(x, Lit) and not x.text for x in items):
            return None
        bounds |= {(x.min, x.max) for x in items if isinstance(x, Str)}
        paths.append(tuple(items))
    return paths if len(bounds) <= 1 else None


def automaton_of(node, utf8: bool) -> Automaton:
    if isinstance(node, list):                       # several grammars, one automaton (a start each)
        return build_node_automaton(node, utf8=utf8)
    paths = seed_paths(node)
    if paths is not None:
        try:
            return build_byte_dfa(paths, utf8=utf8).automaton()
        except AssertionError:       # paths the seed's builder does not take (two reach a value at once)
            pass
    return build_node_automaton(node, utf8=utf8)


def compile_node(node, tokenizer, *, utf8: bool = True, key: dict, device="cpu",
                 pack: bool | None = None) -> CompiledGrammar:
    """Compile a grammar tree against `tokenizer`'s vocabulary into a CompiledGrammar on `device`.

    `node` may be a list of trees: then one table holds them all, with a start state each (`starts`, in
    order; equal parts of the trees, e.g. a tool several tool sets have, are the same states and rows).

    `tokenizer` needs `token_bytes` (list[bytes], b"" for ids with no text) and `eos_id`; `stop_ids`
    (default (eos_id,)) and `vocab_hash()` are used when present. `key` is a JSON-able dict of what
    the grammar was built from: cache files record it and `CompiledGrammar.load` checks it. `pack`: store
    row_next packed (True), dense (False) or by its size (None: batchmask/table/packed.py `want_packed`).
    """
    try:
        json.dumps(key)
    except (TypeError, ValueError) as e:
        raise ValueError(f"compile_node: key must be a JSON-able dict ({e})") from None
    if not isinstance(key, dict):
        raise ValueError(f"compile_node: key must be a dict, got {type(key).__name__}")
    dev = torch.device(device)
    # The work is many mid-sized ops: a second intra-op thread buys little, and when another
    # process holds a core it costs a lot (threads spin at every op's barrier). One thread on the CPU.
    threads = torch.get_num_threads()
    if dev.type == "cpu":
        torch.set_num_threads(1)
    try:
        with gc_paused():
            return _compile(node, tokenizer, utf8, key, dev, pack=pack)
    finally:
        torch.set_num_threads(threads)


def _compile(node, tokenizer, utf8, key, dev, automaton=None, pack=None) -> CompiledGrammar:
    t0 = time.perf_counter()
    V = len(tokenizer.token_bytes)
    eos_id = int(tokenizer.eos_id)
    if not 0 <= eos_id < V:
        raise ValueError(f"eos_id {eos_id} is outside the vocabulary (size {V})")
    aut = automaton if automaton is not None else automaton_of(node, bool(utf8))
    prep = prepare_vocab(tokenizer, dev)
    t = build_tables(aut, prep, dev, far=lambda blk, n, d: _far_mask(blk, n, d), pack=pack)
    row_next = t["row_next"]
    store = table_dtype(row_next, len(t["row_legal"]))
    meta = {"format": CACHE_FORMAT, "key": key, "utf8": bool(utf8), "vocab_hash": prep.vocab_hash,
            "vocab_size": V, "stop_ids": list(prep.stop_ids)}            # + the tree as JSON, when saved
    g = CompiledGrammar(t["token_class"].to(torch.int32), t["state_row"].to(store), row_next.to(store),
                        t["row_legal"], t["row_final"], t["targets"].to(torch.int32),
                        t["segment_start"].to(torch.int32), t["segment_base"].to(torch.int32), aut.start, eos_id,
                        t["done_state"],
                        prep.text, meta, aut, stop_ids=prep.stop_ids, starts=aut.starts,
                        row_base=t["row_base"], row_check=t["row_check"], num_classes=t["num_classes"])
    g.node = node
    g.compile_seconds = time.perf_counter() - t0
    return g


def table_dtype(row_next: torch.Tensor, num_rows: int | None = None) -> torch.dtype:
    """The table's integer width, for row_next (its codes, dense or packed) and state_row alike (the kernels take
    int16 or int32 tables): int16 where every code and every row index (num_rows, default row_next's first
    dimension) fits, else int32 (table/write.py writes the narrowest already)."""
    if row_next.dtype == torch.int16:
        return torch.int16
    lo, hi = (int(row_next.min()), int(row_next.max())) if row_next.numel() else (-1, -1)
    fits = -32768 <= lo and hi <= 32767 and (row_next.shape[0] if num_rows is None else num_rows) <= 32767
    return torch.int16 if fits else torch.int32


def tool_paths(registry: ToolRegistry, max_string: int) -> list[tuple[Segment, ...]]:
    """One path per tool, in registry order (the order `finish` breaks ties by)."""
    if not isinstance(max_string, int) or max_string < 1:
        raise ValueError(f"max_string must be an integer >= 1 (a value holds at least 1 byte), got {max_string!r}")
    return [tool_path(t.name, [a.name for a in t.required_args], max_string) for t in registry]



def seed_node(registry: ToolRegistry, max_string: int):
    """The seed's tool-call grammar of `registry` as a node tree (one Seq of Lit/Str per tool)."""
    return Alt(tuple(Seq(p) for p in tool_paths(registry, max_string)))


def seed_key(registry: ToolRegistry, max_string: int) -> dict:
    return {"grammar": "seed", "registry": registry.grammar_key(), "max_string": max_string}


def compile_seed(registry: ToolRegistry, tokenizer, max_string: int = 256, utf8: bool = True,
                 device="cpu", pack: bool | None = None) -> CompiledGrammar:
    """Compile the seed's tool-call grammar of `registry` against `tokenizer` (see compile_node)."""
    return compile_node(seed_node(registry, max_string), tokenizer, utf8=utf8,
                        key=seed_key(registry, max_string), device=device, pack=pack)


compile_grammar = compile_seed     # the seed's entry point (batchmask.compile_grammar adds call formats)


class CompiledGrammar:
    """The compiled grammar: a factored state x token table on one device.

        token_class  int32 [V]       the column each token uses
        state_row    int16 [S]       the row each state uses  } int32 both, if codes or rows need it
        row_next     int16 [R, C]    next-state codes (table/next_codes.py)  }
                     or int16 [N]    packed (row_base int32 [R], row_check int16 [N]: table/packed.py, the one
                                     place that layout is read; row_base None: dense)
        row_legal    int32 [R]       how many token ids are legal in a state of each row
        row_final    bool  [R]       the value is complete: every stop id is legal (and leads to done)
        targets      int32 [T]       the states absolute codes name
        segment_start int32 [G], segment_base int32 [G]   where each state's absolute codes start in
                                     targets (table/next_codes.py: explicit states at 0, each value block its exits)
    legal_count [S] and final [S] are those per state (row_legal[state_row], row_final[state_row]).

    next_state(s, t) = decode_next(codes_at(state_row[s], token_class[t]), s, targets, segments).
    `class_next` materialises the plain [S, C] table of next states (-1 illegal) on demand.
    `done_state` follows a stop token; there only `eos_id` is legal, back to itself.
    """

    def __init__(self, token_class, state_row, row_next, row_legal, row_final, targets, segment_start, segment_base,
                 start, eos_id, done_state, token_bytes, meta, automaton, stop_ids=None, starts=None,
                 row_base=None, row_check=None, num_classes=None):
        self.token_class = token_class          # int32 [V]
        self.state_row = state_row              # int16/int32 [S]
        self.row_next = row_next                # int16/int32 [R, C], or [N] packed
        self.row_base = row_base                # int32 [R] packed: where each row's columns start; None dense
        self.row_check = row_check              # int16 [N] packed: the column owning each slot (-1 none)
        if row_base is not None and num_classes is None:
            raise ValueError("CompiledGrammar: a packed table needs num_classes")
        self._num_classes = int(num_classes) if row_base is not None else row_next.shape[1]
        self.row_legal = row_legal              # int32 [R]
        self.row_final = row_final              # bool [R]
        self.targets = targets                  # int32 [T]
        self.segment_start = segment_start      # int32 [G]
        self.segment_base = segment_base        # int32 [G]
        self.start = int(start)
        self.starts = [int(s) for s in starts] if starts else [self.start]   # one per grammar compiled together
        self.eos_id = int(eos_id)
        self.stop_ids = tuple(stop_ids) if stop_ids is not None else (self.eos_id,)
        self.done_state = int(done_state)
        self.token_bytes = token_bytes
        self.meta = meta
        self.automaton = automaton
        self.compile_seconds = 0.0
        self.node = None                        # the grammar tree (a list for grammars compiled together)
        self._class_next = None

    @property
    def relaxations(self) -> list[dict]:
        """What lenient mode did not write exactly in this grammar's schemas (batchmask.schema.base.RELAXED): one
        dict per keyword and place (where, pointer, keyword, kind "superset"/"narrowed", effect); [] if none."""
        return list(self.meta.get("relaxations", []))

    @property
    def dfa(self) -> Automaton:
        return self.automaton

    # --- shape ------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.row_next.device

    @property
    def num_states(self) -> int:
        return self.state_row.shape[0]

    @property
    def num_rows(self) -> int:
        return self.row_legal.shape[0]

    @property
    def num_classes(self) -> int:
        return self._num_classes

    @property
    def packed(self) -> bool:
        """row_next is stored packed (table/packed.py)."""
        return self.row_base is not None

    def packed_fields(self) -> dict:
        """The keyword arguments that carry the packed layout (empty for a dense table)."""
        if self.row_base is None:
            return {}
        return {"row_base": self.row_base, "row_check": self.row_check, "num_classes": self.num_classes}

    @property
    def vocab_size(self) -> int:
        return self.token_class.shape[0]

    @property
    def nbytes(self) -> int:
        """Device memory held by the grammar's tables (the packed layout's row_base and row_check included)."""
        held = [getattr(self, k) for k in TABLES] + [x for x in (self.row_base, self.row_check) if x is not None]
        return sum(x.element_size() * x.numel() for x in held)

    @property
    def legal_count(self) -> torch.Tensor:
        """int32 [S]: how many token ids are legal in each state."""
        return self.row_legal.index_select(0, self.state_row.long())

    @property
    def final(self) -> torch.Tensor:
        """bool [S]: the states where the value is complete."""
        return self.row_final.index_select(0, self.state_row.long())

    @property
    def class_next(self) -> torch.Tensor:
        """int32 [S, C]: the unfactored table of next states (-1 illegal), built on first use."""
        if self._class_next is None:
            states = torch.arange(self.num_states, device=self.device)[:, None]
            self._class_next = decode_next(row_codes(self, self.state_row.long()), states, self.targets,
                                           self.segment_start, self.segment_base).to(torch.int32)
        return self._class_next

    def to(self, device) -> CompiledGrammar:
        g = CompiledGrammar(*(getattr(self, k).to(device) for k in TABLES), self.start, self.eos_id,
                            self.done_state, self.token_bytes, self.meta, self.automaton, stop_ids=self.stop_ids,
                            starts=self.starts, **{k: v.to(device) if torch.is_tensor(v) else v
                                                   for k, v in self.packed_fields().items()})
        g.compile_seconds, g.node = self.compile_seconds, self.node
        return g

    # --- queries (vectorised, on the grammar's device) ----------------------------------------
    def _states(self, states) -> torch.Tensor:
        s = torch.as_tensor(states, device=self.device).long()
        if s.numel() and (int(s.min()) < 0 or int(s.max()) >= self.num_states):
            raise IndexError(f"state out of range [0, {self.num_states})")
        return s

    def next_state(self, states, tokens) -> torch.Tensor:
        """LongTensor: the state after each token, -1 where the token is illegal."""
        s = self._states(states)
        t = torch.as_tensor(tokens, device=self.device).long()
        in_vocab = (t >= 0) & (t < self.vocab_size)
        cls = self.token_class[t.clamp(0, self.vocab_size - 1)].long()
        rows, cls = torch.broadcast_tensors(self.state_row[s].long(), cls)
        nxt = decode_next(codes_at(self, rows.contiguous(), cls.contiguous()), s, self.targets,
                          self.segment_start, self.segment_base)
        return torch.where(in_vocab, nxt, torch.full_like(nxt, -1))

    def allowed(self, states) -> torch.Tensor:
        """BoolTensor [n, V]: which tokens are legal in each state."""
        s = self._states(states).reshape(-1)
        return row_codes(self, self.state_row[s].long())[:, self.token_class.long()] != -1

    def is_final(self, states) -> torch.Tensor:
        return self.row_final[self.state_row[self._states(states)].long()]

    def legal_counts(self, states) -> torch.Tensor:
        return self.row_legal[self.state_row[self._states(states)].long()]

    # --- host-side helpers -------------------------------------------------------------------
    def finish_bytes(self, state: int) -> bytes:
        """Bytes still owed from `state` for a shortest complete value ('?' fills a string's minimum)."""
        state = int(state)
        if state == self.done_state or bool(self.is_final([state])[0]):
            return b""
        return self.automaton.finish_bytes(state)

    def finish_text(self, state: int) -> str:
        return self.finish_bytes(state).decode("utf-8", errors="surrogateescape")

    def describe(self, state: int) -> list:
        state = int(state)
        if state == self.done_state:
            return ["done"]
        return self.automaton.describe(state)

    def forced_tokens(self, tokenizer, max_tokens: int = MAX_TOKENS) -> ForcedTokens:
        """The tokens jump-forward appends after each forced state, as `tokenizer` writes the forced text
        (batchmask/table/forced.py), on the CPU. Worked out on first use (tens of ms for a catalogue) and kept:
        derived data, not in the cache file."""
        key = (vocab_hash_of(tokenizer), int(max_tokens))
        memo = self.__dict__.setdefault("_forced", {})
        if key not in memo:
            memo[key] = self._forced_tokens(tokenizer, int(max_tokens))
        return memo[key]

    def _forced_tokens(self, tokenizer, max_tokens: int) -> ForcedTokens:
        return forced_tokens(self, tokenizer, max_tokens)

    # --- cache -------------------------------------------------------------------------------
    def save(self, path) -> None:
        cache.save_grammar(self, path)

    @classmethod
    def load(cls, path, device="cpu", registry: ToolRegistry | None = None, tokenizer=None,
             max_string: int | None = None, utf8: bool | None = None, key: dict | None = None) -> CompiledGrammar:
        """Load a cache file, refusing one built for another grammar, vocabulary or options.

        With `key` (or, for the seed's grammar, `registry`/`max_string`) and `tokenizer` given, the file
        must have been built for them; what is not given is taken from the file (its vocabulary
        checked against its hash). The automaton (describe/finish) is rebuilt from the stored tree.
        """
        payload = cache.read_payload(path)
        meta = payload["meta"]
        if tokenizer is None:
            tokenizer = cache.stored_vocab(payload, meta, path)
        want_key = dict(key) if key is not None else dict(meta.get("key") or {})
        if key is None and registry is not None:
            want_key["registry"] = registry.grammar_key()
        if key is None and max_string is not None:
            want_key["max_string"] = max_string
        expect = {"key": want_key, "utf8": meta.get("utf8") if utf8 is None else bool(utf8),
                  "vocab_hash": vocab_hash_of(tokenizer), "vocab_size": len(tokenizer.token_bytes),
                  "stop_ids": list(stop_ids_of(tokenizer))}
        cache.check_meta(path, meta, expect)
        t = cache.check_tables(path, payload, meta["vocab_size"])
        node = cache.stored_node(path, meta)
        aut = automaton_of(node, bool(meta["utf8"]))
        S = t["state_row"].shape[0]
        if aut.num_states + 1 != S:
            raise GrammarCacheError(f"{path}: corrupt grammar cache ({S} states, its grammar gives "
                                    f"{aut.num_states + 1})")
        if aut.starts is not None and list(aut.starts) != list(payload.get("starts") or [payload["start"]]):
            raise GrammarCacheError(f"{path}: corrupt grammar cache (its start states are not its grammar's)")
        g = cls(*(t[k].to(device) for k in TABLES), payload["start"], payload["eos_id"], payload["done_state"],
                list(tokenizer.token_bytes), meta, aut, stop_ids=payload.get("stop_ids"), starts=aut.starts,
                **{k: v.to(device) if torch.is_tensor(v) else v for k, v in cache.packed_fields(t).items()})
        g.node = node
        return g

    def __repr__(self) -> str:
        return (f"CompiledGrammar(states={self.num_states}, rows={self.num_rows}, classes={self.num_classes}, "
                f"vocab={self.vocab_size}, bytes={self.nbytes}, packed={self.packed}, device={self.device})")
