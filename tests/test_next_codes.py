"""The next-state code (batchmask/table/next_codes.py): absolute codes through the target list, relative codes, -1.

Checked against the plain meaning of a table entry: the state it leads to, written out without the list."""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from batchmask.table.next_codes import decode_next, decode_next_np, encode_relative, encode_targets, segment_bases


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


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 30), min_size=1, max_size=8), st.integers(0, 2**31 - 1))
def test_segments_read_the_list_from_their_base(sizes, seed):
    # states cut into segments of `sizes`; each segment has its own slice of the list: its code k names the
    # k-th state of its slice, written out here without the rule
    rng = np.random.default_rng(seed)
    start = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    S = int(sum(sizes))
    slices = [rng.integers(0, S, size=int(rng.integers(1, 6))) for _ in sizes]
    base = np.concatenate([[0], np.cumsum([len(x) for x in slices])[:-1]])
    targets = np.concatenate(slices)
    states = rng.integers(0, S, size=50)
    seg = np.searchsorted(start, states, side="right") - 1
    codes = np.array([rng.integers(0, len(slices[k])) for k in seg])
    want = np.array([slices[k][c] for k, c in zip(seg, codes)])
    t = [torch.from_numpy(x) for x in (codes, states, targets, start, base)]
    got = segment_bases(t[1], t[3], t[4])             # one segment: its base, for every state
    assert torch.equal(torch.as_tensor(got).expand(len(states)), torch.from_numpy(base[seg]))
    assert decode_next(*t).tolist() == want.tolist()
    assert decode_next_np(codes, states, targets, start, base).tolist() == want.tolist()
    # relative and illegal codes do not read the list
    rel = np.array([-1, -2, -7])
    st_ = np.array([0, 3, S - 1])
    assert decode_next_np(rel, st_, targets, start, base).tolist() == [-1, 3, S - 1 + 5]


def test_one_segment_at_zero_is_the_plain_list():
    codes, states, targets = torch.tensor([0, 2, -1, -3]), torch.tensor([5, 6, 7, 8]), torch.tensor([10, 11, 12])
    zero = torch.zeros(1, dtype=torch.int32)
    assert torch.equal(decode_next(codes, states, targets, zero, zero), decode_next(codes, states, targets))
