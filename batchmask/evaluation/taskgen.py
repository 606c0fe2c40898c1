"""Generated tool-use tasks: the held-out evaluation set of `batchmask ablate`, and the generator it shares
with the default model's training recipe.

    >>> ex = make_examples(1, seed=0)[0]                 # the eval split
    >>> ex.task, ex.tool, ex.args
    ('which files are in letters/music?', 'list_dir', {'path': 'letters/music'})

Every example is a task in words and the one call that answers it, for the built-in tools of
`ToolRegistry.defaults()`:

    kind          tool        example task                          call args
    calc_words    calc        "add forty-two and 19"                {"expr": "42+19"}
    calc_symbols  calc        "compute 3 + 4 * 2"                   {"expr": "3+4*2"}
    read          read_file   "show me notes/todo.txt"              {"path": "notes/todo.txt"}
    list          list_dir    "list the files in src/utils"         {"path": "src/utils"}
    write         write_file  "save 'hello world' to greet.txt"     {"path": "greet.txt", "text": "hello world"}
    chat          answer      "thanks a lot!"                       {"text": "You are welcome."}

A split (`TaskSplit`) is data: its phrasings, its real-word name pools, its numbers, its kind weights and
how it picks a name. This module holds the `EVAL` split and the generator; the training split (training
phrasings and names, invented names, the train-only `echo` kind) is the recipe's:
`recipes/default_model/tasks.py`, outside the package. Held out (the eval split shares none of these
with training, so evaluation measures generalisation, not recall):
- phrasings: every kind has a training template pool and a disjoint eval template pool;
- numbers: 0..999 is cut once, by a fixed permutation, into a train pool and an eval pool
  (`NUMBER_POOLS`; every operand a task mentions comes from its split's pool; results may be any
  number). A held-out number is said in words only when training uses each of its words
  ('forty-seven' is fine when 'forty' and 'seven' occur in training numbers; a held-out 'thirteen' is
  one word that nothing links to 13, so eval says it in digits);
- names: directory names, file stems and the words of written text come from disjoint pools of real
  words (file extensions are shared: they are what makes a path a file).
Shared on purpose: the chat intents and their canonical replies (`CHAT_REPLIES`), and the country ->
capital facts (`CAPITALS`). A reply cannot be inferred for an intent or fact never seen, so the eval
split asks the same things in held-out words.

The same (n, seed, split) gives the same list, draw for draw, as the generator the shipped default
model was trained with (tests/test_taskgen.py compares them).

Calc expressions use digits and `+ - * / ( )` only; `eval_expr` (batchmask/evaluation/calc.py) evaluates one exactly.
"""
from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from ..tools.prompt import parse_call
from ..tools.registry import ToolRegistry
from .calc import ExprError, eval_expr

__all__ = ["CAPITALS", "CHAT_REPLIES", "EVAL", "EVAL_NAMES", "EXTENSIONS", "KIND_TOOL", "KIND_WEIGHTS", "NAME_POOLS",
           "NUMBER_POOLS", "Example", "ExprError", "TaskSplit", "eval_expr", "expected_result", "judge",
           "make_examples", "number_words", "pool_choice", "sayable", "split_name"]

# --- examples ---------------------------------------------------------------------------------
# How often each evaluated kind is drawn (weights, not probabilities), and the tool it calls.
KIND_WEIGHTS = {"calc_words": 20, "calc_symbols": 15, "read": 15, "list": 15, "write": 15, "chat": 20}
KIND_TOOL = {"calc_words": "calc", "calc_symbols": "calc", "read": "read_file", "list": "list_dir",
             "write": "write_file", "chat": "answer"}
NAME_POOLS = ("dirs", "stems", "words")


@dataclass(frozen=True)
class Example:
    task: str            # the user's request, one line
    tool: str            # the tool the call must name
    args: dict           # the reference call's arguments, in the registry's order
    kind: str            # one of its split's kinds
    answer: Fraction | None = field(default=None, compare=True)  # calc only: the value the task asks for


# --- number pools -------------------------------------------------------------------------
_EVAL_NUMBER_FRACTION = 0.2
_NUMBER_SPLIT_SEED = 20261130   # fixed forever: changing it would leak eval numbers into training


