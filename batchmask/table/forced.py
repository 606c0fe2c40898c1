"""Jump-forward data: the text a grammar forces after each state, and the tokens that write it.

A state is *forced* when it is explicit (not a cell of a value block), not accepting, and has exactly one byte
edge: whatever comes next starts with that byte. Following forced states gives each one its forced run f(s), the
bytes up to the next state where more than one byte may come (a choice, a value, the end of the call). Value
blocks never force: their cells are left to the value's own rules (a string at its cap, whose only byte left is
the closing quote, is not forced; it costs one step).

    forced_text(aut)                      -> ForcedText: per explicit state its forced byte, successor, run length
    forced_tokens(grammar, tokenizer)     -> ForcedTokens: per forced state, the tokens to append and the state
                                             after each (tensors; `concat` joins those of grammars side by side)

The tokens of f(s) are the tokenizer's own encoding of that text, so forced text is written in its canonical
tokenization, with two cuts where the model takes over again:

  * the extension cut (llguidance's chop_tokens): where, from some state s_i of the run, a legal token is longer
    than the rest of f(s) (it covers the rest and goes on, e.g. `"pa` opening a value after `"`), the model may
    want to write the end of f(s) together with what follows, so only tokens that end before s_i are forced;
  * each kept token lies wholly inside f(s), the tokens spell f(s) from its start (checked byte for byte: an
    encoding that adds a leading space, or maps text to a special token, gives no tokens for that state), and
    they are walked through the table (each must be legal; the state after each is kept).

At most `max_tokens` tokens per state and `MAX_BYTES` bytes of a run are encoded, so the data is bounded by the
explicit states (a few thousand for a catalogue), not by the value blocks' cells.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..automaton.form import Automaton, explicit_states
from .packed import row_codes

MAX_TOKENS = 16          # forced tokens per state (one step writes at most this many more per row)
MAX_BYTES = 256          # bytes of a forced run that are encoded (a longer run is written in several jumps)


@dataclass
class ForcedText:
    """The forced runs of an automaton's explicit states (compact: index i is state `states[i]`)."""
    states: np.ndarray       # int64 [E]: the explicit states, ascending
    byte: np.ndarray         # int64 [E]: the one byte a forced state allows (-1 where not forced)
    succ: np.ndarray         # int64 [E]: compact index of the state after it (-1: not forced, or not explicit)
    length: np.ndarray       # int64 [E]: bytes in f(s) (0 where not forced)
    terminal: np.ndarray = None   # bool [E]: accepting, no edges (only a stop id may come)

    def index(self, states) -> np.ndarray:
        """int64: the compact index of each state (-1 where it is not explicit)."""
        s = np.asarray(states, dtype=np.int64)
        if not len(self.states):
            return np.full(s.shape, -1, dtype=np.int64)
        at = np.minimum(np.searchsorted(self.states, s), len(self.states) - 1)
        return np.where(self.states[at] == s, at, -1)

    def run_bytes(self, idx: np.ndarray, width: int) -> np.ndarray:
        """uint8 [len(idx), width]: the first `width` bytes of the runs of compact indices `idx` (0 past a run)."""
        out = np.zeros((len(idx), width), dtype=np.uint8)
        cur = np.asarray(idx, dtype=np.int64).copy()
        for j in range(width):                          # one vectorised pass per byte position
            live = (cur >= 0) & (self.byte[np.maximum(cur, 0)] >= 0)
            out[live, j] = self.byte[cur[live]]
            cur = np.where(live, self.succ[np.maximum(cur, 0)], -1)
        return out

    def text(self, state: int) -> bytes:
        """f(state), whole (host-side helper for messages and tests)."""
        i = int(self.index([state])[0])
        if i < 0:
            return b""
        return self.run_bytes(np.array([i]), int(self.length[i]))[0].tobytes()


