"""Chat templates rendered exactly as transformers' `apply_chat_template(..., tokenize=False)` renders them.

A model's `tokenizer_config.json` (or `chat_template.jinja`) holds a Jinja template that turns a conversation
(and, for tool-calling models, the tool list) into the text the model was trained on. transformers renders it
in a sandboxed environment with a fixed set of options and helpers; the text must come out identical here, or
the model sees a prompt it was never trained on. What transformers does, and so what this module does:

  * `ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)` with the `loopcontrols` extension
    ({% break %}, {% continue %}) and a `{% generation %}...{% endgeneration %}` block (it only marks the
    assistant's text for training masks; rendered as its body);
  * `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)` as json.dumps (Jinja's own
    filter escapes HTML characters), `raise_exception(msg)`, `strftime_now(fmt)` (today, local time),
    `dict(...)` and a `namespace(...)` that refuses underscore-prefixed names;
  * the variables: `messages` (keys whose value is None dropped), `tools`, `documents`,
    `add_generation_prompt`, and the tokenizer's named special tokens (bos_token, eos_token, unk_token, ...)
    as strings.

Only the rendering lives here (beside the tokenizers: models/tokenizer_hf.py reads the template and uses
`render` to find the end-of-turn token); the prompt (which messages, which tools) is batchmask.tools.prompt's, which
imports this module as batchmask.tools.chat_template.
"""
from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache

# transformers' PreTrainedTokenizerBase.SPECIAL_TOKENS_ATTRIBUTES: the named special tokens a template sees
SPECIAL_TOKEN_FIELDS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class ChatTemplateError(ValueError):
    """A chat template that does not compile, or that refused the conversation (its raise_exception)."""


# --- the environment ----------------------------------------------------------------------------------------
def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=1)
def _environment():
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    import jinja2.utils
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """{% generation %}BODY{% endgeneration %} renders BODY (transformers tracks its span for masks)."""
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    class Namespace(jinja2.utils.Namespace):
        """namespace(...) without underscore-prefixed attributes (they lead to CPython internals)."""

        def __init__(*args, **kwargs):                     # noqa: N805 - jinja's own signature trick
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"chat templates cannot store underscore-prefixed attributes "
                                                      f"on a namespace, got {name!r}")

    class Dict:
        """dict(...) for templates, without the class itself (no attribute access to type internals)."""

        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=_strftime_now, dict=Dict(), namespace=Namespace)
    return env


@lru_cache(maxsize=16)
def compile_template(source: str):
    """The template compiled once per distinct text (a jinja2.Template); ChatTemplateError if it does not parse."""
    import jinja2
    try:
        return _environment().from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise ChatTemplateError(f"chat template line {e.lineno}: {e.message}") from None


# --- rendering ----------------------------------------------------------------------------------------------
def plain(value):
    """Only JSON types reach the template (transformers' rule): subclasses become their base type."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    return f"<{type(value).__name__}>"


def normalize_messages(messages) -> list[dict]:
    """Messages as transformers hands them over: dicts, keys whose value is None dropped."""
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ChatTemplateError(f"message {i}: a message is an object with \"role\" and \"content\", "
                                    f"got {type(m).__name__}")
        out.append({k: v for k, v in m.items() if v is not None})
    return out


def render(template: str, messages, *, tools: list | None = None, documents: list | None = None,
           add_generation_prompt: bool = False, **variables) -> str:
    """The template's text for this conversation, as transformers' apply_chat_template(tokenize=False).

    `variables`: the special-token strings (see `special_tokens`) and any extra template variable."""
    import jinja2
    compiled = compile_template(template)
    try:
        return compiled.render(messages=plain(normalize_messages(messages)), tools=plain(tools),
                               documents=plain(documents), add_generation_prompt=add_generation_prompt,
                               **plain(variables))
    except jinja2.exceptions.TemplateError as e:      # raise_exception(...) and the template's own errors
        raise ChatTemplateError(f"the chat template refused the conversation: {e}") from None


def special_tokens(tokenizer) -> dict[str, str]:
    """The named special tokens a template sees (transformers' special_tokens_map): the tokenizer's bos/eos
    strings, and the other named ones from tokenizer_config.json beside it (read once per tokenizer)."""
    directory = getattr(tokenizer, "directory", None)
    own = (getattr(tokenizer, "bos_token", None), getattr(tokenizer, "eos_token", None), directory)
    cached = getattr(tokenizer, "_chat_special_tokens", None)
    if cached is not None and cached[0] == own:            # the same strings and directory as when it was read
        return dict(cached[1])
    found: dict[str, str] = {}
    cfg_path = directory / "tokenizer_config.json" if directory is not None else None
    if cfg_path is not None and cfg_path.is_file():
        try:
            cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            cfg = {}                                       # the tokenizer loader reports a broken file itself
        for name in SPECIAL_TOKEN_FIELDS:
            value = cfg.get(name) if isinstance(cfg, dict) else None
            if isinstance(value, dict):
                value = value.get("content")
            if isinstance(value, str):
                found[name] = value
    for name in ("bos_token", "eos_token"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, str):
            found[name] = value
    out = {name: found[name] for name in SPECIAL_TOKEN_FIELDS if name in found}
    try:
        tokenizer._chat_special_tokens = (own, out)
    except AttributeError:                                 # a tokenizer object that takes no new attributes
        pass
    return dict(out)


def pick_template(tokenizer, tools) -> str | None:
    """The tokenizer's template for this call: a "tool_use" template when there are tools and it has one
    (transformers' choice among named templates), else its default one; None if it has none."""
    named = getattr(tokenizer, "chat_templates", None) or {}
    if tools and isinstance(named.get("tool_use"), str):
        return named["tool_use"]
    template = getattr(tokenizer, "chat_template", None)
    return template if isinstance(template, str) else None
