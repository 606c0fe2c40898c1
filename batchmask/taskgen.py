"""Generated tool-use tasks: the training data of the default model and its held-out evaluation.

    >>> ex = make_examples(1, seed=0)[0]
    >>> ex.task, ex.tool, ex.args                        # e.g.
    ('what is 12 times 7?', 'calc', {'expr': '12*7'})

Every example is a task in words and the one call that answers it, for the built-in tools of
`ToolRegistry.defaults()`:

    kind          tool        example task                          call args
    calc_words    calc        "add forty-two and 19"                {"expr": "42+19"}
    calc_symbols  calc        "compute 3 + 4 * 2"                   {"expr": "3+4*2"}
    read          read_file   "show me notes/todo.txt"              {"path": "notes/todo.txt"}
    list          list_dir    "list the files in src/utils"         {"path": "src/utils"}
    write         write_file  "save 'hello world' to greet.txt"     {"path": "greet.txt", "text": "hello world"}
    chat          answer      "thanks a lot!"                       {"text": "You are welcome."}

Held out (the `eval` split shares none of these with `train`, so evaluation measures
generalisation, not recall):
- phrasings: every kind has a train template pool and a disjoint eval template pool;
- numbers: 0..999 is cut once, by a fixed permutation, into a train pool and an eval pool
  (every operand a task mentions comes from its split's pool; results may be any number). A
  held-out number is said in words only when training uses each of its words ('forty-seven' is
  fine when 'forty' and 'seven' occur in training numbers; a held-out 'thirteen' is one word that
  nothing links to 13, so eval says it in digits);
- names: directory names, file stems and the words of written text come from disjoint pools of
  real words (file extensions are shared: they are what makes a path a file). Three training
  names in four are invented afresh (syllables, random letters, compounds with digits, `_` and
  `-`, some capitalised) and never equal an eval name: predicting one is only possible by copying
  it from the task, which is the skill that carries over to a held-out name.
Shared on purpose: the chat intents and their canonical replies, and the country -> capital
facts. A reply cannot be inferred for an intent or fact never seen, so the eval split asks the
same things in held-out words.

Calc expressions use digits and `+ - * / ( )` only; `eval_expr` evaluates one exactly (with
`fractions.Fraction`, through `ast`, never `eval`).
"""
from __future__ import annotations

import ast
import random
from dataclasses import dataclass, field
from fractions import Fraction

from .prompt import parse_call
from .registry import ToolRegistry

SPLITS = ("train", "eval")

# How often each kind is drawn (weights, not probabilities).
KIND_WEIGHTS = {"calc_words": 20, "calc_symbols": 15, "read": 15, "list": 15, "write": 15, "chat": 20}
# Training also has `echo` ("say 'blue kelo7'" -> answer("blue kelo7")): pure copying of arbitrary
# text, a drill for the one skill every argument needs. It is not evaluated (it would flatter the
# argument figure), so the eval split keeps KIND_WEIGHTS.
TRAIN_KIND_WEIGHTS = KIND_WEIGHTS | {"echo": 15}
KIND_TOOL = {"calc_words": "calc", "calc_symbols": "calc", "read": "read_file", "list": "list_dir",
             "write": "write_file", "chat": "answer", "echo": "answer"}


@dataclass(frozen=True)
class Example:
    task: str            # the user's request, one line
    tool: str            # the tool the call must name
    args: dict           # the reference call's arguments, in the registry's order
    kind: str            # one of TRAIN_KIND_WEIGHTS
    answer: Fraction | None = field(default=None, compare=True)  # calc only: the value the task asks for


# --- number pools -------------------------------------------------------------------------
_EVAL_NUMBER_FRACTION = 0.2
_NUMBER_SPLIT_SEED = 20261130   # fixed forever: changing it would leak eval numbers into training


def _number_pools() -> dict[str, frozenset[int]]:
    """0..999 cut once into disjoint train/eval pools; each pool gets its share of 0..99 and 0..12."""
    rng = random.Random(_NUMBER_SPLIT_SEED)
    pools = {"train": set(), "eval": set()}
    # Cut each band separately so both splits get small numbers (words cover 0..99 only).
    for band in (range(0, 13), range(13, 100), range(100, 1000)):
        band = list(band)
        rng.shuffle(band)
        n_eval = max(2, round(len(band) * _EVAL_NUMBER_FRACTION))
        pools["eval"].update(band[:n_eval])
        pools["train"].update(band[n_eval:])
    return {k: frozenset(v) for k, v in pools.items()}


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


