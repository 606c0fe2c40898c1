"""A transformers `LogitsProcessor`: batchmask's grammar mask inside `model.generate`.

The short path, from a Hugging Face tokenizer and the tools (the README's transformers section runs as a test):

    proc = LogitsProcessor.from_pretrained(tokenizer, tools=tools, batch_size=len(tasks), format="hermes",
                                           model=model)        # the model's vocab_size and end tokens
    inputs = proc.chat_inputs(tasks).to(model.device)          # the chat template with tools=tools, left-padded
    out = model.generate(**inputs, logits_processor=[proc], eos_token_id=proc.stop_ids, pad_token_id=proc.pad_id)
    replies = proc.replies(out)                                # each row's call; a row cut short is completed
    calls = proc.parse_calls(r.text for r in replies)          # OpenAI's shape

`from_pretrained` builds batchmask's tokenizer from the Hugging Face one once (models/tokenizer_transformers.py:
its own vocabulary, padded to the model's, its end tokens) and compiles the tools. A row that `max_new_tokens` cut
mid-call is closed by `replies` with its grammar's shortest completion from where it stopped (the bytes the CLI's
`cut` records get too), in the fewest tokens (compiler/shortest.py), then the end token; its Reply says
`completed`.

From a grammar compiled yourself:

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

import os
from dataclasses import dataclass

import torch
import transformers

from . import checks
from .masker import BatchMasker
from .tools.calls import parse_calls
from .tools.prompt import chat_messages
from .tools.registry import ToolRegistry

__all__ = ["LogitsProcessor", "Reply", "chat_inputs", "parse_calls"]


@dataclass
class Reply:
    """One row of a generate() batch, read back: `text` the call (no end token), `ids` the row's new tokens up to
    and including its end token, `completed` whether batchmask appended the end of the call (the row was cut by
    max_new_tokens: `added` are the ids it appended, the end token last)."""
    text: str
    ids: list[int]
    completed: bool = False
    added: list[int] | None = None


class LogitsProcessor(transformers.LogitsProcessor):
    """Constrain every sequence of a `model.generate` batch to `grammar` (a CompiledGrammar)."""

    def __init__(self, grammar, batch_size: int, *, sets=None, device=None, backend: str = "auto",
                 max_tokens: int = 4096, tokenizer=None):
        """sets: for grammars compiled together (compile_grammars), which one each sequence uses (int [batch_size],
        indices into grammar.starts; default: the first for all). device: where the logits will be (builds the
        masker now: its tables take a while for a large grammar and vocabulary, seconds on a CPU for 12 typed tools
        x 152K ids); default: built on the first call. tokenizer (recommended): the model's tokenizer (Hugging
        Face's or batchmask's); the grammar is refused unless it was compiled for its vocabulary. Whatever is given,
        logits much wider than the grammar's vocabulary (another model's) are refused at the first step."""
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
        if tokenizer is not None:
            checks.same_vocabulary(grammar, tokenizer)
        self.grammar = grammar
        self.batch_size = batch_size
        self.backend = backend
        self.max_tokens = max_tokens          # the masker's per-row token history (for masker.tokens/text)
        self.masker: BatchMasker | None = None
        self._prev: torch.Tensor | None = None  # [B, T] the input_ids of the last call
        self._prompt_width: int | None = None   # the (left-padded) prompt's width, from the first call
        self._completer = None
        # set by from_pretrained: batchmask's tokenizer, the Hugging Face one, the tools, the call format
        self.tokenizer = self.hf_tokenizer = self.registry = self.tools = self.format = None
        if device is not None:
            self._masker_on(torch.device(device))

    @classmethod
    def from_pretrained(cls, tokenizer, *, tools, batch_size: int, format: str = "json", model=None,
                        vocab_size: int | None = None, stop_ids=None, max_string: int = 256, options=None,
                        sets=None, device=None, backend: str = "auto", max_tokens: int = 4096) -> LogitsProcessor:
        """A processor for `tools` from a Hugging Face tokenizer (an AutoTokenizer object, or a directory / hub id
        to load one from).

        tools: the tool entries (OpenAI function objects, MCP or Anthropic tools, native ones: anything
        ToolRegistry.from_obj takes, a list or {"tools": [...]}), or a ToolRegistry; the chat template gets them as
        given (`chat_inputs`). format: the call envelope the model writes (batchmask.tools.envelope: json, hermes,
        llama3, seed). model (a transformers model or its config): gives vocab_size (its logits' width: ids past
        the tokenizer are padding, never legal) and the end tokens of its generation_config; or pass vocab_size
        (default: the tokenizer's own size). stop_ids: more ids that end a reply. max_string, options: the caps of
        native and typed tools' values (as compile_grammar takes them)."""
        from .api import compile_grammar
        from .models.tokenizer_transformers import from_transformers

        if isinstance(tokenizer, (str, os.PathLike)):
            tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer)
        model_vocab, model_stops = _model_facts(model)
        if vocab_size is not None and model_vocab is not None and vocab_size != model_vocab:
            raise ValueError(f"vocab_size={vocab_size} but the model's config says {model_vocab}: pass one of them")
        extra = [*model_stops, *([stop_ids] if isinstance(stop_ids, int) else stop_ids or [])]
        tok = from_transformers(tokenizer, vocab_size=model_vocab if vocab_size is None else vocab_size,
                                stop_ids=extra)
        registry = tools if isinstance(tools, ToolRegistry) else ToolRegistry.from_obj(tools, source="tools")
        grammar = compile_grammar(registry, tok, format=format, max_string=max_string, options=options)
        proc = cls(grammar, batch_size, sets=sets, device=device, backend=backend, max_tokens=max_tokens)
        proc.tokenizer, proc.hf_tokenizer, proc.registry, proc.format = tok, tokenizer, registry, format
        proc.tools = _template_tools(tools)
        return proc

    @property
    def stop_ids(self) -> list[int]:
        """The ids that end a reply (pass them as generate's eos_token_id): after a complete call only these."""
        return list(self.grammar.stop_ids)

    @property
    def pad_id(self) -> int:
        """What generate pads finished rows with: the tokenizer's pad token, else the end token."""
        pad = getattr(self.hf_tokenizer, "pad_token_id", None)
        return int(self.grammar.eos_id) if pad is None else int(pad)

    def chat_inputs(self, conversations) -> transformers.BatchEncoding:
        """`chat_inputs(tokenizer, conversations, tools)` with this processor's Hugging Face tokenizer and tools."""
        self._needs("chat_inputs", self.hf_tokenizer)
        conversations = list(conversations)
        if not conversations or self.batch_size % len(conversations):
            raise ValueError(f"chat_inputs: {len(conversations)} conversations for a processor of batch_size="
                             f"{self.batch_size} (one sequence per conversation, or num_return_sequences per one)")
        return chat_inputs(self.hf_tokenizer, conversations, self.tools)

    def parse_calls(self, texts, request_ids=None) -> list[list[dict]]:
        """batchmask.tools.calls.parse_calls with this processor's tools and format: each text's calls in OpenAI's
        shape ([] for a text that is not a valid call)."""
        self._needs("parse_calls", self.registry)
        return parse_calls(texts, self.registry, self.format, request_ids)

    def _needs(self, what: str, value) -> None:
        if value is None:
            raise ValueError(f"LogitsProcessor.{what} needs the processor built by LogitsProcessor.from_pretrained "
                             f"(this one was built from a grammar)")

    def replies(self, sequences) -> list[Reply]:
        """Each row of generate's output (`sequences` [B, T], prompt included, or the GenerateOutput), read back.

        A row that ended (a stop id) is its tokens up to that id. A row cut by max_new_tokens is completed: the
        grammar's shortest completion from its state, in the fewest tokens (compiler/shortest.py), then the end
        token, so its text is a whole call (`completed`). generate samples its last token after the processor's
        last call: that token is fed to the grammar here, once (calling replies again reads the same)."""
        sequences = getattr(sequences, "sequences", sequences)
        if self.masker is None or self._prev is None:
            raise ValueError("LogitsProcessor.replies: the processor has not run (pass it to generate() first)")
        masker, prev = self.masker, self._prev
        if sequences.dim() != 2 or sequences.shape[0] != self.batch_size:
            raise ValueError(f"replies: expected generate's sequences [{self.batch_size}, T], got "
                             f"{list(sequences.shape)}")
        seen = prev.shape[1]
        same = sequences.shape[1] in (seen, seen + 1) and torch.equal(sequences[:, :seen].to(prev.device), prev)
        if not same:
            raise ValueError(f"replies: these are not the sequences of this processor's generate() call ({seen} "
                             f"positions fed, {sequences.shape[1]} given, or other tokens)")
        if sequences.shape[1] == seen + 1:                    # the token generate sampled after the last call
            last = sequences[:, -1].to(masker.device)
            masker.advance(torch.where(masker.done, torch.full_like(last, int(self.grammar.eos_id)), last),
                           check=False)
            self._prev = sequences.to(prev.device)
        masker.check()
        if self._completer is None:
            from .compiler.shortest import Completer
            self._completer = Completer(self.grammar)
        stops, eos, token_bytes = set(self.stop_ids), int(self.grammar.eos_id), self.grammar.token_bytes
        done, states = masker.done.tolist(), masker.states.tolist()
        out = []
        for row, new in enumerate(sequences[:, self._prompt_width:].tolist()):
            end = next((k for k, t in enumerate(new) if t in stops), None)
            if done[row] and end is not None:
                ids, added = new[:end + 1], None
            else:
                ids, added = new, [*self._completer.tokens(states[row]), eos]
                ids = ids + added
            text = b"".join(token_bytes[t] for t in ids).decode("utf-8", errors="replace")   # end tokens: no bytes
            out.append(Reply(text, ids, added is not None, added))
        return out

    def reset(self) -> None:
        """Start over: the next call is the first step of a new generate() call (the masker's tables are kept)."""
        self._prev = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        rows, length = input_ids.shape
        if rows != self.batch_size:
            raise ValueError(self._shape_error(rows))
        masker = self._masker_on(scores.device)
        if self._prev is None:                                    # first step: the prompt only
            V = len(self.grammar.token_bytes)
            if scores.shape[-1] > V:                              # a model padded a little, or another model
                checks.padding_fits(V, scores.shape[-1], "the grammar's vocabulary", "the model's logits")
            masker.reset(starts=self.starts)
            self._prompt_width = length
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


