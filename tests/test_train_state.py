"""The recipe's work files (train_state.pt, data.pt): plain tensors only, loaded with weights_only=True."""
import argparse
import os

import pytest
import torch
from batchmask.models.checkpoint import ModelConfig
from batchmask.models.llama import Transformer

from recipes.default_model.data import Dataset
from recipes.default_model.state import DATA_FORMAT, TrainError, load_data, load_state, save_data, save_state
from recipes.default_model.train import make_optimizer, masked_loss


class CodePayload:
    """Unpickling this runs os.mkdir(marker): what a hostile file in a shared work directory would do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.mkdir, (self.marker,)


def small_dataset(offset=0):
    # (ids, n_prompt): a shared prefix [1, 7, 8], then per-example prompt and call tokens
    return Dataset([([1, 7, 8, 9 + offset, 20, 21, 2], 4), ([1, 7, 8, 10, 11, 22, 2], 5), ([1, 7, 8, 12, 23, 2], 4)])


def args_of(**kw):
    base = dict(dim=16, n_layers=1, batch_size=2, seed=0, lr=1e-3, n_examples=3, seq_len=64, max_piece_len=0,
                short_frac=0.0, length_groups=True)
    return argparse.Namespace(**(base | kw))


def test_data_round_trips_through_plain_tensors(tmp_path):
    data, short = small_dataset(), small_dataset(offset=5)
    save_data(tmp_path / "data.pt", data, short)
    # a plain weights_only load reads it: nothing but tensors, strings and dicts inside
    raw = torch.load(tmp_path / "data.pt", weights_only=True)
    assert raw["format"] == DATA_FORMAT and set(raw["data"]) == set(Dataset.FIELDS)
    got, got_short = load_data(tmp_path / "data.pt")
    for want, have in ((data, got), (short, got_short)):
        for name in Dataset.FIELDS:
            assert torch.equal(getattr(want, name), getattr(have, name)), name
        idx = torch.tensor([2, 0, 1])
        for a, b in zip(want.batch(idx, pad_id=0), have.batch(idx, pad_id=0)):
            assert torch.equal(a, b)
    save_data(tmp_path / "only.pt", data, None)
    assert load_data(tmp_path / "only.pt")[1] is None


@pytest.mark.parametrize("which", ["data", "state"])
def test_a_file_carrying_code_is_refused_and_the_code_never_runs(tmp_path, which):
    marker = tmp_path / "ran"
    path = tmp_path / ("data.pt" if which == "data" else "train_state.pt")
    payload = {"format": DATA_FORMAT, "data": CodePayload(marker), "short": None} if which == "data" else \
        {"model": CodePayload(marker), "optimizer": {}, "step": 0, "elapsed": 0.0, "args": {}}
    torch.save(payload, path)
    with pytest.raises(TrainError, match=rf"{path.name}: refused to load the .*: it holds \w+\.mkdir, not only"):
        load_data(path) if which == "data" else load_state(path, args_of())
    assert not marker.exists()
    # the payload is live: an unrestricted load does run it (what weights_only=False did before)
    torch.load(path, weights_only=False)
    assert marker.is_dir()


def test_data_of_the_old_pickled_format_is_refused_with_one_line(tmp_path):
    # the previous version pickled (Dataset, Dataset) objects: a class, so weights_only refuses it
    torch.save((small_dataset(), None), tmp_path / "data.pt")
    with pytest.raises(TrainError, match=r"data\.pt: refused .* it holds recipes\.default_model\.data\.Dataset"):
        load_data(tmp_path / "data.pt")


@pytest.mark.parametrize("edit, why", [
    (lambda t: t.pop("n_cond"), r"expected the tensors"),
    (lambda t: t.update(tokens=t["tokens"].float()), r"tokens: expected a 1-D int64 tensor, found torch\.float32"),
    (lambda t: t.update(offsets=t["offsets"] + 1), r"offsets: .* do not cut"),
    (lambda t: t.update(n_cond=t["n_cond"] * 0), r"n_cond: every example"),
])
def test_inconsistent_data_is_refused_naming_the_field(tmp_path, edit, why):
    tensors = small_dataset().tensors()
    edit(tensors)
    torch.save({"format": DATA_FORMAT, "data": tensors, "short": None}, tmp_path / "data.pt")
    with pytest.raises(TrainError, match=why):
        load_data(tmp_path / "data.pt")
    torch.save({"format": "something else", "data": {}}, tmp_path / "other.pt")
    with pytest.raises(TrainError, match=r"other\.pt: expected encoded data of format"):
        load_data(tmp_path / "other.pt")


def test_a_real_training_state_loads_with_weights_only(tmp_path):
    # AdamW's state after a step (step counters, moments, param groups) is all plain data
    torch.manual_seed(0)
    model = Transformer(ModelConfig(dim=16, hidden_dim=32, n_layers=1, n_heads=2, n_kv_heads=2, vocab_size=30,
                                    seq_len=64))
    opt = make_optimizer(model, 1e-3, 0.1)
    tokens = torch.randint(0, 30, (2, 5))
    masked_loss(model(tokens), tokens).backward()
    opt.step()
    save_state(tmp_path / "train_state.pt", model, opt, 1, 2.0, 3.0, args_of())
    state = load_state(tmp_path / "train_state.pt", args_of())
    fresh = Transformer(model.config)
    fresh.load_state_dict(state["model"])
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), name
    opt2 = make_optimizer(fresh, 1e-3, 0.1)
    opt2.load_state_dict(state["optimizer"])
    assert opt2.state_dict()["param_groups"] == opt.state_dict()["param_groups"]