# --- template pools -----------------------------------------------------------------------
# calc_words: (task template, expression template). {a} and {b} are the operands as the task
# says them (digits or words); the expression always takes digits, in the order the task means.
_CALC_WORDS = {
    "train": [
        ("what is {a} times {b}?", "{a}*{b}"),
        ("multiply {a} by {b}", "{a}*{b}"),
        ("what is the product of {a} and {b}?", "{a}*{b}"),
        ("add {a} and {b}", "{a}+{b}"),
        ("what is {a} plus {b}?", "{a}+{b}"),
        ("what is the sum of {a} and {b}?", "{a}+{b}"),
        ("subtract {b} from {a}", "{a}-{b}"),
        ("what is {a} minus {b}?", "{a}-{b}"),
        ("take {b} away from {a}", "{a}-{b}"),
        ("divide {a} by {b}", "{a}/{b}"),
        ("what is {a} divided by {b}?", "{a}/{b}"),
        ("how much is {a} times {b}", "{a}*{b}"),
        ("how much is {a} plus {b}", "{a}+{b}"),
        ("calculate {a} minus {b}", "{a}-{b}"),
    ],
    "eval": [
        ("please work out {a} times {b}", "{a}*{b}"),
        ("I need the product of {a} and {b}", "{a}*{b}"),
        ("can you add {a} to {b}?", "{a}+{b}"),
        ("tell me {a} plus {b}", "{a}+{b}"),
        ("what do I get if I subtract {b} from {a}?", "{a}-{b}"),
        ("tell me {a} minus {b}", "{a}-{b}"),
        ("how much is {a} divided by {b}?", "{a}/{b}"),
        ("please divide {a} by {b}", "{a}/{b}"),
    ],
}
# calc_symbols: a frame around an expression written with symbols.
_CALC_SYMBOLS = {
    "train": ["compute {e}", "what is {e}?", "calculate {e}", "{e} = ?", "how much is {e}?", "evaluate {e}"],
    "eval": ["please compute {e} for me", "what does {e} come to?", "solve {e}", "tell me what {e} is"],
}
_READ = {
    "train": ["show me {p}", "open the file {p}", "read {p}", "print the contents of {p}", "what is in {p}?",
              "cat {p}", "read the file {p} please", "show the file {p}"],
    "eval": ["display the file {p}", "can you read {p} for me?", "I want to see what {p} says", "open {p}"],
}
_LIST = {
    "train": ["list the files in {d}", "what files are in the {d} folder?", "ls {d}",
              "show the contents of directory {d}", "list directory {d}", "what is inside the folder {d}?"],
    "eval": ["which files are in {d}?", "list everything in the directory {d}", "show me the folder {d}",
             "give me a listing of {d}"],
}
_WRITE = {
    "train": ["save '{t}' to {p}", "write '{t}' into {p}", "put the text '{t}' in {p}",
              "create {p} containing '{t}'", "write the file {p} with '{t}'", "store '{t}' in {p}"],
    "eval": ["please save '{t}' in the file {p}", "overwrite {p} with '{t}'", "make a file {p} that says '{t}'",
             "write '{t}' to the file {p}"],
}
# chat: intent -> (canonical reply, train phrasings, eval phrasings).
_CHAT = {
    "greet": ("Hello! How can I help you?",
              ["hello", "hi there", "good morning", "hi", "hello, anyone there?", "hey", "good afternoon",
               "hello there!", "greetings", "hi, nice to meet you", "morning!", "hey, hello"],
              ["hey there", "good evening", "hello again"]),
    "thanks": ("You are welcome.",
               ["thanks!", "thank you very much", "thanks a lot", "thank you", "thanks so much",
                "thank you for helping", "much appreciated, thanks", "cheers, thanks", "great, thank you!",
                "thanks, that was helpful"],
               ["many thanks", "thank you so much!", "thanks for the help"]),
    "bye": ("Goodbye!",
            ["bye", "see you later", "goodbye", "bye for now", "bye bye", "I am leaving now, goodbye",
             "talk to you later", "see you next time", "good night, bye", "so long"],
            ["see you soon", "I have to go, bye", "goodbye and see you"]),
    "how": ("I am doing well, thank you.",
            ["how are you?", "how are you doing today?", "how is it going?", "how do you feel?",
             "are you well?", "how are you today?", "how is your day going?", "how are things going?",
             "everything good with you?", "how are you feeling?"],
            ["how are things?", "are you doing well?", "how have you been?"]),
    "who": ("I am a small tool-calling assistant.",
            ["who are you?", "what is your name?", "what are you?", "tell me your name",
             "who am I speaking with?", "introduce yourself", "what do people call you?", "who made you?",
             "are you a person?", "what kind of assistant are you?"],
            ["tell me who you are", "what should I call you?", "who am I talking to?"]),
    "can": ("I can do arithmetic and read, list and write files.",
            ["what can you do?", "help", "what are your skills?", "what do you do?", "how can you help?",
             "what are you good at?", "what tasks can you handle?", "show me what you can do",
             "what tools can you use?", "what help can you give me?"],
            ["what are you able to do?", "how can you help me?", "what tools do you have?"]),
}
_CAPITAL_TEMPLATES = {
    "train": ["what is the capital of {c}?", "name the capital of {c}", "capital of {c}?"],
    "eval": ["which city is the capital of {c}?", "tell me the capital of {c}"],
}
CAPITALS = {"France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid", "Japan": "Tokyo",
            "Egypt": "Cairo", "Canada": "Ottawa", "Peru": "Lima", "Kenya": "Nairobi", "Norway": "Oslo",
            "Poland": "Warsaw", "Greece": "Athens", "Chile": "Santiago", "Ireland": "Dublin"}

