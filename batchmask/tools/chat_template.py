"""Chat templates rendered as transformers renders them: the implementation lives beside the tokenizers, which read
the templates and render them to find a model's end-of-turn token (batchmask.models.chat_template; models/ never
imports the grammar side). This name is what the prompt side imports."""
from batchmask.models.chat_template import (
    SPECIAL_TOKEN_FIELDS,
    ChatTemplateError,
    compile_template,
    normalize_messages,
    pick_template,
    plain,
    render,
    special_tokens,
)

__all__ = ["SPECIAL_TOKEN_FIELDS", "ChatTemplateError", "compile_template", "normalize_messages", "pick_template",
           "plain", "render", "special_tokens"]
