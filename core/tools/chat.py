"""How tool outputs enter an agent's token stream, in the model's own chat template.

After a model turn that called tools, the rollout appends the template's tokens that close the assistant turn,
carry each tool's output as a ``tool`` message, and open the next assistant turn. Those tokens are made once per
tool answer from the template's text and appended to the ids the engine already holds: the history is never
re-tokenised (re-tokenising can merge tokens across the boundary and so change what the log-probs are of).
"""

from __future__ import annotations

_MARK = "\u2063TURN\u2063"  # invisible separator + a word: no template or tokenizer produces it on its own


def tool_response_text(tokenizer, outputs: list[str]) -> str:
    """The template text between the end of the assistant's content and the start of its next turn's content,
    with one ``tool`` message per output. Example (ChatML, SmolLM2 / Qwen-style): ['56088'] ->
    '<|im_end|>\\n<|im_start|>tool\\n56088<|im_end|>\\n<|im_start|>assistant\\n'."""
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": _MARK}]
    messages += [{"role": "tool", "content": text} for text in outputs]
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    if rendered.count(_MARK) != 1:
        raise ValueError("the chat template does not render the assistant's content verbatim; tool outputs cannot "
                         "be placed after it")
    return rendered.split(_MARK, 1)[1]


def tool_response_ids(tokenizer, outputs: list[str]) -> list[int]:
    """``tool_response_text`` as token ids (no BOS), to append after the model's turn; the loss masks them."""
    return tokenizer(tool_response_text(tokenizer, outputs), add_special_tokens=False)["input_ids"]
