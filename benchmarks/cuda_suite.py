"""
One prepared script for a rare, short GPU session: every CUDA figure batchmask needs, in one run of a few minutes.

    python benchmarks/cuda_suite.py OUT.json [--tokenizer PATH] [--budget-s 420]
    python benchmarks/cuda_suite.py --smoke OUT.json      # the same code paths, tiny sizes, on the CPU

Sections, in order (each one guarded: a failure is printed and stored with its traceback in the JSON, and the
next section runs; the one exception is `correctness`, which stops the run, since timing wrong kernels is
pointless). OUT.json is rewritten after every section, so a run cut short still leaves what it measured.

  bandwidth    device-to-device copy of a 1 GiB buffer: GB/s (bytes read + written). Every GB/s figure below
               is also given as a % of this.
  compile      compile_grammar(default registry, tokenizer, device) cold (first in the process) and warm.
  correctness  Triton kernels against the torch reference on the device: the compiled grammar and two synthetic
               ones (int16 / int32 tables), float32 / bfloat16 / float16 logits with padded vocabularies, rows in
               random states (finished rows included): masking bit for bit, advance identical (illegal and
               out-of-vocabulary tokens too), greedy and seeded sampling the same tokens, counts and row state.
  kernels      mask + advance and the fused sample kernel at B in {1, 64, 512, 4096} x V in {32000, 128K},
               float32 logits, rows at realistic states (benchmarks/mask.py): median us (triton.testing.do_bench,
               CUDA events, L2 flushed), achieved GB/s over the bytes the step must move (logits read once, and
               written once for the mask; tokens, counts and row state), % of copy bandwidth.
               Target: fused sample >= 70% of copy bandwidth at B >= 256.
  generation   BatchGenerator end to end, stories15M-shaped random checkpoint in bf16, at B in {1, 64, 512}:
               constrained vs free, eager vs CUDA graphs (tokens/s, ms/step, constrained/free step ratio), and
               the bare decode loop (benchmarks/generate.py step_overhead). Targets: ratio <= 1.02;
               >= 200,000 tok/s at B = 512 with graphs.
  jump         jump-forward (issue 28): BatchGenerator with and without --jump-forward at B in {1, 64, 512}, on the
               same random checkpoint (values run long: a floor) and on benchmarks/scripted_model.py (writes
               reference calls with short values: what a trained model approaches): tokens per step, steps per
               call, calls/s and ms per batch step, valid calls (benchmarks/jump.py run_arms).
  hf_model     a SmolLM2-135M-shaped random Hugging Face directory (dim 576, 30 layers, 9/3 heads, vocab 49152,
               tied; bf16 safetensors) through load_checkpoint in bf16: graphed decode == eager, then decode
               tokens/s at B in {1, 16, 64}, eager and with CUDA graphs.
  hf_processor transformers' model.generate on a small random LlamaForCausalLM with the compiled grammar's
               vocabulary, greedy, left-padded, at B in {1, 64}: ms per step without a processor and with
               batchmask.hf.LogitsProcessor (Triton on CUDA), and the ms spent inside it per step
               (benchmarks/hf_processor.py, which also runs xgrammar's processor beside it).

--smoke runs all of it at tiny sizes on the CPU (Triton under TRITON_INTERPRET=1, set below before triton is
imported; a small synthetic vocabulary and model). The CUDA-only parts get CPU stand-ins: a host memcpy for the
bandwidth, perf_counter medians for do_bench, and for CUDA graphs a decode that hands back one static logits
buffer, which is the contract the graph path relies on. tests/test_cuda_suite.py runs it.

The Llama 2 tokenizer is looked for at --tokenizer, then ../shared/llama2/tokenizer.model; without either, a
synthetic 32000-piece vocabulary is used (and the JSON and the summary say so).
"""
from __future__ import annotations

import os
import sys

SMOKE = "--smoke" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton (kernels.mask_triton)

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # last: see tests/conftest.py

import triton  # noqa: E402
import triton.testing  # noqa: E402
from batchmask.kernels import mask_torch, mask_triton  # noqa: E402
from batchmask.kernels.tables import Rows, make_tables  # noqa: E402
from batchmask.models.checkpoint import ModelConfig  # noqa: E402

