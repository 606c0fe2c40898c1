"""The default model's recipe (recipes/default_model/), and the shipped default model in models/default/."""
import argparse
from pathlib import Path

import pytest
import sentencepiece as spm
import torch
from batchmask.models.checkpoint import ModelConfig, read_checkpoint
from batchmask.models.llama import Transformer, load_checkpoint
from batchmask.models.tokenizer import load_tokenizer

from batchmask.evaluation.taskgen import make_examples
from batchmask.tools.prompt import parse_call, render_call, render_prompt
from batchmask.tools.registry import ToolRegistry
from recipes.default_model.data import ExampleEncoder, build_dataset, common_prefix, encode_example
from recipes.default_model.state import TrainError, load_state, save_state
from recipes.default_model.tasks import make_train_examples
from recipes.default_model.train import (
    forward_shared_prefix,
    lr_at,
    make_optimizer,
    masked_loss,
    sample_batch,
    train_steps,
)
from recipes.default_model.vocab import train_tokenizer

REG = ToolRegistry.defaults()
DEFAULT = Path(__file__).resolve().parents[1] / "models" / "default"


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    """A small vocabulary trained by the script's own function (seconds)."""
    return train_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.model", n_examples=1500, vocab_size=400)


def tiny_config(vocab_size, n_kv_heads=2):
    return ModelConfig(dim=32, hidden_dim=64, n_layers=2, n_heads=4, n_kv_heads=n_kv_heads, vocab_size=vocab_size,
                       seq_len=512)


def train_args(**kw):
    base = dict(lr=3e-3, warmup=5, batch_size=8, seed=0, dim=32, n_layers=2, n_examples=64)
    return argparse.Namespace(**(base | kw))


# --- the vocabulary ---------------------------------------------------------------------------
def test_tokenizer_is_llama2c_shaped_and_matches_sentencepiece(tok, tmp_path):
    # pieces gluing a space to text were dropped from the 400 the trainer made; "▁" alone stays
    assert 259 < tok.vocab_size < 400
    assert [p for p in tok.pieces if "\u2581" in p] == ["\u2581"]
    assert tok.pieces[:3] == ["<unk>", "<s>", "</s>"]
    assert tok.pieces[3:259] == [f"<0x{b:02X}>" for b in range(256)]
    # the independent reference: sentencepiece itself, on the file train_tokenizer wrote
    sp = spm.SentencePieceProcessor(model_file=str(tok.source))
    for ex in make_examples(40, seed=9):
        for text in (render_prompt(REG, ex.task), render_call(ex.tool, ex.args)):
            assert tok.encode(text, bos=False) == sp.encode(text), text
    # the .bin written beside it holds the same vocabulary
    from_bin = load_tokenizer(Path(tok.source).with_name("tokenizer.bin"))
    assert from_bin.token_bytes == tok.token_bytes and from_bin.scores == pytest.approx(tok.scores)


def test_default_vocabulary_keeps_multi_character_pieces(tok):
    # BPE's merges stay (only the space-glued pieces go), and names keep their letters
    normal = [p for p, k in zip(tok.pieces, tok.kinds) if k == 1]
    assert max(len(p) for p in normal) > 2
    path = "Invoices/q4-plans_2023.csv"
    assert tok.decode(tok.encode(path, bos=False, prefix_space=False)) == path


def test_letter_vocabulary_when_asked(tmp_path):
    # max_piece_len=1: every normal piece is one character, and sentencepiece still agrees
    letters = train_tokenizer(tmp_path / "tokenizer.model", n_examples=1500, vocab_size=400, max_piece_len=1)
    normal = [p for p, k in zip(letters.pieces, letters.kinds) if k == 1]
    assert normal and all(len(p) == 1 for p in normal), [p for p in normal if len(p) > 1][:5]
    assert set("abcdefghijklmnopqrstuvwxyz0123456789_-./") <= set(normal)
    path = "Invoices/q4-plans_2023.csv"
    assert len(letters.encode(path, bos=False, prefix_space=False)) == len(path)
    sp = spm.SentencePieceProcessor(model_file=str(letters.source))
    for ex in make_examples(20, seed=4):
        text = render_prompt(REG, ex.task) + render_call(ex.tool, ex.args)
        assert letters.encode(text, bos=False) == sp.encode(text), text


