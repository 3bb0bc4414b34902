"""Chat templates of other model families, written for SmolLM2's vocabulary with their special tokens added (no
hub): Qwen2.5's (tools in the system prompt, tool calls rendered from ``tool_calls``, consecutive tool answers in one
user turn), Llama-3's (header tokens, ``<|eot_id|>``, content trimmed), and a Qwen3-like one that is not prefix-stable
(earlier assistant turns lose their reasoning once a later user turn exists)."""

import copy

QWEN25 = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{% if messages[0].role == 'system' %}{{- messages[0].content }}"
    "{% else %}{{- 'You are a helpful assistant.' }}{% endif %}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided "
    "with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{% for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{% endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) or "
    "(message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant' }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tc in message.tool_calls %}{{- '\\n<tool_call>\\n{\"name\": \"' + tc.function.name + '\", "
    "\"arguments\": ' }}{{- tc.function.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")

LLAMA3 = (
    "{{- '<|begin_of_text|>' }}{%- if tools %}{{- '<|start_header_id|>system<|end_header_id|>\\n\\nYou can call "
    "these functions; answer with {\"name\": function name, \"parameters\": arguments}:\\n' }}"
    "{%- for tool in tools %}{{- tool | tojson }}{{- '\\n' }}{%- endfor %}{{- '<|eot_id|>' }}{%- endif %}"
    "{%- for message in messages %}{%- set role = 'ipython' if message.role == 'tool' else message.role %}"
    "{{- '<|start_header_id|>' + role + '<|end_header_id|>\\n\\n' }}"
    "{%- if message.tool_calls %}{%- for tc in message.tool_calls %}{{- '{\"name\": \"' + tc.function.name + "
    "'\", \"parameters\": ' }}{{- tc.function.arguments | tojson }}{{- '}' }}{%- endfor %}"
    "{%- else %}{{- message.content | trim }}{%- endif %}{{- '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}")

# Qwen3's rule: an assistant turn before the last user message renders without its <think>...</think>
THINK = (
    "{%- set last_user = namespace(i=-1) %}{%- for m in messages %}{%- if m.role == 'user' %}"
    "{%- set last_user.i = loop.index0 %}{%- endif %}{%- endfor %}"
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.role == 'assistant' and loop.index0 < last_user.i and '</think>' in message.content %}"
    "{{- message.content.split('</think>')[-1].lstrip() }}{%- else %}{{- message.content }}{%- endif %}"
    "{{- '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def with_template(tokenizer, name: str):
    """A copy of SmolLM2's tokenizer speaking the named family's template, its special tokens added (ids past
    SmolLM2's 49152: a model for it needs its embeddings resized)."""
    tok = copy.deepcopy(tokenizer)
    if name == "qwen2.5":
        tok.add_tokens(["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"])
        tok.chat_template = QWEN25
    elif name == "llama3":
        tok.add_special_tokens({"additional_special_tokens": ["<|begin_of_text|>", "<|start_header_id|>",
                                                              "<|end_header_id|>", "<|eot_id|>"]})
        tok.chat_template = LLAMA3
        tok.eos_token = "<|eot_id|>"
    elif name == "think":
        tok.chat_template = THINK
    elif name != "smollm2":
        raise ValueError(name)
    return tok