from batchmask.compiler.compiled import compile_grammar  # noqa: E402
from batchmask.tools.registry import ToolRegistry  # noqa: E402
from benchmarks.common import MemoEncode, find_tokenizer, make_tasks, random_model, synthetic_tokenizer  # noqa: E402
from benchmarks.generate import GraphedDecode, run_generation, step_overhead  # noqa: E402
from benchmarks.mask import masker_steps, widen  # noqa: E402
from benchmarks.model import SMOLLM2_135M, STORIES15M, bench_decode, write_random_hf  # noqa: E402
from tests.grammar_fixtures import make_random_grammar  # noqa: E402

LOGIT_DTYPES = [torch.float32, torch.bfloat16, torch.float16]
BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


@dataclass
class Plan:
    """The sizes of a run: the real GPU one, or the CPU smoke one."""
    device: str
    copy_bytes: int
    check_rows: int
    kernel_batches: list
    kernel_vocabs: list
    gen_batches: list
    gen_max_new_tokens: int
    model: ModelConfig
    model_dtype: torch.dtype
    synthetic_vocab: int  # vocabulary size when no tokenizer file is found (smoke: always synthetic)
    loop_steps: int       # decode-loop figure: steps per block, blocks per mode (benchmarks/generate.py)
    loop_reps: int
    timing_calls: int     # CPU stand-in for do_bench: timed calls per figure


GPU = Plan("cuda", 1 << 30, 64, [1, 64, 512, 4096], [32000, 128 * 1024], [1, 64, 512], 96, STORIES15M,
           torch.bfloat16, 32000, 8, 4, 0)
SMOKE_PLAN = Plan("cpu", 1 << 22, 5, [2], [600, 1500], [2], 4,
                  ModelConfig(dim=32, hidden_dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=600,
                              seq_len=256), torch.float32, 600, 2, 2, 3)


# the hf_model section: a SmolLM2-135M-shaped random HF directory on the GPU; a tiny one of the same kind in the smoke
HF_MODELS = {"cuda": (SMOLLM2_135M, [1, 16, 64]),
             "cpu": (ModelConfig(dim=64, hidden_dim=96, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=600,
                                 seq_len=128, rope=SMOLLM2_135M.rope), [2])}


class KernelMismatch(AssertionError):
    """The Triton kernels and the torch reference disagree on the device."""


def log(msg: str) -> None:
    print(msg, flush=True)


def sync(plan: Plan) -> None:
    if plan.device == "cuda":
        torch.cuda.synchronize()


def bench_ms(fn, plan: Plan) -> dict:
    """median / p20 / p80 ms of fn. CUDA: triton.testing.do_bench (CUDA events, L2 flushed between calls, no
    host sync inside the timed region); CPU stand-in: perf_counter around each call."""
    if plan.device == "cuda":
        med, lo, hi = triton.testing.do_bench(fn, warmup=25, rep=100, quantiles=[0.5, 0.2, 0.8])
        return {"median_ms": med, "p20_ms": lo, "p80_ms": hi}
    fn()
    times = []
    for _ in range(plan.timing_calls):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    q = statistics.quantiles(times, n=5)
    return {"median_ms": statistics.median(times), "p20_ms": q[0], "p80_ms": q[-1]}


# ----------------------------------------------------------------------------------------------------------
# sections

def section_bandwidth(plan: Plan, state: dict) -> dict:
    n = plan.copy_bytes // 4
    src = torch.randn(n, device=plan.device)  # [n] float32
    dst = torch.empty_like(src)
    t = bench_ms(lambda: dst.copy_(src), plan)
    gbs = 2 * plan.copy_bytes / (t["median_ms"] * 1e-3) / 1e9  # read + write
    state["copy_gbs"] = gbs
    note = "" if plan.device == "cuda" else "CPU stand-in: host memcpy, perf_counter"
    log(f"  copy {plan.copy_bytes >> 20} MiB: {t['median_ms']:.3f} ms -> {gbs:.0f} GB/s {note}")
    return {"bytes": plan.copy_bytes, **t, "gbs": gbs, "note": note}


def section_compile(plan: Plan, state: dict) -> dict:
    registry, tok = state["registry"], state["tokenizer"]

    def once():
        t0 = time.perf_counter()
        g = compile_grammar(registry, tok, device=plan.device)
        sync(plan)
        return g, time.perf_counter() - t0

    grammar, cold = once()
    warm = [once()[1] for _ in range(3)]
    state["grammar"] = grammar
    log(f"  {grammar}: cold {cold:.2f} s, warm median {statistics.median(warm):.2f} s")
    return {"cold_s": cold, "warm_s": statistics.median(warm), "warm_all_s": warm, "states": grammar.num_states,
            "classes": grammar.num_classes, "vocab": grammar.vocab_size, "table_dtype": str(grammar.class_next.dtype)}


