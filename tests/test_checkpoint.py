"""Checkpoint reading/writing: round trips, hand-packed files in each llama2.c layout, bad files."""

import dataclasses
import struct

import batchmask.models.checkpoint as checkpoint_module
import numpy as np
import pytest
import torch
from batchmask.models.checkpoint import (
    MAGIC,
    CheckpointError,
    ModelConfig,
    check_vocab,
    random_weights,
    read_checkpoint,
    read_config,
    weight_shapes,
    write_checkpoint,
)
from hypothesis import given, settings
from hypothesis import strategies as st

CONFIGS = {
    "mha_shared": ModelConfig(dim=32, hidden_dim=64, n_layers=2, n_heads=4, n_kv_heads=4, vocab_size=50, seq_len=16),
    "gqa_unshared": ModelConfig(dim=64, hidden_dim=96, n_layers=3, n_heads=8, n_kv_heads=2, vocab_size=70,
                                seq_len=20, shared_classifier=False),
    "odd_dims": ModelConfig(dim=48, hidden_dim=100, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=67, seq_len=24),
}


# -----------------------------------------------------------------------------
# deliberately plain packers, written from the format descriptions (not via the writer)

def f32(t):
    return struct.pack(f"<{t.numel()}f", *t.reshape(-1).tolist())


