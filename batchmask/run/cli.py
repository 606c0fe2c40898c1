"""`batchmask` command line: generate, ablate, compile.

    batchmask generate --tasks tasks.txt [--out calls.jsonl] [--checkpoint model.bin --tokenizer tokenizer.model]
    batchmask ablate [--n 30] [--json ablation.json]
    batchmask compile [--tools tools.json] [--tokenizer ...] --out grammar.pt

Every error a user can cause ends as one line on stderr and a non-zero exit.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from ..safe_write import write_text_atomic
from ..text import printable, say_error, say_warning
from . import interrupts, limits
from .cli_format import Parser as _Parser
from .cli_format import Version as _Version
from .cli_grammar import schema_args
from .fingerprint import run_file_fields
from .limits import float_arg, int_arg
from .loading import (  # noqa: F401
    DEFAULT_DIR,
    DEFAULT_MAX_CONTEXT,
    DEFAULT_MAX_NEW_TOKENS,
    DTYPES,
    _device,
    _dtype,
    _max_new_tokens,
    load_model_and_tokenizer,
    load_registry,
    resolve_model_paths,
    schema_options,
)
from .openai_batch import BatchWriter, check_fit, per_task
from .out_paths import check_not_an_input, check_output_file
from .runfiles import TASK_FORMATS


# --- commands -----------------------------------------------------------------------------------
def cmd_generate(args) -> int:
    from . import distributed
    from .runfiles import read_tasks

    if args.resume and args.force:
        raise ValueError("--resume and --force contradict each other: pick one")
    out_path = Path(args.out) if args.out and args.out != "-" else None
    if args.resume and out_path is None:
        raise ValueError("--resume needs --out FILE")
    if args.jump_forward and args.no_constrain:
        raise ValueError("--jump-forward writes the text the grammar forces: the free arm (--no-constrain) has none")
    if out_path is not None:
        check_not_an_input(out_path, args)
    taskfile = read_tasks(args.tasks, args.tasks_format)
    dist = distributed.setup(args.device)
    if args.system is not None and (own := taskfile.own_system_lines()) and not (dist and dist.rank):  # said once
        say_warning(f"--system comes before the task's own system message in {len(own)} task(s) ({taskfile.name} "
                    f"line {', '.join(map(str, own[:5]))}{', ...' if len(own) > 5 else ''}): the prompt holds both")
    # the output is locked and checked before the model loads, so a clash is refused at once
    with distributed.Output(out_path, dist, resume=args.resume, force=args.force) as output:
        return _generate(args, dist, taskfile, output)


def _generate(args, dist, taskfile, output) -> int:
    from . import distributed
    from .display import PHASE_SECONDS, Progress, phase, show_call
    from .generation import BatchGenerator, GenerationConfig, encode_prompts

    device = dist.device if dist else _device(args.device)
    dtype = _dtype(args.dtype, device)
    tasks = taskfile.tasks
    registry = load_registry(args.tools, schema_options(args))
    from .grammar_store import plan_tasks, run_choice
    from .waves import prepare_waves, run_waves, wave_table
    plan = plan_tasks(taskfile, registry, schema_options(args), choice=run_choice(args),
                      format=args.format)                                          # validated before the model
    grammar_file = None
    if args.grammar and not args.no_constrain:     # --grammar FILE read and matched to the flags, named by flag
        from .cli_grammar import GrammarFile
        grammar_file = GrammarFile.read(args.grammar)
        grammar_file.check_flags(plan.registries[0], args)      # the run's tools under its --tool-choice
    shown = not args.quiet and (dist is None or dist.rank == 0)      # progress: one rank speaks for all
    with phase("loading the model and tokenizer", shown):
        model, tokenizer = load_model_and_tokenizer(args.checkpoint, args.tokenizer, device, dtype, args.max_context,
                                                    args.eos_id)
    if grammar_file is not None:
        grammar_file.check_vocab(tokenizer)
    context = model.config.seq_len
    max_new = _max_new_tokens(args.max_new_tokens, context)
    check_fit(taskfile, plan, tokenizer, context, args.system)     # a Batch API request's: answered with a 400
    settings, info = run_file_fields(args, taskfile, tokenizer, device, dtype, max_new) \
        if output.out_path is not None and output.rank0 else (None, None)     # what --resume checks (fingerprint.py)
    requests = taskfile.requests                              # a Batch API file's (run/openai_batch.py), or []
    skip = output.plan(settings, tasks, [r["custom_id"] for r in requests] if requests else None)
    todo = [i for i in range(len(tasks)) if i not in skip and not (requests and requests[i]["refused"])]
    if dist:
        todo = todo[dist.rank::dist.world]
    limits = [taskfile.limits[i] or max_new for i in todo]
    batch = max(1, min(args.batch_size, len(todo)))           # more slots than tasks would only cost memory
    inputs = [taskfile.task_input(i) for i in todo]           # a task's text, or its JSONL "messages"
    sampling, keys = per_task(requests, todo, args.temperature, args.top_p)   # a Batch API file's, or None
    config = GenerationConfig(batch_size=batch, max_new_tokens=max([max_new, *limits]),
                              temperature=args.temperature, top_p=args.top_p, seed=args.seed,
                              constrain=not args.no_constrain, record_counts=args.show, format=args.format,
                              system=args.system, jump_forward=bool(args.jump_forward))

    def generator(w):
        return BatchGenerator(model, tokenizer, registry, wave_table(w, args, plan, todo, tokenizer, device),
                              w.config(config), registries=w.registries)

    prompt_tokens: dict[int, int] = {}                      # task -> its prompt's length (a Batch API file's usage)

    def prepare():
        # every tool set's grammar (cached; a table per wave of tasks: run/waves.py), every prompt and the first
        # wave's generator (its KV cache: too large a batch is refused here), before any write
        waves = prepare_waves(args, plan, todo, tokenizer, device, args.max_sets_per_table, sampling)
        for w in waves:
            ids = encode_prompts(inputs[w.lo:w.hi], tokenizer, [w.registries[g] for g in w.groups], context,
                                 args.system)
            prompt_tokens.update((todo[w.lo + k], len(x)) for k, x in enumerate(ids))
        return waves, [generator(waves[0])]
    with phase("compiling the grammars, encoding the prompts", shown and bool(todo)):
        waves, first = distributed.agree(dist, prepare)         # first: [the first wave's generator], popped when used
    task_registry = {todo[w.lo + k]: w.registries[g] for w in waves for k, g in enumerate(w.groups)}
    output.commit(settings, info)
    sink = output.sink()
    if requests:                                              # answers as Batch API output lines, in order
        batch_out = BatchWriter(taskfile, sink, skip, prompt_tokens, args.checkpoint, writes_refused=output.rank0)
    progress = Progress(len(todo), enabled=shown and bool(todo))
    parsed = 0

    def on_result(res):
        nonlocal parsed
        parsed += res.call is not None
        if requests:
            batch_out.write(res.record(), schema=hasattr(task_registry[res.index], "schema"))  # a SchemaTask
        else:
            sink.write(res.record())
        if args.show:
            from .schema_task import render_prompt  # a tool set's prompt, or a schema task's
            reg = task_registry[res.index]                                # the task's own tool set
            prompt = render_prompt(reg, taskfile.task_input(res.index), tokenizer, system=args.system)
            print("prompt: " + json.dumps(prompt, ensure_ascii=False), file=sys.stderr)   # the exact text, escaped
            show_call(res, tokenizer)

    t0 = time.perf_counter()
    interrupts.raise_from_now_on()
    done = [0, 0]                                                # tasks, tokens (of every wave so far)
    try:
        run_waves(waves, lambda w: first.pop() if first else generator(w), inputs, todo, limits, on_result,
                  progress, done, keys)
    except KeyboardInterrupt as stop:                       # Ctrl-C (130) or SIGTERM (143): keep what finished
        progress.close()
        sink.close()
        where = output.out_path if dist is None else f"{output.out_path}.part{dist.rank}"
        interrupts.say_interrupted(f"{interrupts.word_of(stop)}; {sink.count} finished results kept"
                                   + (f" in {where} (rerun with --resume to continue)" if output.out_path else ""))
        return interrupts.status_of(stop)
    except Exception as e:              # e.g. an illegal token caught by masker.check(): the lines may be wrong
        sink.close()
        output.mark_failed(e)
        raise
    if requests:
        batch_out.finish()
    progress(done[0], done[1], force=True)
    progress.close()
    sink.close()
    wall = time.perf_counter() - t0
    PHASE_SECONDS.append(("generating", wall))
    if shown and not todo and skip:
        print(f"batchmask: {output.out_path} is already complete ({len(skip)} of {len(tasks)} tasks); nothing to do",
              file=sys.stderr)
    ranks = distributed.gathered(dist, (done[0], parsed, done[1], wall))   # one summary for every rank
    n, parsed, tokens = (sum(r[k] for r in ranks) for k in range(3))
    wall = max(r[3] for r in ranks)                                          # the slowest rank's
    if shown and (todo or not skip):
        arm = "free" if args.no_constrain else "constrained"
        where = f"{len(ranks)} ranks on {device.type}, batch {batch} each" if dist else f"batch {batch}, {device}"
        print(f"batchmask: {n} tasks ({arm}), {parsed} parsed as calls, {tokens} tokens in {wall:.2f} s "
              f"({tokens / max(wall, 1e-9):,.0f} tok/s, {where})", file=sys.stderr)
    output.finish(sink)
    if dist:
        distributed.teardown()
    return 0


def cmd_ablate(args) -> int:
    from ..evaluation.ablation import run_ablation
    check_output_file(args.json, "--json", {"--checkpoint": args.checkpoint, "--tokenizer": args.tokenizer})
    from .display import phase
    device = _device(args.device)
    with phase("loading the model and tokenizer", not args.quiet):
        model, tokenizer = load_model_and_tokenizer(args.checkpoint, args.tokenizer, device,
                                                    _dtype(args.dtype, device), args.max_context, args.eos_id)
    report = run_ablation(model, tokenizer, n=args.n, batch_size=args.batch_size,
                          max_new_tokens=_max_new_tokens(args.max_new_tokens, model.config.seq_len), seed=args.seed,
                          max_string=args.max_string, format=args.format, system=args.system,
                          progress=not args.quiet)
    print(report.table())
    if args.json:
        write_text_atomic(args.json, json.dumps(report.to_json(), indent=2), "--json")
        print(f"wrote {args.json}")
    return 0


def cmd_compile(args) -> int:
    from batchmask.models.tokenizer import load_tokenizer

    from ..api import compile_grammar
    from ..tools.choice import check_choice
    from .grammar_store import run_choice
    registry = load_registry(args.tools, schema_options(args))
    check_choice(run_choice(args), registry, args.format, "--tool-choice")
    registry = registry.with_choice(run_choice(args))
    tok_path = args.tokenizer or (DEFAULT_DIR / "tokenizer.model")
    if not Path(tok_path).exists():
        raise ValueError(f"tokenizer not found: {tok_path}")
    check_output_file(args.out, "--out", {"--tools": args.tools, "--tokenizer": tok_path})
    from .cli_grammar import check_compile_out
    check_compile_out(args.out, tok_path)          # not into a model directory, not over a file of another kind
    tokenizer = load_tokenizer(tok_path, eos_id=args.eos_id)
    t = time.perf_counter()
    g = compile_grammar(registry, tokenizer, format=args.format, max_string=args.max_string, utf8=not args.bytes,
                        options=schema_options(args), device=_device(args.device))
    dt = time.perf_counter() - t
    # names and paths may hold control characters: printed escaped
    print(f"registry: {printable(', '.join(registry.names))}")
    print(f"vocabulary: {tokenizer.vocab_size} tokens ({printable(str(tok_path))})")
    print(f"states: {g.num_states}  rows: {g.num_rows}  token classes: {g.num_classes}  "
          f"table: {tuple(g.row_next.shape)} {str(g.row_next.dtype).removeprefix('torch.')}  "
          f"device bytes: {g.nbytes:,}  compile: {dt * 1e3:.1f} ms")
    if args.out:
        g.save(args.out)
        print(f"wrote {args.out}")
    return 0


# --- argument parsing ---------------------------------------------------------------------------
# A new `generate` flag is part of the run's fingerprint (--resume) as given, with no further work; name it in
# batchmask/run/fingerprint.py: NOT_RESULT_FLAGS if no result can depend on it, FILE_FLAGS if its value is a path.
# Numbers: type=int_arg(lo, hi) / float_arg(lo, hi) (batchmask/run/limits.py) refuse 1e20, nan and out-of-range
# values in one line.


def _eos_arg(p):
    p.add_argument("--eos-id", type=int_arg(0, limits.MAX_TOKENS),
                   help="the end-of-sequence token id, for a vocabulary whose files name none "
                   "(the end tokens they do name stay stop ids)")


def _model_args(p):
    p.add_argument("--checkpoint", help="llama2.c checkpoint (.bin), Hugging Face model directory (config.json + "
                   "safetensors) or hub id ORG/NAME (needs huggingface_hub); default: the embedded model")
    p.add_argument("--tokenizer", help="tokenizer.model, tokenizer.bin or tokenizer.json; default: beside a llama2.c "
                   "checkpoint, or the HF model directory itself")
    _eos_arg(p)
    p.add_argument("--max-context", type=int_arg(1, limits.MAX_TOKENS), default=DEFAULT_MAX_CONTEXT,
                   help=f"cap on the model's context (KV cache positions per row; default {DEFAULT_MAX_CONTEXT}: "
                        "a HF model's max_position_embeddings of 128K would need a cache no batch fits)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: auto, cuda if available)")
    p.add_argument("--dtype", default="auto", choices=("auto", *DTYPES),
                   help="the model's dtype (default: auto, float32 on the CPU and bfloat16 on CUDA)")
    p.add_argument("--batch-size", type=int_arg(1, limits.MAX_BATCH), default=16,
                   help="slots run at once (default %(default)s; clamped to the number of tasks, refused if its KV "
                        "cache does not fit the device's free memory)")
    p.add_argument("--max-new-tokens", type=int_arg(1, limits.MAX_TOKENS), default=None,
                   help=f"token ceiling per call (default {DEFAULT_MAX_NEW_TOKENS}; at most the model's context, "
                        "and also capped by the context left after the prompt)")
    p.add_argument("--seed", type=limits.seed_arg, default=0,
                   help="any integer, reduced to 63 bits (seed mod 2**63); each task's draws are keyed by "
                        "(seed, task index)")
    p.add_argument("--max-string", type=int_arg(1, limits.MAX_STRING), default=256,
                   help=f"byte cap of one argument value (default 256, at most {limits.MAX_STRING})")


def _format_arg(p):
    from ..tools.envelope import FORMATS
    p.add_argument("--format", choices=FORMATS, default="seed",
                   help='the call\'s envelope: seed {"tool":NAME,"args":{...}}, json '
                        '{"name":NAME,"arguments":{...}} (the OpenAI body), llama3 {"name": NAME, "parameters": '
                        '{...}} (Llama 3.1/3.2) or hermes <tool_call>\\n{"name": NAME, "arguments": {...}}\\n'
                        '</tool_call> (Hermes, Qwen2.5)')


def _system_arg(p):
    p.add_argument("--system", help="a system message before each task (models with a chat template; before a "
                   "JSONL task's own messages, with a warning if they hold one)")


def _choice_args(p):
    from ..tools.choice import DEFAULT_MAX_CALLS, MAX_CALLS_LIMIT
    # defaults None: a run without them keeps the one-call grammar (and the fingerprint) it had before
    p.add_argument("--tool-choice", metavar="auto|required|none|NAME",
                   help="OpenAI's tool_choice for every task (a task's own \"tool_choice\" wins): auto (text or "
                        "calls), required (at least one call), none (text), or a tool's name (calls to it only); "
                        "without it and without --parallel-tool-calls/--max-calls, exactly one call")
    p.add_argument("--parallel-tool-calls", choices=("true", "false"),
                   help="a reply may hold 1 to --max-calls calls (true, OpenAI's default) or exactly one (false)")
    p.add_argument("--max-calls", type=int_arg(1, MAX_CALLS_LIMIT), metavar="N",
                   help=f"calls one reply may hold under parallel tool calls (default {DEFAULT_MAX_CALLS})")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="batchmask", description="Batched grammar-constrained tool calling.")
    ap.add_argument("--version", action=_Version, help="print the installed version and exit")
    sub = ap.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="one tool call per task, batched")
    g.add_argument("--tasks", required=True,
                   help="text file (one task per line), JSONL ({\"task\": ..., \"max_new_tokens\": ...} per line), an "
                        "OpenAI Batch API requests file, or -; JSONL when the first non-blank line is a JSON object")
    g.add_argument("--tasks-format", choices=TASK_FORMATS, default="auto",
                   help="force reading --tasks as plain lines, JSONL or Batch API requests (default: auto, by content)")
    g.add_argument("--tools", help="tool registry JSON (default: the built-in tools)")
    g.add_argument("--grammar", help="a cache file written by `batchmask compile`")
    g.add_argument("--grammar-cache", metavar="DIR", help="where compiled grammars are kept between runs, one per "
                   "tool set (default $XDG_CACHE_HOME/batchmask or ~/.cache/batchmask; none: memory only)")
    g.add_argument("--max-sets-per-table", type=int_arg(1, 1 << 20), default=64, metavar="N",
                   help="tasks run in waves whose tasks use at most N distinct tool sets, one table each "
                        "(default 64; batchmask/run/waves.py)")
    _model_args(g)
    g.add_argument("--temperature", type=float_arg(0.0, limits.MAX_TEMPERATURE), default=0.0,
                   help="sampling temperature; 0 is greedy")
    g.add_argument("--top-p", type=float_arg(0.0, 1.0, lo_open=True), default=1.0,
                   help="nucleus sampling: draw only from the most likely legal tokens whose probabilities add up "
                        "to P (0 < P <= 1; 1 keeps every legal token; used only when --temperature is above 0)")
    g.add_argument("--no-constrain", action="store_true", help="the free arm: no grammar mask")
    # default None, not False: a run without the flag keeps the fingerprint runs had before it existed
    g.add_argument("--jump-forward", action="store_true", default=None,
                   help="write the text the grammar forces (a call's frame, the rest of a unique name, required "
                        "keys) at once, several tokens a row in one forward pass (batchmask/run/jump.py)")
    _format_arg(g)
    schema_args(g)
    _system_arg(g)
    _choice_args(g)
    g.add_argument("--bytes", action="store_true", help="the seed's byte rule instead of whole UTF-8 characters")
    g.add_argument("--out", help="JSONL output (default: stdout); its settings go to OUT.run.json, and OUT.lock "
                                 "is held while the run writes")
    g.add_argument("--resume", action="store_true",
                   help="skip tasks already in --out and append (refused unless the settings that wrote it match)")
    g.add_argument("--force", action="store_true", help="overwrite an existing --out")
    g.add_argument("--show", action="store_true", help="print each call with every token's legal count")
    g.add_argument("--quiet", action="store_true", help="no progress or summary on stderr")
    g.set_defaults(func=cmd_generate)

    a = sub.add_parser("ablate", help="the same model with and without the mask")
    _model_args(a)
    a.add_argument("--n", type=int_arg(1, limits.MAX_ABLATE_N), default=30,
                   help=f"trials per arm (default 30, at most {limits.MAX_ABLATE_N})")
    a.add_argument("--json", help="write per-arm counts as JSON")
    a.add_argument("--quiet", action="store_true", help="no progress on stderr (the table still goes to stdout)")
    _format_arg(a)                                 # as generate's: the grammar's format, both arms parsed in it
    _system_arg(a)
    a.set_defaults(func=cmd_ablate, batch_size=30)

    c = sub.add_parser("compile", help="compile a registry against a tokenizer and write the cache file")
    c.add_argument("--tools", help="tool registry JSON (default: the built-in tools)")
    c.add_argument("--tokenizer", help="tokenizer.model, tokenizer.bin, tokenizer.json or a model directory "
                   "(default: the embedded model's)")
    _eos_arg(c)
    c.add_argument("--max-string", type=int_arg(1, limits.MAX_STRING), default=256,
                   help=f"byte cap of one argument value (default 256, at most {limits.MAX_STRING})")
    c.add_argument("--bytes", action="store_true", help="the seed's byte rule instead of whole UTF-8 characters")
    _choice_args(c)
    _format_arg(c)
    schema_args(c)
    c.add_argument("--device", default="cpu", help="where the table is built and checked: cpu, cuda or cuda:N")
    c.add_argument("--out", help="cache file to write")
    c.set_defaults(func=cmd_compile)

    from ..kernels import (
        check as kernel_check,  # check-kernels lives in its own module (ahead-of-time compile of the kernels)
    )
    k = sub.add_parser("check-kernels", help="compile the Triton kernels ahead of time: registers, spills")
    kernel_check.add_arguments(k)
    k.set_defaults(func=lambda args: kernel_check.run(args.arch, args.jobs))
    return ap


def _say_lenient_warnings() -> None:
    """Lenient mode's warnings (one per relaxed schema keyword) as `batchmask: warning: ...` lines."""
    import warnings

    from ..schema.base import LenientWarning
    shown = warnings.showwarning
    if getattr(shown, "batchmask", False):
        return

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, LenientWarning):
            say_warning(str(message))
        else:
            shown(message, category, filename, lineno, file, line)
    show.batchmask = True
    warnings.showwarning = show