def random_rows(g, B: int, H: int, gen: torch.Generator, device) -> Rows:
    """Rows over every state, the first and every 7th one finished (done_state), with random steps/history."""
    state = torch.randint(0, g.num_states, (B,), generator=gen, dtype=torch.int32)  # [B]
    state[::7] = g.done_state
    return Rows(state=state.to(device),
                step=torch.randint(0, H + 2, (B,), generator=gen, dtype=torch.int32).to(device),  # [B]
                history=torch.randint(0, g.vocab_size, (B, H), generator=gen, dtype=torch.int32).to(device),
                fault=torch.zeros(B, 3, dtype=torch.int64, device=device))  # [B, 3]


def clone(r: Rows) -> Rows:
    return Rows(r.state.clone(), r.step.clone(), r.history.clone(), r.fault.clone(),
                None if r.key is None else r.key.clone())


def rows_differ(a: Rows, b: Rows) -> list[str]:
    return [f"rows.{name}" for name in ("state", "step", "history", "fault")
            if not torch.equal(getattr(a, name), getattr(b, name))]


def first_diff(a: torch.Tensor, b: torch.Tensor) -> str:
    """Where two equal-shaped tensors first disagree, for the error message."""
    where = (a != b).nonzero()
    if not len(where):
        return "shapes/dtypes differ"
    at = tuple(where[0].tolist())
    return f"first at index {list(at)}: torch {a[at].item()} vs triton {b[at].item()}"


def check_grammar(name: str, g, dtype, pad: int, B: int, plan: Plan, seed: int) -> list[str]:
    """Every kernel against the torch reference for one grammar / dtype / padding. Returns the disagreements."""
    dev = plan.device
    t = make_tables(g.token_class.to(dev).int(), g.class_next.to(dev).contiguous(), g.legal_count.to(dev).int(),
                    int(g.done_state), int(g.eos_id))
    V, Vp = g.vocab_size, g.vocab_size + pad
    gen = torch.Generator().manual_seed(seed)
    rows = random_rows(g, B, 12, gen, dev)
    logits = (torch.randn(B, Vp, generator=gen) * 3).to(dtype).to(dev)  # [B, V'] (bf16/f16 give many ties)
    logits[1 % B] = float("-inf")  # a row the model rules out entirely: the first legal token is the fallback
    bad = []
    tag = f"{name} {str(dtype).removeprefix('torch.')} V'={Vp}"

    # mask: bit for bit (compared as integers, so -0.0 / +0.0 and NaN payloads count)
    a, b = logits.clone(), logits.clone()
    ca = mask_torch.mask_logits_(a, rows.state, t)
    cb = mask_triton.mask_logits_(b, rows.state, t)
    if not torch.equal(a.view(BITS[dtype]), b.view(BITS[dtype])):
        bad.append(f"{tag}: masked logits differ, {first_diff(a.view(BITS[dtype]), b.view(BITS[dtype]))}")
    if not torch.equal(ca.int(), cb.int()):
        bad.append(f"{tag}: mask legal counts differ, {first_diff(ca.int(), cb.int())}")

    # greedy and seeded sampling: same tokens, counts, row state; the logits untouched
    for temperature, sd in [(0.0, 0), (1.0, 0), (0.7, 12345)]:
        before = logits.clone()
        ra, rb = clone(rows), clone(rows)
        ta, na = mask_torch.sample_(logits, ra, t, temperature=temperature, seed=sd)
        tb, nb = mask_triton.sample_(logits, rb, t, temperature=temperature, seed=sd)
        what = f"{tag} sample T={temperature} seed={sd}"
        if not torch.equal(ta, tb):
            bad.append(f"{what}: tokens differ, {first_diff(ta, tb)}")
        if not torch.equal(na.int(), nb.int()):
            bad.append(f"{what}: counts differ")
        bad += [f"{what}: {d} differ after the fused advance" for d in rows_differ(ra, rb)]
        if not torch.equal(logits.view(BITS[dtype]), before.view(BITS[dtype])):
            bad.append(f"{what}: the logits were modified")
        # independent of both: every sampled token of a row that has a legal token is legal
        live = t.row_legal.index_select(0, t.state_row.index_select(0, rows.state).long()) > 0
        nxt = t.class_next.long()[rows.state.long(), t.token_class.long()[ta.clamp(0, V - 1)]]
        if bool((live & ((nxt < 0) | (ta >= V))).any()):
            bad.append(f"{what}: the torch reference sampled an illegal token")

    # advance: legal moves, illegal ids, padded and negative ids; finished rows
    legal = mask_torch.sample_(logits, clone(rows), t, temperature=0.0)[0]  # [B]
    noise = torch.randint(-1, Vp + 2, (B,), generator=gen).to(dev)  # [B] out-of-range ids included
    tokens = torch.where(torch.arange(B, device=dev) % 3 == 0, noise, legal)
    ra, rb = clone(rows), clone(rows)
    mask_torch.advance_(tokens, ra, t)
    mask_triton.advance_(tokens.contiguous(), rb, t)
    bad += [f"{tag} advance: {d} differ" for d in rows_differ(ra, rb)]
    return bad