def _chain_lengths(member: np.ndarray, succ: np.ndarray) -> np.ndarray:
    """int64 [E]: how many members a chain walk from each member visits before leaving the members (0 for the
    others), by pointer doubling (Wyllie's list ranking: log E vectorised passes, no walk per state). A walk that
    never leaves (a cycle of members, which a bounded grammar does not have) counts 0."""
    E = len(member)
    # a sentinel E (distance 0, pointing to itself) after each walk's last member: every round adds the distance
    # still ahead and halves the pointers, so after log E rounds every walk points to the sentinel
    nxt = np.append(np.where((succ >= 0) & member[np.maximum(succ, 0)], succ, E), E)
    dist = np.append(member.astype(np.int64), 0)
    for _ in range(max(E, 1).bit_length() + 1):
        dist = dist + dist[nxt]
        nxt = nxt[nxt]
    return np.where(member & (nxt[:E] == E), dist[:E], 0)


def forced_text(aut: Automaton) -> ForcedText:
    """The forced byte, successor and run length of every explicit state of `aut` (see the module docstring)."""
    states = explicit_states(aut)
    E = len(states)
    e = np.asarray(aut.edges, dtype=np.int64).reshape(-1, 3)
    pos = np.searchsorted(states, e[:, 0])                                     # compact source of each edge
    degree = np.bincount(pos, minlength=E)[:E]
    accepting = np.isin(states, np.asarray(aut.accepting if aut.accepting is not None else [], dtype=np.int64))
    forced = (degree == 1) & ~accepting
    byte = np.full(E, -1, dtype=np.int64)
    dst = np.full(E, -1, dtype=np.int64)
    one = forced[pos]
    byte[pos[one]], dst[pos[one]] = e[one, 1], e[one, 2]
    text = ForcedText(states, byte, dst, np.zeros(E, dtype=np.int64), accepting & (degree == 0))
    text.succ = np.where(dst >= 0, text.index(dst), -1)
    text.length = _chain_lengths(forced, text.succ)
    return text


@dataclass
class ForcedTokens:
    """Per forced state, the tokens jump-forward appends and the state after each (on one device).

        states   int32 [F]       ascending: the states that have forced tokens
        offsets  int32 [F + 1]   state states[i]'s tokens are tokens[offsets[i]:offsets[i + 1]]
        tokens   int32 [P]       the tokenizer's encoding of the forced text (its canonical tokenization)
        after    int32 [P]       the state after each of them
    """
    states: torch.Tensor
    offsets: torch.Tensor
    tokens: torch.Tensor
    after: torch.Tensor

    @property
    def max_tokens(self) -> int:
        """The most tokens any state forces (the width of a jump)."""
        return int((self.offsets[1:] - self.offsets[:-1]).max()) if self.states.numel() else 0

    @property
    def nbytes(self) -> int:
        return sum(t.element_size() * t.numel() for t in (self.states, self.offsets, self.tokens, self.after))

    def to(self, device) -> ForcedTokens:
        return ForcedTokens(*(t.to(device) for t in (self.states, self.offsets, self.tokens, self.after)))

    def of(self, state: int) -> tuple[list[int], list[int]]:
        """(tokens, states after each) that `state` forces (host-side helper)."""
        i = int(torch.searchsorted(self.states, torch.tensor([int(state)], dtype=torch.int32))[0])
        if i >= self.states.numel() or int(self.states[i]) != int(state):
            return [], []
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.tokens[lo:hi].tolist(), self.after[lo:hi].tolist()


def concat(parts: list[ForcedTokens], offsets: list[int]) -> ForcedTokens:
    """The forced tokens of grammars whose states sit side by side at `offsets` (compiler/sets.py's layout)."""
    base = np.cumsum([0] + [int(p.tokens.numel()) for p in parts])
    return ForcedTokens(torch.cat([p.states + off for p, off in zip(parts, offsets)]).to(torch.int32),
                        torch.cat([parts[0].offsets[:1]] + [p.offsets[1:] + int(b) for p, b in zip(parts, base)])
                        .to(torch.int32),
                        torch.cat([p.tokens for p in parts]).to(torch.int32),
                        torch.cat([p.after + off for p, off in zip(parts, offsets)]).to(torch.int32))


