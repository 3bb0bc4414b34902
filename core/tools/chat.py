"""How tool outputs enter an agent's token stream, in the model's own chat template.

After a model turn that called tools, the rollout appends the template's tokens that close the assistant turn,
carry each tool's output as a ``tool`` message, and open the next assistant turn. Those tokens are made once per
tool answer from the template's text and appended to the ids the engine already holds: the history is never
re-tokenised (re-tokenising can merge tokens across the boundary and so change what the log-probs are of).
"""

from __future__ import annotations

_MARK = "\u2063TURN\u2063"  # invisible separator + a word: no template or tokenizer produces it on its own


def continuation_text(tokenizer, messages: list[dict]) -> str:
    """The template text between the end of an assistant turn's content and the start of the next assistant turn's
    content, with ``messages`` between them (tool answers, a user turn). Example (ChatML, SmolLM2 / Qwen-style):
    [{"role": "tool", "content": "56088"}] -> '<|im_end|>\\n<|im_start|>tool\\n56088<|im_end|>\\n<|im_start|>assistant\\n'."""
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "q"}, {"role": "assistant", "content": _MARK},
                                              *messages], add_generation_prompt=True, tokenize=False)
    if rendered.count(_MARK) != 1:
        raise ValueError("the chat template does not render the assistant's content verbatim; what follows a turn "
                         "cannot be placed after it")
    return rendered.split(_MARK, 1)[1]


def tool_response_text(tokenizer, outputs: list[str]) -> str:
    """``continuation_text`` with one ``tool`` message per output: ['56088'] ->
    '<|im_end|>\\n<|im_start|>tool\\n56088<|im_end|>\\n<|im_start|>assistant\\n'."""
    return continuation_text(tokenizer, [{"role": "tool", "content": text} for text in outputs])


def tool_response_ids(tokenizer, outputs: list[str]) -> list[int]:
    """``tool_response_text`` as token ids (no BOS), to append after the model's turn; the loss masks them."""
    return tokenizer(tool_response_text(tokenizer, outputs), add_special_tokens=False)["input_ids"]
