"""SFT conversations as ids and a loss mask (core/sft/data.py) with real chat templates (SmolLM2's own, Llama-3's
and a Qwen3-like one written for SmolLM2's vocabulary): the assistant's tokens only are trained, tool answers and
the template's headers are context, a template that is not prefix-stable is refused naming the row and turn, and
verl's single-turn columns and OpenAI messages rows read alike."""

import json

import pytest

from core.models import load_tokenizer
from core.sft import conversation_sample, conversations, read_rows
from tests.agent_server.templates import with_template

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*7"}}\n</tool_call>'
TRACE = [{"role": "system", "content": "Use the calculator."}, {"role": "user", "content": "What is 12 * 7?"},
         {"role": "assistant", "content": CALL}, {"role": "tool", "content": "84"},
         {"role": "assistant", "content": "The answer is 84."}]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("SmolLM2-135M-Instruct")


def trained_text(tokenizer, sample) -> str:
    return tokenizer.decode([t for t, m in zip(sample.ids, sample.mask) if m])


def test_only_the_assistant_turns_and_their_end_of_turn_token_are_trained(tok):
    s = conversation_sample(tok, TRACE)
    # SmolLM2's turns are delimited by special tokens: nothing merges across them, its whole render gives these ids
    assert s.ids == tok.apply_chat_template(TRACE, tokenize=True, return_dict=False)
    assert trained_text(tok, s) == CALL + "<|im_end|>" + "The answer is 84.<|im_end|>"
    # the tool's answer, the user's question and every header are context
    context = tok.decode([t for t, m in zip(s.ids, s.mask) if not m])
    assert "84<|im_end|>" in context and "What is 12 * 7?" in context and context.count("<|im_start|>assistant") == 2


def test_a_turn_is_tokenised_as_the_model_writes_it_after_its_prompt(tok):
    """Llama-3's template: tokenising the whole text merges the header's ``\n\n`` with the reply's opening ``<``,
    ids the model never meets at inference (its prompt ends at ``\n\n``; it writes ``<tool_call>`` after it). The
    sample is the prompt's ids, then the turn's own."""
    llama = with_template(tok, "llama3")
    s = conversation_sample(llama, TRACE[:3], eos_ids=[llama.convert_tokens_to_ids("<|eot_id|>")])
    assert trained_text(llama, s) == CALL + "<|eot_id|>"
    prompt = llama.apply_chat_template(TRACE[:2], add_generation_prompt=True, tokenize=True, return_dict=False)
    turn = llama(CALL + "<|eot_id|>", add_special_tokens=False)["input_ids"]
    assert s.ids == prompt + turn and s.mask == [0] * len(prompt) + [1] * len(turn)
    whole = llama.apply_chat_template(TRACE[:3], tokenize=True, return_dict=False)
    assert whole != s.ids and llama.decode(whole) == llama.decode(s.ids)  # the same text, other ids at the seam


def test_a_template_that_is_not_prefix_stable_is_refused_naming_the_row_and_turn(tok):
    think = with_template(tok, "think")
    reasoned = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "<think>two and two</think>4"},
                {"role": "user", "content": "and 3+3?"}, {"role": "assistant", "content": "6"}]
    with pytest.raises(ValueError, match=r"train\.jsonl row 7: the chat template is not prefix-stable at "
                                         r"messages\[3\]"):
        conversation_sample(think, reasoned, where="train.jsonl row 7")
    # up to its first answer it is stable: trained as the reasoning and the answer
    assert trained_text(think, conversation_sample(think, reasoned[:2])) == "<think>two and two</think>4<|im_end|>"


def test_verl_columns_and_openai_messages_rows_read_alike(tok, tmp_path):
    rows = [{"extra_info": {"question": "What is 12 * 7?", "answer": "84"}, "data_source": "x"},
            {"messages": [{"role": "user", "content": "What is 12 * 7?"}, {"role": "assistant", "content": "84"}]}]
    path = tmp_path / "sft.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    read = read_rows(path)
    with pytest.raises(ValueError, match=r"sft\.jsonl row 0: neither a 'messages' column nor 'prompt' and 'response'"):
        conversations(read, "sft.jsonl")
    (a, _), (b, _) = conversations(read, "sft.jsonl", prompt_key="extra_info", response_key="extra_info",
                                   prompt_dict_key="question", response_dict_key="answer")
    assert a == b
    assert conversation_sample(tok, a) == conversation_sample(tok, b)


def test_bad_rows_are_named(tok, tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"messages": []}\n{"messages": \n')
    with pytest.raises(ValueError, match=r"broken\.jsonl:2: not valid JSON"):
        read_rows(path)
    with pytest.raises(ValueError, match="row 3: no assistant turn"):
        conversation_sample(tok, [{"role": "user", "content": "hi"}], where="row 3")