def _encoder(tokenizer):
    """text -> ids as the tokenizer writes that text in the middle of a sequence (no BOS, no dummy prefix).

    SentencePiece (models/tokenizer_spm.py) takes prefix_space=False; a `tokenizers` backend matches special
    tokens inside the text unless told not to (encode_special_tokens), and forced text is never a special."""
    backend = getattr(tokenizer, "backend", None)
    if backend is not None and hasattr(backend, "encode_batch"):
        def encode_all(texts):
            flag = getattr(backend, "encode_special_tokens", False)
            try:
                backend.encode_special_tokens = True          # restored below: the backend is the tokenizer's own
                return [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]
            finally:
                backend.encode_special_tokens = flag
        return encode_all
    import inspect
    try:
        spm = "prefix_space" in inspect.signature(tokenizer.encode).parameters
    except (TypeError, ValueError):
        spm = False
    if spm:
        return lambda texts: [tokenizer.encode(t, bos=False, prefix_space=False) for t in texts]
    return lambda texts: [tokenizer.encode(t, bos=False) for t in texts]


def _longest_extension(grammar, states: np.ndarray) -> np.ndarray:
    """int64 [n]: the byte length of the longest token legal in each state (vectorised over the table's rows)."""
    token_bytes = grammar.token_bytes
    lengths = np.fromiter(map(len, token_bytes), dtype=np.int64, count=len(token_bytes))           # [V]
    cls = grammar.token_class.cpu().numpy().astype(np.int64)
    class_len = np.zeros(int(grammar.num_classes), dtype=np.int64)                                 # [C]
    np.maximum.at(class_len, cls, lengths)
    rows, inv = np.unique(grammar.state_row.cpu().numpy()[states].astype(np.int64), return_inverse=True)
    legal = row_codes(grammar, torch.from_numpy(rows).to(grammar.row_next.device)).cpu().numpy() != -1  # [n rows, C]
    return np.where(legal, class_len[None, :], 0).max(1, initial=0)[inv.reshape(-1)]


def forced_tokens(grammar, tokenizer, max_tokens: int = MAX_TOKENS) -> ForcedTokens:
    """The forced tokens of every forced state of `grammar` (a CompiledGrammar with its automaton), encoded by
    `tokenizer` (the vocabulary the grammar was compiled for). See the module docstring for the cuts.

    A run that ends where the call is complete and nothing may follow (an accepting state without edges: only the
    stop ids are legal) ends with the end token, `eos_id`, as does such a state itself: which stop id ends a call
    does not change its text, so a finished call costs no step to say so."""
    if not 1 <= int(max_tokens) <= 255:
        raise ValueError(f"max_tokens must be in [1, 255], got {max_tokens!r}")
    K = int(max_tokens)
    text = forced_text(grammar.automaton)
    states, toks, count, spelled, length = _text_tokens(grammar, tokenizer, text, K)
    # the states where only a stop id may come: their own row (nothing spelled), after the rows of text
    end_states = text.states[text.terminal]
    states = np.concatenate([states, end_states])
    toks = np.concatenate([toks, np.zeros((len(end_states), K), dtype=np.int64)])
    count, spelled, length = (np.concatenate([x, np.zeros(len(end_states), dtype=np.int64)])
                              for x in (count, spelled, length))
    if not len(states):
        return ForcedTokens(*(torch.zeros(n, dtype=torch.int32) for n in (0, 1, 0, 0)))
    order = np.argsort(states, kind="stable")
    states, toks, count, spelled, length = states[order], toks[order], count[order], spelled[order], length[order]
    n, after, last = _walk(grammar, states, toks, count)
    # a run spelled whole, ending where only a stop id may come: the end token after it
    whole = (n.numpy() == count) & (spelled == length) & (count < K)
    ends = last.numpy()
    stop = whole & np.isin(ends, text.states[text.terminal])
    if stop.any():
        eos = torch.full((int(stop.sum()),), int(grammar.eos_id), dtype=torch.int64)
        nxt = grammar.next_state(torch.from_numpy(ends[stop]).to(grammar.device), eos.to(grammar.device)).cpu()
        rows = np.flatnonzero(stop)[nxt.numpy() >= 0]
        toks[rows, count[rows]] = int(grammar.eos_id)
        r, c = torch.from_numpy(rows), torch.from_numpy(count[rows])
        after[r, c] = nxt[nxt >= 0]
        n[r] += 1
    has = n > 0
    mask = torch.arange(K)[None, :] < n[:, None]                              # [F, K]
    offsets = torch.zeros(int(has.sum()) + 1, dtype=torch.int32)
    offsets[1:] = torch.cumsum(n[has], 0)
    return ForcedTokens(torch.from_numpy(states)[has].to(torch.int32), offsets,
                        torch.from_numpy(toks)[mask].to(torch.int32), after[mask].to(torch.int32))