# Names. Extensions are shared (they mark a file); everything else is split.
_EXTENSIONS = ["txt", "md", "yaml", "json", "py", "csv", "log", "toml"]
_DIRS = {
    "train": ["notes", "src", "docs", "data", "config", "tests", "logs", "home", "tmp", "scripts", "assets",
              "lib", "build", "work", "images", "backup", "drafts", "inbox"],
    "eval": ["music", "reports", "archive", "media", "projects", "photos", "letters", "vendor", "recipes_2023",
             "q4-plans", "clients", "Invoices"],
}
_STEMS = {
    "train": ["todo", "config", "readme", "main", "notes", "list", "report", "greet", "hello", "data", "index",
              "setup", "plan", "ideas", "log", "summary", "budget", "test", "shopping", "draft", "utils", "app",
              "server", "client", "users", "orders", "items", "diary"],
    "eval": ["agenda", "recipes", "invoice", "contacts", "journal", "goals", "minutes", "schedule", "manifest",
             "tasks", "meeting_notes", "backlog-v2", "Changelog", "week42", "expenses"],
}
_WORDS = {
    "train": ["hello", "world", "buy", "milk", "call", "mom", "meeting", "at", "noon", "done", "the", "cat",
              "is", "asleep", "remember", "to", "water", "plants", "good", "night", "version", "two", "ship",
              "it", "fix", "bug", "soon", "red", "blue", "green", "apple", "bread", "coffee", "lunch"],
    "eval": ["pick", "up", "kids", "send", "invoice", "friday", "see", "you", "tomorrow", "happy", "birthday",
             "pay", "rent", "walk", "dog", "tea"],
}

_EVAL_NAMES = frozenset(n.lower() for pool in (_DIRS, _STEMS, _WORDS) for n in pool["eval"])

# --- the exact evaluator ------------------------------------------------------------------
class ExprError(ValueError):
    """A calc expression is not digits and + - * / ( ), or divides by zero."""


_EXPR_CHARS = frozenset("0123456789+-*/() ")


def eval_expr(expr: str) -> Fraction:
    """The exact value of an arithmetic expression over digits and + - * / ( ); ExprError otherwise."""
    bad = [i for i, c in enumerate(expr) if c not in _EXPR_CHARS]
    if bad:
        raise ExprError(f"calc expression {expr!r}: character {expr[bad[0]]!r} at offset {bad[0]} is not a digit "
                        "or one of + - * / ( )")
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as e:
        raise ExprError(f"calc expression {expr!r}: not well formed at offset {e.offset}") from None
    return _eval_node(tree.body, expr)


_BINOPS = {ast.Add: lambda x, y: x + y, ast.Sub: lambda x, y: x - y, ast.Mult: lambda x, y: x * y}


def _eval_node(node, expr: str) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _eval_node(node.operand, expr)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp):
        x, y = _eval_node(node.left, expr), _eval_node(node.right, expr)
        if isinstance(node.op, ast.Div):
            if y == 0:
                raise ExprError(f"calc expression {expr!r}: division by zero")
            return x / y
        if type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](x, y)
    # Only '//' and '**' can reach here given the character check; both are outside the language.
    raise ExprError(f"calc expression {expr!r}: unsupported construct {type(node).__name__}")


# --- generators: one per kind ---------------------------------------------------------------
def _pick_number(rng: random.Random, pool: list[int], lo: int, hi: int) -> int:
    """A number of the split's pool within lo..hi."""
    choices = [n for n in pool if lo <= n <= hi]
    return rng.choice(choices)


