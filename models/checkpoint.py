"""
llama2.c checkpoint files: read (memory-mapped, validated) and write.

Three on-disk formats exist, all little-endian:

v0 "legacy" (run.c; what karpathy/tinyllamas ships, e.g. stories15M.bin)
    header: 7 x int32  dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
            (vocab_size < 0 means the classifier is NOT shared with the token embedding)
    float32 tensors, in this order:
        token_embedding, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final,
        freq_cis_real [seq_len, head_dim/2], freq_cis_imag [seq_len, head_dim/2]  (old RoPE
        tables; the reader skips them, RoPE is recomputed), wcls (only if unshared)

v1 (llama2.c export.py --version 1)
    256-byte header: uint32 magic 0x616b3432 ("ak42"), int32 version=1, the 7 int32 params
    (vocab_size positive), uint8 shared_classifier, zero padding to 256 bytes
    float32 tensors: rms_att, rms_ffn, rms_final, token_embedding, wq, wk, wv, wo, w1, w2, w3,
    wcls (only if unshared)

v2 (llama2.c export.py --version 2, read by runq.c): int8 "Q8_0", symmetric, per group
    256-byte header: magic, int32 version=2, the 7 params, uint8 shared_classifier,
    int32 group_size, zero padding
    float32: rms_att, rms_ffn, rms_final
    then for each quantized tensor -- token_embedding, wq[0..L), wk[0..L), wv[0..L), wo[0..L),
    w1[0..L), w2[0..L), w3[0..L), wcls (only if unshared) -- its int8 values immediately followed
    by its float32 scales (one per group of group_size consecutive values); value = q * scale.

Every per-layer tensor is stored layer after layer, so each weight kind is one contiguous block;
the reader returns it stacked over layers.  The weight dictionary (`weights`) used by the
reader, the writer and `models.llama.Transformer` has these entries (run.c's names):

    token_embedding [vocab_size, dim]
    rms_att         [n_layers, dim]                     attention RMSNorm gains
    wq              [n_layers, n_heads * head_dim, dim]
    wk              [n_layers, n_kv_heads * head_dim, dim]
    wv              [n_layers, n_kv_heads * head_dim, dim]
    wo              [n_layers, dim, n_heads * head_dim]
    rms_ffn         [n_layers, dim]                     FFN RMSNorm gains
    w1              [n_layers, hidden_dim, dim]         SwiGLU gate
    w2              [n_layers, dim, hidden_dim]         SwiGLU down projection
    w3              [n_layers, hidden_dim, dim]         SwiGLU up projection
    rms_final       [dim]
    wcls            [vocab_size, dim]                   only when config.shared_classifier is False

All matrices are [out_features, in_features], i.e. y = W @ x, as in run.c and nn.Linear.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..safe_write import write_atomic
from .config import PARAM_FIELDS, CheckpointError, ModelConfig, weight_shapes  # noqa: F401 (re-exported)
from .rope import rope_tables

MAGIC = 0x616B3432  # "ak42" read as a little-endian uint32
HEADER_BYTES = 256  # v1 / v2 header size
LEGACY_HEADER_BYTES = 7 * 4
# said whenever a file without the magic fails: it may be a v1/v2 file with a damaged magic
NOT_V1_NOTE = ("bytes 0-3 are not the 'ak42' magic 0x616b3432, so the file was read as a legacy v0 "
               "checkpoint whose header is 7 int32 values")
# On-disk order of the float32 tensors in each format ("rope" = the two skipped legacy tables).
LEGACY_ORDER = ("token_embedding", "rms_att", "wq", "wk", "wv", "wo", "rms_ffn", "w1", "w2", "w3",
                "rms_final", "rope", "wcls")
V1_ORDER = ("rms_att", "rms_ffn", "rms_final", "token_embedding", "wq", "wk", "wv", "wo", "w1", "w2",
            "w3", "wcls")
V2_FLOAT = ("rms_att", "rms_ffn", "rms_final")
V2_QUANTIZED = ("token_embedding", "wq", "wk", "wv", "wo", "w1", "w2", "w3", "wcls")


def _numel(shape) -> int:
    return int(np.prod(shape, dtype=np.int64)) if shape else 1


def _quantized_groups(shape) -> tuple[int, int]:
    """(number of separately quantized tensors, elements in each) for a stacked weight shape."""
    return (shape[0], _numel(shape[1:])) if len(shape) == 3 else (1, _numel(shape))


def _rope_table_shape(config: ModelConfig) -> tuple[int, int]:
    return (config.seq_len, config.head_dim // 2)


# -----------------------------------------------------------------------------
# header parsing


@dataclass(frozen=True)
class Header:
    """What the first bytes of a checkpoint say: format version, config, payload start."""

    version: int  # 0 = legacy, 1 = float32 with header, 2 = Q8_0
    config: ModelConfig
    data_offset: int  # byte offset of the first tensor
    group_size: int | None = None  # v2 only


def _parse_header(path, buf) -> Header:
    """Decode and validate the header in `buf` (the mapped file)."""
    size = len(buf)
    if size < 4:
        raise CheckpointError(path, "header", f"at least {LEGACY_HEADER_BYTES} bytes", f"a {size}-byte file")
    (magic,) = struct.unpack_from("<I", buf, 0)
    if magic != MAGIC:
        return _parse_legacy_header(path, buf)
    if size < HEADER_BYTES:
        raise CheckpointError(path, "header", f"{HEADER_BYTES} bytes after the 'ak42' magic", f"a {size}-byte file")
    (version,) = struct.unpack_from("<i", buf, 4)
    if version not in (1, 2):
        raise CheckpointError(path, "version", "1 or 2 (after the 'ak42' magic at byte 0)", version,
                              "byte offset 4")
    params = struct.unpack_from("<7i", buf, 8)
    (shared,) = struct.unpack_from("<B", buf, 36)
    if shared not in (0, 1):
        raise CheckpointError(path, "shared_classifier", "0 or 1", shared, "byte offset 36")
    config = ModelConfig(*params, shared_classifier=bool(shared)).validate(path)
    group_size = None
    if version == 2:
        (group_size,) = struct.unpack_from("<i", buf, 37)
        if group_size <= 0:
            raise CheckpointError(path, "group_size", "a positive integer", group_size, "byte offset 37")
        for name, shape in weight_shapes(config).items():
            if name in V2_QUANTIZED and _quantized_groups(shape)[1] % group_size:
                raise CheckpointError(path, "group_size", f"a divisor of the {name} size {_quantized_groups(shape)[1]}",
                                      group_size, "byte offset 37")
    return Header(version, config, HEADER_BYTES, group_size)


def _parse_legacy_header(path, buf) -> Header:
    if len(buf) < LEGACY_HEADER_BYTES:
        raise CheckpointError(path, "header", f"at least {LEGACY_HEADER_BYTES} bytes", f"a {len(buf)}-byte file")
    params = list(struct.unpack_from("<7i", buf, 0))
    # legacy files flag an unshared classifier with a negative vocab_size
    shared = params[5] > 0
    params[5] = abs(params[5])
    try:
        config = ModelConfig(*params, shared_classifier=shared).validate(path)
    except CheckpointError as e:
        raise CheckpointError(path, e.field, e.expected, e.found, NOT_V1_NOTE) from None
    return Header(0, config, LEGACY_HEADER_BYTES)


def _payload_layout(header: Header) -> list[tuple[str, tuple[int, ...], int]]:
    """[(name, shape, bytes)] of the tensors after the header, in file order."""
    shapes = weight_shapes(header.config)
    if header.version == 0:
        layout = []
        for name in LEGACY_ORDER:
            if name == "rope":
                table = _rope_table_shape(header.config)
                layout.append(("rope", (2, *table), 4 * 2 * _numel(table)))
            elif name in shapes:
                layout.append((name, shapes[name], 4 * _numel(shapes[name])))
        return layout
    if header.version == 1:
        return [(n, shapes[n], 4 * _numel(shapes[n])) for n in V1_ORDER if n in shapes]
    layout = [(n, shapes[n], 4 * _numel(shapes[n])) for n in V2_FLOAT]
    for name in V2_QUANTIZED:
        if name in shapes:
            count, each = _quantized_groups(shapes[name])
            layout.append((name, shapes[name], count * (each + 4 * (each // header.group_size))))
    return layout


def expected_file_size(header: Header) -> int:
    return header.data_offset + sum(nbytes for _, _, nbytes in _payload_layout(header))


# -----------------------------------------------------------------------------
# reading


def _map_file(path) -> np.ndarray:
    """The whole file as a uint8 array backed by a private (copy-on-write) memory map.

    Copy-on-write keeps the file untouched while giving torch a writable buffer (no warnings).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(path, "file", "an existing checkpoint file", "nothing at this path")
    if path.stat().st_size == 0:
        raise CheckpointError(path, "header", f"at least {LEGACY_HEADER_BYTES} bytes", "an empty file")
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    return np.frombuffer(mm, dtype=np.uint8)