def section_correctness(plan: Plan, state: dict) -> dict:
    grammars = [("random-int16", make_random_grammar(num_states=300, num_classes=40, vocab_size=plan.kernel_vocabs[0],
                                                       hole_frac=0.5, seed=1, index_dtype=torch.int16)),
                ("random-int32", make_random_grammar(num_states=300, num_classes=40, vocab_size=plan.kernel_vocabs[0],
                                                       hole_frac=0.5, seed=2, index_dtype=torch.int32))]
    if state.get("grammar") is not None:
        grammars.insert(0, ("compiled", state["grammar"]))
    checked, bad = [], []
    for i, (name, g) in enumerate(grammars):
        dtypes = LOGIT_DTYPES if i == 0 else [torch.float32]
        for dtype in dtypes:
            for pad in (0, 37):
                bad += check_grammar(name, g, dtype, pad, plan.check_rows, plan, seed=100 + i)
                checked.append(f"{name}/{str(dtype).removeprefix('torch.')}/pad{pad}")
    log(f"  {len(checked)} configurations checked, {len(bad)} disagreements")
    if bad:
        raise KernelMismatch("Triton and torch disagree on the device:\n  " + "\n  ".join(bad[:20]))
    return {"checked": checked, "rows": plan.check_rows, "ok": True}


def step_bytes(B: int, V: int, elem: int, kind: str) -> int:
    """Bytes a step must move: logits read once (and written once for the mask), tokens (int64), counts (int32),
    row state and step read and written (int32 each), and the token -> class table (int32 [V]) once."""
    logits = B * V * elem * (2 if kind == "mask+advance" else 1)
    return logits + B * (8 + 4 + 2 * 4 + 2 * 4) + 4 * V


def section_kernels(plan: Plan, state: dict) -> dict:
    base = state.get("grammar")
    if base is None:
        base = make_random_grammar(num_states=4000, num_classes=200, vocab_size=plan.kernel_vocabs[0],
                                   hole_frac=0.5, num_final=20, device=plan.device)
    copy_gbs = state.get("copy_gbs")
    out = []
    log(f"  {'B':>5} {'V':>7} {'step':<14} {'median us':>10} {'GB/s':>7} {'% copy':>7}")
    for V in plan.kernel_vocabs:
        g = widen(base, V) if V >= base.vocab_size else base
        for B in plan.kernel_batches:
            m, steps = masker_steps(g, B, plan.device, "triton", 0.8, torch.Generator().manual_seed(B))
            for kind, fn in steps.items():
                t = bench_ms(fn, plan)
                moved = step_bytes(B, g.vocab_size, 4, kind)
                gbs = moved / (t["median_ms"] * 1e-3) / 1e9
                pct = 100 * gbs / copy_gbs if copy_gbs else None
                out.append({"B": B, "V": g.vocab_size, "step": kind, **t, "bytes": moved, "gbs": gbs,
                            "pct_copy": pct})
                log(f"  {B:>5} {g.vocab_size:>7} {kind:<14} {1e3 * t['median_ms']:>10.1f} {gbs:>7.1f} "
                    f"{'' if pct is None else f'{pct:6.0f}%':>7}")
            m.check()
            del m, steps
    return {"results": out, "logits_dtype": "float32", "states": "80% value states, 20% few-legal (mask.py)"}


