"""The grammar node types: what every front end (call formats, JSON Schema) builds and the automaton compiles.

The seed's form first. A call is `{"tool":"NAME","args":{"K1":"V1","K2":"V2"}}`. The machine writes every key and
every piece of punctuation itself; the model only ever fills the values. Each tool is one
path of two kinds of segment:

    Lit(text)  exactly these bytes
    Str        a value: body bytes only, at least `min` and at most `max` of them. The
               closing quote belongs to the *next* literal, so the end of a value needs no
               lookahead: a quote simply cannot stay in the body.

For calc that is  Lit('{"tool":"calc","args":{"expr":"')  Str  Lit('"}}').
A tool with no required args is the single literal '{"tool":"NAME","args":{}}'.

Typed tools (JSON Schema, issue 13) need more than linear paths: the grammar of a call is then a
tree of the node types below (the schema front-end builds it, the automaton builder compiles it).
Every node but an unbounded Repeat is bounded (the token ceiling bounds a call):

    Lit(text)             exactly these bytes (may be empty)
    Seq(items)            one after another
    Alt(options)          exactly one of them; ties in `finish` go to the first
    ByteSet(mask)         one byte from a set (mask: 256 bools, as bytes 0/1)
    Repeat(item, min, max) item, min..max times (unrolled by the builder); max None: min or more
                          times (a loop: one copy of the item; the item may not be empty)
    Str(min, max)         the seed's value body (bytes; closing quote in the next Lit)
    JsonStr(min, max)     a JSON string body, min..max characters (max None: no max; a value block whose
                          count stops once the minimum is met): raw UTF-8 characters (whole,
                          valid) except '"', '\\' and U+0000-U+001F, U+007F; the escapes
                          \\" \\\\ \\b \\f \\n \\r \\t and \\u00XX (only for the characters
                          that may not be raw); an escape counts as one character. The closing
                          quote is the first byte of what follows.
"""
from __future__ import annotations

from dataclasses import dataclass

QUOTE = 0x22
BACKSLASH = 0x5C


@dataclass(frozen=True)
class Lit:
    text: bytes


@dataclass(frozen=True)
class Str:
    min: int
    max: int


Segment = Lit | Str


def tool_path(name: str, arg_names: list[str], max_string: int, min_string: int = 1) -> tuple[Segment, ...]:
    head = '{"tool":"%s","args":{' % name
    if not arg_names:
        return (Lit((head + "}}").encode()),)
    segs: list[Segment] = []
    for i, arg in enumerate(arg_names):
        opener = (head + '"%s":"' % arg) if i == 0 else ('","%s":"' % arg)
        segs.append(Lit(opener.encode()))
        # min 1: a required argument may not be empty -- an empty value is a missing one.
        segs.append(Str(min_string, max_string))
    segs.append(Lit(b'"}}'))
    return tuple(segs)


def is_body_byte(b: int) -> bool:
    """Bytes a value may hold: printable, no quote, no backslash -- so no escapes, ever."""
    return b >= 0x20 and b != QUOTE and b != BACKSLASH


# --- typed grammar nodes (see the module docstring) ---------------------------------------------------
class _HashOnce:
    """A composite node's hash, computed once: trees are deduplicated in sets (schema_nodes.alt) and
    hash-consed (automaton/nfa.py), and a dataclass hash would walk the whole subtree at every level. Not pickled:
    a hash of bytes differs from one process to the next."""

    def __hash__(self):
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((type(self).__name__,) + tuple(getattr(self, f) for f in self.__dataclass_fields__))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}


@dataclass(frozen=True)
class Seq(_HashOnce):
    items: tuple

    __hash__ = _HashOnce.__hash__


@dataclass(frozen=True)
class Alt(_HashOnce):
    options: tuple

    __hash__ = _HashOnce.__hash__


@dataclass(frozen=True)
class ByteSet:
    mask: bytes            # 256 bytes, each 0 or 1: mask[b] == 1 where byte b is allowed

    @staticmethod
    def of(allowed) -> ByteSet:
        m = bytearray(256)
        for b in allowed:
            m[b] = 1
        return ByteSet(bytes(m))


@dataclass(frozen=True)
class Repeat(_HashOnce):
    item: object
    min: int
    max: int | None        # None: no upper bound

    __hash__ = _HashOnce.__hash__


@dataclass(frozen=True)
class JsonStr:
    min: int
    max: int | None        # None: no upper bound


@dataclass(frozen=True)
class Word:
    """min..max ASCII bytes: the first from `start`, every other from `body`, the last from `end` (masks of
    256 bytes of 0/1, end within body). Compiled as a value block (values.word_type): its cells share rows
    by shift, where the same language written with Repeat would be one automaton state per position."""
    start: bytes
    body: bytes
    end: bytes
    min: int
    max: int


Node = Lit | Str | Seq | Alt | ByteSet | Repeat | JsonStr | Word