def read_header(path) -> Header:
    """Read and validate just the header and the file size of a checkpoint."""
    buf = _map_file(path)
    header = _parse_header(path, buf)
    _check_size(path, header, len(buf))
    return header


def _check_size(path, header: Header, size: int) -> None:
    expected = expected_file_size(header)
    if size != expected:
        what = "truncated" if size < expected else "trailing bytes after the last tensor"
        if header.version == 0:
            what += "; " + NOT_V1_NOTE
        raise CheckpointError(path, "file size", f"{expected} bytes for version {header.version} with {header.config}",
                              f"{size} bytes", what)


def read_config(path) -> ModelConfig:
    return read_header(path).config


def _dequantize_block(raw: np.ndarray, count: int, each: int, group_size: int, shape) -> torch.Tensor:
    """raw: uint8 [count * (each + 4*each/group_size)], each tensor = int8 values then f32 scales."""
    groups = each // group_size
    rows = raw.reshape(count, each + 4 * groups)  # one row per quantized tensor
    q = rows[:, :each].view(np.int8).reshape(count, groups, group_size)  # [count, groups, gs]
    scales = np.ascontiguousarray(rows[:, each:]).view("<f4")  # [count, groups]
    with np.errstate(invalid="ignore", over="ignore"):  # a NaN/Inf scale is reported by check_finite
        values = q.astype(np.float32) * scales[:, :, None]  # [count, groups, gs]
    return torch.from_numpy(values.reshape(shape))