class StaticBufferDecode(GraphedDecode):
    """CPU stand-in for GraphedDecode: eager decode, but every call returns the same static logits buffer,
    overwritten in place, exactly as a CUDA graph's output is. Exercises the generation loop under that
    contract where no graph can be captured."""

    def capture(self) -> None:
        self._static = None  # [B, V], allocated by the first decode
        self._captured = True

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        if not self._captured:
            self.capture()
        logits = self.model.decode(tokens)
        if self._static is None:
            self._static = torch.empty_like(logits)
        return self._static.copy_(logits)


def section_generation(plan: Plan, state: dict, deadline: float) -> dict:
    registry, tok, grammar = state["registry"], state["tokenizer"], state["grammar"]
    config = plan.model if plan.device == "cuda" else \
        ModelConfig(**{**plan.model.__dict__, "vocab_size": tok.vocab_size})
    model = random_model(config, plan.device, plan.model_dtype)
    graph_note = "" if plan.device == "cuda" else "CPU stand-in for graphs: eager decode into one static buffer"
    runs, loops, skipped = [], [], []

    def graphed(m):
        return GraphedDecode(m) if plan.device == "cuda" else StaticBufferDecode(m)

    log(f"  {'B':>4} {'decode':<7} {'mode':<12} {'tokens':>7} {'steps':>6} {'tok/s':>10} {'ms/step':>8} {'valid':>6}")
    for B in plan.gen_batches:
        tasks = make_tasks(max(2 * B, 4), seed=B)
        # warm-up: Triton JIT, cuBLAS handles and the allocator, outside the timed runs
        run_generation(model, tok, registry, grammar, tasks[:B], B, constrain=True, max_new_tokens=4,
                       backend="triton")
        run_generation(model, tok, registry, grammar, tasks[:B], B, constrain=False, max_new_tokens=4)
        for use_graphs in (False, True):
            for constrain in (True, False):
                if time.perf_counter() > deadline:
                    skipped.append(f"B={B} graphs={use_graphs} constrained={constrain}: time budget spent")
                    continue
                m = graphed(model) if use_graphs else model
                r = run_generation(m, tok, registry, grammar, tasks, B, constrain=constrain,
                                   max_new_tokens=plan.gen_max_new_tokens, backend="triton")
                runs.append(r)
                log(f"  {B:>4} {'graphs' if use_graphs else 'eager':<7} {r['mode']:<12} {r['tokens']:>7} "
                    f"{r['steps']:>6} {r['tokens_per_s']:>10.0f} {r['ms_per_step']:>8.3f} {r['valid_calls']:>6.0%}")
            if time.perf_counter() <= deadline:
                loop = step_overhead(graphed(model) if use_graphs else model, tok, registry, grammar, B,
                                     steps=plan.loop_steps, reps=plan.loop_reps, backend="triton")
                loops.append(loop)
                log(f"  {B:>4} {'graphs' if use_graphs else 'eager':<7} loop only: free {loop['free_ms']:.3f} ms, "
                    f"constrained {loop['constrained_ms']:.3f} ms, ratio {loop['ratio']:.3f}")
    for s in skipped:
        log(f"  skipped {s}")
    return {"runs": runs, "loop": loops, "skipped": skipped, "graph_note": graph_note,
            "model": config.__dict__, "model_dtype": str(plan.model_dtype)}


def section_jump(plan: Plan, state: dict, deadline: float) -> dict:
    from batchmask.tools.envelope import get_envelope
    from benchmarks.jump import line, run_arms
    from benchmarks.scripted_model import ScriptedModel, reference_calls
    registry, tok, grammar = state["registry"], state["tokenizer"], state["grammar"]
    config = plan.model if plan.device == "cuda" else \
        ModelConfig(**{**plan.model.__dict__, "vocab_size": tok.vocab_size})
    model = random_model(config, plan.device, plan.model_dtype)
    runs, skipped = [], []
    for B in plan.gen_batches:
        for kind in ("random", "scripted"):
            if time.perf_counter() > deadline:
                skipped.append(f"B={B} {kind}: time budget spent")
                continue
            if kind == "scripted":
                calls = reference_calls(registry, get_envelope("seed"), max(2 * B, 4), seed=B)
                tasks = [t for t, _ in calls]
                m = ScriptedModel(tok.token_bytes, dict(calls), eos_id=tok.eos_id, seq_len=config.seq_len,
                                  decode_text=tok.decode).to(plan.device)
            else:
                tasks, m = make_tasks(max(2 * B, 4), seed=B), model
            limit = plan.gen_max_new_tokens if kind == "random" else 160   # a scripted call runs to its end
            for r in run_arms(m, tok, registry, grammar, tasks, B, fmt="seed", max_new_tokens=limit,
                              backend="triton"):
                r["model"] = kind
                runs.append(r)
                log("  " + line(f"default seed {kind}", r))
    for s in skipped:
        log(f"  skipped {s}")
    return {"runs": runs, "skipped": skipped, "model": config.__dict__, "model_dtype": str(plan.model_dtype)}