def main(argv=None) -> int:
    """Run one command; returns the exit status (0 done, 2 bad input, 130 interrupted, 143 terminated).

    Ctrl-C at any moment ends as 130 and SIGTERM as 143, without a traceback (batchmask/run/interrupts.py).
    """
    if argv is None:
        interrupts.install_for_program()
    _say_lenient_warnings()
    args = None
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except SystemExit as e:                    # argparse: --help (0) or a bad flag (2, its one line printed)
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except KeyboardInterrupt as stop:
        interrupts.say_interrupted(interrupts.word_of(stop))
        return interrupts.status_of(stop)
    except BrokenPipeError:                    # `batchmask generate ... | head`: the reader left; not an error
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at interpreter exit
        except OSError:
            pass
        return 141                             # 128 + SIGPIPE, as a shell reports it
    except MemoryError:                        # e.g. a grammar too large to build: one line, not a traceback
        say_error(f"out of memory in `batchmask {getattr(args, 'command', '')}` (a smaller grammar, batch or "
                  "context needs less)")
        return 2
    except (ValueError, OSError, RuntimeError) as e:          # one line; a quoted value must not drive the terminal
        if os.environ.get("BATCHMASK_DEBUG"):
            raise
        ranks = sys.modules.get(__package__ + ".distributed")           # torchrun: one rank says it
        if ranks is None or not ranks.said_by_rank0(e):
            say_error(str(e).strip() or type(e).__name__)       # its first line, escaped
        if ranks is not None:
            ranks.error_said(e)
        return 2


if __name__ == "__main__":
    sys.exit(main())