def chat_inputs(tokenizer, conversations, tools=None) -> transformers.BatchEncoding:
    """input_ids and attention_mask [n, T] for `model.generate`: each conversation (a list of messages, or a string
    for one user message) through the tokenizer's chat template, `tokenizer.apply_chat_template(conversation,
    tools=tools, add_generation_prompt=True)` with `tools` exactly as given, left-padded (with the pad token, else
    the end token: the mask hides them). The tokenizer is not changed (no padding side or pad token set on it)."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(f"chat_inputs: {type(tokenizer).__name__}({getattr(tokenizer, 'name_or_path', '')}) has no "
                         f"chat template (tokenizer_config.json's chat_template or chat_template.jinja)")
    rows = []
    for conversation in conversations:
        text = tokenizer.apply_chat_template(chat_messages(conversation), tools=tools, add_generation_prompt=True,
                                             tokenize=False)
        rows.append(tokenizer(text, add_special_tokens=False)["input_ids"])   # as apply_chat_template encodes
    if not rows:
        raise ValueError("chat_inputs: no conversations")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise ValueError(f"chat_inputs: {type(tokenizer).__name__} has neither a pad token nor an end token to pad "
                         f"with")
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), int(pad), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for r, row in enumerate(rows):
        if row:
            ids[r, width - len(row):] = torch.tensor(row)
            mask[r, width - len(row):] = 1
    return transformers.BatchEncoding({"input_ids": ids, "attention_mask": mask})


def _model_facts(model) -> tuple[int | None, list[int]]:
    """(vocab_size, the generation config's end tokens) of a transformers model or config (None, [] for None)."""
    if model is None:
        return None, []
    config = getattr(model, "config", model)
    vocab = getattr(config, "vocab_size", None)
    if vocab is None and hasattr(config, "get_text_config"):        # a multimodal model: its text part's
        vocab = getattr(config.get_text_config(), "vocab_size", None)
    if not isinstance(vocab, int):
        raise ValueError(f"model: {type(model).__name__} has no config.vocab_size; pass vocab_size=")
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None)
    return vocab, [eos] if isinstance(eos, int) else list(eos or [])


def _template_tools(tools):
    """The tools a chat template gets: the user's own entries as given; a registry's as the CLI shows them."""
    if isinstance(tools, ToolRegistry):
        from .tools.prompt import tool_schemas
        return tool_schemas(tools)
    if isinstance(tools, dict):                     # {"tools": [...]}, or an MCP tools/list response
        inner = tools.get("tools", (tools.get("result") or {}).get("tools") if isinstance(tools.get("result"), dict)
                          else None)
        return inner if isinstance(inner, list) else tools
    return tools
