"""The default model's training split: training phrasings, real-word names, invented names, and `echo`.

    >>> from recipes.default_model.tasks import make_train_examples
    >>> make_train_examples(1, seed=0)[0].task
    "put the text 'Ploa done' in stret/eemu/Myst.txt"

The generator and the held-out eval split live in the library (batchmask/evaluation/taskgen.py, which
`batchmask ablate` uses); this module only says what training draws from. Training shares none of
the eval split's phrasings, numbers or names (tests/test_taskgen.py checks it), so evaluation
measures generalisation:
- names: three training names in four are invented afresh (syllables, random letters, compounds with
  digits, `_` and `-`, some capitalised) and never equal an eval name: predicting one is only possible
  by copying it from the task, which is the skill that carries over to a held-out name;
- `echo` ("say 'blue kelo7'" -> answer("blue kelo7")): pure copying of arbitrary text, a drill for the
  one skill every argument needs. It is not evaluated (it would flatter the argument figure).

The draws are those the shipped model was trained on: the same (n, seed) gives the same examples
as the generator of that training run, draw for draw (tests/test_taskgen.py compares them).
"""
from __future__ import annotations

import random
from collections.abc import Sequence

from batchmask.evaluation.taskgen import (
    EVAL_NAMES,
    KIND_TOOL,
    KIND_WEIGHTS,
    NUMBER_POOLS,
    Example,
    TaskSplit,
    make_examples,
    split_name,
)

# Evaluated kinds keep their weights; echo is added (last: the order of kinds is part of the stream).
TRAIN_KIND_WEIGHTS = KIND_WEIGHTS | {"echo": 15}
TRAIN_KIND_TOOL = KIND_TOOL | {"echo": "answer"}

# --- invented names ---------------------------------------------------------------------------
# Training names are mostly invented, fresh in almost every example, and cover every letter,
# digit and separator a name can hold: the only way to predict one is to copy it from the task,
# which is what lets the model copy a held-out name it has never seen.
_POOL_FRACTION = 0.25          # a real word from the training pool
_ONSETS = ("b c d f g h j k l m n p r s t v w y z b c d f g h k l m n p r s t "
           "bl br ch cl cr dr fl fr gl gr kn ph pl pr qu sc sh sk sl sm sn sp st str sw th tr tw wh wr").split()
_NUCLEI = "a e i o u a e i o u a e i o u y ai ea ee oo ou ie oa".split()
_CODAS = ("- - - - - - - - n r s t l m d k x ck ng nd nt st sh ch rt ll ss ve").split()
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_SEPARATORS = ("_", "-", "")
MAX_NAME = 16                  # as long as real names (the eval names are 2-14 characters)


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


def _word(rng: random.Random) -> str:
    return _syllables(rng) if rng.random() < 0.8 else _letters(rng)


def invented_name(rng: random.Random, pool: Sequence[str]) -> str:
    """One invented name: mostly pronounceable syllables (real names are words, and the pieces a
    word breaks into are what the model must learn to copy), sometimes random letters, or a
    compound with digits and separators (`pool`'s real words may be one half of it)."""
    r = rng.random()
    if r < 0.65:
        name = _syllables(rng)
    elif r < 0.75:
        name = _letters(rng)
    else:
        # Compounds: 'draft_2', 'v3-plan', 'kelo42', 'notes_old'.
        first = _word(rng) if rng.random() < 0.7 else rng.choice(pool)
        second = str(rng.randint(0, 9999 if rng.random() < 0.2 else 99)) if rng.random() < 0.6 else _word(rng)
        if rng.random() < 0.3:
            first, second = second, first
        name = first + rng.choice(_SEPARATORS) + second
    shape = rng.random()
    if shape < 0.1:
        name = name.capitalize()
    elif shape < 0.12:
        name = name.upper()
    return name


def training_name(rng: random.Random, pool: Sequence[str]) -> str:
    """A real training word a quarter of the time, else a fresh invented name that is no eval name."""
    if rng.random() < _POOL_FRACTION:
        return rng.choice(pool)
    while True:
        name = invented_name(rng, pool)
        if len(name) <= MAX_NAME and name.lower() not in EVAL_NAMES:
            return name


