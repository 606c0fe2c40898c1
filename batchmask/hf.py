"""A transformers `LogitsProcessor`: batchmask's grammar mask inside `model.generate`.

    from batchmask import compile_grammar
    from batchmask.hf import LogitsProcessor
    grammar = compile_grammar(registry, tok, format="hermes")     # tok: batchmask's tokenizer, padded to the model
    proc = LogitsProcessor(grammar, batch_size=len(prompts))
    out = model.generate(**inputs, logits_processor=[proc], eos_token_id=list(tok.stop_ids), ...)

Several tool sets in one batch: compile them together (`batchmask.compile_grammars([reg0, reg1, ...], tok)`) and
pass `sets=[...]`, which of them each sequence uses (an index into the grammar's `starts`).

One BatchMasker row per sequence, on the logits' device (Triton on CUDA, the torch path elsewhere). Per call
of generate's loop the processor advances every row by the token generate appended to it (the first call sees
the prompt only), then masks all rows in one launch, in place: no per-row work on the host and no bitmask
filled on the CPU. A row that has finished its call (a stop token) allows only the end token from then on;
generate pads finished rows, and those pads are not fed to the grammar.

Greedy and sampling, left-padded batches (the prompt is never read). Beam search is refused: its sequences
are reordered between steps, which one grammar row per sequence cannot follow. num_return_sequences=N works
with batch_size = N x prompts. One processor serves one generate() call; reset() readies it for another
(keeping its tables, so reuse it rather than building a new one per call).

Needs transformers (`pip install batchmask[hf]`); `import batchmask` never imports it.
"""
from __future__ import annotations

import torch
import transformers

from .masker import BatchMasker


class LogitsProcessor(transformers.LogitsProcessor):
    """Constrain every sequence of a `model.generate` batch to `grammar` (a CompiledGrammar)."""

    def __init__(self, grammar, batch_size: int, *, sets=None, device=None, backend: str = "auto",
                 max_tokens: int = 4096):
        """sets: for grammars compiled together (compile_grammars), which one each sequence uses (int [batch_size],
        indices into grammar.starts; default: the first for all). device: where the logits will be (builds the
        masker now: its tables take a while for a large grammar and vocabulary, seconds on a CPU for 12 typed tools
        x 152K ids); default: built on the first call."""
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1 (the sequences generate runs), got {batch_size!r}")
        starts = list(getattr(grammar, "starts", None) or [grammar.start])
        self.starts = None
        if sets is not None:
            sets = [int(k) for k in sets]
            if len(sets) != batch_size:
                raise ValueError(f"sets: one per sequence, {batch_size}, got {len(sets)}")
            bad = [k for k in sets if not 0 <= k < len(starts)]
            if bad:
                raise ValueError(f"sets: {bad[0]} is not a grammar of this table (it holds {len(starts)}: 0.."
                                 f"{len(starts) - 1})")
            self.starts = [starts[k] for k in sets]
        self.grammar = grammar
        self.batch_size = batch_size
        self.backend = backend
        self.max_tokens = max_tokens          # the masker's per-row token history (for masker.tokens/text)
        self.masker: BatchMasker | None = None
        self._prev: torch.Tensor | None = None  # [B, T] the input_ids of the last call
        if device is not None:
            self._masker_on(torch.device(device))

    def reset(self) -> None:
        """Start over: the next call is the first step of a new generate() call (the masker's tables are kept)."""
        self._prev = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        rows, length = input_ids.shape
        if rows != self.batch_size:
            raise ValueError(self._shape_error(rows))
        masker = self._masker_on(scores.device)
        if self._prev is None:                                    # first step: the prompt only
            masker.reset(starts=self.starts)
        else:
            prev_len = self._prev.shape[1]
            if length != prev_len + 1 or not torch.equal(input_ids[:, :prev_len], self._prev):
                raise ValueError(
                    f"batchmask LogitsProcessor: the sequences did not grow by one token each since the last step "
                    f"({prev_len} -> {length} positions{'' if length != prev_len + 1 else ', earlier tokens changed'}"
                    f"): beam search (num_beams > 1) and assisted decoding reorder or rewrite them, which one grammar "
                    f"row per sequence cannot follow; for another generate() call, use a new processor or reset()")
            last = input_ids[:, -1].to(masker.device)
            # finished rows: generate appends its pad token, which the grammar never sees (they keep emitting EOS)
            eos = torch.full_like(last, int(self.grammar.eos_id))
            masker.advance(torch.where(masker.done, eos, last), check=False)
        self._prev = input_ids
        masker.apply_(scores)
        return scores

    def check(self) -> None:
        """Raise IllegalTokenError if a sequence took a token its grammar state forbids (e.g. a later
        processor un-masked it); a host sync, so call it after generate()."""
        if self.masker is not None:
            self.masker.check()

    def _masker_on(self, device: torch.device) -> BatchMasker:
        if self.masker is None or self.masker.device != device:
            self.masker = BatchMasker(self.grammar, self.batch_size, device=device, backend=self.backend,
                                      max_tokens=self.max_tokens)
        return self.masker

    def _shape_error(self, rows: int) -> str:
        B = self.batch_size
        if rows % B == 0:
            return (f"batchmask LogitsProcessor(batch_size={B}) got {rows} sequences = {rows // B} per prompt: beam "
                    f"search (num_beams > 1) is not supported (beams are reordered between steps); with "
                    f"num_return_sequences={rows // B} and sampling, pass batch_size={rows}")
        return f"batchmask LogitsProcessor(batch_size={B}) got a batch of {rows} sequences; pass batch_size={rows}"
