"""A deliberately plain walk of the seed's grammar semantics, used only as a test oracle.

It follows ../shared/seed/grammar.lua's shape: one linear path of segments per tool, a SET of
live (path, segment, offset) states, one byte at a time, a whole token consumed or rejected.
It shares no code with batchmask's compiler. On top of the seed it learns the UTF-8 rule the
compiler enforces with utf8=True, in its own way: it keeps the bytes of the character in
progress and asks Python's decoder whether they can still become a character.
"""
from __future__ import annotations

from functools import cache, lru_cache


def build_paths(tools, max_string):
    """tools: list of (name, [required arg names]). Each path: list of ("lit", bytes) / ("str", min, max)."""
    paths = []
    for name, args in tools:
        head = '{"tool":"' + name + '","args":{'
        if not args:
            paths.append([("lit", (head + "}}").encode())])
            continue
        segs = []
        for i, a in enumerate(args):
            opener = (head + '"' + a + '":"') if i == 0 else ('","' + a + '":"')
            segs.append(("lit", opener.encode()))
            segs.append(("str", 1, max_string))
        segs.append(("lit", b'"}}'))
        paths.append(segs)
    return paths


def char_len(lead: int) -> int:
    if lead < 0x80:
        return 1
    if 0xC2 <= lead <= 0xDF:
        return 2
    if 0xE0 <= lead <= 0xEF:
        return 3
    if 0xF0 <= lead <= 0xF4:
        return 4
    return 0  # never a lead byte


@cache
def can_become_char(partial: bytes) -> bool:
    """Is `partial` a prefix of some well-formed UTF-8 character? Asked of the decoder itself."""
    n = char_len(partial[0])
    if n == 0 or len(partial) > n:
        return False
    missing = n - len(partial)
    fillers = [0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF]
    candidates = [b""]
    for _ in range(missing):
        candidates = [c + bytes([f]) for c in candidates for f in fillers]
    for tail in candidates:
        try:
            (partial + tail).decode("utf-8", errors="strict")
            return True
        except UnicodeDecodeError:
            pass
    return False


def is_body(c: int) -> bool:
    return c >= 0x20 and c != 0x22 and c != 0x5C


class Oracle:
    """States are (path, seg, pos, pending) tuples; `pending` is the unfinished character's bytes."""

    def __init__(self, tools, max_string, utf8=True):
        self.paths = build_paths(tools, max_string)
        self.max_string = max_string
        self.utf8 = utf8
        self._memo = {}

    def start(self):
        return frozenset((p, 0, 0, b"") for p in range(len(self.paths)))

    def is_done(self, states) -> bool:
        return any(seg >= len(self.paths[p]) for p, seg, _, _ in states)

    def _step(self, st, c):
        p, seg, pos, pend = st
        path = self.paths[p]
        if seg >= len(path):
            return []
        kind = path[seg]
        out = []
        if kind[0] == "lit":
            text = kind[1]
            if text[pos] == c:
                out.append((p, seg + 1, 0, b"") if pos + 1 == len(text) else (p, seg, pos + 1, b""))
            return out
        _, lo, hi = kind
        if is_body(c) and pos < hi:
            if not self.utf8 or (c < 0x80 and not pend):
                out.append((p, seg, pos + 1, b""))
            elif self.utf8 and (c >= 0x80 or pend):
                cand = pend + bytes([c])
                if can_become_char(cand):
                    need = char_len(cand[0])
                    # the whole character must fit under the cap
                    if (pos - len(pend)) + need <= hi:
                        out.append((p, seg, pos + 1, b"" if len(cand) == need else cand))
        if pos >= lo and not pend:
            nxt = path[seg + 1]
            if nxt[1][0] == c:
                out.append((p, seg + 2, 0, b"") if len(nxt[1]) == 1 else (p, seg + 1, 1, b""))
        return out

    def _step_memo(self, st, c):
        key = (st, c)
        if key not in self._memo:
            self._memo[key] = self._step(st, c)
        return self._memo[key]

    def consume(self, states, data: bytes):
        cur = set(states)
        for c in data:
            nxt = set()
            for st in cur:
                nxt.update(self._step_memo(st, c))
            if not nxt:
                return None
            cur = nxt
        return frozenset(cur)

    def legal(self, states, token_bytes, eos_id):
        """The legal token ids. A complete call allows EOS only."""
        if self.is_done(states):
            return {eos_id}
        # Only tokens whose first byte some live state accepts can be legal: try just those.
        firsts = [c for c in range(256) if any(self._step(st, c) for st in states)]
        by_first = _by_first_byte(tuple(token_bytes))
        return {i for c in firsts for i in by_first.get(c, ())
                if i != eos_id and self.consume(states, token_bytes[i]) is not None}

    def finish(self, states) -> bytes:
        """Owed bytes: lowest path first, '?' up to a value's minimum, a cut character completed minimally."""
        p, seg, pos, pend = min(states)
        path = self.paths[p]
        out = b""
        while seg < len(path):
            kind = path[seg]
            if kind[0] == "lit":
                out += kind[1][pos:]
            else:
                if pend:
                    # the smallest continuation the decoder accepts
                    need = char_len(pend[0]) - len(pend)
                    for lo in range(0x80, 0xC0):
                        tail = bytes([lo]) + b"\x80" * (need - 1)
                        try:
                            (pend + tail).decode("utf-8")
                            break
                        except UnicodeDecodeError:
                            continue
                    out += tail
                    pos += len(tail)
                    pend = b""
                if pos < kind[1]:
                    out += b"?" * (kind[1] - pos)
            seg, pos = seg + 1, 0
        return out

    def describe(self, states):
        """The residuals, in path order, in the compiler's `describe` vocabulary."""
        if self.is_done(states):
            return ["final"]
        out = []
        for p, seg, pos, pend in sorted(states):
            path = self.paths[p]
            suffix = tuple(("L", k[1]) if k[0] == "lit" else ("S", k[1], k[2]) for k in path[seg + 1:])
            kind = path[seg]
            if kind[0] == "lit":
                r = ("L", kind[1][pos:], suffix)
            else:
                r = ("S", pos, _substate_name(pend), suffix)
            if r not in out:
                out.append(r)
        return out


@lru_cache(maxsize=8)
def _by_first_byte(token_bytes: tuple) -> dict:
    groups = {}
    for i, t in enumerate(token_bytes):
        if t:
            groups.setdefault(t[0], []).append(i)
    return groups


def _substate_name(pend: bytes) -> str:
    if not pend:
        return "boundary"
    if len(pend) == 1 and pend[0] in (0xE0, 0xED, 0xF0, 0xF4):
        return "after_%02x" % pend[0]
    return "cont%d" % (char_len(pend[0]) - len(pend))