def section_hf_model(plan: Plan, state: dict, deadline: float) -> dict:
    """A SmolLM2-135M-shaped random Hugging Face directory (benchmarks/model.py write_random_hf: bf16 safetensors)
    loaded through load_checkpoint in the plan's dtype: graphed decode == eager for a few steps, then decode tokens/s
    at each batch size, eager and with CUDA graphs (benchmarks/model.py bench_decode). The smoke has no graphs:
    eager only, its graph check a static-buffer stand-in."""
    import tempfile

    from batchmask.models.llama import load_checkpoint
    config, batches = HF_MODELS[plan.device]
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        model = load_checkpoint(write_random_hf(Path(tmp) / "hf", config), device=plan.device,
                                dtype=plan.model_dtype, max_context=config.seq_len)
        sync(plan)
        load_s = time.perf_counter() - t0
    dev = torch.device(plan.device)
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, config.vocab_size, (3, 7), generator=gen).to(dev)
    fed = torch.randint(0, config.vocab_size, (4, 3), generator=gen).to(dev)

    def steps(graphed: bool) -> torch.Tensor:
        model.setup_cache(3)
        model.prefill(torch.arange(3), prompts, torch.tensor([7, 3, 5]))
        if graphed:
            model.capture_decode()
            return torch.stack([model.decode_graphed(fed[i]).clone() for i in range(4)])
        step = StaticBufferDecode(model) if plan.device != "cuda" else model
        return torch.stack([step.decode(fed[i]).clone() for i in range(4)])

    eager = steps(False)
    other = steps(plan.device == "cuda")
    graph_err = float((other - eager).abs().max() / eager.abs().max())
    log(f"  loaded in {load_s:.2f} s ({str(plan.model_dtype).removeprefix('torch.')}); graphed vs eager logits: "
        f"max relative difference {graph_err:.2e}")
    if not graph_err < 2e-2:
        raise AssertionError(f"graphed decode differs from eager: {graph_err:.3g} relative")
    runs, skipped = [], []
    log(f"  {'B':>4} {'decode':<7} {'tok/s':>10} {'ms/step':>8}")
    for B in batches:
        for graphed in ((False, True) if plan.device == "cuda" else (False,)):
            if time.perf_counter() > deadline:
                skipped.append(f"B={B} graphs={graphed}: time budget spent")
                continue
            tps, step_s, context = bench_decode(model, B, 16 if plan.device == "cuda" else 2,
                                                5 if plan.device == "cuda" else 2, dev, graphed)
            runs.append({"B": B, "graphs": graphed, "tokens_per_s": tps, "ms_per_step": 1e3 * step_s,
                         "mean_context": context})
            log(f"  {B:>4} {'graphs' if graphed else 'eager':<7} {tps:>10.0f} {1e3 * step_s:>8.3f}")
    model.setup_cache(1)
    return {"model": {k: v for k, v in config.__dict__.items() if k != "rope"}, "rope_theta": config.rope.theta,
            "dtype": str(plan.model_dtype), "load_s": load_s, "graph_vs_eager_rel": graph_err, "runs": runs,
            "skipped": skipped, "graph_note": "" if plan.device == "cuda" else "CPU: eager only"}