def test_no_piece_spans_a_newline(tok):
    # what ExampleEncoder's shortcut relies on
    assert not any("\n" in p for p in tok.pieces)


def test_example_encoder_equals_full_encoding(tok):
    encode = ExampleEncoder(tok, REG)
    for ex in make_train_examples(100, seed=4) + make_examples(100, seed=4):
        assert encode(ex) == encode_example(tok, REG, ex)


def test_encoded_example_layout(tok):
    ex = make_train_examples(1, seed=0)[0]
    ids, n_prompt = encode_example(tok, REG, ex)
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
    assert tok.decode_bytes(ids[:n_prompt]).decode() == " " + render_prompt(REG, ex.task)  # the dummy prefix
    assert tok.decode_bytes(ids[n_prompt:-1]).decode() == render_call(ex.tool, ex.args)


def test_short_encoder_is_the_full_one_without_the_catalogue(tok):
    full, short = ExampleEncoder(tok, REG), ExampleEncoder(tok, REG, catalogue=False)
    n_head = len(full.head_ids)
    for ex in make_train_examples(50, seed=5):
        (f_ids, f_prompt), (s_ids, s_prompt) = full(ex), short(ex)
        assert s_ids[0] == tok.bos_id and s_ids[1:] == f_ids[n_head:]
        assert s_prompt == f_prompt - n_head + 1
        assert tok.decode_bytes(s_ids[1:s_prompt]).decode().startswith("\nTASK: ")


# --- batches ----------------------------------------------------------------------------------
def test_length_grouped_batches_cover_each_epoch_once():
    g = torch.Generator().manual_seed(3)
    lengths = torch.randint(5, 200, (1003,), generator=g)
    B = 16
    n_batches = len(lengths) // B
    epoch = [sample_batch(step, lengths, B, seed=7) for step in range(n_batches)]
    seen = torch.cat(epoch)
    assert len(seen) == n_batches * B and len(set(seen.tolist())) == len(seen)  # no example twice
    # grouped by length: a batch spans a small slice of the length range
    spans = torch.tensor([int(lengths[b].max() - lengths[b].min()) for b in epoch])
    assert float(spans.float().mean()) < 0.05 * float(lengths.max() - lengths.min())
    # a function of (seed, step) only, and the next epoch visits the batches in another order
    assert torch.equal(sample_batch(5, lengths, B, seed=7), epoch[5])
    nxt = [sample_batch(n_batches + k, lengths, B, seed=7) for k in range(n_batches)]
    assert sorted(map(tuple, map(torch.Tensor.tolist, nxt))) == sorted(map(tuple, map(torch.Tensor.tolist, epoch)))
    assert any(not torch.equal(a, b) for a, b in zip(nxt, epoch))
    # uniform draws when asked: not grouped
    uniform = sample_batch(0, lengths, B, seed=7, grouped=False)
    assert len(uniform) == B and int(lengths[uniform].max() - lengths[uniform].min()) > spans.max()


def test_common_prefix():
    assert common_prefix([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3]]) == [1, 2]
    assert common_prefix([[7, 8], [9]]) == []


def test_batch_targets_are_exactly_the_call_and_eos(tok):
    examples = make_train_examples(12, seed=5)
    data = build_dataset(tok, 12, seed=5)
    assert len(data.prefix) > 20  # the catalogue is shared
    inputs, targets = data.batch(torch.arange(12), pad_id=tok.eos_id)
    for row, ex in enumerate(examples):
        ids, n_prompt = encode_example(tok, REG, ex)
        full_inputs = torch.cat([data.prefix, inputs[row]])  # [P + T]
        assert full_inputs[:len(ids) - 1].tolist() == ids[:-1]
        learned = targets[row][targets[row] != -100].tolist()
        want = tok.encode(render_call(ex.tool, ex.args), bos=False, prefix_space=False) + [tok.eos_id]
        assert learned == want == ids[n_prompt:]
        # each learned target sits one position before its token: next-token prediction
        first = int((targets[row] != -100).nonzero()[0])
        assert len(data.prefix) + first + 1 == n_prompt