def read_checkpoint(path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Read a v0/v1/v2 checkpoint: (config, weights) with weights named as in the module doc.

    Float32 files give tensors that view the memory-mapped file; v2 files are dequantized to float32.
    Raises CheckpointError for any malformed file, and for a tensor holding NaN or Inf (named).
    """
    buf = _map_file(path)
    header = _parse_header(path, buf)
    _check_size(path, header, len(buf))
    weights = {}
    offset = header.data_offset
    for name, shape, nbytes in _payload_layout(header):
        raw = buf[offset:offset + nbytes]
        offset += nbytes
        if name == "rope":
            continue  # the legacy RoPE tables: RoPE is recomputed by the model
        if header.version == 2 and name in V2_QUANTIZED:
            count, each = _quantized_groups(shape)
            weights[name] = _dequantize_block(raw, count, each, header.group_size, shape)
        else:
            weights[name] = torch.from_numpy(raw.view("<f4").reshape(shape))
        check_finite(path, name, weights[name])
    return header.config, weights


def check_finite(path, name: str, tensor: torch.Tensor) -> None:
    """Raise CheckpointError naming `name` if `tensor` holds a NaN or an infinity (one vectorised test; the
    position of the first bad value is only looked for once one is known to exist)."""
    if bool(torch.isfinite(tensor).all()):
        return
    bad = (~torch.isfinite(tensor)).flatten().nonzero()[0, 0].item()
    index = list(np.unravel_index(bad, tuple(tensor.shape)))
    value = tensor.flatten()[bad].item()
    raise CheckpointError(path, f"tensor {name}", "finite weights", f"{value} at index {[int(i) for i in index]}",
                          "a model with NaN/Inf weights writes garbage; the file is damaged or was saved after "
                          "a diverged training step")


def check_vocab(config: ModelConfig, tokenizer_vocab_size: int, checkpoint_path, tokenizer_path) -> None:
    """Raise CheckpointError unless the tokenizer and the model agree on the vocabulary size."""
    if int(tokenizer_vocab_size) != config.vocab_size:
        raise CheckpointError(checkpoint_path, "vocab_size",
                              f"{tokenizer_vocab_size} (the vocabulary of tokenizer {tokenizer_path})",
                              config.vocab_size, "the model and the tokenizer were not trained together")


# -----------------------------------------------------------------------------
# writing


def quantize_q80(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 quantization of `w` in groups of `group_size` consecutive values.

    Returns (q int8 [numel], scales float32 [numel / group_size]) with w ~= q * scale.  An all-zero
    group gets scale 0 and q 0 (export.py would divide by zero there).
    """
    groups = w.detach().float().reshape(-1, group_size)  # [n_groups, gs]
    scale = groups.abs().amax(dim=1) / 127.0  # [n_groups]
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(groups / safe[:, None]).to(torch.int8)  # [n_groups, gs]
    return q.reshape(-1), scale


def _fit_group_size(config: ModelConfig, group_size: int) -> int:
    """Halve group_size until it divides both matmul input widths (dim and hidden_dim).

    export.py backs off on dim only; also requiring hidden_dim keeps every weight row made of
    whole groups, which is what runq.c's group-wise matmul assumes.
    """
    if group_size <= 0:
        raise CheckpointError("<write>", "group_size", "a positive integer", group_size)
    while config.dim % group_size or config.hidden_dim % group_size:
        group_size //= 2
    return group_size


def _check_weights(path, config: ModelConfig, weights: dict) -> None:
    shapes = weight_shapes(config)
    for name in shapes.keys() - weights.keys():
        raise CheckpointError(path, name, f"a tensor of shape {shapes[name]}", "no such weight")
    for name in weights.keys() - shapes.keys():
        raise CheckpointError(path, name, f"only the weights {sorted(shapes)}", "an extra weight",
                              "wcls is only written when shared_classifier is False")
    for name, shape in shapes.items():
        if tuple(weights[name].shape) != shape:
            raise CheckpointError(path, name, f"shape {shape}", tuple(weights[name].shape))
    for name in shapes:                        # a NaN or Inf written now would only be refused when read back
        check_finite(path, name, weights[name])


def _f32_bytes(t: torch.Tensor) -> bytes:
    return t.detach().to("cpu", torch.float32).contiguous().numpy().astype("<f4", copy=False).tobytes()


def write_checkpoint(path, config: ModelConfig, weights: dict[str, torch.Tensor], version: int = 0,
                     group_size: int = 64) -> int | None:
    """Write `weights` (named as in the module doc) as a v0, v1 or v2 llama2.c checkpoint.

    For v2 the group size is halved until it divides dim and hidden_dim; the size actually used is
    returned (None for float formats).  The file is written to a temporary name and renamed, so a
    failed write never leaves a half-written checkpoint behind.
    """
    config.validate(path)
    for reason in config.llama2c_incompatibilities():
        raise CheckpointError(path, "config", "a model llama2.c's formats can express", reason)
    if version not in (0, 1, 2):
        raise CheckpointError(path, "version", "0, 1 or 2", version)
    _check_weights(path, config, weights)
    c = config
    params = (c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size, c.seq_len)
    used = []
    # a temporary file beside it, then os.replace: a failed or interrupted write leaves nothing behind, and a
    # device node, FIFO, directory or link at `path` is refused (batchmask/safe_write.py)
    write_atomic(path, lambda tmp: used.append(_write_body(tmp, config, weights, version, group_size, params)),
                 "checkpoint")
    return used[0]


def _write_body(tmp: Path, config: ModelConfig, weights: dict, version: int, group_size: int, params) -> int | None:
    c = config
    used_group_size = None
    with open(tmp, "xb") as f:
        if version == 0:
            legacy_vocab = c.vocab_size if c.shared_classifier else -c.vocab_size
            f.write(struct.pack("<7i", *params[:5], legacy_vocab, c.seq_len))
            cos, sin = rope_tables(config)
            for name in LEGACY_ORDER:
                if name == "rope":
                    f.write(_f32_bytes(cos) + _f32_bytes(sin))
                elif name in weights:
                    f.write(_f32_bytes(weights[name]))
        else:
            header = struct.pack("<Ii7iB", MAGIC, version, *params, int(c.shared_classifier))
            if version == 2:
                used_group_size = _fit_group_size(config, group_size)
                header += struct.pack("<i", used_group_size)
            f.write(header + b"\0" * (HEADER_BYTES - len(header)))
            if version == 1:
                for name in V1_ORDER:
                    if name in weights:
                        f.write(_f32_bytes(weights[name]))
            else:
                for name in V2_FLOAT:
                    f.write(_f32_bytes(weights[name]))
                for name in V2_QUANTIZED:
                    if name not in weights:
                        continue
                    count, each = _quantized_groups(tuple(weights[name].shape))
                    for tensor in weights[name].reshape(count, each):  # one layer at a time
                        q, scale = quantize_q80(tensor, used_group_size)
                        f.write(q.numpy().tobytes() + _f32_bytes(scale))
    return used_group_size


def random_weights(config: ModelConfig, seed: int = 0, std: float = 0.05) -> dict[str, torch.Tensor]:
    """Random float32 weights for `config` (tests, benchmarks): N(0, std) matrices, norms ~ 1."""
    g = torch.Generator().manual_seed(seed)
    weights = {}
    for name, shape in weight_shapes(config).items():
        if name.startswith("rms"):
            weights[name] = 1.0 + 0.1 * torch.randn(shape, generator=g)
        else:
            weights[name] = std * torch.randn(shape, generator=g)
    return weights