def pack_legacy(c, w):
    vocab = c.vocab_size if c.shared_classifier else -c.vocab_size
    out = struct.pack("<7i", c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, vocab, c.seq_len)
    for name in ["token_embedding", "rms_att", "wq", "wk", "wv", "wo", "rms_ffn", "w1", "w2", "w3", "rms_final"]:
        out += f32(w[name])
    out += b"\x11" * (4 * c.seq_len * (c.head_dim // 2) * 2)  # RoPE tables: content must be ignored
    if not c.shared_classifier:
        out += f32(w["wcls"])
    return out


def header(c, version, extra=b""):
    h = struct.pack("<Ii7iB", MAGIC, version, c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads,
                    c.vocab_size, c.seq_len, int(c.shared_classifier)) + extra
    return h + bytes(256 - len(h))


def pack_v1(c, w):
    out = header(c, 1)
    for l in range(c.n_layers):
        out += f32(w["rms_att"][l])
    for l in range(c.n_layers):
        out += f32(w["rms_ffn"][l])
    out += f32(w["rms_final"]) + f32(w["token_embedding"])
    for name in ["wq", "wk", "wv", "wo", "w1", "w2", "w3"]:
        for l in range(c.n_layers):
            out += f32(w[name][l])
    if not c.shared_classifier:
        out += f32(w["wcls"])
    return out


def pack_v2(c, q, s, group_size):
    """q: name -> list of int8 arrays (one per layer), s: matching float32 scales."""
    out = header(c, 2, struct.pack("<i", group_size))
    for name in ["rms_att", "rms_ffn", "rms_final"]:
        out += f32(q[name])
    for name in ["token_embedding", "wq", "wk", "wv", "wo", "w1", "w2", "w3", "wcls"]:
        for qi, si in zip(q.get(name, []), s.get(name, [])):  # per layer: int8 values, then scales
            out += struct.pack(f"<{qi.size}b", *qi.tolist()) + struct.pack(f"<{si.size}f", *si.tolist())
    return out


def small_weights(c, seed=0):
    return random_weights(c, seed=seed)


def assert_same_weights(a, b, atol=0.0):
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == torch.float32, name
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=atol, msg=name)


# -----------------------------------------------------------------------------
# reading hand-packed files

@pytest.mark.parametrize("name", CONFIGS)
def test_reads_hand_packed_legacy_and_v1(tmp_path, name):
    c = CONFIGS[name]
    w = small_weights(c)
    for version, packed in [(0, pack_legacy(c, w)), (1, pack_v1(c, w))]:
        path = tmp_path / f"v{version}.bin"
        path.write_bytes(packed)
        config, weights = read_checkpoint(path)
        assert config == c
        assert_same_weights(weights, w)


@pytest.mark.parametrize("name", ["mha_shared", "gqa_unshared"])
def test_reads_hand_packed_v2_and_dequantizes(tmp_path, name):
    c = CONFIGS[name]
    gs = 16
    rng = np.random.default_rng(3)
    q, s, expected = {}, {}, {}
    for wname, shape in weight_shapes(c).items():
        if wname.startswith("rms"):
            q[wname] = torch.randn(shape)
            expected[wname] = q[wname]
            continue
        layers = shape[0] if len(shape) == 3 else 1
        each = int(np.prod(shape)) // layers
        q[wname] = [rng.integers(-127, 128, each).astype(np.int8) for _ in range(layers)]
        s[wname] = [rng.uniform(0.001, 0.1, each // gs).astype(np.float32) for _ in range(layers)]
        deq = [qi.astype(np.float32) * np.repeat(si, gs) for qi, si in zip(q[wname], s[wname])]
        expected[wname] = torch.from_numpy(np.stack(deq).reshape(shape))
    path = tmp_path / "v2.bin"
    path.write_bytes(pack_v2(c, q, s, gs))
    config, weights = read_checkpoint(path)
    assert config == c
    assert_same_weights(weights, expected)


# -----------------------------------------------------------------------------
# writer round trips

@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("version", [0, 1])
def test_float_round_trip_is_exact_and_matches_hand_packing(tmp_path, name, version):
    c = CONFIGS[name]
    w = small_weights(c, seed=1)
    path = tmp_path / "m.bin"
    assert write_checkpoint(path, c, w, version=version) is None
    if version == 1:
        assert path.read_bytes() == pack_v1(c, w)
    else:  # same bytes as the plain packer except the RoPE tables, which the writer fills for real
        written, packed = path.read_bytes(), pack_legacy(c, w)
        rope_bytes = 4 * 2 * c.seq_len * (c.head_dim // 2)
        rope_start = len(packed) - rope_bytes - (0 if c.shared_classifier else 4 * c.vocab_size * c.dim)
        assert len(written) == len(packed)
        assert written[:rope_start] == packed[:rope_start]
        assert written[rope_start + rope_bytes:] == packed[rope_start + rope_bytes:]
    config, weights = read_checkpoint(path)
    assert config == c
    assert_same_weights(weights, w)


def test_legacy_rope_tables_are_run_c_frequencies(tmp_path):
    c = CONFIGS["odd_dims"]
    w = small_weights(c)
    path = tmp_path / "m.bin"
    write_checkpoint(path, c, w, version=0)
    n_before = 28 + 4 * sum(int(np.prod(s)) for s in weight_shapes(c).values())
    half = c.head_dim // 2
    tables = np.frombuffer(path.read_bytes()[n_before:], dtype="<f4").reshape(2, c.seq_len, half)
    for pos in (0, 5, c.seq_len - 1):
        for j in range(half):
            angle = pos / 10000 ** (2 * j / c.head_dim)
            assert tables[0, pos, j] == pytest.approx(np.cos(angle), abs=1e-6)
            assert tables[1, pos, j] == pytest.approx(np.sin(angle), abs=1e-6)


@pytest.mark.parametrize("name", CONFIGS)
def test_v2_round_trip_within_quantisation_error(tmp_path, name):
    c = CONFIGS[name]
    w = small_weights(c, seed=2)
    path = tmp_path / "q.bin"
    gs = write_checkpoint(path, c, w, version=2, group_size=64)
    assert c.dim % gs == 0 and c.hidden_dim % gs == 0
    config, weights = read_checkpoint(path)
    assert config == c
    for wname, t in w.items():
        got = weights[wname]
        assert got.dtype == torch.float32 and got.shape == t.shape
        if wname.startswith("rms"):
            assert torch.equal(got, t), wname  # norms stay float32
            continue
        groups = t.reshape(-1, gs)
        bound = groups.abs().amax(1, keepdim=True) / 127 / 2 * 1.0001  # half a quantisation step
        assert ((got.reshape(-1, gs) - groups).abs() <= bound + 1e-9).all(), wname


def test_v2_group_size_backs_off_to_fit_dims(tmp_path):
    c = CONFIGS["odd_dims"]  # dim 48, hidden 100: 64 -> 32 -> 16 -> 8 -> 4
    assert write_checkpoint(tmp_path / "q.bin", c, small_weights(c), version=2, group_size=64) == 4


@settings(max_examples=20, deadline=None)
@given(kv=st.integers(1, 3), group=st.integers(1, 3), hd_half=st.integers(1, 4), hidden=st.integers(1, 40),
       layers=st.integers(1, 3), vocab=st.integers(1, 40), seq_len=st.integers(1, 12), shared=st.booleans(),
       version=st.sampled_from([0, 1, 2]))
def test_round_trip_any_small_shape(tmp_path_factory, kv, group, hd_half, hidden, layers, vocab, seq_len, shared,
                                    version):
    n_heads = kv * group
    c = ModelConfig(n_heads * 2 * hd_half, hidden, layers, n_heads, kv, vocab, seq_len, shared)
    w = small_weights(c)
    path = tmp_path_factory.mktemp("rt") / "m.bin"
    write_checkpoint(path, c, w, version=version, group_size=8)
    config, weights = read_checkpoint(path)
    assert config == c and weights.keys() == w.keys()
    for name in w:
        atol = w[name].abs().max().item() / 127 if version == 2 else 0.0
        torch.testing.assert_close(weights[name], w[name], rtol=0, atol=atol + 1e-7)


def test_writer_rejects_wrong_weights(tmp_path):
    c = CONFIGS["mha_shared"]
    w = small_weights(c)
    bad = dict(w, wq=w["wq"][:, :-1])
    with pytest.raises(CheckpointError, match="'wq'.*shape"):
        write_checkpoint(tmp_path / "m.bin", c, bad)
    with pytest.raises(CheckpointError, match="'wcls'"):
        write_checkpoint(tmp_path / "m.bin", c, dict(w, wcls=w["token_embedding"]))
    with pytest.raises(CheckpointError, match="'w2'"):
        write_checkpoint(tmp_path / "m.bin", c, {k: v for k, v in w.items() if k != "w2"})
    assert not (tmp_path / "m.bin").exists()


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_writer_refuses_non_finite_weights(tmp_path, value):
    c = CONFIGS["mha_shared"]
    w = small_weights(c)
    w["w1"] = w["w1"].clone()
    w["w1"][1, 2, 3] = value
    for version in (0, 2):
        with pytest.raises(CheckpointError, match=r"tensor w1.*finite weights.*at index \[1, 2, 3\]"):
            write_checkpoint(tmp_path / "m.bin", c, w, version=version)
    assert not list(tmp_path.iterdir())                      # nothing written, not even a temporary file


# -----------------------------------------------------------------------------
# bad files: each raises CheckpointError naming the file and the field

@pytest.fixture
def good_files(tmp_path):
    c = CONFIGS["gqa_unshared"]
    w = small_weights(c)
    paths = {}
    for version in (0, 1, 2):
        paths[version] = tmp_path / f"good_v{version}.bin"
        write_checkpoint(paths[version], c, w, version=version, group_size=32)
    return paths


def corrupt(path, tmp_path, fn, name):
    bad = tmp_path / name
    bad.write_bytes(fn(bytearray(path.read_bytes())))
    return bad


def expect_error(path, field):
    with pytest.raises(CheckpointError) as info:
        read_checkpoint(path)
    message = str(info.value)
    assert str(path) in message and f"'{field}'" in message, message
    assert info.value.field == field
    return message


@pytest.mark.parametrize("version", [0, 1, 2])
def test_truncated_and_extra_bytes(good_files, tmp_path, version):
    good = good_files[version]
    size = good.stat().st_size
    msg = expect_error(corrupt(good, tmp_path, lambda b: b[:-1], "short.bin"), "file size")
    assert f"{size - 1} bytes" in msg and f"{size} bytes" in msg and "truncated" in msg
    msg = expect_error(corrupt(good, tmp_path, lambda b: b + b"\0\0\0\0", "long.bin"), "file size")
    assert "trailing" in msg
    expect_error(corrupt(good, tmp_path, lambda b: b[:20], "stub.bin"), "header")


def test_bad_magic_is_reported(good_files, tmp_path):
    def break_magic(b):
        b[0:4] = b"XXXX"
        return b
    with pytest.raises(CheckpointError) as info:
        read_checkpoint(corrupt(good_files[1], tmp_path, break_magic, "magic.bin"))
    assert "magic" in str(info.value) and "magic.bin" in str(info.value)


def test_bad_version(good_files, tmp_path):
    def version7(b):
        b[4:8] = struct.pack("<i", 7)
        return b
    msg = expect_error(corrupt(good_files[1], tmp_path, version7, "ver.bin"), "version")
    assert "found 7" in msg


@pytest.mark.parametrize("field, index, value", [
    ("dim", 0, 0), ("n_layers", 2, -3), ("n_heads", 3, 0), ("dim", 3, 5),  # 64 % 5
    ("n_kv_heads", 4, 3), ("n_kv_heads", 4, 16), ("seq_len", 6, 0), ("dim", 3, 64),  # head_dim 1 is odd
])
@pytest.mark.parametrize("version", [0, 1])
def test_nonsense_header(good_files, tmp_path, field, index, value, version):
    start = 0 if version == 0 else 8
    def patch(b):
        b[start + 4 * index:start + 4 * index + 4] = struct.pack("<i", value)
        return b
    expect_error(corrupt(good_files[version], tmp_path, patch, "hdr.bin"), field)


def test_bad_flags(good_files, tmp_path):
    def flag(b):
        b[36] = 9
        return b
    expect_error(corrupt(good_files[1], tmp_path, flag, "flag.bin"), "shared_classifier")
    def group(b):
        b[37:41] = struct.pack("<i", 0)
        return b
    expect_error(corrupt(good_files[2], tmp_path, group, "gs.bin"), "group_size")
    def group_not_dividing(b):
        b[37:41] = struct.pack("<i", 7)
        return b
    expect_error(corrupt(good_files[2], tmp_path, group_not_dividing, "gs7.bin"), "group_size")


def test_missing_and_empty_file(tmp_path):
    expect_error(tmp_path / "nope.bin", "file")
    (tmp_path / "empty.bin").write_bytes(b"")
    expect_error(tmp_path / "empty.bin", "header")


def test_read_config_validates_size_too(good_files, tmp_path):
    assert read_config(good_files[2]) == CONFIGS["gqa_unshared"]
    with pytest.raises(CheckpointError, match="file size"):
        read_config(corrupt(good_files[2], tmp_path, lambda b: b[:-4], "short.bin"))


def test_check_vocab(tmp_path):
    c = CONFIGS["mha_shared"]
    check_vocab(c, 50, "m.bin", "tok.bin")  # agrees: no error
    with pytest.raises(CheckpointError) as info:
        check_vocab(c, 32000, "m.bin", "tok.bin")
    msg = str(info.value)
    assert "m.bin" in msg and "tok.bin" in msg and "'vocab_size'" in msg and "32000" in msg and "50" in msg


def test_export_tool_converts_between_versions(tmp_path, capsys):
    from batchmask.models.export import main as export_main
    config = ModelConfig(dim=32, hidden_dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=50, seq_len=16)
    weights = random_weights(config, seed=3)
    src = tmp_path / "v0.bin"
    write_checkpoint(src, config, weights, version=0)
    tol = 0.0
    for version in (1, 2, 0):                  # v0 -> v1 -> v2 -> v0: exact until the int8 step
        dst = tmp_path / f"out{version}.bin"
        assert export_main([str(src), str(dst), "--version", str(version), "--group-size", "16"]) == 0
        got_config, got = read_checkpoint(dst)
        assert got_config == config
        tol = 0.02 if version == 2 else tol
        for name, w in weights.items():
            assert torch.allclose(got[name].float(), w, atol=tol * float(w.abs().max()) + 1e-7), name
        src = dst
    assert export_main([str(tmp_path / "missing.bin"), str(tmp_path / "x.bin")]) == 2
    assert "missing.bin" in capsys.readouterr().err


@pytest.mark.parametrize("version", [0, 1, 2])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused_naming_the_tensor(tmp_path, version, bad):
    """One bad value anywhere (here one layer of wk, and one embedding row) refuses the file at read."""
    c = CONFIGS["gqa_unshared"]
    for name, index in [("wk", (2, 5, 7)), ("token_embedding", (11, 0))]:
        w = random_weights(c, seed=2)
        w[name][index] = bad
        path = tmp_path / f"{name}.bin"
        with pytest.MonkeyPatch.context() as m:    # a file as another tool could write it: ours refuses to
            m.setattr(checkpoint_module, "check_finite", lambda *a: None)
            write_checkpoint(path, c, w, version=version)
        with pytest.raises(CheckpointError) as info:
            read_checkpoint(path)
        msg = str(info.value)
        assert f"tensor {name}" in msg and "finite" in msg and str(path) in msg and "\n" not in msg
        if version != 2:  # int8 scales turn one bad value into a bad group; the float formats keep its place
            assert f"at index {list(index)}" in msg


def test_writer_refuses_what_llama2c_cannot_express(tmp_path):
    from batchmask.models.config import RopeConfig
    base = CONFIGS["mha_shared"]
    for change, needle in [(dict(rope=RopeConfig(theta=5e5)), "rope_theta"), (dict(norm_eps=1e-6), "rms_norm_eps"),
                           (dict(qkv_bias=True), "biases"), (dict(head_size=4), "head_dim"),
                           (dict(rope=RopeConfig(kind="linear", factor=2.0)), "rope scaling")]:
        c = dataclasses.replace(base, **change)
        with pytest.raises(CheckpointError, match=needle):
            write_checkpoint(tmp_path / "m.bin", c, random_weights(c))
        assert not (tmp_path / "m.bin").exists()