# --- echo -------------------------------------------------------------------------------------
_ECHO = ("say '{t}'", "reply with '{t}'", "answer '{t}'", "repeat after me: {t}", "just say {t}",
         "respond with the text '{t}'", "echo '{t}'", "tell me '{t}'")


def _gen_echo(rng: random.Random, split: TaskSplit, pool: Sequence[int]) -> Example:
    t = " ".join(split_name(rng, split, "words") for _ in range(rng.randint(1, 4)))
    return Example(rng.choice(_ECHO).format(t=t), "answer", {"text": t}, "echo")


# --- the training split -----------------------------------------------------------------------
TRAIN = TaskSplit(
    name="train",
    kind_weights=TRAIN_KIND_WEIGHTS,
    numbers=NUMBER_POOLS["train"],
    calc_words=(
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
    ),
    calc_symbols=("compute {e}", "what is {e}?", "calculate {e}", "{e} = ?", "how much is {e}?", "evaluate {e}"),
    read=("show me {p}", "open the file {p}", "read {p}", "print the contents of {p}", "what is in {p}?",
          "cat {p}", "read the file {p} please", "show the file {p}"),
    listing=("list the files in {d}", "what files are in the {d} folder?", "ls {d}",
             "show the contents of directory {d}", "list directory {d}", "what is inside the folder {d}?"),
    write=("save '{t}' to {p}", "write '{t}' into {p}", "put the text '{t}' in {p}",
           "create {p} containing '{t}'", "write the file {p} with '{t}'", "store '{t}' in {p}"),
    chat={
        "greet": ("hello", "hi there", "good morning", "hi", "hello, anyone there?", "hey", "good afternoon",
                  "hello there!", "greetings", "hi, nice to meet you", "morning!", "hey, hello"),
        "thanks": ("thanks!", "thank you very much", "thanks a lot", "thank you", "thanks so much",
                   "thank you for helping", "much appreciated, thanks", "cheers, thanks", "great, thank you!",
                   "thanks, that was helpful"),
        "bye": ("bye", "see you later", "goodbye", "bye for now", "bye bye", "I am leaving now, goodbye",
                "talk to you later", "see you next time", "good night, bye", "so long"),
        "how": ("how are you?", "how are you doing today?", "how is it going?", "how do you feel?",
                "are you well?", "how are you today?", "how is your day going?", "how are things going?",
                "everything good with you?", "how are you feeling?"),
        "who": ("who are you?", "what is your name?", "what are you?", "tell me your name",
                "who am I speaking with?", "introduce yourself", "what do people call you?", "who made you?",
                "are you a person?", "what kind of assistant are you?"),
        "can": ("what can you do?", "help", "what are your skills?", "what do you do?", "how can you help?",
                "what are you good at?", "what tasks can you handle?", "show me what you can do",
                "what tools can you use?", "what help can you give me?"),
    },
    capital=("what is the capital of {c}?", "name the capital of {c}", "capital of {c}?"),
    names={
        "dirs": ("notes", "src", "docs", "data", "config", "tests", "logs", "home", "tmp", "scripts", "assets",
                 "lib", "build", "work", "images", "backup", "drafts", "inbox"),
        "stems": ("todo", "config", "readme", "main", "notes", "list", "report", "greet", "hello", "data", "index",
                  "setup", "plan", "ideas", "log", "summary", "budget", "test", "shopping", "draft", "utils", "app",
                  "server", "client", "users", "orders", "items", "diary"),
        "words": ("hello", "world", "buy", "milk", "call", "mom", "meeting", "at", "noon", "done", "the", "cat",
                  "is", "asleep", "remember", "to", "water", "plants", "good", "night", "version", "two", "ship",
                  "it", "fix", "bug", "soon", "red", "blue", "green", "apple", "bread", "coffee", "lunch"),
    },
    pick_name=training_name,
    extra_generators={"echo": _gen_echo},
)


def make_train_examples(n: int, seed: int) -> list[Example]:
    """n training examples, the same list for the same (n, seed); the first k do not depend on n."""
    return make_examples(n, seed, TRAIN)
