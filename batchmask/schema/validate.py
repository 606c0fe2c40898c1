"""Is a JSON value valid under a schema? The jsonschema library's draft 2020-12 validator answers.

The grammar already guarantees that a constrained call is valid within its exact language; this judges any
text independently of it: the free arm of the ablation, `--no-constrain`, a user's own output, and the finished
values of a lenient compile (a keyword the automaton writes as a superset: batchmask.schema.base.RELAXED).
`check(value, schema)` returns None when `value` is valid, else one reason: the JSON pointer of the offending
value and jsonschema's message.

What it reads: the schema with drafts 4-7 spellings rewritten (schema/drafts.py `to_2020_12`), formats asserted
(jsonschema's format checker, with the `format-nongpl` checkers installed), and batchmask's closed objects
(`drafts.closed`; `closed=False` gives the specification's open reading). Numbers are exact: values come from
`loads` (Decimal for every non-integer literal) and the schema's own numbers are read the same way, so
`29.9999999999999999999` stays below an exclusive maximum of 30 and an enum's `0.001` is the decimal written.
"""
from __future__ import annotations

import json
import threading
from collections import OrderedDict
from decimal import Decimal, InvalidOperation

import jsonschema
from jsonschema.exceptions import best_match

from .drafts import closed as close_objects
from .drafts import to_2020_12
from .json_values import integer_literal

MESSAGE_CHARS = 240             # a reason longer than this (jsonschema quotes whole values) is cut
VALIDATORS_KEPT = 256           # validators kept, least recently used dropped first


def loads(text: str):
    """JSON with exact numbers (Decimal for every non-integer literal; an integer past Python's int conversion
    limit, 4300 digits, as an integral Decimal). Numbers have no digit cap: an exponent past Decimal's range
    (more than 18 digits) is read as +-10^17, the same side of every bound a schema writes."""
    return json.loads(text, parse_float=_decimal, parse_int=integer_literal)


def _decimal(text: str) -> Decimal:
    try:
        return Decimal(text)
    except InvalidOperation:
        mantissa, _, exponent = text.replace("E", "e").partition("e")
        return Decimal(f"{mantissa}e{'-' if exponent.startswith('-') else ''}{10 ** 17}")



def check(value, schema, *, closed: bool = True) -> str | None:
    """None if `value` (from `loads`) is valid under `schema`, else the first reason: "#/a/1: message"."""
    errors = list(validator(schema, closed).iter_errors(value))
    if not errors:
        return None
    e = best_match(errors)
    where = "#" + "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in e.absolute_path)
    message = e.message if len(e.message) <= MESSAGE_CHARS else e.message[:MESSAGE_CHARS] + "..."
    return f"{where}: {message}"


# --- the validator -------------------------------------------------------------------------------------------
def _integer(checker, v) -> bool:
    if isinstance(v, bool):
        return False
    if isinstance(v, int):
        return True
    if isinstance(v, float):
        return v.is_integer()
    return isinstance(v, Decimal) and v.is_finite() and v == v.to_integral_value()


def _number(checker, v) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float, Decimal))


_BASE = jsonschema.Draft202012Validator
_Exact = jsonschema.validators.extend(
    _BASE, type_checker=_BASE.TYPE_CHECKER.redefine_many({"integer": _integer, "number": _number}))
_KEPT: OrderedDict = OrderedDict()
_LOCK = threading.Lock()


def validator(schema, closed: bool = True):
    """The validator of `schema` (module docstring), built once per schema text and reading."""
    text = json.dumps(schema, ensure_ascii=False, sort_keys=False, separators=(",", ":"), allow_nan=False,
                      default=str)
    key = (text, closed)
    with _LOCK:
        got = _KEPT.get(key)
        if got is not None:
            _KEPT.move_to_end(key)
            return got
    exact = to_2020_12(loads(text))
    if closed:
        exact = close_objects(exact)
    v = _Exact(exact, format_checker=_BASE.FORMAT_CHECKER)
    with _LOCK:
        _KEPT[key] = v
        while len(_KEPT) > VALIDATORS_KEPT:
            _KEPT.popitem(last=False)
    return v
