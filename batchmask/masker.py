"""
BatchMasker: grammar-constrained decoding state for a whole batch, resident on the device.

Every row of the batch sits in some DFA state of a CompiledGrammar. Per decoding step the masker either
  apply_(logits) + advance(tokens)   mask in place (illegal -> -inf, legal untouched), the caller samples, or
  sample(logits, ...)                mask + sample + advance in one launch (Triton) / a few torch ops,
and never synchronises with the host: illegal tokens set a per-row fault that `check()` turns into an error.

Backends: "triton" (the kernels of kernels/mask_triton.py; on a CPU only under TRITON_INTERPRET=1) and
"torch" (kernels/mask_torch.py, the reference, on an accelerator; on the CPU its fast paths in
kernels/mask_cpu.py and kernels/choose_cpu.py, which touch only the logits that must change); "auto" picks
Triton on CUDA and torch elsewhere. All give the same tokens: at temperature > 0 the draw of kernels/gumbel.py, keyed by
(seed, row key, step). NaN logits count as -inf; a row without a finite legal logit takes its first legal token.

`sample_unmasked` is the same sampler with every token legal: the free arm of the ablation draws through it, so
the two arms differ only by the mask.
"""
from __future__ import annotations

import functools
import importlib.util
import os
from types import SimpleNamespace

import numpy as np
import torch

from batchmask import checks
from batchmask.device_tables import GrammarTableError, device_tables  # noqa: F401 (GrammarTableError: re-exported)
from batchmask.kernels import choose_cpu, mask_cpu, mask_torch
from batchmask.kernels.tables import Rows, legal_counts

LOGIT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class IllegalTokenError(ValueError):
    """A row was advanced by a token its grammar state does not allow."""

    def __init__(self, message: str, faults: list[tuple[int, int, int]]):
        super().__init__(message)
        self.faults = faults  # [(row, token id, state)]


