"""Tokenizer directories with chat templates for the chat-format tests (written for these tests, in the style
of the models' own templates), and a copy of Qwen2's vocabulary that carries Qwen2.5's added tool-call tokens."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from data_paths import data_dir

# Llama 3.1 style: BOS as text, a dated system header (strftime_now), tools as indented JSON in the first user
# turn, namespace / loop controls, raise_exception on a role it does not know.
LLAMA31_STYLE = """{{- bos_token }}
{%- if not date_string is defined %}{%- set date_string = strftime_now("%d %b %Y") %}{%- endif %}
{%- set ns = namespace(system="", seen=0) %}
{%- if messages[0]['role'] == 'system' %}
    {%- set ns.system = messages[0]['content'] | trim %}
    {%- set messages = messages[1:] %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none %}{{- "Environment: ipython\\n" }}{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- ns.system }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if message.role not in ['user', 'assistant', 'tool'] %}
        {{- raise_exception("unknown role " + message.role) }}
    {%- endif %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}
    {%- if message.role == 'user' and tools is not none and ns.seen == 0 %}
        {%- set ns.seen = 1 %}
        {{- "Given the following functions, please respond with a JSON for a function call with its proper "
            "arguments that best answers the given prompt.\\n\\n" }}
        {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its '
            'value}. Do not use variables.\\n\\n' }}
        {%- for t in tools %}
            {{- t | tojson(indent=4) }}
            {{- "\\n\\n" }}
        {%- endfor %}
    {%- endif %}
    {{- message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}
"""

# Hermes / Qwen2.5 style: ChatML turns, tools one JSON object per line inside <tools></tools>.
HERMES_STYLE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}
    {%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
        "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": "
        "<args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- elif messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if loop.first and message.role == 'system' %}{% continue %}{% endif %}
    {%- generation %}
    {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- endgeneration %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""


def tokenizer_dir(path: Path, vocab: str, template: str | None, **config) -> Path:
    """`path` holding a copy of the shared `vocab` tokenizer.json and a tokenizer_config.json with `template`."""
    path.mkdir(parents=True, exist_ok=True)
    shutil.copy(data_dir(vocab) / "tokenizer.json", path / "tokenizer.json")
    cfg = json.loads((data_dir(vocab) / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    if template is not None:
        cfg["chat_template"] = template
    cfg.update(config)
    (path / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1))
    return path


def qwen25_tool_tokens(path: Path, template: str | None = HERMES_STYLE) -> Path:
    """The Qwen2 vocabulary with two padding ids turned into Qwen2.5's added, non-special <tool_call> and
    </tool_call> tokens (same ids as Qwen2.5: 151657, 151658), chat end token <|im_end|>."""
    tokenizer_dir(path, "qwen2", template, eos_token="<|im_end|>")
    spec = json.loads((path / "tokenizer.json").read_text())
    for t in spec["added_tokens"]:
        if t["id"] in (151657, 151658):
            t.update(content="<tool_call>" if t["id"] == 151657 else "</tool_call>", special=False)
    (path / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False))
    return path
