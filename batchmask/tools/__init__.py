"""The tool side: what a user's tools are, how a call to one is written, and how a prompt shows them.

In: tool files and objects (native, OpenAI, MCP, Anthropic). Out: a ToolRegistry, the node tree of a call in a
format (envelope.py, built on batchmask.schema and batchmask.grammar), prompts, and calls parsed back.

    registry.py       ToolRegistry, Tool, ToolArg (`from_json`, `defaults`); RegistryError is batchmask.errors'
    envelope.py       the call formats (seed, json, llama3, hermes) as data; `registry_node`; `Envelope.parse`
    prompt.py         the compact prompt protocol (`Tools:` catalogue, `TASK:`, `CALL: `) and the call parser
    choice.py         tool_choice / parallel_tool_calls as OpenAI means them: one reply grammar per choice
    calls.py          replies read back in OpenAI's shape (content, tool_calls with stable ids, finish_reason)
    bfcl.py           BFCL's function docs and question lines read as BFCL's own OpenAI conversion reads them
    chat_template.py  chat templates, as the prompt side imports them (implemented in batchmask.models)

Public names: batchmask.tools.registry.{ToolRegistry, Tool, ToolArg}, batchmask.tools.envelope.{ENVELOPES,
FORMATS, get_envelope, registry_node}, batchmask.tools.prompt.{render_prompt, encode_prompt, parse_call},
batchmask.tools.choice.{ToolChoice, resolve_choice, check_choice, reply_node},
batchmask.tools.calls.{parse_reply, parse_calls, reply_fields}.
"""
