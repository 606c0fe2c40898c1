"""The generation loop: tasks in, one tool call per task out, continuously batched.

Each of the B batch slots holds one task at a time. Per step, for the whole batch at once:

    tokens = masker.sample(logits)        mask + sample + advance (free arm: plain sampling)
    logits = model.decode(tokens)         one token per row, each at its own position

A slot whose row has finished (EOS, or its token ceiling) is emptied and refilled with the
next task at once (its KV rows and grammar state reset), so a long call does not hold the
batch back. Results are handed out in input order as soon as every earlier task is done.

The only host work per step is reading one bool per row (which slots finished) to schedule
refills; the masking, sampling and grammar bookkeeping stay on the device.

With jump_forward (run/jump.py) a row's forced text after its sampled token is appended at once, as the
tokenizer's canonical encoding of that text, and the next pass takes each row's new tokens together
(model.extend: a ragged [B, 1 + K] batch); the per-row counts come back with the finished bools, in the same
host read. A record's `tokens` counts every token it wrote, `steps` the forward passes that chose one (its
sampled tokens: the prefill's and each later pass's); without jump_forward the two are equal.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from ..masker import BatchMasker, sample_unmasked
from ..tools.calls import reply_fields
from ..tools.prompt import encode_prompt, task_text
from ..tools.registry import ToolRegistry
from .limits import check_batch_fits, reduce_seed, task_seed
from .schema_task import SchemaTask


class GenerationError(ValueError):
    """A task cannot be run as given (for example, its prompt does not fit the model's context)."""


@dataclass
class GenerationConfig:
    batch_size: int = 16
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    constrain: bool = True
    continuous: bool = True          # False: refill only when the whole batch is done (static batching)
    record_counts: bool = False      # keep each token's legal count (for --show)
    format: str = "seed"             # the call format results are parsed in (batchmask.tools.envelope)
    system: str | None = None        # a system message before each task (chat templates only)
    jump_forward: bool = False       # forced text appended without a model step per token (run/jump.py)


@dataclass
class Result:
    index: int
    task: str
    text: str
    call: dict | None
    error: str | None
    tokens: int
    cut: bool
    seconds: float
    legal_counts: list[int] | None = None
    token_ids: list[int] | None = None
    raw: bytes = b""                 # the exact bytes written (text is their UTF-8 decoding)
    steps: int | None = None         # forward passes that chose a token (None: one per token)
    content: str | None = None       # OpenAI's message fields (batchmask.tools.calls.reply_fields)
    tool_calls: list = field(default_factory=list)
    finish_reason: str = "stop"

    def record(self) -> dict:
        return {"index": self.index, "task": self.task, "text": self.text, "call": self.call, "error": self.error,
                "content": self.content, "tool_calls": self.tool_calls, "finish_reason": self.finish_reason,
                "tokens": self.tokens, "steps": self.tokens if self.steps is None else self.steps, "cut": self.cut,
                "seconds": round(self.seconds, 4)}


@dataclass
class RunStats:
    tasks: int = 0
    tokens: int = 0                  # tokens that belong to a task (EOS included; forced ones too)
    steps: int = 0                   # decode steps of the whole batch
    row_steps: int = 0               # forward passes the tasks' rows took part in (= tokens without jump-forward)
    seconds: float = 0.0
    prefill_tokens: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Tokens a row wrote per forward pass it took part in (1.0 without jump-forward)."""
        return self.tokens / self.row_steps if self.row_steps else 0.0


def encode_prompts(tasks: list, tokenizer, registry: ToolRegistry, seq_len: int,
                   system: str | None = None) -> list[list[int]]:
    """Tokenise every prompt up front, so a task that cannot fit fails before any output.

    A task is its text, or a conversation (a list of messages) for a tokenizer with a chat template
    (batchmask.tools.prompt.render_prompt). `registry` may be a list: each task's own tool set."""
    prompts = []
    regs = registry if isinstance(registry, (list, tuple)) else [registry] * len(tasks)
    for i, (task, reg) in enumerate(zip(tasks, regs)):
        ids = reg.encode_prompt(task, tokenizer, system=system) if isinstance(reg, SchemaTask) else \
            encode_prompt(reg, task, tokenizer, system=system)
        if len(ids) >= seq_len:
            raise GenerationError(f"task {i}: prompt is {len(ids)} tokens but the model's context (seq_len) is "
                                  f"{seq_len}; it needs at least one position left for the call "
                                  f"(task starts {task_text(task)[:40]!r})")
        prompts.append(ids)
    return prompts


class BatchGenerator:
    """Runs tasks through a model (and, constrained, a compiled grammar) with B slots.

    Several tool sets: `registries` (one per grammar of a table from batchmask.compiler.sets.combine, in its
    order) and run(groups=...) (which one each task uses): each row starts in its own grammar."""

    def __init__(self, model, tokenizer, registry: ToolRegistry, grammar=None, config: GenerationConfig | None = None,
                 backend: str = "auto", registries: list[ToolRegistry] | None = None):
        self.model, self.tokenizer, self.registry = model, tokenizer, registry
        self.registries = list(registries) if registries else [registry]
        config = config or GenerationConfig()
        self.config = replace(config, seed=reduce_seed(config.seed))     # any seed, in 63 bits (run/limits.py)
        c = self.config
        if c.batch_size < 1:
            raise GenerationError(f"batch size must be >= 1, got {c.batch_size}")
        if c.max_new_tokens < 1:
            raise GenerationError(f"max new tokens must be >= 1, got {c.max_new_tokens}")
        if c.constrain and grammar is None:
            raise GenerationError("constrained generation needs a compiled grammar")
        if c.jump_forward and not c.constrain:
            raise GenerationError("jump-forward needs the grammar (it writes the text the grammar forces); "
                                  "drop --no-constrain or --jump-forward")
        self.device = next(model.parameters()).device
        self.grammar = grammar if c.constrain else None
        self.eos_id = int(tokenizer.eos_id)
        stops = tuple(getattr(tokenizer, "stop_ids", None) or (self.eos_id,))
        self.seq_len = model.config.seq_len
        B, H = c.batch_size, c.max_new_tokens
        # refuse a batch whose KV cache and buffers cannot fit before allocating any of it
        check_batch_fits(model.config, B, H, next(model.parameters()).dtype, self.device)
        model.setup_cache(B)
        self.masker = BatchMasker(self.grammar, B, device=self.device, backend=backend, max_tokens=H + 1) \
            if self.grammar is not None else None
        dev = self.device
        self.history = torch.zeros(B, H + 1, dtype=torch.long, device=dev)     # [B, H+1] generated ids
        self.counts = torch.zeros(B, H + 1, dtype=torch.int32, device=dev)     # [B, H+1] legal count per token
        self.n_gen = torch.zeros(B, dtype=torch.long, device=dev)              # [B] tokens generated so far
        self.n_steps = torch.zeros(B, dtype=torch.long, device=dev)            # [B] of them sampled
        self.limit = torch.zeros(B, dtype=torch.long, device=dev)              # [B] per-row token ceiling
        self.seeds = torch.zeros(B, dtype=torch.long, device=dev)              # [B] per-task seed
        self.ended = torch.zeros(B, dtype=torch.bool, device=dev)              # [B] EOS seen
        self.active = torch.zeros(B, dtype=torch.bool, device=dev)             # [B] slot holds a task
        self.logits = torch.zeros(B, model.config.vocab_size, dtype=torch.float32, device=dev)  # [B, V]
        self.rows = torch.arange(B, device=dev)
        # one start state per tool set (a table of several grammars: batchmask.compiler.sets.combine)
        starts = list(getattr(self.grammar, "starts", None) or [getattr(self.grammar, "start", 0)])
        starts = starts * len(self.registries) if len(starts) == 1 else starts   # one grammar for all of them
        if self.grammar is not None and len(starts) != len(self.registries):
            raise GenerationError(f"{len(self.registries)} tool sets but the grammar table holds {len(starts)}")
        self.starts = torch.tensor(starts, dtype=torch.int64, device=dev)      # [G] start state per tool set
        self.one_start = len(set(starts)) == 1                                  # every row starts alike
        self.stop_ids = torch.tensor(stops, dtype=torch.long, device=dev)      # [S] any of them ends a row
        self.jump = None
        if c.jump_forward:
            from .jump import JumpForward
            self.jump = JumpForward(self.grammar, tokenizer, dev)

    # --- one step --------------------------------------------------------------------------------
    def _sample(self) -> torch.Tensor:
        c = self.config
        if self.masker is not None:
            tokens = self.masker.sample(self.logits, c.temperature, c.top_p, c.seed)   # from unmasked logits
            if c.record_counts:                                   # the legal counts before the draw
                self.counts[self.rows, self.n_gen.clamp(max=c.max_new_tokens)] = self.masker.legal_counts
        else:   # the free arm: the same sampler, noise and keys (task seed, step) with the mask off
            tokens = sample_unmasked(self.logits, self.seeds, self.n_gen, c.temperature, c.top_p, c.seed,
                                     vocab_size=min(len(self.tokenizer.token_bytes), self.logits.shape[1]))
            if c.record_counts:
                self.counts[self.rows, self.n_gen.clamp(max=c.max_new_tokens)] = self.logits.shape[1]
        return tokens

    def _record(self, tokens: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        """Write each active row's token into its history; return bool [B] rows that just finished."""
        self.history[self.rows, self.n_gen.clamp(max=self.config.max_new_tokens)] = tokens
        self.n_gen += active.long()
        self.n_steps += active.long()
        self.ended |= active & torch.isin(tokens, self.stop_ids)
        return active & (self.ended | (self.n_gen >= self.limit))

    def _jump(self, finished: torch.Tensor):
        """Append each live row's forced tokens (history, masker); return (tokens [B, K], counts [B], finished [B]:
        rows whose forced tokens reached their ceiling join the finished ones)."""
        from .jump import append_
        live = self.active & ~finished
        room = torch.where(live, self.limit - self.n_gen, 0)
        forced, n, after = self.jump.lookup(self.masker.states, room)
        self.masker.skip(forced, n, after)
        if self.config.record_counts:           # 0: no choice was made (the grammar's text, written at once)
            append_(self.counts, self.n_gen.clone(), torch.zeros_like(forced), n)
        append_(self.history, self.n_gen, forced, n)
        if forced.shape[1]:                     # a forced end token (the call is complete): the row has ended
            last = forced.gather(1, (n - 1).clamp(min=0)[:, None])[:, 0]
            self.ended |= live & (n > 0) & torch.isin(last, self.stop_ids)
        return forced, n, finished | (live & (self.ended | (self.n_gen >= self.limit)))

    def _start_forced(self, rows: torch.Tensor, first: list[list[int]]) -> None:
        """Rows `rows` (just reset) write their start state's forced tokens `first` (already in their prefill)."""
        B, K = self.config.batch_size, max(map(len, first))
        forced = torch.zeros(B, K, dtype=torch.long, device=self.device)
        n = torch.zeros(B, dtype=torch.long, device=self.device)
        after = self.masker.states.clone()
        for r, f in zip(rows.tolist(), first):
            if f:
                forced[r, :len(f)] = torch.tensor(f)
                n[r] = len(f)
                after[r] = self.jump.host.of(int(after[r]))[1][len(f) - 1]
        from .jump import append_
        self.masker.skip(forced, n, after)
        if self.config.record_counts:
            append_(self.counts, self.n_gen.clone(), torch.zeros_like(forced), n)
        append_(self.history, self.n_gen, forced, n)

    def _forward(self, tokens, forced=None, n=None, n_host=None) -> torch.Tensor:
        """The next logits [B, V]: one token per row, or (jump-forward) each row's token and its forced ones."""
        width = max(n_host) if n_host is not None else 0
        if width == 0:
            return self.model.decode(tokens)
        batch = torch.cat([tokens[:, None], forced[:, :width]], 1)          # [B, 1 + width]
        return self.model.extend(batch, 1 + n, host_lengths=[1 + k for k in n_host])

    # --- results ---------------------------------------------------------------------------------
    def _result(self, slot: int, index: int, task, started: float, registry: ToolRegistry | None = None) -> Result:
        n = int(self.n_gen[slot])
        ids = self.history[slot, :n].tolist()
        ended = bool(self.ended[slot])
        text_ids = ids[:-1] if ended else ids
        data = b"".join(self.tokenizer.token_bytes[t] for t in text_ids)
        cut = False
        if not ended and self.masker is not None:
            owed = self.grammar.finish_bytes(int(self.masker.states[slot]))
            cut = owed != b""
            data += owed
        elif not ended:
            cut = True
        text = data.decode("utf-8", errors="replace")
        registry = registry or self.registry
        if isinstance(registry, SchemaTask):      # structured output: the value is the message's content
            call, error = registry.parse(text)
            reply = {"content": text, "tool_calls": [], "finish_reason": "stop" if ended else "length"}
        else:
            reply = reply_fields(text, registry, self.config.format, index, ended)
            call, error = reply.pop("call"), reply.pop("error")
        counts = self.counts[slot, :n].tolist() if self.config.record_counts else None
        return Result(index, task_text(task), text, call, error, n, cut, time.perf_counter() - started, counts, ids,
                      data, steps=int(self.n_steps[slot]), **reply)

    # --- the loop --------------------------------------------------------------------------------
    def run(self, tasks: list[str], indices: list[int] | None = None,
            on_result: Callable[[Result], None] | None = None,
            on_progress: Callable[[int, int], None] | None = None,
            limits: list[int] | None = None, groups: list[int] | None = None,
            keys: list[int | None] | None = None) -> RunStats:
        """Generate a call for every task; `on_result` gets each Result in input order.

        limits: an optional token ceiling per task (at most config.max_new_tokens, the default).
        groups: which of `registries` each task uses (default 0: `registry`).
        keys: a task's own draw key instead of its index's (None: the index's), e.g. a Batch API request's seed.
        """
        c = self.config
        B = c.batch_size
        indices = list(range(len(tasks))) if indices is None else list(indices)
        if limits is None:
            limits = [c.max_new_tokens] * len(tasks)
        elif len(limits) != len(tasks) or any(not 1 <= int(n) <= c.max_new_tokens for n in limits):
            raise GenerationError(f"limits: need one per task, each in [1, {c.max_new_tokens}] (max_new_tokens)")
        groups = [0] * len(tasks) if groups is None else [int(g) for g in groups]
        if len(groups) != len(tasks) or any(not 0 <= g < len(self.registries) for g in groups):
            raise GenerationError(f"groups: need one per task, each in [0, {len(self.registries)})")
        prompts = encode_prompts(tasks, self.tokenizer, [self.registries[g] for g in groups], self.seq_len, c.system)
        stats = RunStats()
        t0 = time.perf_counter()
        next_task = 0                                   # next position in `tasks` to start
        slot_task = [-1] * B                            # host: which task each slot holds (-1 empty)
        slot_start = [0.0] * B
        pending: dict[int, Result] = {}                 # finished out of order, waiting for their turn
        next_out = 0

        def emit(res: Result, pos: int):
            nonlocal next_out
            pending[pos] = res
            while next_out in pending:
                r = pending.pop(next_out)
                next_out += 1
                stats.tasks += 1
                if on_result:
                    on_result(r)

        def refill(free: list[int]):
            nonlocal next_task
            take = free[: len(tasks) - next_task]
            if not take:
                return
            batch = prompts[next_task: next_task + len(take)]
            first = [[] for _ in take]          # jump-forward: the start state's forced tokens join the prefill
            stops = set(self.stop_ids.tolist())
            if self.jump is not None:
                for j in range(len(take)):
                    p, room = batch[j], min(int(limits[next_task + j]), self.seq_len - len(batch[j]))
                    first[j] = self.jump.start_tokens(int(self.starts[groups[next_task + j]]), stops)[:room - 1]
                    batch[j] = p + first[j]
            T = max(len(p) for p in batch)
            ids = torch.zeros(len(take), T, dtype=torch.long)
            for j, p in enumerate(batch):
                ids[j, : len(p)] = torch.tensor(p)
            lengths = torch.tensor([len(p) for p in batch])
            rows = torch.tensor(take, device=self.device)
            self.model.reset(rows)
            self.logits[rows] = self.model.prefill(rows, ids.to(self.device), lengths.to(self.device))
            room = torch.tensor([min(int(limits[next_task + j]), self.seq_len - len(p) + len(f))
                                 for j, (p, f) in enumerate(zip(batch, first))], device=self.device)
            self.limit[rows] = room
            self.n_gen[rows] = 0
            self.n_steps[rows] = 0
            self.ended[rows] = False
            self.active[rows] = True
            own = keys[next_task: next_task + len(take)] if keys is not None else [None] * len(take)
            self.seeds[rows] = torch.tensor([task_seed(c.seed, indices[next_task + j]) if k is None else int(k)
                                             for j, k in enumerate(own)], device=self.device)
            if self.masker is not None:
                starts = None if self.one_start else \
                    self.starts[torch.tensor(groups[next_task: next_task + len(take)], device=self.device)]
                self.masker.reset(rows, keys=self.seeds[rows], starts=starts)   # draws keyed by task, not by slot
            if any(first):
                self._start_forced(rows, first)
            for j, slot in enumerate(take):
                slot_task[slot] = next_task + j
                slot_start[slot] = time.perf_counter()
            stats.prefill_tokens += int(lengths.sum()) - sum(map(len, first))
            stats.tokens += sum(map(len, first))
            next_task += len(take)

        refill(list(range(B)))
        while any(t >= 0 for t in slot_task):
            tokens = self._sample()
            finished = self._record(tokens, self.active)
            stats.steps += 1
            stats.row_steps += sum(t >= 0 for t in slot_task)
            stats.tokens += sum(t >= 0 for t in slot_task)
            if self.jump is None:
                done_slots = torch.nonzero(finished).flatten().tolist()     # the one host sync per step
            else:
                forced, n, finished = self._jump(finished)
                flags = torch.cat([finished.long(), n]).tolist()           # the one host sync per step
                done_slots, n_host = [s for s in range(B) if flags[s]], flags[B:]
                stats.tokens += sum(n_host)
            for slot in done_slots:
                pos = slot_task[slot]
                emit(self._result(slot, indices[pos], tasks[pos], slot_start[slot], self.registries[groups[pos]]),
                     pos)
                slot_task[slot] = -1
            if done_slots:
                gone = torch.tensor(done_slots, device=self.device)
                self.active[gone] = False
                self.model.reset(gone)
                if on_progress:
                    on_progress(stats.tasks, stats.tokens)
            if any(t >= 0 for t in slot_task):
                self.logits = self._forward(tokens) if self.jump is None else self._forward(tokens, forced, n, n_host)
            if next_task < len(tasks):
                free = [s for s in range(B) if slot_task[s] < 0]
                if free and (c.continuous or len(free) == B):
                    refill(free)
        if self.masker is not None:
            self.masker.check()
        stats.seconds = time.perf_counter() - t0
        return stats