def _number_pools() -> dict[str, frozenset[int]]:
    """0..999 cut once into disjoint train/eval pools; each pool gets its share of 0..99 and 0..12."""
    rng = random.Random(_NUMBER_SPLIT_SEED)
    pools: dict[str, set[int]] = {"train": set(), "eval": set()}
    # Cut each band separately so both splits get small numbers (words cover 0..99 only).
    for band_range in (range(0, 13), range(13, 100), range(100, 1000)):
        band = list(band_range)
        rng.shuffle(band)
        n_eval = max(2, round(len(band) * _EVAL_NUMBER_FRACTION))
        pools["eval"].update(band[:n_eval])
        pools["train"].update(band[n_eval:])
    return {k: frozenset(v) for k, v in pools.items()}


# Both sides of the one cut: the eval split needs the training side to know which words training says.
NUMBER_POOLS = _number_pools()

_ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
         "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
         "nineteen"]
_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def number_words(n: int) -> str:
    """0..99 in English words: 42 -> 'forty-two'."""
    if not 0 <= n <= 99:
        raise ValueError(f"number_words: {n} is outside 0..99")
    if n < 20:
        return _ONES[n]
    tens, ones = divmod(n, 10)
    return _TENS[tens] + ("" if ones == 0 else "-" + _ONES[ones])


# Every word (split at '-') that training uses to say a number: 'forty-seven' is 'forty', 'seven'.
_TRAIN_NUMBER_WORDS = frozenset(w for n in NUMBER_POOLS["train"] if n <= 99 for w in number_words(n).split("-"))


def sayable(n: int) -> bool:
    """Can n be said in words made only of training's number words?

    A held-out 47 can ('forty' and 'seven' occur in training numbers), a held-out 13 cannot
    ('thirteen' is one word, never seen): nothing links that word to its digits.
    """
    return n <= 99 and set(number_words(n).split("-")) <= _TRAIN_NUMBER_WORDS


# --- what both splits share ---------------------------------------------------------------
# chat: intent -> its canonical reply (each split phrases the intents its own way).
CHAT_REPLIES = {
    "greet": "Hello! How can I help you?",
    "thanks": "You are welcome.",
    "bye": "Goodbye!",
    "how": "I am doing well, thank you.",
    "who": "I am a small tool-calling assistant.",
    "can": "I can do arithmetic and read, list and write files.",
}
CAPITALS = {"France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid", "Japan": "Tokyo",
            "Egypt": "Cairo", "Canada": "Ottawa", "Peru": "Lima", "Kenya": "Nairobi", "Norway": "Oslo",
            "Poland": "Warsaw", "Greece": "Athens", "Chile": "Santiago", "Ireland": "Dublin"}
EXTENSIONS = ("txt", "md", "yaml", "json", "py", "csv", "log", "toml")


# --- a split ------------------------------------------------------------------------------
def pool_choice(rng: random.Random, pool: Sequence[str]) -> str:
    """A name drawn from the split's real-word pool (the eval split's only way to pick one)."""
    return rng.choice(pool)


