"""The default model's training data: examples encoded exactly as generation sees them, in one flat tensor.

    ids = encode(render_prompt(registry, task), bos=True)                  # conditioning
        + encode(render_call(tool, args), bos=False, prefix_space=False)   # what the model writes
        + [EOS]

The loss is taken only on the call tokens and the EOS. Every full prompt begins with the same tool
catalogue, so `Dataset` stores that shared prefix once and each example's suffix after it.
"""
from __future__ import annotations

import sys

import torch
from batchmask.models.tokenizer import Tokenizer

from batchmask.evaluation.taskgen import Example, TaskSplit, make_examples
from batchmask.tools.prompt import render_call, render_prompt
from batchmask.tools.registry import ToolRegistry

from .tasks import TRAIN


# --- encoding ---------------------------------------------------------------------------------
def encode_example(tok: Tokenizer, registry: ToolRegistry, ex: Example) -> tuple[list[int], int]:
    """(ids, n_prompt): the example's tokens and how many of them are prompt (conditioning)."""
    prompt = tok.encode(render_prompt(registry, ex.task), bos=True)
    call = tok.encode(render_call(ex.tool, ex.args), bos=False, prefix_space=False)
    return prompt + call + [tok.eos_id], len(prompt)


class ExampleEncoder:
    """`encode_example`, ~4x faster: the catalogue's tokens are computed once.

    Exact because no piece of our vocabulary contains a newline (SentencePiece learnt it from
    single lines), so BPE never merges across one and the prompt's tokens are the catalogue's
    tokens followed by those of the "\nTASK: ..." tail. tests/test_train.py checks the equality.

    catalogue=False drops the tool catalogue (the prompt is BOS + "\nTASK: ...\nCALL: "): the
    short form the training curriculum starts with.
    """

    def __init__(self, tok: Tokenizer, registry: ToolRegistry, catalogue: bool = True):
        self.tok, self.registry = tok, registry
        head = render_prompt(registry, "x")
        self.cut = head.rindex("\nTASK: ")
        self.head_ids = tok.encode(head[:self.cut], bos=True) if catalogue else [tok.bos_id]

    def __call__(self, ex: Example) -> tuple[list[int], int]:
        tail = render_prompt(self.registry, ex.task)[self.cut:]
        prompt = self.head_ids + self.tok.encode(tail, bos=False, prefix_space=False)
        call = self.tok.encode(render_call(ex.tool, ex.args), bos=False, prefix_space=False)
        return prompt + call + [self.tok.eos_id], len(prompt)


def common_prefix(seqs: list[list[int]]) -> list[int]:
    """The longest token prefix that every sequence starts with."""
    first = seqs[0]
    n = len(first)
    for s in seqs[1:]:
        n = min(n, len(s))
        while s[:n] != first[:n]:
            n -= 1
    return first[:n]


