"""Argument checks at the door of the Python API: a wrong type or range is a TypeError or ValueError naming the
argument, raised before any work, never a raw error from deep inside torch (or a silent reading, such as row 0
for `rows=[0.5]`).

    integer(name, value, lo, hi)      an int (not a bool, not a float that happens to be whole)
    number(name, value, lo, hi)       a real number (int or float, not NaN), within [lo, hi]
    device_of(name, device)           a torch.device that exists here (CUDA asked for without CUDA is refused)
    logits_tensor(name, logits)       a tensor that autograd does not track (masking writes it in place)
    same_vocabulary(grammar, tok)     a grammar and a tokenizer agree on every token's bytes
    padding_fits(tokens, width, ...)  ids past a vocabulary are a model's padding only in small number

The vocabulary rules (the last two) are the one place for "a model, a tokenizer and a grammar pair only when
they agree": the command line and the transformers processor both call them.
"""
from __future__ import annotations

import numbers


def integer(name: str, value, lo: int | None = None, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r:.40}")
    value = int(value)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ValueError(f"{name} must be {_range(lo, hi)}, got {value}")
    return value


def number(name: str, value, lo: float | None = None, hi: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r:.40}")
    value = float(value)
    if value != value or (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ValueError(f"{name} must be {_range(lo, hi)}, got {value}")
    return value


def _range(lo, hi) -> str:
    if lo is not None and hi is not None:
        return f"in [{lo}, {hi}]"
    return f">= {lo}" if lo is not None else f"<= {hi}"


def device_of(name: str, device):
    """`device` as a torch.device, refused when it names a backend this machine lacks."""
    import torch
    try:
        dev = torch.device(device)
    except (TypeError, RuntimeError) as e:
        raise ValueError(f"{name}: not a device ({device!r:.40}): {e}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{name}={str(dev)!r}, but CUDA is not available here (torch {torch.__version__}); "
                         f"use device='cpu'")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"{name}={str(dev)!r}, but this machine has {torch.cuda.device_count()} CUDA device(s)")
    return dev


def row_ids(rows):
    """Row ids as given (a tensor of an integer dtype, an int or ints); floats and bools are refused."""
    import torch
    if isinstance(rows, torch.Tensor):
        if rows.dtype.is_floating_point or rows.dtype.is_complex or rows.dtype == torch.bool:
            raise TypeError(f"rows must be integer row ids, got a {rows.dtype} tensor")
        return rows
    return [integer("rows", r) for r in ([rows] if not hasattr(rows, "__iter__") else rows)]


def logits_tensor(name: str, logits) -> None:
    import torch
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(logits).__name__}")
    if logits.requires_grad:
        raise ValueError(f"{name} require grad: masking writes them in place, which autograd cannot follow; "
                         f"pass logits.detach() (or compute them under torch.no_grad())")


# --- vocabularies ---------------------------------------------------------------------------------
def max_padding(tokens: int) -> int:
    """How many ids past a vocabulary of `tokens` a model may hold as padding. Models pad their embedding to a
    round size (Qwen2: 151,665 tokens in 151,936 rows; Phi-3: 32,011 in 32,064; GPT-NeoX: 50,277 in 50,432):
    a few hundred rows, never another vocabulary's worth. 1,024 or 1/64 of the vocabulary, whichever is more."""
    return max(1024, tokens // 64)


def padding_fits(tokens: int, width: int, what_tokens: str, what_width: str) -> None:
    """Refuse a model (or logits) of `width` ids against a vocabulary of `tokens`: fewer ids than tokens, or
    more padding than any model carries (then they were not trained together, and the output would be
    another vocabulary's ids read as this one's)."""
    if width < tokens:
        raise ValueError(f"{what_width} has {width:,} token ids, fewer than the {tokens:,} of {what_tokens}: "
                         f"they were not made for each other")
    if width - tokens > max_padding(tokens):
        raise ValueError(f"{what_width} has {width:,} token ids but {what_tokens} {tokens:,}: {width - tokens:,} ids "
                         f"would be padding (a model pads by at most {max_padding(tokens):,}); the model and the "
                         f"vocabulary were not trained together")


def same_vocabulary(grammar, tokenizer, what: str = "tokenizer") -> None:
    """Refuse `tokenizer` (batchmask's, or a Hugging Face one) unless every id it has means the bytes `grammar`
    was compiled for, and the grammar's ids past it are padding (no bytes)."""
    mine = list(grammar.token_bytes)
    if hasattr(tokenizer, "token_bytes"):
        theirs = list(tokenizer.token_bytes)
    else:                                        # a transformers tokenizer: read through the tokenizers library
        from .models.tokenizer_transformers import from_transformers
        theirs = list(from_transformers(tokenizer).token_bytes)
    n = min(len(mine), len(theirs))
    if mine[:n] != theirs[:n]:
        first = next(i for i in range(n) if mine[i] != theirs[i])   # only once they are known to differ
        raise ValueError(f"the grammar was compiled for another vocabulary than this {what}'s: id {first} is "
                         f"{mine[first]!r:.30} in the grammar, {theirs[first]!r:.30} in the {what} (grammar "
                         f"{len(mine):,} ids, {what} {len(theirs):,}); compile the grammar with this {what}")
    if any(mine[n:]):
        raise ValueError(f"the grammar was compiled for {len(mine):,} ids, this {what} has {len(theirs):,}: ids past "
                         f"{len(theirs) - 1} have text in the grammar; compile the grammar with this {what}")
    padding_fits(len(theirs), len(mine), f"this {what}", "the grammar")
