"""The training run's work files: the resumable state (train_state.pt) and the encoded data (data.pt).

Both hold plain tensors, numbers, strings, lists and dicts only, and both are read with
`torch.load(weights_only=True)`, which refuses anything else: a work directory shared with others
can hold a file that was written to run code when unpickled, and loading it here never runs it.
"""
from __future__ import annotations

import os
import pickle
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from .data import Dataset

DATA_FORMAT = "batchmask-default-model-data/1"
# The arguments a resumed run must share with the saved one (the others may change between runs).
RESUME_KEYS = ("dim", "n_layers", "batch_size", "seed", "lr", "n_examples", "seq_len", "max_piece_len",
               "short_frac", "length_groups")


class TrainError(ValueError):
    """Training cannot start or resume (bad state file, mismatched arguments)."""


def _save(obj: Any, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)  # a crash mid-save never leaves a broken file behind


_TORCH_ADVICE = ("Weights only load failed", "Please file an issue", "Check the documentation", "(1)", "(2)")


def _load(path: Path, what: str) -> Any:
    """torch.load with weights_only=True: a file carrying code (or any object but plain data) is refused."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        # torch wraps its reason in advice (including to load with weights_only=False): name the reason only
        found = re.search(r"GLOBAL ([\w.]+)", str(e))
        if found:  # a pickled object other than plain data: a class, a function, a code payload
            raise TrainError(f"{path}: refused to load the {what}: it holds {found[1]}, not only tensors and "
                             "plain data (loading it could run code)") from None
        lines = [line.strip().removeprefix("WeightsUnpickler error:").strip() for line in str(e).splitlines()]
        reason = "; ".join(line for line in lines if line and not line.startswith(_TORCH_ADVICE)) or str(e)
        raise TrainError(f"{path}: cannot read the {what}: {reason[:200]}") from None
    except (OSError, RuntimeError, EOFError, ValueError) as e:
        raise TrainError(f"{path}: cannot read the {what}: {e}") from None


# --- the training state -----------------------------------------------------------------------
def save_state(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int, elapsed: float,
               loss: float, args: Any) -> None:
    _save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
           "elapsed": elapsed, "loss": loss, "config": asdict(model.config),
           "args": {k: v for k, v in vars(args).items() if k not in ("out", "work", "resume")}}, path)


def load_state(path: Path, args: Any) -> dict:
    state = _load(path, "training state")
    if not isinstance(state, dict) or not {"model", "optimizer", "step", "elapsed", "args"} <= state.keys():
        raise TrainError(f"{path}: not a training state written by recipes/default_model/train.py (expected a dict "
                         "with model, optimizer, step, elapsed and args)")
    for key in RESUME_KEYS:
        if state["args"].get(key) != getattr(args, key, None):
            raise TrainError(f"{path}: state was saved with {key}={state['args'].get(key)}, "
                             f"this run has {key}={getattr(args, key, None)} (drop --resume to start over)")
    return state


# --- the encoded data -------------------------------------------------------------------------
def save_data(path: Path, data: Dataset, short: Dataset | None) -> None:
    """The two data sets of a run (the full prompts, and the curriculum's short ones or None)."""
    _save({"format": DATA_FORMAT, "data": data.tensors(), "short": None if short is None else short.tensors()}, path)


def load_data(path: Path) -> tuple[Dataset, Dataset | None]:
    saved = _load(path, "encoded data")
    if not isinstance(saved, dict) or saved.get("format") != DATA_FORMAT:
        found = saved.get("format") if isinstance(saved, dict) else type(saved).__name__
        raise TrainError(f"{path}: expected encoded data of format {DATA_FORMAT}, found {found!r} "
                         "(drop --resume to start over)")
    try:
        data = Dataset.from_tensors(saved.get("data"))
        short = None if saved.get("short") is None else Dataset.from_tensors(saved["short"])
    except ValueError as e:
        raise TrainError(f"{path}: {e} (drop --resume to start over)") from None
    return data, short
