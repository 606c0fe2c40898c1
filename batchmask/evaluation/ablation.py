"""The seed's measurement as a command: the same model, prompts and greedy sampler, with and without the mask.

Two columns per arm: did the output parse as a tool call (the grammar's work), and did it pick
a usable tool with the right argument (the model's work). Tasks are the held-out evaluation
examples of batchmask.evaluation.taskgen: arithmetic, reading, listing, writing and chat, in phrasings,
numbers and names the embedded model never saw in training.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..api import compile_grammar  # any call format (the seed path for seed + native tools)
from ..run.generation import BatchGenerator, GenerationConfig
from ..text import printable
from ..tools.envelope import get_envelope
from ..tools.prompt import parse_call, render_call, render_prompt
from ..tools.registry import ToolRegistry
from .taskgen import judge, make_examples

ARMS = ("constrained", "free")


@dataclass
class ArmResult:
    trials: int = 0
    parsed: int = 0
    usable: int = 0          # picked the tool the task needs
    right_arg: int = 0       # ... and the argument is right
    tokens: int = 0
    seconds: float = 0.0
    samples: list = field(default_factory=list)


@dataclass
class AblationReport:
    arms: dict

    def table(self) -> str:
        lines = [f"{'':<28}{'constrained':>18}{'free':>18}"]
        for label, key in (("parsed as a tool call", "parsed"), ("picked a usable tool", "usable"),
                           ("... with the right argument", "right_arg")):
            cells = []
            for arm in ARMS:
                r = self.arms[arm]
                cells.append(f"{getattr(r, key)}/{r.trials} ({100 * getattr(r, key) / max(r.trials, 1):.0f}%)")
            lines.append(f"{label:<28}{cells[0]:>18}{cells[1]:>18}")
        for arm in ARMS:
            lines.append(f"\n{arm} samples:")
            for task, text in self.arms[arm].samples:
                lines.append(f"  {task[:50]!r:<54} -> {printable(text[:90])}")   # model text: control bytes too
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {arm: {"trials": r.trials, "parsed": r.parsed, "usable": r.usable, "right_arg": r.right_arg,
                      "tokens": r.tokens, "seconds": round(r.seconds, 3)} for arm, r in self.arms.items()}


def run_ablation(model, tokenizer, n: int = 30, batch_size: int = 30, max_new_tokens: int = 160, seed: int = 0,
                 max_string: int = 256, n_samples: int = 3, format: str = "seed",
                 system: str | None = None, progress: bool = False) -> AblationReport:
    """Both arms on the same `n` held-out tasks. `format` and `system` mean what they mean to `generate`: the call
    format the grammar writes and both arms are parsed in, and a system message before each task (chat
    templates only). progress: a bar per phase on a terminal (batchmask.run.display)."""
    from ..run.display import Progress, phase
    if n < 1:
        raise ValueError(f"--n must be >= 1, got {n}")
    registry = ToolRegistry.defaults()
    examples = make_examples(n, seed=seed, split="eval")
    render_prompt(registry, examples[0].task, tokenizer, system=system)   # --system without a template: refused
    device = next(model.parameters()).device                               # before any compile or run
    with phase("compiling the grammar", progress):
        grammar = compile_grammar(registry, tokenizer, format=format, max_string=max_string, device=device)
    arms = {}
    for arm in ARMS:
        config = GenerationConfig(batch_size=min(batch_size, n), max_new_tokens=max_new_tokens, temperature=0.0,
                                  constrain=arm == "constrained", seed=seed, format=format, system=system)
        gen = BatchGenerator(model, tokenizer, registry, grammar if arm == "constrained" else None, config)
        res = ArmResult()
        results = []
        bar = Progress(n, enabled=progress, desc=f"ablate, {arm}")
        tokens = [0]                                  # of the results so far, for the bar's tok/s

        def keep(r, results=results, bar=bar, tokens=tokens):
            results.append(r)
            tokens[0] += r.tokens
            bar(len(results), tokens[0])
        try:
            stats = gen.run([ex.task for ex in examples], on_result=keep)
        finally:
            bar.close()
        for ex, r in zip(examples, results):
            score = _judge(ex, r.text, registry, format)
            res.trials += 1
            res.parsed += score["parsed"]
            res.usable += score["right_tool"]
            res.right_arg += score["right_arg"]
        res.samples = [(r.task, r.text) for r in results[:n_samples]]
        res.tokens, res.seconds = stats.tokens, stats.seconds
        arms[arm] = res
    return AblationReport(arms)


def _judge(example, text: str, registry: ToolRegistry, format: str) -> dict:
    """taskgen.judge (which reads the seed's envelope) for a call written in `format`: parsed in that format,
    then judged in the seed's compact form (the same tool and arguments)."""
    if format == "seed":
        return judge(example, text, registry)
    call, _ = parse_call(text, registry, format=format)
    if call is None:
        return {"parsed": False, "right_tool": False, "right_arg": False}
    env = get_envelope(format)
    return judge(example, render_call(call[env.name_key], call[env.args_key]), registry)
