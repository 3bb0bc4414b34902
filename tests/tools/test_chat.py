"""Tool outputs in the chat template (core/tools/chat.py), with SmolLM2's real tokenizer and template."""

import pytest

from core.models import load_tokenizer
from core.tools.chat import tool_response_ids, tool_response_text


@pytest.fixture(scope="module")
def smollm2():
    return load_tokenizer("SmolLM2-135M-Instruct")


def test_chatml_closes_the_turn_carries_each_output_and_opens_the_next(smollm2):
    assert tool_response_text(smollm2, ["56088"]) == "<|im_end|>\n<|im_start|>tool\n56088<|im_end|>\n<|im_start|>assistant\n"
    assert tool_response_text(smollm2, ["a", "b"]).count("<|im_start|>tool\n") == 2


def test_the_ids_are_the_whole_conversation_s_tail(smollm2):
    """Appended after the assistant's content ids, the fragment gives the same ids as the template renders for the
    whole conversation (so the engine sees the conversation the template defines), and decodes back exactly."""
    ids = tool_response_ids(smollm2, ["56088"])
    assert smollm2.decode(ids) == tool_response_text(smollm2, ["56088"]) and ids[0] == smollm2.convert_tokens_to_ids("<|im_end|>")
    turn = "<tool_call>{\"name\": \"calculator\"}</tool_call>"
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": turn}, {"role": "tool", "content": "56088"}]
    whole = smollm2.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    head = smollm2.apply_chat_template(messages[:1], add_generation_prompt=True, tokenize=True, return_dict=False)
    assert head + smollm2(turn, add_special_tokens=False)["input_ids"] + ids == list(whole)