# --- the model forward ------------------------------------------------------------------------
@pytest.mark.parametrize("n_kv_heads", [4, 2])
def test_shared_prefix_forward_equals_plain_forward(n_kv_heads):
    torch.manual_seed(0)
    model = Transformer(tiny_config(50, n_kv_heads))
    prefix = torch.randint(0, 50, (9,))  # [P]
    tokens = torch.randint(0, 50, (3, 6))  # [B, T]
    plain = model(torch.cat([prefix.expand(3, -1), tokens], dim=1))[:, 9:]  # [B, T, V]
    shared = forward_shared_prefix(model, prefix, tokens)
    torch.testing.assert_close(shared, plain, rtol=1e-5, atol=1e-5)
    # the prefix matters (guards against a forward that ignores it)
    other = forward_shared_prefix(model, (prefix + 1) % 50, tokens)
    assert (other - shared).abs().max() > 1e-3


def test_shared_prefix_gradients_equal_plain_gradients():
    torch.manual_seed(1)
    model = Transformer(tiny_config(50))
    prefix, tokens = torch.randint(0, 50, (7,)), torch.randint(0, 50, (2, 5))
    targets = torch.randint(0, 50, (2, 5))
    masked_loss(forward_shared_prefix(model, prefix, tokens), targets).backward()
    shared = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    plain = model(torch.cat([prefix.expand(2, -1), tokens], dim=1))[:, 7:]
    masked_loss(plain, targets).backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(shared[n], p.grad, rtol=1e-4, atol=1e-6, msg=n)


def test_masked_loss_ignores_unmarked_positions():
    logits = torch.randn(2, 3, 5)
    targets = torch.tensor([[1, -100, 2], [-100, -100, 4]])
    want = torch.stack([-logits[0, 0].log_softmax(-1)[1], -logits[0, 2].log_softmax(-1)[2],
                        -logits[1, 2].log_softmax(-1)[4]]).mean()
    torch.testing.assert_close(masked_loss(logits, targets), want)


# --- optimisation -----------------------------------------------------------------------------
def test_lr_schedule():
    lrs = [lr_at(s, s / 100, 1.0, 10) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(0.1 * 10)  # linear warm-up
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))  # the cosine never rises
    assert lr_at(50, 0.5, 1.0, 10) == pytest.approx(0.05 + 0.95 * 0.5)
    assert lr_at(100, 1.0, 1.0, 10) == lr_at(200, 3.0, 1.0, 10) == pytest.approx(0.05)


def test_a_few_steps_lower_the_loss(tok):
    torch.manual_seed(0)
    data = build_dataset(tok, 64, seed=0)
    model = Transformer(tiny_config(tok.vocab_size))
    args = train_args()
    inputs, targets = data.batch(torch.arange(64), tok.eos_id)

    def loss_now():
        with torch.no_grad():
            return masked_loss(forward_shared_prefix(model, data.prefix, inputs), targets).item()

    before = loss_now()
    train_steps(model, data, make_optimizer(model, args.lr, 0.1), range(40), lambda s: s / 40, args,
                tok.eos_id)
    after = loss_now()
    assert after < 0.7 * before, (before, after)


def test_resumed_training_matches_uninterrupted(tok, tmp_path):
    data = build_dataset(tok, 64, seed=0)
    args = train_args()

    def fresh():
        torch.manual_seed(0)
        model = Transformer(tiny_config(tok.vocab_size))
        return model, make_optimizer(model, args.lr, 0.1)

    def progress(s):
        return s / 6

    straight, opt = fresh()
    train_steps(straight, data, opt, range(6), progress, args, tok.eos_id)

    first, opt = fresh()
    train_steps(first, data, opt, range(3), progress, args, tok.eos_id)
    save_state(tmp_path / "state.pt", first, opt, 3, 1.0, 0.0, args)
    state = load_state(tmp_path / "state.pt", args)
    resumed, opt = fresh()
    resumed.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    train_steps(resumed, data, opt, range(state["step"], 6), progress, args, tok.eos_id)
    for (n, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, msg=n)
    with pytest.raises(TrainError, match="batch_size=8"):
        load_state(tmp_path / "state.pt", train_args(batch_size=16))


