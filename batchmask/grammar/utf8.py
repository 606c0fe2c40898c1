"""The value-body byte automaton: which bytes a value may take next, by UTF-8 progress.

With `utf8=True` a value is a sequence of whole, well-formed UTF-8 characters (RFC 3629: no
overlong forms, no surrogates, nothing above U+10FFFF). Inside a value the machine therefore
remembers one of eight sub-states:

    BOUNDARY  between characters                       pending 0
    CONT1     one more continuation byte 80..BF         pending 1
    CONT2     two more, next 80..BF                     pending 2
    CONT3     three more, next 80..BF                   pending 3
    AFTER_E0  after E0: next A0..BF (no overlongs)      pending 2
    AFTER_ED  after ED: next 80..9F (no surrogates)     pending 2
    AFTER_F0  after F0: next 90..BF (no overlongs)      pending 3
    AFTER_F4  after F4: next 80..8F (<= U+10FFFF)       pending 3

`pending` is how many bytes the character still needs; the compiler uses it for the byte
cap (a lead byte is legal only where its whole character fits) and `finish` uses it to
complete a character cut mid-way. With `utf8=False` there is one sub-state and any byte
>= 0x80 is a body byte on its own, exactly as in the seed.
"""
from __future__ import annotations

import numpy as np

from .nodes import is_body_byte

BOUNDARY, CONT1, CONT2, CONT3, AFTER_E0, AFTER_ED, AFTER_F0, AFTER_F4 = range(8)
NUM_SUBSTATES = 8
NAMES = ["boundary", "cont1", "cont2", "cont3", "after_e0", "after_ed", "after_f0", "after_f4"]
PENDING = np.array([0, 1, 2, 3, 2, 2, 3, 3], dtype=np.int64)
# The smallest bytes that complete a character from each sub-state (used by finish()).
COMPLETION = [b"", b"\x80", b"\x80\x80", b"\x80\x80\x80", b"\xa0\x80", b"\x80\x80", b"\x90\x80\x80",
              b"\x80\x80\x80"]


def body_table(utf8: bool) -> np.ndarray:
    """int64 [U, 256]: next sub-state after a body byte, -1 where the byte is not allowed.

    U = 8 with utf8, 1 without. Quote, backslash and control bytes are -1 everywhere: the
    quote is handled by the compiler as the end of the value.
    """
    if not utf8:
        t = np.full((1, 256), -1, dtype=np.int64)
        for b in range(256):
            if is_body_byte(b):
                t[0, b] = BOUNDARY
        return t
    t = np.full((NUM_SUBSTATES, 256), -1, dtype=np.int64)
    for b in range(0x80):
        if is_body_byte(b):
            t[BOUNDARY, b] = BOUNDARY
    t[BOUNDARY, 0xC2:0xE0] = CONT1
    t[BOUNDARY, 0xE0] = AFTER_E0
    t[BOUNDARY, 0xE1:0xED] = CONT2
    t[BOUNDARY, 0xED] = AFTER_ED
    t[BOUNDARY, 0xEE:0xF0] = CONT2
    t[BOUNDARY, 0xF0] = AFTER_F0
    t[BOUNDARY, 0xF1:0xF4] = CONT3
    t[BOUNDARY, 0xF4] = AFTER_F4
    t[CONT1, 0x80:0xC0] = BOUNDARY
    t[CONT2, 0x80:0xC0] = CONT1
    t[CONT3, 0x80:0xC0] = CONT2
    t[AFTER_E0, 0xA0:0xC0] = CONT1
    t[AFTER_ED, 0x80:0xA0] = CONT1
    t[AFTER_F0, 0x90:0xC0] = CONT2
    t[AFTER_F4, 0x80:0x90] = CONT2
    return t


