"""Hugging Face checkpoints (models/hf.py) against transformers itself: random small models of each architecture
and option written with save_pretrained, logits on a 100-token sequence, batched greedy decoding with the KV
cache against generate(do_sample=False), and one clear line for each kind of bad directory."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from batchmask.models.checkpoint import CheckpointError
from batchmask.models.hf import HFCheckpoint
from batchmask.models.llama import ContextOverflowError, OutOfMemoryError, kv_cache_bytes, load_checkpoint
from data_paths import data_dir
from hf_fixtures import edit_config, greedy_ours, greedy_transformers, hf_model, save, to_classic_spelling

transformers = pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[1]

LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
# name -> (architecture, config overrides, how the files are written)
CASES = {
    "llama-gqa-untied-llama3": ("llama", dict(rope_parameters=LLAMA3), {}),
    "llama-gqa-llama3-classic": ("llama", dict(rope_parameters=LLAMA3), {"classic": True}),
    "llama-mha-tied-linear-classic": ("llama", dict(num_key_value_heads=4, tie_word_embeddings=True, rms_norm_eps=1e-5,
                                                    rope_parameters={"rope_type": "linear", "factor": 2.5,
                                                                     "rope_theta": 10000.0}), {"classic": True}),
    "qwen2-bias-tied": ("qwen2", dict(num_key_value_heads=1, tie_word_embeddings=True,
                                      rope_parameters={"rope_type": "default", "rope_theta": 1e6}), {}),
    "qwen2-bias-untied-bf16": ("qwen2", dict(), {"dtype": torch.bfloat16}),
    "mistral-head-dim": ("mistral", dict(head_dim=24, sliding_window=None), {}),
    "llama-bf16": ("llama", dict(), {"dtype": torch.bfloat16}),
    "llama-f16-tied": ("llama", dict(tie_word_embeddings=True), {"dtype": torch.float16}),
    "llama-sharded": ("llama", dict(rope_parameters=LLAMA3), {"max_shard_size": "40KB"}),
}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """name -> (directory, the transformers model to compare with), built once per module."""
    cache = {}

    def get(name):
        if name not in cache:
            arch, overrides, how = CASES[name]
            model = hf_model(arch, seed=len(cache), **overrides)
            path = save(model, tmp_path_factory.mktemp(name), how.get("dtype"), how.get("max_shard_size"))
            if how.get("classic"):
                to_classic_spelling(path)
            if how:  # the reference reads the same files (classic spelling, bf16 values): both must read them alike
                model = getattr(transformers, type(model).__name__).from_pretrained(path, dtype=torch.float32).eval()
            cache[name] = (path, model)
        return cache[name]
    return get


def tokens(n, vocab=120, seed=0, rows=2):
    return torch.randint(3, vocab, (rows, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", CASES)
def test_logits_match_transformers(written, name):
    path, ref = written(name)
    ours = load_checkpoint(path)
    x = tokens(100)
    with torch.no_grad():
        want = ref(x).logits.double()
    got = ours.logits(x).double()
    err = (got - want).abs().max().item()
    assert err <= 1e-4 * want.abs().max().item(), f"{name}: max error {err} vs scale {want.abs().max().item()}"


@pytest.mark.parametrize("name", CASES)
def test_batched_greedy_equals_transformers_generate(written, name):
    path, ref = written(name)
    ours = load_checkpoint(path)
    g = torch.Generator().manual_seed(5)
    # different lengths, and decoding well past llama3's original_max_position_embeddings (32)
    prompts = [torch.randint(3, 120, (n,), generator=g).tolist() for n in (5, 40, 17)]
    n_new = 24
    batched = greedy_ours(ours, prompts, n_new)
    compared = 0
    for prompt, row in zip(prompts, batched):
        want = greedy_transformers(ref, prompt, n_new)
        assert row[:len(want)] == want  # generate stops at EOS; the cache keeps going
        assert len(want) == n_new or want[-1] == ref.config.eos_token_id
        compared += len(want)
    assert compared >= n_new  # not a comparison of empty continuations


def test_files_are_what_the_case_says(written):
    """The cases exercise what they claim: shards with an index, bf16 tensors, the classic config spelling."""
    from safetensors import safe_open
    sharded, _ = written("llama-sharded")
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    bf16, _ = written("llama-bf16")
    with safe_open(str(bf16 / "model.safetensors"), "pt") as f:
        assert f.get_slice("model.embed_tokens.weight").get_dtype() == "BF16"
    classic = json.loads((written("llama-gqa-llama3-classic")[0] / "config.json").read_text())
    assert "rope_parameters" not in classic and classic["rope_scaling"]["rope_type"] == "llama3"
    assert "torch_dtype" in classic and "dtype" not in classic
    new, old = HFCheckpoint(written("llama-gqa-untied-llama3")[0]), HFCheckpoint(written("llama-gqa-llama3-classic")[0])
    assert new.config == old.config and new.info == old.info
    assert (new.info.dtype, HFCheckpoint(bf16).info.dtype) == ("float32", "bfloat16")


def test_max_context_caps_the_context_and_the_cache(written):
    path, _ = written("mistral-head-dim")
    model = load_checkpoint(path, max_context=50)
    c = model.config
    assert c.seq_len == 50 and c.head_dim == 24
    model.setup_cache(3)
    assert model.k_cache.nbytes + model.v_cache.nbytes == kv_cache_bytes(c, 3, 50, torch.float32) == model.cache_bytes
    assert kv_cache_bytes(c, 3, 50, torch.bfloat16) * 2 == kv_cache_bytes(c, 3, 50, torch.float32)
    with pytest.raises(ContextOverflowError):
        model.prefill(torch.tensor([0]), tokens(51, rows=1), torch.tensor([51]))
    assert load_checkpoint(path).config.seq_len == 160  # max_position_embeddings


def test_max_context_caps_a_llama2c_file_too(tmp_path):
    from batchmask.models.checkpoint import ModelConfig, random_weights, write_checkpoint
    c = ModelConfig(dim=32, hidden_dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=50, seq_len=64)
    write_checkpoint(tmp_path / "m.bin", c, random_weights(c))
    x = tokens(20, vocab=50, rows=1)
    capped = load_checkpoint(tmp_path / "m.bin", max_context=24)
    assert capped.config.seq_len == 24 and load_checkpoint(tmp_path / "m.bin", max_context=1000).config.seq_len == 64
    assert torch.equal(capped.logits(x), load_checkpoint(tmp_path / "m.bin").logits(x))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_decode_of_a_bf16_hf_model_matches_eager(written):
    model = load_checkpoint(written("qwen2-bias-untied-bf16")[0], device="cuda", dtype=torch.bfloat16)
    prompts, fed = tokens(6, rows=3).cuda(), tokens(4, seed=1, rows=3).T.contiguous().cuda()
    lengths = torch.tensor([6, 2, 4])

    def run(graphed):
        model.setup_cache(3)
        model.prefill(torch.arange(3), prompts, lengths)
        if graphed:
            model.capture_decode()
        step = model.decode_graphed if graphed else model.decode
        return torch.stack([step(fed[i]).clone() for i in range(4)])
    torch.testing.assert_close(run(True), run(False), rtol=2e-2, atol=2e-2)


def test_a_cache_the_machine_cannot_hold_is_refused_before_allocating(written):
    model = load_checkpoint(written("mistral-head-dim")[0])
    with pytest.raises(OutOfMemoryError, match=r"KV cache for batch 10000000 x context 160 .* needs [\d.]+ GiB") as e:
        model.setup_cache(10_000_000)
    assert "\n" not in str(e.value) and model.k_cache is None


# -----------------------------------------------------------------------------
# bad directories: one line each, naming the file and the field or tensor


def copy_of(written, name, tmp_path):
    import shutil
    src, _ = written(name)
    return Path(shutil.copytree(src, tmp_path / name))


def refused(path, *needles, **kwargs):
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path, **kwargs)
    msg = str(e.value)
    assert "\n" not in msg, msg
    for needle in needles:
        assert needle in msg, msg
    return msg


def test_missing_shard(written, tmp_path):
    d = copy_of(written, "llama-sharded", tmp_path)
    shard = sorted(d.glob("model-*.safetensors"))[-1]
    shard.unlink()
    refused(d, "model.safetensors.index.json", shard.name, "no such file")


@pytest.mark.parametrize("outside", ["../elsewhere.safetensors", "ABSOLUTE", "sub/../../elsewhere.safetensors"])
def test_index_naming_a_shard_outside_the_directory(written, tmp_path, outside):
    d = copy_of(written, "llama-sharded", tmp_path)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    name, shard = next(iter(index["weight_map"].items()))
    elsewhere = tmp_path / "elsewhere.safetensors"             # a real file there: refused for where it is
    elsewhere.write_bytes((d / shard).read_bytes())
    index["weight_map"][name] = str(elsewhere) if outside == "ABSOLUTE" else outside
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    refused(d, "model.safetensors.index.json", "weight_map", "a shard file inside", name)


def test_index_naming_a_tensor_its_shard_lacks(written, tmp_path):
    d = copy_of(written, "llama-sharded", tmp_path)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    name = next(n for n, s in index["weight_map"].items() if s == shards[0])
    index["weight_map"][name] = shards[1]
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    refused(d, shards[1], f"tensor {name}", "no such tensor in the file")
    del index["weight_map"][name]
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    refused(d, f"tensor {name}", "no such tensor")


def test_wrong_shape(written, tmp_path):
    d = copy_of(written, "llama-gqa-untied-llama3", tmp_path)
    edit_config(d, intermediate_size=80)
    refused(d, "model.safetensors", "model.layers.0.mlp.gate_proj.weight", "shape [80, 64]", "[96, 64]")


def test_config_with_fewer_layers_than_the_weights(written, tmp_path):
    d = copy_of(written, "llama-gqa-untied-llama3", tmp_path)
    edit_config(d, num_hidden_layers=1)
    refused(d, "tensor model.layers.1.", "unexpected tensor")


@pytest.mark.parametrize("change, needles", [
    (dict(architectures=["GPT2LMHeadModel"]), ["architectures", "GPT2LMHeadModel"]),
    (dict(architectures=["MixtralForCausalLM"]), ["architectures", "MixtralForCausalLM"]),
    (dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}), ["rope_type", "'yarn'"]),
    (dict(rope_parameters=None, rope_scaling={"type": "dynamic", "factor": 2.0}), ["rope_scaling.rope_type",
                                                                                   "'dynamic'"]),
    (dict(rope_parameters={"rope_type": "llama3", "factor": 8.0}), ["low_freq_factor", "required"]),
    (dict(hidden_act="gelu"), ["hidden_act", "'gelu'"]),
    (dict(num_local_experts=8), ["num_local_experts", "mixture-of-experts"]),
    (dict(quantization_config={"quant_method": "gptq"}), ["quantization_config", "gptq"]),
    (dict(attention_bias=True), ["attention_bias"]),
    (dict(num_attention_heads="4"), ["num_attention_heads", "positive integer"]),
    (dict(num_attention_heads=3), ["num_key_value_heads", "divisor"]),
])
def test_config_refusals(written, tmp_path, change, needles):
    d = copy_of(written, "llama-gqa-untied-llama3", tmp_path)
    edit_config(d, **change)
    refused(d, "config.json", *needles)


def test_sliding_window_shorter_than_the_context(written, tmp_path):
    d = copy_of(written, "mistral-head-dim", tmp_path)
    edit_config(d, sliding_window=64)
    refused(d, "sliding_window", "160", "64")
    assert load_checkpoint(d, max_context=64).config.seq_len == 64  # the window covers the whole context


def test_qwen2_sliding_window_only_counts_when_used(written, tmp_path):
    d = copy_of(written, "qwen2-bias-tied", tmp_path)
    edit_config(d, use_sliding_window=False, sliding_window=64)
    assert load_checkpoint(d).config.seq_len == 160  # Qwen2 ignores the window unless use_sliding_window
    edit_config(d, use_sliding_window=True, layer_types=["full_attention", "sliding_attention"])
    refused(d, "sliding_window", "160", "64")
    edit_config(d, layer_types=["full_attention", "chunked_attention"])
    refused(d, "layer_types", "chunked_attention")


def test_nan_weight_is_refused_naming_the_tensor(tmp_path):
    model = hf_model("llama")
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight[7, 3] = float("nan")
    d = save(model, tmp_path / "nan", dtype=torch.bfloat16)
    refused(d, "model.safetensors", "tensor model.layers.1.mlp.up_proj.weight", "finite", "nan at index [7, 3]")


def test_not_a_model_directory(tmp_path):
    refused(tmp_path, "config.json", "a directory without config.json")
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 8,
                                                      "intermediate_size": 8, "num_hidden_layers": 1,
                                                      "num_attention_heads": 2, "vocab_size": 10}))
    refused(tmp_path, "model.safetensors", "neither file")
    (tmp_path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")
    refused(tmp_path, "model.safetensors", "unreadable")


def test_cli_prints_one_line_for_a_bad_directory(written, tmp_path, capsys):
    from batchmask.run.cli import main
    d = copy_of(written, "llama-gqa-untied-llama3", tmp_path)
    edit_config(d, rope_parameters={"rope_type": "longrope", "rope_theta": 1e4})
    tasks = tmp_path / "tasks.txt"
    tasks.write_text("read the file notes.txt\n")
    tok = data_dir("llama2") / "tokenizer.model"
    rc = main(["generate", "--checkpoint", str(d), "--tokenizer", str(tok), "--tasks", str(tasks), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "'longrope'" in err and "config.json" in err


def test_cli_takes_the_tokenizer_from_the_model_directory(written):
    from batchmask.run.cli import resolve_model_paths
    d, _ = written("qwen2-bias-tied")
    assert resolve_model_paths(str(d), None) == (d, d)
    assert resolve_model_paths(str(d / "config.json"), None) == (d / "config.json", d)


# -----------------------------------------------------------------------------
# hub ids


def test_hub_id_resolves_from_the_offline_cache(written, tmp_path):
    """HF_HUB_OFFLINE=1 and a hand-made cache (models--ORG--NAME/refs/main -> snapshots/<commit>/): the id loads
    from the cache; an id not in it is one line. A subprocess, since huggingface_hub reads the variables at import."""
    pytest.importorskip("huggingface_hub")
    import shutil
    src, _ = written("qwen2-bias-tied")
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "cache" / "models--someorg--tiny-qwen"
    shutil.copytree(src, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    script = ("from batchmask.models.llama import load_checkpoint\n"
              "m = load_checkpoint('someorg/tiny-qwen'); print('qkv_bias', m.config.qkv_bias, m.config.vocab_size)\n"
              "try:\n    load_checkpoint('someorg/absent')\nexcept ValueError as e:\n    print('refused:', e)\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "cache"), "HF_HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == "qkv_bias True 120"
    assert lines[1].startswith("refused: someorg/absent") and "HF_HUB_OFFLINE is set" in lines[1]


def test_hub_id_asks_for_the_model_files(monkeypatch, written):
    huggingface_hub = pytest.importorskip("huggingface_hub")
    from batchmask.models import hf
    path, _ = written("llama-bf16")
    seen, calls = {}, []

    def fake_snapshot_download(repo_id, allow_patterns=None, **kwargs):
        seen.update(repo_id=repo_id, allow_patterns=allow_patterns)
        calls.append(repo_id)
        return str(path)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    assert hf.resolve_checkpoint("meta-llama/Llama-3.2-1B-Instruct") == path
    assert seen["repo_id"] == "meta-llama/Llama-3.2-1B-Instruct"
    assert {"config.json", "*.safetensors", "model.safetensors.index.json"} <= set(seen["allow_patterns"])
    assert any(p.startswith("tokenizer") for p in seen["allow_patterns"])
    assert hf.resolve_checkpoint("no/such/local/path.bin") == Path("no/such/local/path.bin")  # not an id: as given
    monkeypatch.chdir(path.parent)
    assert hf.resolve_checkpoint(f"{path.name}/typo.bin") == Path(path.name, "typo.bin")  # its folder exists: local
    assert calls == ["meta-llama/Llama-3.2-1B-Instruct"]  # only the id went to the hub


def test_generate_reads_the_tokenizer_from_the_model_directory(tmp_path, capsys):
    """End to end: a HF directory holding its tokenizer.json (GPT-2's byte-level BPE) and a random Llama; the
    constrained call parses whatever the random model prefers."""
    import shutil

    from batchmask.run.cli import main
    shared = data_dir("gpt2")
    if not (shared / "tokenizer.json").exists():
        pytest.skip("no ../shared/gpt2 tokenizer beside the checkout")
    d = save(hf_model("llama", vocab_size=50257, eos_token_id=50256, bos_token_id=50256, pad_token_id=None,
                      max_position_embeddings=512), tmp_path / "model")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(shared / name, d / name)
    tasks, out = tmp_path / "tasks.txt", tmp_path / "calls.jsonl"
    tasks.write_text("read the file notes.txt\nlist the files in /tmp\n")
    rc = main(["generate", "--checkpoint", str(d), "--tasks", str(tasks), "--out", str(out), "--max-new-tokens", "24",
               "--batch-size", "2", "--quiet"])
    assert rc == 0, capsys.readouterr().err
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["index"] for r in records] == [0, 1] and all(isinstance(r["call"], dict) for r in records)
