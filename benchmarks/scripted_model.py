"""
A scripted model for the loop's benchmarks: it writes given reference calls, the way a trained model that knows
the answer would, so that what jump-forward saves is measured on realistic calls (short values that end, enums,
dates) instead of a random model's values that run to the ceiling.

    model = ScriptedModel(token_bytes, {task_text: call_text, ...}, seq_len=2048)

It has the interface BatchGenerator drives (config, parameters, reset, prefill, decode, extend) and no weights:
prefill finds which task a row's prompt holds; every later token a row is fed is appended to what the row has
written; the logits favour the longest token that continues the row's reference text (and the end token once the
text is complete). The mask still decides: when the reference is not a legal continuation (a call the grammar
writes differently), every legal token scores the same and the row leaves its script (`off_script` counts them).
The scoring is one [V, L] byte comparison per row a step (numpy), never a Python loop over the vocabulary.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import random

import numpy as np
import torch
from batchmask.models.config import ModelConfig

MAX_PIECE = 48     # bytes of a token compared; longer tokens never continue a script (they are rare in calls)


class ScriptedModel(torch.nn.Module):
    def __init__(self, token_bytes: list[bytes], script: dict[str, str], *, eos_id: int, seq_len: int = 2048,
                 decode_text=None):
        super().__init__()
        V = len(token_bytes)
        self.config = ModelConfig(dim=64, hidden_dim=128, n_layers=1, n_heads=1, n_kv_heads=1, vocab_size=V,
                                  seq_len=seq_len)
        self.anchor = torch.nn.Parameter(torch.zeros(1), requires_grad=False)  # dtype and device for the loop
        self.token_bytes, self.eos_id, self.script = token_bytes, eos_id, {k: v.encode() for k, v in script.items()}
        self.decode_text = decode_text or (lambda ids: b"".join(token_bytes[i] for i in ids).decode("utf-8", "replace"))
        lengths = np.array([len(b) for b in token_bytes])
        self.piece_len = np.where(lengths <= MAX_PIECE, lengths, 0)                 # [V] 0: never scored
        self.pieces = np.full((V, MAX_PIECE), -1, dtype=np.int16)                   # [V, L] bytes, -1 padding
        for i, b in enumerate(token_bytes):      # once per vocabulary, at construction (not a step's hot path)
            if 0 < len(b) <= MAX_PIECE:
                self.pieces[i, :len(b)] = np.frombuffer(b, dtype=np.uint8)
        self.targets: dict[int, bytes] = {}
        self.written: dict[int, bytearray] = {}
        self.off_script = 0

    # --- the interface BatchGenerator uses --------------------------------------------------------
    def setup_cache(self, batch_size: int) -> None:     # no cache: what a row has written is kept as bytes
        self.batch_size = batch_size

    def reset(self, rows) -> None:
        for r in (rows.tolist() if torch.is_tensor(rows) else rows):
            self.targets.pop(int(r), None)
            self.written.pop(int(r), None)

    def prefill(self, rows, tokens: torch.Tensor, lengths) -> torch.Tensor:
        rows = rows.tolist() if torch.is_tensor(rows) else list(rows)
        lengths = lengths.tolist() if torch.is_tensor(lengths) else list(lengths)
        for j, r in enumerate(rows):
            prompt = self.decode_text(tokens[j, :lengths[j]].tolist())
            task = max((t for t in self.script if t in prompt), key=len, default=None)
            if task is None:
                raise ValueError(f"the scripted model has no call for the prompt {prompt[-80:]!r}")
            target = self.script[task]
            tail = b"".join(self.token_bytes[t] for t in tokens[j, :lengths[j]].tolist()[-64:])
            # jump-forward joins the start state's forced tokens (the call's first bytes) to the prompt
            begun = next((k for k in range(min(len(target), len(tail)), 0, -1) if tail.endswith(target[:k])), 0)
            self.targets[r], self.written[r] = target, bytearray(target[:begun])
        return self._logits(rows)

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:     # [B] -> [B, V]
        rows = list(range(tokens.shape[0]))
        for r, t in zip(rows, tokens.tolist()):
            self._feed(r, [t])
        return self._logits(rows)

    def extend(self, tokens: torch.Tensor, lengths: torch.Tensor, host_lengths=None) -> torch.Tensor:  # [B, T]
        n = host_lengths if host_lengths is not None else lengths.tolist()
        rows = list(range(tokens.shape[0]))
        for r in rows:
            self._feed(r, tokens[r, :n[r]].tolist())
        return self._logits(rows)

    # --- scoring ---------------------------------------------------------------------------------
    def _feed(self, row: int, ids: list[int]) -> None:
        if row in self.written:
            for t in ids:
                self.written[row] += self.token_bytes[t]

    def _logits(self, rows: list[int]) -> torch.Tensor:
        out = np.zeros((len(rows), len(self.token_bytes)), dtype=np.float32)      # [n, V]
        for j, r in enumerate(rows):
            target, done = self.targets.get(r), self.written.get(r)
            if target is None:
                continue
            if not target.startswith(bytes(done)):
                self.off_script += 1
                continue
            rest = np.frombuffer(target[len(done):len(done) + MAX_PIECE], dtype=np.uint8).astype(np.int16)
            if rest.size == 0:
                out[j, self.eos_id] = 1e4
                continue
            padded = np.full(MAX_PIECE, -2, dtype=np.int16)
            padded[:rest.size] = rest
            fits = ((self.pieces == padded) | (self.pieces == -1)).all(axis=1) & (self.piece_len > 0)  # [V]
            out[j] = np.where(fits, self.piece_len.astype(np.float32), 0.0)  # longest continuing piece first
        return torch.from_numpy(out).to(self.anchor.device)


# --- reference calls ----------------------------------------------------------------------------
WORDS = ["paris", "report", "team sync", "notes", "london", "budget", "alice", "weekly review", "tokyo", "draft"]


def example_value(schema: dict, rng: random.Random):
    """A short, realistic value of `schema` (the keywords the tool catalogues use): what a trained model writes."""
    if "enum" in schema:
        return rng.choice(schema["enum"])
    if "const" in schema:
        return schema["const"]
    if "anyOf" in schema:
        return example_value(rng.choice(schema["anyOf"]), rng)
    kind = schema.get("type", "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "string":
        fmt = schema.get("format")
        if fmt == "date":
            return (dt.date(2025, 1, 1) + dt.timedelta(days=rng.randint(0, 364))).isoformat()
        if fmt == "date-time":
            return f"2025-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}T{rng.randint(10, 23)}:00:00Z"
        lo, hi = schema.get("minLength", 1), schema.get("maxLength", 40)
        text = rng.choice(WORDS)
        while len(text) < lo:
            text += rng.choice(WORDS)
        return text[:hi] if len(text) > hi else text
    if kind == "integer":
        lo, hi = schema.get("minimum", 1), schema.get("maximum", 100)
        return rng.randint(int(lo), int(min(hi, lo + 50)))
    if kind == "number":
        lo = schema.get("minimum", 0)
        return round(lo + rng.randint(1, 40) * 0.5, 1)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "array":
        n = max(schema.get("minItems", 0), min(2, schema.get("maxItems", 2)))
        return [example_value(schema.get("items", {}), rng) for _ in range(n)]
    if kind == "object":
        props, required = schema.get("properties", {}), set(schema.get("required", []))
        return {k: example_value(v, rng) for k, v in props.items() if k in required or rng.random() < 0.5}
    raise ValueError(f"no example for a schema of type {kind!r}")


def reference_calls(registry, envelope, n: int, seed: int = 0) -> list[tuple[str, str]]:
    """n (task, call text) pairs over the registry's tools in turn: arguments checked with jsonschema against the
    tool's parameters, the call written by the format's envelope (keys in declared order, as the grammar does)."""
    import jsonschema

    from batchmask.tools.envelope import native_args_schema
    rng = random.Random(seed)
    # the tools a call may name: the user's (the seed form also writes its built-in `answer` as a call)
    tools = list(registry.tools) if envelope.format == "seed" else list(registry.user_tools)
    out = []
    for i in range(n):
        tool = tools[i % len(tools)]
        params = tool.parameters or native_args_schema(tool, 40)
        args = example_value(params, rng)
        jsonschema.validate(args, params)
        out.append((f"request {i}: please use {tool.name}", envelope.render(tool.name, args)))
    return out


def describe(model: ScriptedModel) -> dict:
    return dataclasses.asdict(model.config) | {"scripted": True, "off_script_steps": model.off_script}