def section_hf_processor(plan: Plan, state: dict) -> dict:
    """generate() without a processor and with batchmask's (benchmarks/hf_processor.py run_arm), same model and
    prompts; every constrained sequence must be a grammar-legal call (the processor's check())."""
    import transformers

    from batchmask.hf import LogitsProcessor
    from benchmarks.hf_processor import left_padded, run_arm
    grammar = state["grammar"]
    dev = torch.device(plan.device)
    cuda = plan.device == "cuda"
    cfg = transformers.LlamaConfig(hidden_size=256 if cuda else 32, intermediate_size=512 if cuda else 64,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   vocab_size=grammar.vocab_size, max_position_embeddings=512,
                                   eos_token_id=list(grammar.stop_ids), pad_token_id=grammar.eos_id)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval().to(dev)
    gen = torch.Generator().manual_seed(0)
    batches, new_tokens, repeats = ([1, 64], 32, 3) if cuda else ([2], 4, 1)
    runs = []
    log(f"  {'B':>4} {'steps':>5} {'generate ms':>12} {'+ batchmask ms':>15} {'in processor ms':>16}")
    for B in batches:
        prompts = [torch.randint(0, grammar.vocab_size, (int(n),), generator=gen).tolist()
                   for n in torch.randint(8, 40, (B,), generator=gen)]
        ids, mask = left_padded(prompts, grammar.eos_id, dev)
        base, _, steps = run_arm(model, ids, mask, None, new_tokens, grammar.eos_id, dev, repeats)
        proc = LogitsProcessor(grammar, B, device=dev)

        def again(proc=proc):
            proc.check()                       # the previous call's sequences were all legal
            proc.reset()
            return proc
        ours, inside, ours_steps = run_arm(model, ids, mask, again, new_tokens, grammar.eos_id, dev, repeats)
        proc.check()
        runs.append({"B": B, "steps": steps, "generate_ms": 1e3 * base, "batchmask_ms": 1e3 * ours,
                     "in_processor_ms": 1e3 * inside, "batchmask_steps": ours_steps, "backend": proc.masker.backend})
        log(f"  {B:>4} {steps:>5} {1e3 * base:>12.3f} {1e3 * ours:>15.3f} {1e3 * inside:>16.3f}")
    return {"model": {"hidden": cfg.hidden_size, "layers": 2, "vocab": grammar.vocab_size}, "runs": runs,
            "new_tokens": new_tokens, "repeats": repeats}


# ----------------------------------------------------------------------------------------------------------
# summary

def summary_rows(report: dict) -> list[tuple[str, str, str]]:
    """(figure, value, target) lines of the closing table."""
    rows = []
    s = report["sections"]
    bw = s.get("bandwidth", {})
    if "gbs" in bw:
        rows.append(("copy bandwidth", f"{bw['gbs']:.0f} GB/s", ""))
    c = s.get("compile", {})
    if "cold_s" in c:
        rows.append(("compile default registry", f"cold {c['cold_s']:.2f} s, warm {c['warm_s']:.2f} s", ""))
    if s.get("correctness", {}).get("ok"):
        rows.append(("triton == torch", f"{len(s['correctness']['checked'])} configurations", "all equal"))
    for k in s.get("kernels", {}).get("results", []):
        if k["B"] >= 256 or k["B"] == max(r["B"] for r in s["kernels"]["results"]):
            pct = "" if k["pct_copy"] is None else f", {k['pct_copy']:.0f}% copy"
            target = ">= 70% copy" if k["step"].startswith("sample") and k["B"] >= 256 else ""
            rows.append((f"{k['step']} B={k['B']} V={k['V']}", f"{1e3 * k['median_ms']:.1f} us, "
                         f"{k['gbs']:.0f} GB/s{pct}", target))
    gen = s.get("generation", {})
    for r in gen.get("runs", []):
        target = ">= 200,000 tok/s" if r["B"] == 512 and r["graphs"] and r["mode"] == "constrained" else ""
        rows.append((f"generate B={r['B']} {'graphs' if r['graphs'] else 'eager'} {r['mode']}",
                     f"{r['tokens_per_s']:,.0f} tok/s, {r['ms_per_step']:.3f} ms/step", target))
    for l in gen.get("loop", []):
        rows.append((f"step ratio B={l['B']} {'graphs' if l['graphs'] else 'eager'} (loop)",
                     f"{l['ratio']:.3f} ({l['constrained_ms']:.3f} / {l['free_ms']:.3f} ms)", "<= 1.02"))
    for r in s.get("jump", {}).get("runs", []):
        rows.append((f"jump-forward {r['model']} B={r['B']} {'on' if r['jump_forward'] else 'off'}",
                     f"{r['tokens_per_step']:.2f} tok/step, {r['calls_per_s']:.1f} calls/s, {r['ms_per_step']:.3f} "
                     f"ms/step, {r['valid_calls']:.0%} valid", ">= 1.5 tok/step" if r["jump_forward"] else ""))
    for r in s.get("hf_model", {}).get("runs", []):
        rows.append((f"SmolLM2-135M shape B={r['B']} {'graphs' if r['graphs'] else 'eager'}",
                     f"{r['tokens_per_s']:,.0f} tok/s, {r['ms_per_step']:.3f} ms/step", ""))
    for r in s.get("hf_processor", {}).get("runs", []):
        rows.append((f"model.generate + LogitsProcessor B={r['B']}",
                     f"{r['batchmask_ms']:.3f} vs {r['generate_ms']:.3f} ms/step ({r['in_processor_ms']:.3f} inside)",
                     ""))
    for name, sec in s.items():
        if "error" in sec:
            rows.append((f"{name}", "FAILED: " + sec["error"].splitlines()[-1][:80], ""))
    return rows