# --- the data set -----------------------------------------------------------------------------
class Dataset:
    """Encoded examples as one flat tensor, split into the shared prefix and per-example suffixes.

    prefix  [P]        tokens every example starts with (BOS + the tool catalogue + ...)
    tokens  [sum N_i]  each example's tokens after the prefix, concatenated
    offsets [n + 1]    example i is tokens[offsets[i]:offsets[i + 1]]
    n_cond  [n]        how many of example i's suffix tokens are still prompt
    """

    FIELDS = ("prefix", "tokens", "offsets", "n_cond")

    def __init__(self, encoded: list[tuple[list[int], int]], prefix_len: int | None = None):
        seqs = [ids for ids, _ in encoded]
        prefix = common_prefix(seqs)
        # Keep at least one prompt token per suffix: the first call token is predicted from it.
        P = min([len(prefix)] + [n_prompt - 1 for _, n_prompt in encoded])
        if prefix_len is not None:
            P = min(P, prefix_len)
        self.prefix = torch.tensor(prefix[:P], dtype=torch.long)  # [P]
        lengths = torch.tensor([len(ids) - P for ids in seqs])  # [n]
        self.offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])  # [n + 1]
        self.tokens = torch.tensor([t for ids in seqs for t in ids[P:]], dtype=torch.long)  # [sum]
        self.n_cond = torch.tensor([n_prompt - P for _, n_prompt in encoded])  # [n]

    def __len__(self) -> int:
        return len(self.n_cond)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The four tensors, by name: all a Dataset is (saved as plain tensors, loaded with weights_only)."""
        return {name: getattr(self, name) for name in self.FIELDS}

    @classmethod
    def from_tensors(cls, tensors: object) -> Dataset:
        """The Dataset `tensors()` gave; ValueError naming the field when they do not describe one."""
        if not isinstance(tensors, dict) or set(tensors) != set(cls.FIELDS):
            got = sorted(tensors) if isinstance(tensors, dict) else type(tensors).__name__
            raise ValueError(f"expected the tensors {list(cls.FIELDS)}, found {got}")
        for name in cls.FIELDS:
            t = tensors[name]
            if not isinstance(t, torch.Tensor) or t.dtype != torch.long or t.dim() != 1:
                what = f"{t.dtype} {list(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"{name}: expected a 1-D int64 tensor, found {what}")
        offsets, n_cond, tokens = tensors["offsets"], tensors["n_cond"], tensors["tokens"]
        lengths = offsets[1:] - offsets[:-1]
        if (len(offsets) != len(n_cond) + 1 or len(n_cond) == 0 or int(offsets[0]) != 0
                or int(offsets[-1]) != len(tokens) or bool((lengths < 2).any())):
            raise ValueError(f"offsets: {len(offsets)} offsets do not cut {len(tokens)} tokens into "
                             f"{len(n_cond)} examples of at least 2 tokens")
        if bool((n_cond < 1).any()) or bool((n_cond >= lengths).any()):
            raise ValueError("n_cond: every example needs at least one prompt and one call token")
        data = cls.__new__(cls)
        for name in cls.FIELDS:
            setattr(data, name, tensors[name])
        return data

    @property
    def lengths(self) -> torch.Tensor:
        """[n] each example's suffix token count."""
        return self.offsets[1:] - self.offsets[:-1]

    @property
    def max_len(self) -> int:
        return len(self.prefix) + int(self.lengths.max())

    def batch(self, idx: torch.Tensor, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """idx [B] -> (inputs [B, T], targets [B, T]); targets are -100 where no loss is taken.

        Right-padded: with causal attention a pad only ever follows real tokens, so it changes nothing.
        """
        starts, ends = self.offsets[idx], self.offsets[idx + 1]  # [B]
        T = int((ends - starts).max()) - 1
        inputs = torch.full((len(idx), T), pad_id, dtype=torch.long)  # [B, T]
        targets = torch.full((len(idx), T), -100, dtype=torch.long)  # [B, T]
        for row, (s, e, c) in enumerate(zip(starts.tolist(), ends.tolist(), self.n_cond[idx].tolist())):
            seq = self.tokens[s:e]  # [N] this example's suffix
            inputs[row, :len(seq) - 1] = seq[:-1]
            # target t is seq[t + 1]; only call tokens and EOS (index >= c) are learned
            targets[row, c - 1:len(seq) - 1] = seq[c:]
        return inputs, targets


def build_dataset(tok: Tokenizer, n: int, seed: int, split: TaskSplit = TRAIN, max_len: int | None = None,
                  catalogue: bool = True) -> Dataset:
    """n generated examples, encoded; those over max_len tokens (a rare long write) are left out."""
    encode = ExampleEncoder(tok, ToolRegistry.defaults(), catalogue)
    encoded = [encode(ex) for ex in make_examples(n, seed, split)]
    if max_len is not None:
        kept = [e for e in encoded if len(e[0]) <= max_len]
        if len(kept) < len(encoded):
            print(f"left out {len(encoded) - len(kept)} of {len(encoded)} examples longer than {max_len} tokens",
                  file=sys.stderr)
        encoded = kept
    return Dataset(encoded)
