"""Paths -> byte-level NFA -> DFA (subset construction), with a dense byte transition table.

NFA states are named by their *residual*: what is left to write. A residual is either
    ("L", rest, suffix)      inside a literal: the bytes `rest`, then the segments `suffix`
    ("S", n, u, suffix)      inside a value: n bytes written, UTF-8 sub-state u, then `suffix`
Two paths whose remaining segments are equal (read_file's and list_dir's `"}}`, say) have
equal residuals, so subset construction merges their states for free: the DFA comes out
with one block of value states per distinct continuation, not one per tool.

DFA states come in four kinds, numbered in this order:
    literal states  ordered tuples of literal residuals. Several are live only while the tool
                    name is still ambiguous; the tuple is in registry order, which is the
                    order `finish` breaks ties by (lowest tool first, as in the seed).
    value states    one block per distinct continuation after a value; in a block, state
                    (n, u) for every reachable byte count n and sub-state u. A value state
                    is always a single residual: only one path can have reached a value.
    final           the call is complete.
    done            EOS was emitted (added by the compiler).
The literal part is tiny (hundreds of states) and built by a plain Python BFS; the value
blocks are regular (values.ValueType.cells lays them out). `ByteDFA.automaton()` hands the
result to the table builder in the common form of automaton/form.py; this module keeps the seed's
own `describe` and `finish` (the lowest tool in registry order completes a call).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..grammar import utf8 as U
from ..grammar.nodes import QUOTE, Lit, Segment, Str
from ..grammar.values import ValueType, value_type
from .form import Automaton, Block

FINAL = ("F",)


def _enter(rest: bytes, suffix: tuple[Segment, ...]):
    """Normalise a residual whose literal part may be used up: move on to what follows."""
    while not rest:
        if not suffix:
            return FINAL
        seg, suffix = suffix[0], suffix[1:]
        if isinstance(seg, Str):
            return ("S", 0, U.BOUNDARY, suffix)
        rest = seg.text
    return ("L", rest, suffix)


@dataclass
class ValueBlock:
    """The value states that share one continuation `suffix` (starting with the closing literal)."""
    suffix: tuple[Segment, ...]
    min: int
    max: int
    base: int = 0                       # id of the block's first state
    grid: np.ndarray = None             # int64 [max+1, U]: state id of (n, u), -1 if unreachable
    ns: np.ndarray = None               # int64 [Nb]: byte count of each state in the block
    us: np.ndarray = None               # int64 [Nb]: sub-state of each state in the block
    after_quote: int = -1               # state id after the closing quote


@dataclass
class ByteDFA:
    utf8: bool
    vt: ValueType
    lit_states: list = field(default_factory=list)   # list of tuples of ("L", rest, suffix)
    blocks: list = field(default_factory=list)       # list of ValueBlock
    lit_edges: dict = field(default_factory=dict)    # (lit state id, byte) -> next state id
    final: int = -1
    num_states: int = 0                               # literal + value + final (done is the compiler's)

    @property
    def num_lit(self) -> int:
        return len(self.lit_states)

    @property
    def num_substates(self) -> int:
        return self.vt.num_substates

    def automaton(self) -> Automaton:
        """The common form (automaton/form.py): literal states and `final` explicit, value blocks as blocks."""
        edges = np.array([(s, b, t) for (s, b), t in self.lit_edges.items()], dtype=np.int64).reshape(-1, 3)
        blocks = []
        for blk in self.blocks:
            exits = np.full(256, -1, dtype=np.int64)
            exits[QUOTE] = blk.after_quote
            local = np.where(blk.grid >= 0, blk.grid - blk.base, -1)
            blocks.append(Block(self.vt, blk.min, blk.max, blk.base, local, blk.ns, blk.us, exits,
                                label=_suffix_key(blk.suffix)))
        return Automaton(num_states=self.num_states, start=0, edges=edges, blocks=blocks,
                         accepting=np.array([self.final], dtype=np.int64), source=self, utf8=self.utf8)

    def state_kind(self, s: int):
        """('L', i) / ('S', block, n, u) / ('F',) for a state id."""
        if s < self.num_lit:
            return ("L", s)
        for k, blk in enumerate(self.blocks):
            if blk.base <= s < blk.base + len(blk.ns):
                i = s - blk.base
                return ("S", k, int(blk.ns[i]), int(blk.us[i]))
        if s == self.final:
            return ("F",)
        raise IndexError(f"state {s} out of range (num_states={self.num_states})")

    def describe(self, s: int) -> list:
        """The NFA residuals a state stands for, as plain tuples (used by the tests' oracle)."""
        kind = self.state_kind(s)
        if kind[0] == "L":
            return [("L", r[1], _suffix_key(r[2])) for r in self.lit_states[kind[1]]]
        if kind[0] == "S":
            blk = self.blocks[kind[1]]
            return [("S", kind[2], self.vt.names[kind[3]], _suffix_key(blk.suffix))]
        return ["final"]

    def finish_bytes(self, s: int) -> bytes:
        """The shortest bytes that complete the call from state s ('?' fills a value below its minimum)."""
        kind = self.state_kind(s)
        if kind[0] == "F":
            return b""
        if kind[0] == "L":
            _, rest, suffix = self.lit_states[kind[1]][0]     # lowest tool in registry order
            return rest + _owed(suffix)
        blk = self.blocks[kind[1]]
        return self.vt.finish(kind[2], kind[3], blk.min) + _owed(blk.suffix)


def _owed(suffix) -> bytes:
    return b"".join(seg.text if isinstance(seg, Lit) else b"?" * seg.min for seg in suffix)


def _suffix_key(suffix) -> tuple:
    return tuple(("L", seg.text) if isinstance(seg, Lit) else ("S", seg.min, seg.max) for seg in suffix)


def build_byte_dfa(paths: list[tuple[Segment, ...]], utf8: bool = True) -> ByteDFA:
    """Subset construction: the literal states by BFS, the value blocks laid out as grids."""
    dfa = ByteDFA(utf8=utf8, vt=value_type("seed", utf8))
    lit_index: dict[tuple, int] = {}
    block_index: dict[tuple, int] = {}
    pending_edges: list[tuple[int, int, object]] = []   # (lit id, byte, target residual or lit tuple)

    def lit_state(residuals: tuple) -> int:
        if residuals not in lit_index:
            lit_index[residuals] = len(dfa.lit_states)
            dfa.lit_states.append(residuals)
            queue.append(residuals)
        return lit_index[residuals]

    def block_of(value_residual) -> int:
        """The block for a value residual ("S", 0, BOUNDARY, suffix), created on first sight."""
        suffix = value_residual[3]
        if suffix not in block_index:
            close = suffix[0]
            assert isinstance(close, Lit) and close.text[:1] == bytes([QUOTE]), "a value must be closed by a quote"
            block_index[suffix] = len(dfa.blocks)
            seg = _value_segment(paths, suffix)
            dfa.blocks.append(ValueBlock(suffix=suffix, min=seg.min, max=seg.max))
        return block_index[suffix]

    queue: list[tuple] = []
    start = tuple(dict.fromkeys(_enter(p[0].text, p[1:]) for p in paths))
    if any(r[0] != "L" for r in start):
        raise ValueError("every tool path must open with a literal")
    lit_state(start)
    # BFS over literal states. A literal state only ever has a handful of outgoing bytes.
    while queue:
        residuals = queue.pop()
        sid = lit_index[residuals]
        for b in dict.fromkeys(r[1][0] for r in residuals):
            nxt = tuple(dict.fromkeys(_enter(r[1][1:], r[2]) for r in residuals if r[1][0] == b))
            if len(nxt) > 1 and any(r[0] != "L" for r in nxt):
                raise AssertionError("a value or the end was reached on two paths at once")
            target = nxt[0]
            if target == FINAL or target[0] == "S":
                if target[0] == "S":
                    k = block_of(target)
                    # The literal after this block's closing quote is a literal state too.
                    after = _enter(dfa.blocks[k].suffix[0].text[1:], dfa.blocks[k].suffix[1:])
                    if after[0] == "L":
                        lit_state((after,))
                    elif after[0] == "S":
                        block_of(after)
                pending_edges.append((sid, b, target))
            else:
                pending_edges.append((sid, b, lit_state(nxt)))

    # Number the states: literal, then each value block, then final.
    next_id = len(dfa.lit_states)
    for blk in dfa.blocks:
        blk.base = next_id
        blk.grid, blk.ns, blk.us = dfa.vt.cells(blk.max, next_id)            # row-major: (n, u) order
        next_id += len(blk.ns)
    dfa.final = next_id
    dfa.num_states = next_id + 1

    def resolve(target) -> int:
        if isinstance(target, int):
            return target
        if target == FINAL:
            return dfa.final
        if target[0] == "S":
            return int(dfa.blocks[block_index[target[3]]].grid[0, U.BOUNDARY])
        return lit_index[(target,)]

    for blk in dfa.blocks:
        blk.after_quote = resolve(_enter(blk.suffix[0].text[1:], blk.suffix[1:]))
    dfa.lit_edges = {(sid, b): resolve(t) for sid, b, t in pending_edges}
    return dfa


def _value_segment(paths, suffix) -> Str:
    for p in paths:
        for i, seg in enumerate(p):
            if isinstance(seg, Str) and p[i + 1:] == suffix:
                return seg
    raise AssertionError("value block without a value segment")