class BatchMasker:
    def __init__(self, grammar, batch_size: int, device=None, backend: str = "auto", max_tokens: int = 1024,
                 tokenizer=None):
        batch_size, max_tokens = (checks.integer("batch_size", batch_size, 1),
                                  checks.integer("max_tokens", max_tokens, 1))
        if tokenizer is not None:
            checks.same_vocabulary(grammar, tokenizer)
        self.grammar = grammar
        self.batch_size = batch_size
        self.max_tokens = max_tokens
        self.device = (checks.device_of("device", device) if device is not None
                       else torch.device(grammar.token_class.device))
        self.backend = _pick_backend(backend, self.device)
        self._kernels = _load_kernels(self.backend)
        self.tables = device_tables(grammar, self.device)
        # the torch backend: the CPU fast paths on the CPU (their token lists are listed per table row when a
        # step first meets it, kernels/short_sides.py: building them all here took seconds on a large vocabulary)
        self._torch = mask_torch
        self.start = int(grammar.start)
        if self.device.type == "cpu":
            self._torch = SimpleNamespace(mask_logits_=mask_cpu.mask_logits_, advance_=mask_cpu.advance_,
                                          sample_=choose_cpu.sample_)
            mask_cpu.sides_of(self.tables).groups(np.array([self.start]))  # the start row, now
        self._start_count = int(legal_counts(torch.tensor([self.start], device=self.device), self.tables)[0])

        B, dev = batch_size, self.device
        self.rows = Rows(
            state=torch.full((B,), self.start, dtype=torch.int32, device=dev),        # [B]
            step=torch.zeros(B, dtype=torch.int32, device=dev),                       # [B]
            history=torch.zeros(B, max_tokens, dtype=torch.int32, device=dev),        # [B, H]
            fault=torch.zeros(B, 3, dtype=torch.int64, device=dev),                   # [B, 3]
            key=torch.arange(B, dtype=torch.int64, device=dev),                       # [B] draw keys
        )
        self.legal_counts = legal_counts(self.rows.state, self.tables)  # int32 [B], last step
        self._tokens = torch.empty(B, dtype=torch.int64, device=dev)

    # ------------------------------------------------------------------------------------------------------
    # state

    @property
    def states(self) -> torch.Tensor:
        """int32 [B]: each row's DFA state (the live buffer: do not write to it)."""
        return self.rows.state

    @property
    def steps(self) -> torch.Tensor:
        """int32 [B]: tokens each row has emitted (EOS counted once)."""
        return self.rows.step

    @property
    def done(self) -> torch.Tensor:
        """bool [B]: rows that have emitted EOS (they only allow EOS from now on)."""
        return self.rows.state == self.tables.done_state

    def reset(self, rows=None, keys=None, starts=None) -> None:
        """Start new sequences in the given slots (default all): start state, step 0, no fault, empty history.

        keys (int [n], optional): what the rows' random draws are keyed by from now on, e.g. a task id, so
        a sequence samples the same tokens whichever slot it runs in (default: the slot index).
        starts (int [n], optional): the state each row starts in, one of the table's start states: a table of
        several grammars (batchmask.compiler.sets.combine) has one per grammar, `table.starts` (default: start)."""
        idx = self._row_index(rows)
        if keys is not None:
            keys = torch.as_tensor(keys, dtype=torch.int64, device=self.device).reshape(-1)
            if keys.numel() != idx.numel():
                raise ValueError(f"reset: {idx.numel()} rows but {keys.numel()} keys")
            self.rows.key.index_copy_(0, idx, keys)
        self.rows.step.index_fill_(0, idx, 0)
        self.rows.fault.index_fill_(0, idx, 0)
        if starts is None:
            self.rows.state.index_fill_(0, idx, self.start)
            self.legal_counts = self.legal_counts.index_fill(0, idx, self._start_count)  # out of place: held
            return
        starts = torch.as_tensor(starts, dtype=torch.int64).reshape(-1).to(self.device)
        if starts.numel() != idx.numel():
            raise ValueError(f"reset: {idx.numel()} rows but {starts.numel()} starts")
        allowed = torch.tensor(list(getattr(self.grammar, "starts", None) or [self.start]), device=self.device)
        if not bool(torch.isin(starts, allowed).all()):
            raise ValueError(f"reset: starts {starts.tolist()} are not all start states of the grammar "
                             f"({allowed.tolist()})")
        self.rows.state.index_copy_(0, idx, starts.to(torch.int32))
        self.legal_counts = self.legal_counts.index_copy(0, idx, legal_counts(starts, self.tables))

    # ------------------------------------------------------------------------------------------------------
    # the decoding step

    def apply_(self, logits: torch.Tensor) -> torch.Tensor:
        """Mask logits [B, V'] in place: illegal and padded ids -> -inf, legal ones keep their exact value
        (a NaN becomes -inf). Returns the legal counts, int32 [B] on the device."""
        self._check_logits(logits)
        if self.backend == "torch":
            self.legal_counts = self._torch.mask_logits_(logits, self.rows.state, self.tables)
        else:
            self.legal_counts = self._kernels.mask_logits_(logits, self.rows.state, self.tables)
        return self.legal_counts

    def advance(self, tokens: torch.Tensor, check: bool | None = None) -> None:
        """Move every row by its token (int [B]). An illegal token leaves its row unchanged and is recorded;
        check=True raises IllegalTokenError at once (a host sync), check=None does so only on the CPU, where
        checking costs nothing; on a GPU call check() when convenient."""
        if tokens.shape != (self.batch_size,):
            raise ValueError(f"advance: tokens must have shape [{self.batch_size}], got {list(tokens.shape)}")
        if tokens.device != self.device:
            raise ValueError(f"advance: tokens are on {tokens.device}, the masker on {self.device}")
        if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
            raise ValueError(f"advance: tokens must be an integer tensor, got {tokens.dtype}")
        if self.backend == "torch":
            self._torch.advance_(tokens, self.rows, self.tables)
        else:
            self._kernels.advance_(tokens.contiguous(), self.rows, self.tables)
        if check or (check is None and self.device.type == "cpu"):
            self.check()

    def sample(self, logits: torch.Tensor, temperature: float = 0.0, top_p: float = 1.0,
               seed: int = 0) -> torch.Tensor:
        """Mask + sample + advance every row; logits [B, V'] are not modified. Returns int64 [B] tokens.

        temperature 0 is greedy (the first maximum among legal tokens); otherwise a draw from
        softmax(logits / temperature) over legal tokens: the maximum over them of a Gumbel process that
        depends on the logits of all tokens and on (seed, row key, step) only (kernels/gumbel.py), so a row's
        draw does not depend on the other rows of the batch, and pass the logits unmasked to couple with
        sample_unmasked. top_p < 1 keeps the smallest set of most likely legal tokens whose probability
        reaches top_p (a second pass of torch ops). Finished rows get EOS. NaN logits count as -inf; a row
        whose legal logits are all non-finite takes its first legal token."""
        self._check_logits(logits)
        temperature = checks.number("sample: temperature", temperature, 0.0)
        top_p = checks.number("sample: top_p", top_p, 0.0, 1.0)
        if top_p == 0.0:
            raise ValueError("sample: top_p must be in (0, 1], got 0.0")
        seed = checks.integer("sample: seed", seed)
        if self.backend == "torch" or (top_p < 1.0 and temperature > 0):
            # the top-p pass needs the sorted distribution: torch ops on both backends (same tokens either way)
            tokens, counts = self._torch.sample_(logits, self.rows, self.tables, temperature, top_p, seed,
                                                 advance=self._advance_quietly)
        else:
            tokens, counts = self._kernels.sample_(logits, self.rows, self.tables, temperature, seed,
                                                   tokens=torch.empty_like(self._tokens))
        self.legal_counts = counts
        return tokens

    def skip(self, tokens: torch.Tensor, counts: torch.Tensor, states: torch.Tensor) -> None:
        """Jump-forward (batchmask/run/jump.py): row r appends its first counts[r] of tokens [B, K], which the caller
        walked through the grammar beforehand, and moves to states[r] (rows with counts 0 stay). No host sync."""
        mask_torch.skip_(self.rows, tokens, counts, states)

    def _advance_quietly(self, tokens: torch.Tensor) -> None:
        self.advance(tokens, check=False)

    # ------------------------------------------------------------------------------------------------------
    # reading results (host syncs: not for the hot loop)

    def check(self) -> None:
        """Raise IllegalTokenError naming every row advanced by an illegal token since its last reset."""
        flagged = self.rows.fault[:, 0] != 0  # [B]
        if not bool(flagged.any()):
            return
        rows = flagged.nonzero()[:, 0].tolist()
        faults = [(r, *self.rows.fault[r, 1:].tolist()) for r in rows]
        lines = [f"row {r}: token {tok} ({self._token_text(tok)!r}) is not legal in state {s}" for r, tok, s in faults]
        # the first line is the whole story for a command line (one line, not one per row); each row's follows
        head = (f"{len(rows)} row{'s' if len(rows) > 1 else ''} advanced by a token the grammar does not allow "
                f"-- was the mask applied? (first: {lines[0]})")
        raise IllegalTokenError("\n".join([head, *lines]), faults)

    def finish(self, rows=None) -> list[str]:
        """The characters each row still owes for a complete call (its grammar's shortest completion)."""
        states = self.rows.state.index_select(0, self._row_index(rows)).tolist()
        return [self.grammar.finish_text(s) for s in states]

    def tokens(self, row: int) -> list[int]:
        """The token ids row has emitted (EOS included), oldest first."""
        row = self._one_row(row)
        n = int(self.rows.step[row])
        if n > self.max_tokens:
            raise ValueError(f"row {row} emitted {n} tokens but the history holds {self.max_tokens} "
                             f"(raise BatchMasker(max_tokens=...))")
        return self.rows.history[row, :n].tolist()

    def text(self, row: int) -> str:
        """The text row has emitted (EOS and other textless ids contribute nothing), decoded as UTF-8."""
        eos = self.tables.eos_id
        data = b"".join(self.grammar.token_bytes[t] for t in self.tokens(row) if t != eos)
        return data.decode("utf-8", errors="replace")  # a row cut mid-character shows U+FFFD, not an error

    # ------------------------------------------------------------------------------------------------------
    # helpers

    def _token_text(self, tok: int) -> str:
        if 0 <= tok < self.tables.vocab_size:
            return self.grammar.token_bytes[tok].decode("utf-8", errors="backslashreplace")
        return f"<not in the vocabulary of {self.tables.vocab_size}>"

    def _one_row(self, row: int) -> int:
        if not 0 <= row < self.batch_size:
            raise IndexError(f"row {row} is out of range for a batch of {self.batch_size}")
        return int(row)

    def _row_index(self, rows) -> torch.Tensor:
        """None | int | sequence | tensor of row ids -> int64 [n] on the device, range checked."""
        if rows is None:
            return torch.arange(self.batch_size, device=self.device)
        rows = checks.row_ids(rows)
        idx = torch.as_tensor(rows, dtype=torch.int64).reshape(-1).to(self.device)
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= self.batch_size):
            raise IndexError(f"rows {idx.tolist()} out of range for a batch of {self.batch_size}")
        return idx

    def _check_logits(self, logits: torch.Tensor) -> None:
        checks.logits_tensor("logits", logits)
        B, V = self.batch_size, self.tables.vocab_size
        if logits.dim() != 2 or logits.shape[0] != B or logits.shape[1] < V:
            raise ValueError(f"logits must have shape [{B}, >= {V}] (batch, vocabulary), got {list(logits.shape)}")
        if logits.dtype not in LOGIT_DTYPES:
            raise ValueError(f"logits must be float32, bfloat16 or float16, got {logits.dtype}")
        if logits.device != self.device:
            raise ValueError(f"logits are on {logits.device}, the masker on {self.device}")
        if self.backend == "triton" and logits.stride(1) != 1:
            raise ValueError(f"the Triton backend needs logits with unit stride along the vocabulary, "
                             f"got strides {logits.stride()}")