def print_summary(report: dict) -> None:
    rows = summary_rows(report)
    w = max(len(r[0]) for r in rows) if rows else 10
    log("\n" + "=" * 100)
    log(f"SUMMARY  {report['meta']['device_name']}  ({'SMOKE, CPU' if report['meta']['smoke'] else 'GPU'}); "
        f"tokenizer: {report['meta']['tokenizer']}")
    for name, value, target in rows:
        log(f"  {name:<{w}}  {value:<52} {target}")
    log("=" * 100)


# ----------------------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="write every figure here as JSON")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (Triton interpreted)")
    ap.add_argument("--tokenizer", help="Llama 2 tokenizer.model / tokenizer.bin (default ../shared/llama2/)")
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="after this many seconds the generation section skips its remaining runs")
    args = ap.parse_args()
    plan = SMOKE_PLAN if args.smoke else GPU
    if plan.device == "cuda" and not torch.cuda.is_available():
        ap.error("no CUDA device: run with --smoke for the CPU rehearsal")
    started = time.perf_counter()
    torch.manual_seed(0)

    if args.smoke:
        tok = synthetic_tokenizer(plan.synthetic_vocab)
        tok_note = f"SYNTHETIC {plan.synthetic_vocab}-piece vocabulary (smoke)"
    else:
        tok, tok_note = find_tokenizer(args.tokenizer, plan.synthetic_vocab)
    name = torch.cuda.get_device_name() if plan.device == "cuda" else f"CPU {platform.machine()}"
    report = {"meta": {"smoke": args.smoke, "device": plan.device, "device_name": name, "torch": torch.__version__,
                       "triton": triton.__version__, "tokenizer": tok_note, "load_avg": os.getloadavg(),
                       "started": time.strftime("%Y-%m-%d %H:%M:%S")},
              "sections": {}}
    state = {"tokenizer": MemoEncode(tok), "registry": ToolRegistry.defaults()}
    log(f"# batchmask CUDA suite -- {name}, torch {torch.__version__}, triton {triton.__version__}"
        f"{' [SMOKE: CPU, tiny sizes, TRITON_INTERPRET=1]' if args.smoke else ''}")
    log(f"# tokenizer: {tok_note}")

    def save():
        report["meta"]["elapsed_s"] = time.perf_counter() - started
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1, default=str))

    def run(name, fn, *extra, fatal=False):
        log(f"\n## {name}  (t = {time.perf_counter() - started:.1f} s)")
        t0 = time.perf_counter()
        try:
            result = fn(plan, state, *extra)
        except Exception as e:  # noqa: BLE001 -- a section's failure is data; only correctness is fatal
            report["sections"][name] = {"error": traceback.format_exc(), "seconds": time.perf_counter() - t0}
            log(f"  FAILED: {type(e).__name__}: {e}")
            save()
            if fatal:
                print_summary(report)
                log(f"\nSTOPPED: {name} failed, so no timing was run. See {args.out}.")
                sys.exit(2)
            return
        result["seconds"] = time.perf_counter() - t0
        report["sections"][name] = result
        save()

    run("bandwidth", section_bandwidth)
    run("compile", section_compile)
    run("correctness", section_correctness, fatal=True)
    run("kernels", section_kernels)
    if state.get("grammar") is None:
        report["sections"]["generation"] = {"error": "skipped: no compiled grammar (the compile section failed)"}
    else:
        run("generation", section_generation, started + args.budget_s)
        run("jump", section_jump, started + args.budget_s + 40)
    run("hf_model", section_hf_model, started + args.budget_s + 60)
    if state.get("grammar") is not None:
        run("hf_processor", section_hf_processor)
    save()
    print_summary(report)
    log(f"# wrote {args.out} ({time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