@dataclass(frozen=True)
class TaskSplit:
    """Everything one split draws from. `name` also seeds the stream, so splits never coincide for a seed.

    calc_words: (task template, expression template) pairs; {a}, {b} are the operands as the task says
    them, the expression takes digits in the order the task means. calc_symbols/read/list/write/capital:
    templates around {e} (an expression), {p} (a file path), {d} (a directory: `listing`), {t} (text),
    {c} (a country). chat: intent -> phrasings (the intents of CHAT_REPLIES). names: NAME_POOLS -> real words.
    pick_name(rng, pool) -> one name. extra_generators: kinds this split adds (kind -> generator).
    """

    name: str
    kind_weights: Mapping[str, int]
    numbers: frozenset[int]
    calc_words: Sequence[tuple[str, str]]
    calc_symbols: Sequence[str]
    read: Sequence[str]
    listing: Sequence[str]
    write: Sequence[str]
    chat: Mapping[str, Sequence[str]]
    capital: Sequence[str]
    names: Mapping[str, Sequence[str]]
    pick_name: Callable[[random.Random, Sequence[str]], str] = pool_choice
    extra_generators: Mapping[str, Callable[[random.Random, TaskSplit, Sequence[int]], Example]] = \
        field(default_factory=dict)

    def __post_init__(self) -> None:
        # The chat generator draws an intent from sorted(CHAT_REPLIES): a split must phrase every one.
        if set(self.chat) != set(CHAT_REPLIES):
            raise ValueError(f"TaskSplit {self.name!r}: chat intents {sorted(self.chat)} are not "
                             f"{sorted(CHAT_REPLIES)}")
        if set(self.names) != set(NAME_POOLS):
            raise ValueError(f"TaskSplit {self.name!r}: name pools {sorted(self.names)} are not {list(NAME_POOLS)}")
        unknown = set(self.kind_weights) - set(_GENERATORS) - set(self.extra_generators)
        if unknown:
            raise ValueError(f"TaskSplit {self.name!r}: no generator for kinds {sorted(unknown)}")

    def templates(self) -> dict[str, frozenset[str]]:
        """Every template and real name the split draws from, by pool (for the disjointness tests)."""
        return {
            "calc_words": frozenset(t for t, _ in self.calc_words),
            "calc_symbols": frozenset(self.calc_symbols), "read": frozenset(self.read),
            "list": frozenset(self.listing), "write": frozenset(self.write),
            "chat": frozenset(p for phrasings in self.chat.values() for p in phrasings),
            "capital": frozenset(self.capital),
            **{pool: frozenset(self.names[pool]) for pool in NAME_POOLS},
        }


# --- generators: one per kind ---------------------------------------------------------------
# Each draws from `rng` in a fixed order: that order is the data (the shipped model was trained on
# the stream it gives), so a change here is a change of data set.
def _pick_number(rng: random.Random, pool: Sequence[int], lo: int, hi: int) -> int:
    """A number of the split's pool within lo..hi."""
    return rng.choice([n for n in pool if lo <= n <= hi])


def _say(rng: random.Random, n: int) -> str:
    """A number as a task would mention it: in words half of the time when it can be, else in digits."""
    return number_words(n) if sayable(n) and rng.random() < 0.5 else str(n)


def _gen_calc_words(rng: random.Random, split: TaskSplit, pool: Sequence[int]) -> Example:
    task_t, expr_t = rng.choice(split.calc_words)
    op = expr_t[3]   # the operator sits between '{a}' and '{b}'
    if op == "/":
        # Whole quotients only: a = b * q with a, b (and q) from the pool.
        while True:
            b = _pick_number(rng, pool, 2, 12)
            q = _pick_number(rng, pool, 1, 20)
            if b * q in pool:
                a = b * q
                break
    elif op == "*":
        a, b = _pick_number(rng, pool, 0, 30), _pick_number(rng, pool, 0, 30)
    else:
        a, b = _pick_number(rng, pool, 0, 99), _pick_number(rng, pool, 0, 99)
        if op == "-" and b > a and rng.random() < 0.8:
            a, b = b, a   # mostly non-negative differences, as people ask them
    value = {"+": lambda: Fraction(a + b), "-": lambda: Fraction(a - b), "*": lambda: Fraction(a * b),
             "/": lambda: Fraction(a, b)}[op]()
    task = task_t.format(a=_say(rng, a), b=_say(rng, b))
    return Example(task, "calc", {"expr": expr_t.format(a=a, b=b)}, "calc_words", value)


def _random_expr(rng: random.Random, pool: Sequence[int], n_operands: int) -> tuple[list[str], Fraction]:
    """A flat or once-parenthesised expression as a token list, with its exact value computed here."""
    nums = [_pick_number(rng, pool, 0, 99 if rng.random() < 0.8 else 999) for _ in range(n_operands)]
    ops = [rng.choice("+-*") for _ in range(n_operands - 1)]
    if n_operands == 2 and rng.random() < 0.2:
        nums[1] = _pick_number(rng, pool, 1, 12)
        nums[0] = nums[1] * _pick_number(rng, pool, 1, 12)
        if nums[0] not in pool:
            nums[0] = nums[1]
        ops = ["/"]
    # Build the value with Python's own precedence on Fractions, independent of eval_expr.
    paren = n_operands == 3 and rng.random() < 0.4
    f = [Fraction(n) for n in nums]
    apply = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y,
             "/": lambda x, y: x / y}
    if n_operands == 2:
        value = apply[ops[0]](f[0], f[1])
        toks = [str(nums[0]), ops[0], str(nums[1])]
    elif paren:  # (a op b) op c
        value = apply[ops[1]](apply[ops[0]](f[0], f[1]), f[2])
        toks = ["(", str(nums[0]), ops[0], str(nums[1]), ")", ops[1], str(nums[2])]
    else:        # a op b op c with * binding tighter
        if ops[1] == "*" and ops[0] != "*":
            value = apply[ops[0]](f[0], f[1] * f[2])
        else:
            value = apply[ops[1]](apply[ops[0]](f[0], f[1]), f[2])
        toks = [str(nums[0]), ops[0], str(nums[1]), ops[1], str(nums[2])]
    return toks, value