# Every word (split at '-') that training uses to say a number: 'forty-seven' is 'forty', 'seven'.
_TRAIN_NUMBER_WORDS = frozenset(w for n in NUMBER_POOLS["train"] if n <= 99 for w in number_words(n).split("-"))


def sayable(n: int) -> bool:
    """Can n be said in words made only of training's number words?

    A held-out 47 can ('forty' and 'seven' occur in training numbers), a held-out 13 cannot
    ('thirteen' is one word, never seen): nothing links that word to its digits.
    """
    return n <= 99 and set(number_words(n).split("-")) <= _TRAIN_NUMBER_WORDS


def _say(rng: random.Random, n: int) -> str:
    """A number as a task would mention it: in words half of the time when it can be, else in digits."""
    return number_words(n) if sayable(n) and rng.random() < 0.5 else str(n)


def _gen_calc_words(rng, split, pool) -> Example:
    task_t, expr_t = rng.choice(_CALC_WORDS[split])
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


def _random_expr(rng: random.Random, pool: list[int], n_operands: int) -> tuple[list[str], Fraction]:
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


def _gen_calc_symbols(rng, split, pool) -> Example:
    toks, value = _random_expr(rng, pool, rng.choice((2, 2, 3)))
    spaced = rng.random() < 0.7
    # Spaces between operators, none inside parentheses: "(5 + 7) * 3" or "(5+7)*3".
    shown = " ".join(toks).replace("( ", "(").replace(" )", ")") if spaced else "".join(toks)
    task = rng.choice(_CALC_SYMBOLS[split]).format(e=shown)
    return Example(task, "calc", {"expr": "".join(toks)}, "calc_symbols", value)


# Training names are mostly invented, fresh in almost every example, and cover every letter,
# digit and separator a name can hold: the only way to predict one is to copy it from the task,
# which is what lets the model copy a held-out name it has never seen. Evaluation names are real
# words (and a few compounds) from the held-out pools.
_POOL_FRACTION = 0.25          # a real word from the split's pool
_ONSETS = ("b c d f g h j k l m n p r s t v w y z b c d f g h k l m n p r s t "
           "bl br ch cl cr dr fl fr gl gr kn ph pl pr qu sc sh sk sl sm sn sp st str sw th tr tw wh wr").split()
_NUCLEI = "a e i o u a e i o u a e i o u y ai ea ee oo ou ie oa".split()
_CODAS = ("- - - - - - - - n r s t l m d k x ck ng nd nt st sh ch rt ll ss ve").split()
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_SEPARATORS = ("_", "-", "")
_MAX_NAME = 16


def _syllables(rng: random.Random) -> str:
    """A pronounceable invented word of 1-3 syllables ('strobik', 'quen', 'mailodst')."""
    parts = []
    for _ in range(rng.choice((1, 2, 2, 3))):
        coda = rng.choice(_CODAS)
        onset = rng.choice(_ONSETS) if rng.random() < 0.85 else ""
        parts.append(onset + rng.choice(_NUCLEI) + ("" if coda == "-" else coda))
    return "".join(parts)


def _letters(rng: random.Random) -> str:
    """A short string of uniformly random letters, 1-5 long ('qzx', 'mwbia')."""
    return "".join(rng.choice(_LETTERS) for _ in range(rng.randint(1, 5)))


def _invented(rng: random.Random, pool: list[str]) -> str:
    """One invented name: mostly pronounceable syllables (real names are words, and the pieces a
    word breaks into are what the model must learn to copy), sometimes random letters, or a
    compound with digits and separators."""
    r = rng.random()
    if r < 0.65:
        name = _syllables(rng)
    elif r < 0.75:
        name = _letters(rng)
    else:
        # Compounds: 'draft_2', 'v3-plan', 'kelo42', 'notes_old'.
        word = (lambda g: _syllables(g) if g.random() < 0.8 else _letters(g))
        first = word(rng) if rng.random() < 0.7 else rng.choice(pool)
        second = str(rng.randint(0, 9999 if rng.random() < 0.2 else 99)) if rng.random() < 0.6 else word(rng)
        if rng.random() < 0.3:
            first, second = second, first
        name = first + rng.choice(_SEPARATORS) + second
    shape = rng.random()
    if shape < 0.1:
        name = name.capitalize()
    elif shape < 0.12:
        name = name.upper()
    return name


def _name(rng: random.Random, split: str, pools: dict[str, list[str]]) -> str:
    if split == "eval" or rng.random() < _POOL_FRACTION:
        return rng.choice(pools[split])
    while True:
        name = _invented(rng, pools["train"])
        # Names as long as real ones (the eval names are 2-14 characters), never an eval name.
        if len(name) <= _MAX_NAME and name.lower() not in _EVAL_NAMES:
            return name


