"""The next-state code (batchmask/next_codes.py): absolute codes through the target list, relative codes, -1.

Checked against the plain meaning of a table entry: the state it leads to, written out without the list."""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from batchmask.next_codes import decode_next, decode_next_np, encode_relative, encode_targets


@st.composite
def moves(draw):
    """(states [n], next states [n, k] with -1 illegal): forward moves anywhere in a large state space."""
    n, k = draw(st.integers(1, 12)), draw(st.integers(1, 6))
    S = draw(st.sampled_from([50, 40_000, 300_000]))
    states = draw(st.lists(st.integers(0, S - 2), min_size=n, max_size=n))
    rows = [[draw(st.one_of(st.just(-1), st.integers(s + 1, S - 1))) for _ in range(k)] for s in states]
    return torch.tensor(states), torch.tensor(rows)


@settings(max_examples=60, deadline=None)
@given(moves(), st.integers(0, 2**31 - 1))
def test_codes_name_the_states_they_were_made_from(m, seed):
    states, nxt = m
    rng = np.random.default_rng(seed)
    relative = torch.from_numpy(rng.random(tuple(nxt.shape)) < 0.5) & (nxt >= 0)   # some moves relative
    codes = torch.where(relative, encode_relative(nxt, states[:, None]), nxt)
    codes, targets = encode_targets(codes)
    # each absolute target once, sorted, and only the states absolute moves name
    assert targets.tolist() == sorted(set(nxt[(nxt >= 0) & ~relative].tolist()))
    assert torch.equal(decode_next(codes, states[:, None], targets), nxt)
    assert np.array_equal(decode_next_np(codes.numpy(), states[:, None].numpy(), targets.numpy()), nxt.numpy())
    assert int(codes.max()) < max(1, targets.numel())            # absolute codes are small whatever S is


def test_a_table_without_absolute_moves_has_an_empty_list():
    codes = torch.tensor([[-1, -3], [-5, -1]])
    out, targets = encode_targets(codes.clone())
    assert torch.equal(out, codes) and targets.numel() == 0
    assert decode_next(out, torch.tensor([[0], [4]]), targets).tolist() == [[-1, 1], [7, -1]]
