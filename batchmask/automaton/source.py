"""describe() and finish_bytes() of an automaton built from a node tree (automaton/tree.py): read back from its
explicit states' NFA elements and its value blocks, after the build."""
from __future__ import annotations

from .nfa import ALT, BYTE, END, NFA


class NodeSource:
    """describe() and finish_bytes() for a node-built automaton."""

    def __init__(self, nfa: NFA, states, blocks, vts: dict):
        self.nfa, self.states, self.blocks, self.vts = nfa, states, blocks, vts
        self._best = None

    def _elements(self, s: int):
        if s < len(self.states):
            return self.states[s]
        for blk in self.blocks:
            if blk.base <= s < blk.base + blk.size:
                return ((blk.label[3], int(blk.ns[s - blk.base]), int(blk.qs[s - blk.base])),)
        raise IndexError(f"state {s} out of range")

    def describe(self, s: int) -> list:
        out = []
        for e in self._elements(s):
            if isinstance(e, tuple):
                vname, lo, hi = self.nfa.arg[e[0]]
                out.append(("S", e[1], self.vts[vname].names[e[2]], (vname, lo, hi)))
            elif e == self.nfa.end:
                out.append("final")
            else:
                out.append(("B", _mask_text(self.nfa.masks[self.nfa.arg[e]]), self._tail(e)))
        return out

    def _tail(self, e, limit: int = 24) -> bytes:
        """The shortest bytes from NFA state e on, cut at `limit` (describe only)."""
        return self._path(e)[:limit]

    def _lengths(self):
        """Shortest completion length per NFA state and the choice at each ALT (one pass in id order)."""
        if self._best is None:
            nfa = self.nfa
            inf = 1 << 60
            best = [inf] * len(nfa.kind)
            pick = [-1] * len(nfa.kind)
            for i, k in enumerate(nfa.kind):
                if k == END:
                    best[i] = 0
                elif k == BYTE:
                    has = self.nfa.masks[nfa.arg[i]].find(1) >= 0
                    best[i] = 1 + best[nfa.next[i]] if has else inf
                elif k == ALT:
                    opts = nfa.arg[i]
                    j = min(range(len(opts)), key=lambda x: best[opts[x]])      # ties: the first option
                    best[i], pick[i] = best[opts[j]], opts[j]
                else:
                    vname, lo, _ = nfa.arg[i]
                    best[i] = len(self.vts[vname].finish(0, 0, lo)) + best[nfa.next[i]]
            self._best = (best, pick)
        return self._best

    def _path(self, i: int) -> bytes:
        best, pick = self._lengths()
        nfa, out = self.nfa, bytearray()
        while nfa.kind[i] != END:
            k = nfa.kind[i]
            if k == ALT:
                i = pick[i]
                continue
            if k == BYTE:
                out.append(nfa.masks[nfa.arg[i]].find(1))
            else:
                vname, lo, _ = nfa.arg[i]
                out += self.vts[vname].finish(0, 0, lo)
            i = nfa.next[i]
        return bytes(out)

    def finish_bytes(self, s: int) -> bytes:
        """A shortest completion: the element with the shortest one wins, ties to the first."""
        best, _ = self._lengths()
        nfa = self.nfa
        choice, length = None, None
        for e in self._elements(s):
            if isinstance(e, tuple):
                j, n, q = e
                vname, lo, _ = nfa.arg[j]
                head = self.vts[vname].finish(n, q, lo)
                n_e, tail_from = len(head) + best[nfa.next[j]], nfa.next[j]
            else:
                head, n_e, tail_from = b"", best[e], e
            if length is None or n_e < length:
                choice, length = (head, tail_from), n_e
        head, tail_from = choice
        return head + self._path(tail_from)


def _mask_text(mask: bytes) -> str:
    on = [b for b in range(256) if mask[b]]
    if len(on) == 1:
        return repr(bytes(on))
    return f"[{len(on)} bytes {bytes(on[:6])!r}...]" if len(on) > 6 else f"{bytes(on)!r}"