def _file_path(rng, split) -> str:
    stem = _name(rng, split, _STEMS) + "." + rng.choice(_EXTENSIONS)
    dirs = [_name(rng, split, _DIRS) for _ in range(rng.choice((0, 1, 1, 2)))]
    return "/".join(dirs + [stem])


def _dir_path(rng, split) -> str:
    return "/".join(_name(rng, split, _DIRS) for _ in range(rng.choice((1, 1, 2))))


def _gen_read(rng, split, pool) -> Example:
    p = _file_path(rng, split)
    return Example(rng.choice(_READ[split]).format(p=p), "read_file", {"path": p}, "read")


def _gen_list(rng, split, pool) -> Example:
    d = _dir_path(rng, split)
    return Example(rng.choice(_LIST[split]).format(d=d), "list_dir", {"path": d}, "list")


def _gen_write(rng, split, pool) -> Example:
    p = _file_path(rng, split)
    t = " ".join(_name(rng, split, _WORDS) for _ in range(rng.randint(1, 4)))
    task = rng.choice(_WRITE[split]).format(t=t, p=p)
    return Example(task, "write_file", {"path": p, "text": t}, "write")


def _gen_chat(rng, split, pool) -> Example:
    if rng.random() < 0.3:
        country = rng.choice(sorted(CAPITALS))
        task = rng.choice(_CAPITAL_TEMPLATES[split]).format(c=country)
        return Example(task, "answer", {"text": CAPITALS[country]}, "chat")
    reply, train, eval_ = _CHAT[rng.choice(sorted(_CHAT))]
    task = rng.choice(train if split == "train" else eval_)
    return Example(task, "answer", {"text": reply}, "chat")


_ECHO = ["say '{t}'", "reply with '{t}'", "answer '{t}'", "repeat after me: {t}", "just say {t}",
         "respond with the text '{t}'", "echo '{t}'", "tell me '{t}'"]


def _gen_echo(rng, split, pool) -> Example:
    if split != "train":
        raise ValueError("echo examples are training-only")
    t = " ".join(_name(rng, split, _WORDS) for _ in range(rng.randint(1, 4)))
    return Example(rng.choice(_ECHO).format(t=t), "answer", {"text": t}, "echo")


_GENERATORS = {"echo": _gen_echo, "calc_words": _gen_calc_words, "calc_symbols": _gen_calc_symbols, "read": _gen_read,
               "list": _gen_list, "write": _gen_write, "chat": _gen_chat}


def make_examples(n: int, seed: int, split: str = "train") -> list[Example]:
    """n examples of `split`, the same list for the same (n, seed, split)."""
    if split not in SPLITS:
        raise ValueError(f"make_examples: split must be one of {SPLITS}, got {split!r}")
    if n < 0:
        raise ValueError(f"make_examples: n must be >= 0, got {n}")
    # Mix the split into the seed so train and eval streams never coincide for one seed.
    rng = random.Random(f"{split}:{seed}")
    pool = sorted(NUMBER_POOLS[split])
    table = TRAIN_KIND_WEIGHTS if split == "train" else KIND_WEIGHTS
    kinds, weights = list(table), list(table.values())
    # One kind at a time, so the first k examples are the same whatever n is.
    return [_GENERATORS[rng.choices(kinds, weights)[0]](rng, split, pool) for _ in range(n)]


# --- judging a call -----------------------------------------------------------------------
def expected_result(example: Example):
    """What a right call must produce: calc -> the value (Fraction); file tools -> the path; answer -> the reply."""
    if example.tool == "calc":
        return example.answer
    if example.tool in ("read_file", "list_dir", "write_file"):
        return example.args["path"]
    return example.args["text"]


def judge(example: Example, text: str, registry: ToolRegistry | None = None) -> dict:
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


def template_pools(split: str) -> dict[str, frozenset[str]]:
    """Every template and name a split draws from, by pool name (for the disjointness tests)."""
    return {
        "calc_words": frozenset(t for t, _ in _CALC_WORDS[split]),
        "calc_symbols": frozenset(_CALC_SYMBOLS[split]),
        "read": frozenset(_READ[split]),
        "list": frozenset(_LIST[split]),
        "write": frozenset(_WRITE[split]),
        "chat": frozenset(p for _, train, eval_ in _CHAT.values() for p in (train if split == "train" else eval_)),
        "capital": frozenset(_CAPITAL_TEMPLATES[split]),
        "dirs": frozenset(_DIRS[split]),
        "stems": frozenset(_STEMS[split]),
        "words": frozenset(_WORDS[split]),
    }