def _text_tokens(grammar, tokenizer, text: ForcedText, K: int):
    """Per forced state with tokens to force: (states [F], tokens [F, K], counts [F], bytes they spell [F], bytes
    of the whole run [F]), the tokenizer's encoding of each run cut as the module docstring says."""
    idx = np.flatnonzero(text.length > 0)
    states, length = text.states[idx], text.length[idx]
    # the extension cut: from each state of a run, is a legal token longer than the rest of the run?
    ext = np.zeros(len(text.states), dtype=bool)
    ext[idx] = _longest_extension(grammar, states) > length
    safe = _chain_lengths((text.length > 0) & ~ext, text.succ)[idx]          # bytes before the first such state
    go = safe > 0
    idx, states, length, safe = idx[go], states[go], length[go], safe[go]
    width = int(min(length.max(initial=0), MAX_BYTES))
    raw = text.run_bytes(idx, width)                                          # [F, width]
    texts, limits = [], []
    for i in range(len(idx)):                      # one string per forced state: the tokenizer's API is per text
        data = raw[i, :min(int(length[i]), width)].tobytes()
        try:
            s = data.decode("utf-8")
        except UnicodeDecodeError as e:            # a run that starts or is cut inside a character
            s = data[:e.start].decode("utf-8")
        size = len(s.encode("utf-8"))
        cut = size < int(length[i])                # the run goes on: the encoding's last token may not be canonical
        texts.append(s)
        limits.append(int(safe[i]) if int(safe[i]) < size else size - int(cut))
    unique = list(dict.fromkeys(t for t in texts if t))
    encoded = dict(zip(unique, _encoder(tokenizer)(unique)))
    token_bytes = grammar.token_bytes
    F = len(idx)
    toks = np.zeros((F, K), dtype=np.int64)
    count, spelled = np.zeros(F, dtype=np.int64), np.zeros(F, dtype=np.int64)
    for row, (s, limit) in enumerate(zip(texts, limits)):
        ids = encoded.get(s, [])
        pieces = [token_bytes[t] if 0 <= t < len(token_bytes) else b"" for t in ids]
        if not ids or b"".join(pieces) != s.encode("utf-8") or any(not p for p in pieces):
            continue                               # not a plain spelling of the text: force nothing here
        ends = np.cumsum([len(p) for p in pieces])
        k = min(int(np.searchsorted(ends, limit, side="right")), K)
        toks[row, :k], count[row] = ids[:k], k
        spelled[row] = ends[k - 1] if k else 0
    return states, toks, count, spelled, length


def _walk(grammar, states: np.ndarray, toks: np.ndarray, count: np.ndarray):
    """Walk each row's first count tokens through the table from its state (vectorised over the rows): (how many
    are legal in a row [F], the state after each [F, K], the state after the last legal one [F]), on the CPU."""
    F, K = toks.shape
    dev = grammar.device
    cur = torch.from_numpy(states).to(dev)
    after = torch.full((F, K), -1, dtype=torch.int64, device=dev)
    n = torch.from_numpy(count).to(dev)
    for j in range(K):
        live = n > j
        nxt = grammar.next_state(cur, torch.from_numpy(toks[:, j]).to(dev))
        bad = live & (nxt < 0)
        n = torch.where(bad, torch.full_like(n, j), n)
        live &= ~bad
        after[:, j] = torch.where(live, nxt, -1)
        cur = torch.where(live, nxt, cur)
    return n.cpu(), after.cpu(), cur.cpu()