def _pick_backend(backend: str, device: torch.device) -> str:
    if backend not in ("auto", "torch", "triton"):
        raise ValueError(f"backend must be 'auto', 'torch' or 'triton', got {backend!r}")
    if backend == "auto":   # CUDA torch on Linux brings triton; where none is installed the torch path runs
        return "triton" if device.type == "cuda" and importlib.util.find_spec("triton") is not None else "torch"
    if backend == "triton" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"backend 'triton' on {device} needs TRITON_INTERPRET=1 in the environment "
                         f"before triton is first imported (or use backend='torch')")
    return backend


def _load_kernels(backend: str):
    if backend != "triton":
        return None
    if importlib.util.find_spec("triton") is None:
        raise ValueError("backend 'triton' needs triton, and none is installed: pip install 'batchmask[cuda]' "
                         "(or use backend='torch')")
    from batchmask.kernels import mask_triton  # imports triton: only when asked for
    return mask_triton


# ----------------------------------------------------------------------------------------------------------
# the same sampler with the mask off (the free arm)

def free_grammar(vocab_size: int, eos_id: int, device=None) -> SimpleNamespace:
    """A one-state grammar in which every token id is legal: BatchMasker over it samples without a mask."""
    if not 0 <= eos_id < vocab_size:
        raise ValueError(f"eos_id {eos_id} is not a token id of a vocabulary of {vocab_size}")
    return SimpleNamespace(token_class=torch.zeros(vocab_size, dtype=torch.int32, device=device),
                           class_next=torch.zeros(1, 1, dtype=torch.int32, device=device),
                           legal_count=torch.tensor([vocab_size], dtype=torch.int32, device=device),
                           start=0, done_state=0, eos_id=eos_id, vocab_size=vocab_size,
                           token_bytes=[b""] * vocab_size, finish_text=lambda state: "")


@functools.lru_cache(maxsize=4)
def _free_masker(vocab_size: int, batch_size: int, device: torch.device, backend: str) -> BatchMasker:
    return BatchMasker(free_grammar(vocab_size, 0, device), batch_size, device=device, backend=backend,
                       max_tokens=1)


def sample_unmasked(logits: torch.Tensor, keys: torch.Tensor, steps: torch.Tensor, temperature: float = 0.0,
                    top_p: float = 1.0, seed: int = 0, vocab_size: int | None = None,
                    backend: str = "auto") -> torch.Tensor:
    """BatchMasker.sample's draw with every id below vocab_size legal (default: the logits' width).

    logits [B, V'] (not modified), keys int [B] (what BatchMasker.reset(keys=...) would key the rows by),
    steps int [B] (tokens each row has emitted) -> int64 [B]. Where this draw is legal in a grammar, a masker
    at those keys and steps draws the same token from the same logits."""
    B, width = logits.shape
    V = width if vocab_size is None else vocab_size
    m = _free_masker(V, B, logits.device, backend)
    m.rows.key.copy_(keys)
    m.rows.step.copy_(steps)
    m.rows.state.zero_()
    return m.sample(logits, temperature, top_p, seed)