def _gen_calc_symbols(rng: random.Random, split: TaskSplit, pool: Sequence[int]) -> Example:
    toks, value = _random_expr(rng, pool, rng.choice((2, 2, 3)))
    spaced = rng.random() < 0.7
    # Spaces between operators, none inside parentheses: "(5 + 7) * 3" or "(5+7)*3".
    shown = " ".join(toks).replace("( ", "(").replace(" )", ")") if spaced else "".join(toks)
    task = rng.choice(split.calc_symbols).format(e=shown)
    return Example(task, "calc", {"expr": "".join(toks)}, "calc_symbols", value)


def split_name(rng: random.Random, split: TaskSplit, pool: str) -> str:
    """One name of the split from one of NAME_POOLS, picked the split's way."""
    return split.pick_name(rng, split.names[pool])


def _file_path(rng: random.Random, split: TaskSplit) -> str:
    stem = split_name(rng, split, "stems") + "." + rng.choice(EXTENSIONS)
    dirs = [split_name(rng, split, "dirs") for _ in range(rng.choice((0, 1, 1, 2)))]
    return "/".join(dirs + [stem])


def _dir_path(rng: random.Random, split: TaskSplit) -> str:
    return "/".join(split_name(rng, split, "dirs") for _ in range(rng.choice((1, 1, 2))))


def _gen_read(rng: random.Random, split: TaskSplit, pool: Sequence[int]) -> Example:
    p = _file_path(rng, split)
    return Example(rng.choice(split.read).format(p=p), "read_file", {"path": p}, "read")


def _gen_list(rng: random.Random, split: TaskSplit, pool: Sequence[int]) -> Example:
    d = _dir_path(rng, split)
    return Example(rng.choice(split.listing).format(d=d), "list_dir", {"path": d}, "list")


def _gen_write(rng: random.Random, split: TaskSplit, pool: Sequence[int]) -> Example:
    p = _file_path(rng, split)
    t = " ".join(split_name(rng, split, "words") for _ in range(rng.randint(1, 4)))
    task = rng.choice(split.write).format(t=t, p=p)
    return Example(task, "write_file", {"path": p, "text": t}, "write")


def _gen_chat(rng: random.Random, split: TaskSplit, pool: Sequence[int]) -> Example:
    if rng.random() < 0.3:
        country = rng.choice(sorted(CAPITALS))
        task = rng.choice(split.capital).format(c=country)
        return Example(task, "answer", {"text": CAPITALS[country]}, "chat")
    intent = rng.choice(sorted(CHAT_REPLIES))
    return Example(rng.choice(split.chat[intent]), "answer", {"text": CHAT_REPLIES[intent]}, "chat")


_GENERATORS = {"calc_words": _gen_calc_words, "calc_symbols": _gen_calc_symbols, "read": _gen_read,
               "list": _gen_list, "write": _gen_write, "chat": _gen_chat}


