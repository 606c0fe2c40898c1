"""The converter (python -m batchmask.models.export) from Hugging Face directories to llama2.c files: what llama2.c
can express converts and then runs like transformers; the rest is refused in one line saying why."""
import pytest
import torch
from batchmask.models.checkpoint import read_checkpoint
from batchmask.models.export import main as export_main
from batchmask.models.llama import load_checkpoint
from hf_fixtures import hf_model, save, to_classic_spelling

pytest.importorskip("transformers")

PLAIN = dict(rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


def relative_error(got, want):
    return ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()


@pytest.mark.parametrize("tied", [False, True])
def test_llama_converts_and_runs_like_transformers(tmp_path, tied, capsys):
    ref = hf_model("llama", seed=3, tie_word_embeddings=tied, **PLAIN)
    src = save(ref, tmp_path / "hf")
    to_classic_spelling(src)  # rope_scaling: null, rope_theta, torch_dtype: also read by the converter
    x = torch.randint(3, 120, (2, 100), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = ref(x).logits
    for version in (0, 1):
        dst = tmp_path / f"v{version}.bin"
        assert export_main([str(src), str(dst), "--version", str(version), "--max-context", "128"]) == 0
        config, _ = read_checkpoint(dst)
        assert (config.seq_len, config.shared_classifier, config.n_kv_heads) == (128, tied, 2)
        assert relative_error(load_checkpoint(dst).logits(x), want) <= 1e-4
    dst = tmp_path / "v2.bin"
    assert export_main([str(src), str(dst), "--version", "2", "--group-size", "32"]) == 0
    assert read_checkpoint(dst)[0].seq_len == 160  # max_position_embeddings when not capped
    assert relative_error(load_checkpoint(dst).logits(x), want) <= 0.1  # int8 Q8_0
    assert "wrote" in capsys.readouterr().out


@pytest.mark.parametrize("arch, overrides, reason", [
    ("llama", dict(rms_norm_eps=1e-5, rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                       "original_max_position_embeddings": 32}), "rope scaling"),
    ("llama", dict(rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
     "rope_theta 500000"),
    ("llama", dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}), "rms_norm_eps 1e-06"),
    ("qwen2", PLAIN, "biases"),
    ("mistral", dict(head_dim=24, sliding_window=None, **PLAIN), "head_dim 24"),
])
def test_what_llama2c_cannot_express_is_refused(tmp_path, capsys, arch, overrides, reason):
    src = save(hf_model(arch, **overrides), tmp_path / "hf")
    dst = tmp_path / "out.bin"
    assert export_main([str(src), str(dst)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and reason in err and "config.json" in err and "llama2.c" in err
    assert not dst.exists() and not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.tmp"))