# --- the shipped default model ----------------------------------------------------------------
def test_shipped_files_exist_and_are_small():
    files = {p.name: p.stat().st_size for p in DEFAULT.iterdir()}
    for name in ("model.bin", "tokenizer.model", "tokenizer.bin", "CARD.md"):
        assert name in files, name
    assert sum(files.values()) <= 10 * 2 ** 20


def test_shipped_checkpoint_and_tokenizers_agree():
    config, weights = read_checkpoint(DEFAULT / "model.bin")
    from_model = load_tokenizer(DEFAULT / "tokenizer.model")
    from_bin = load_tokenizer(DEFAULT / "tokenizer.bin")
    assert config.vocab_size == from_model.vocab_size == from_bin.vocab_size
    assert weights["token_embedding"].shape == (config.vocab_size, config.dim)
    assert from_bin.token_bytes == from_model.token_bytes
    # and sentencepiece reads the .model the same way our tokenizer does
    sp = spm.SentencePieceProcessor(model_file=str(DEFAULT / "tokenizer.model"))
    assert sp.vocab_size() == config.vocab_size
    task = make_examples(1, seed=0)[0].task
    assert from_bin.encode(render_prompt(REG, task), bos=False) == sp.encode(render_prompt(REG, task))


def test_shipped_model_writes_a_call():
    """Greedy, unmasked, on one held-out task: the model alone already produces a valid call."""
    from recipes.default_model.train import greedy_calls
    model = load_checkpoint(DEFAULT / "model.bin")
    tok = load_tokenizer(DEFAULT / "tokenizer.bin")
    ex = next(e for e in make_examples(20, seed=11) if e.kind == "read")
    (text,) = greedy_calls(model, tok, [ex.task])
    call, why = parse_call(text, REG)
    assert call is not None, (ex.task, text, why)
    assert call["tool"] == "read_file"


def test_whole_run_writes_the_shipped_files_and_resumes(tmp_path):
    """`python -m recipes.default_model.train` end to end on a tiny config: curriculum, files, evaluation, resume."""
    from recipes.default_model.train import parse_args, run
    argv = ["--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"), "--steps", "40", "--save-every", "20",
            "--n-examples", "200", "--dim", "32", "--hidden-dim", "64", "--n-layers", "2", "--eval-n", "4"]
    report = run(parse_args(argv))
    for name in ("model.bin", "tokenizer.model", "tokenizer.bin", "eval.json"):
        assert (tmp_path / "out" / name).exists(), name
    assert report["train"]["steps"] == 40 and report["overall"]["n"] == 4
    config, _ = read_checkpoint(tmp_path / "out" / "model.bin")
    assert config.vocab_size == load_tokenizer(tmp_path / "out" / "tokenizer.bin").vocab_size
    # a resumed run continues from the saved step with the saved vocabulary and data
    resumed = run(parse_args(argv[:5] + ["60"] + argv[6:] + ["--resume"]))
    assert resumed["train"]["steps"] == 60
    with pytest.raises(TrainError, match="short_frac"):
        run(parse_args(argv + ["--resume", "--short-frac", "0.5"]))


def test_bad_files_and_arguments_get_one_clear_error(tmp_path, capsys):
    from recipes.default_model.train import main
    with pytest.raises(SystemExit, match=r"model\.bin.*expected an existing checkpoint file"):
        main(["--eval-only", "--out", str(tmp_path / "missing")])
    work = tmp_path / "work"
    work.mkdir()
    (work / "train_state.pt").write_bytes(b"not a torch file")
    with pytest.raises(SystemExit, match=r"train_state\.pt: cannot read the training state"):
        main(["--out", str(tmp_path / "out"), "--work", str(work), "--resume", "--steps", "2"])
    with pytest.raises(SystemExit):
        main(["--short-frac", "1.5"])
    assert "--short-frac must be in [0, 1)" in capsys.readouterr().err