# --- the eval split -----------------------------------------------------------------------
EVAL = TaskSplit(
    name="eval",
    kind_weights=KIND_WEIGHTS,
    numbers=NUMBER_POOLS["eval"],
    calc_words=(
        ("please work out {a} times {b}", "{a}*{b}"),
        ("I need the product of {a} and {b}", "{a}*{b}"),
        ("can you add {a} to {b}?", "{a}+{b}"),
        ("tell me {a} plus {b}", "{a}+{b}"),
        ("what do I get if I subtract {b} from {a}?", "{a}-{b}"),
        ("tell me {a} minus {b}", "{a}-{b}"),
        ("how much is {a} divided by {b}?", "{a}/{b}"),
        ("please divide {a} by {b}", "{a}/{b}"),
    ),
    calc_symbols=("please compute {e} for me", "what does {e} come to?", "solve {e}", "tell me what {e} is"),
    read=("display the file {p}", "can you read {p} for me?", "I want to see what {p} says", "open {p}"),
    listing=("which files are in {d}?", "list everything in the directory {d}", "show me the folder {d}",
             "give me a listing of {d}"),
    write=("please save '{t}' in the file {p}", "overwrite {p} with '{t}'", "make a file {p} that says '{t}'",
           "write '{t}' to the file {p}"),
    chat={
        "greet": ("hey there", "good evening", "hello again"),
        "thanks": ("many thanks", "thank you so much!", "thanks for the help"),
        "bye": ("see you soon", "I have to go, bye", "goodbye and see you"),
        "how": ("how are things?", "are you doing well?", "how have you been?"),
        "who": ("tell me who you are", "what should I call you?", "who am I talking to?"),
        "can": ("what are you able to do?", "how can you help me?", "what tools do you have?"),
    },
    capital=("which city is the capital of {c}?", "tell me the capital of {c}"),
    names={
        "dirs": ("music", "reports", "archive", "media", "projects", "photos", "letters", "vendor", "recipes_2023",
                 "q4-plans", "clients", "Invoices"),
        "stems": ("agenda", "recipes", "invoice", "contacts", "journal", "goals", "minutes", "schedule", "manifest",
                  "tasks", "meeting_notes", "backlog-v2", "Changelog", "week42", "expenses"),
        "words": ("pick", "up", "kids", "send", "invoice", "friday", "see", "you", "tomorrow", "happy", "birthday",
                  "pay", "rent", "walk", "dog", "tea"),
    },
)
# Every held-out name, lower-cased: a training split must never produce one.
EVAL_NAMES = frozenset(n.lower() for pool in NAME_POOLS for n in EVAL.names[pool])


def make_examples(n: int, seed: int, split: TaskSplit | str = EVAL) -> list[Example]:
    """n examples of `split` (the eval split unless given another TaskSplit), the same list for the same
    (n, seed, split)."""
    if split == "eval":
        split = EVAL
    if not isinstance(split, TaskSplit):
        raise ValueError(f"make_examples: split must be 'eval' or a TaskSplit, got {split!r} (the training split "
                         "is recipes/default_model/tasks.py's TRAIN)")
    if n < 0:
        raise ValueError(f"make_examples: n must be >= 0, got {n}")
    # Mix the split into the seed so train and eval streams never coincide for one seed.
    rng = random.Random(f"{split.name}:{seed}")
    pool = sorted(split.numbers)
    generators = _GENERATORS | dict(split.extra_generators)
    kinds, weights = list(split.kind_weights), list(split.kind_weights.values())
    # One kind at a time, so the first k examples are the same whatever n is.
    return [generators[rng.choices(kinds, weights)[0]](rng, split, pool) for _ in range(n)]


# --- judging a call -----------------------------------------------------------------------
def expected_result(example: Example) -> Fraction | str | None:
    """What a right call must produce: calc -> the value (Fraction); file tools -> the path; answer -> the reply."""
    if example.tool == "calc":
        return example.answer
    if example.tool in ("read_file", "list_dir", "write_file"):
        return example.args["path"]
    return example.args["text"]


def judge(example: Example, text: str, registry: ToolRegistry | None = None) -> dict[str, bool]:
    """Score a model's call text: {'parsed', 'right_tool', 'right_arg'} (each a bool).

    right_arg: calc -- the expression evaluates to the task's value; file tools -- the path is the
    named one; answer -- the reply is the intent's canonical reply.
    """
    registry = registry or ToolRegistry.defaults()
    call, _ = parse_call(text, registry)
    if call is None:
        return {"parsed": False, "right_tool": False, "right_arg": False}
    right_tool = call["tool"] == example.tool
    right_arg = False
    if right_tool:
        args = call["args"]
        if example.tool == "calc":
            try:
                right_arg = eval_expr(args["expr"]) == example.answer
            except ExprError:
                right_arg = False
        elif example.tool == "answer":
            right_arg = args["text"] == example.args["text"]
        else:
            right_arg = args["path"] == example.args["path"]
    return {"parsed": True, "right_tool": right_tool, "right_arg": right_arg}
