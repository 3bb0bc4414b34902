"""Token in, token out (core/rollout/agent_server/conversation.py) with SmolLM2's tokenizer and three other families' templates
written for its vocabulary: each request's ids are the ids before it plus the template's text for what it adds; the
sampled ids are kept as sampled; and where re-rendering the conversation would have given other ids (the drift a
plain OpenAI server trains on) it is detected -- each case shown to drift, so the checks can fail."""

import pytest

from core.rollout.agent_server.conversation import Conversations, render_ids
from core.models import load_tokenizer
from tests.agent_server.templates import with_template

TOOLS = [{"name": "calculator", "description": "Evaluate arithmetic.",
          "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}]
QUESTION = [{"role": "system", "content": "Use the calculator."}, {"role": "user", "content": "What is 12 * 34?"}]


@pytest.fixture(scope="module")
def smollm2():
    return load_tokenizer("SmolLM2-135M-Instruct")


def eos_of(tok):
    return [tok.convert_tokens_to_ids(tok.eos_token)]


def call_reply(text: str) -> dict:
    """The assistant message the server returns for a turn that called the calculator."""
    return {"role": "assistant", "content": text or None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "12 * 34"}'}}]}


@pytest.mark.parametrize("family", ["smollm2", "qwen2.5", "llama3"])
def test_each_turn_extends_the_ids_before_it_and_keeps_the_sampled_ids(smollm2, family):
    tok = with_template(smollm2, family)
    conv = Conversations(tok, eos_of(tok))
    first = conv.prompt("t", QUESTION, TOOLS)
    assert first.parent is None and first.ids == render_ids(tok, [*QUESTION], TOOLS)
    # the model's turn: a tool call in its own words, stopped at </tool_call> (not at EOS)
    sampled = tok('<tool_call>{"name": "calculator", "arguments": {"expression": "12 * 34"}}</tool_call>',
                  add_special_tokens=False)["input_ids"]
    logps = [-0.5] * len(sampled)
    conv.reply(first, sampled, logps, [0] * len(sampled), call_reply(""))
    second = conv.prompt("t", [*QUESTION, call_reply(""), {"role": "tool", "tool_call_id": "call_1", "content": "408"}],
                         TOOLS)
    assert second.parent is not None and second.ids[:len(first.ids) + len(sampled)] == first.ids + sampled
    # what it adds is the template's own text for the tool answer and the next assistant header
    assert tok.decode(second.added).endswith(tok.decode(render_ids(tok, [{"role": "user", "content": "x"}], None)[-3:]))
    assert "408" in tok.decode(second.added)
    answer = tok("The answer is 408.", add_special_tokens=False)["input_ids"] + eos_of(tok)
    conv.reply(second, answer, [-0.1] * len(answer), [1] * len(answer), {"role": "assistant", "content": "The answer is 408."})
    (seg,) = conv.finished("t")
    t = seg.traj
    assert t.prompt == first.ids and t.prompt + t.tokens == second.ids + answer
    assert [x for x, m in zip(t.tokens, t.sampled) if m] == sampled + answer      # loss on the model's tokens only
    assert [lp for lp, m in zip(t.logps, t.sampled) if m] == logps + [-0.1] * len(answer)
    assert t.turns == 2 and t.num_calls == 1 and t.at_eos
    # every family re-renders this conversation differently from what the engine saw: its tool call comes back
    # as tool_calls (SmolLM2's template drops them; Qwen's and Llama's write their own JSON)
    assert second.drift and seg.drift == 1


def test_a_prefix_stable_conversation_does_not_drift(smollm2):
    """Plain replies ending at EOS, in SmolLM2's own template: the incremental ids are the re-rendered ones."""
    conv = Conversations(smollm2, eos_of(smollm2))
    p = conv.prompt("t", QUESTION)
    reply = smollm2("It is 408.", add_special_tokens=False)["input_ids"] + eos_of(smollm2)
    conv.reply(p, reply, [0.0] * len(reply), [0] * len(reply), {"role": "assistant", "content": "It is 408."})
    q = conv.prompt("t", [*QUESTION, {"role": "assistant", "content": "It is 408."}, {"role": "user", "content": "Sure?"}])
    assert not q.drift and q.ids == render_ids(smollm2, [*QUESTION, {"role": "assistant", "content": "It is 408."},
                                                         {"role": "user", "content": "Sure?"}], None)
    assert q.added[0] != eos_of(smollm2)[0]  # the sampled EOS closed the turn: the template's is not added again


def test_sampled_ids_that_retokenise_differently_are_kept_and_the_drift_detected(smollm2):
    """The engine may sample 'Hel' 'lo' where the tokenizer writes 'Hello': re-tokenising the reply would train on
    ids the policy never produced."""
    conv = Conversations(smollm2, eos_of(smollm2))
    p = conv.prompt("t", QUESTION)
    split = smollm2("Hel", add_special_tokens=False)["input_ids"] + smollm2("lo", add_special_tokens=False)["input_ids"]
    assert split != smollm2("Hello", add_special_tokens=False)["input_ids"]       # the case exists in this vocabulary
    reply = split + eos_of(smollm2)
    conv.reply(p, reply, [0.0] * len(reply), [0] * len(reply), {"role": "assistant", "content": "Hello"})
    q = conv.prompt("t", [*QUESTION, {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Go on."}])
    assert q.ids[len(p.ids):len(p.ids) + len(reply)] == reply and q.drift
    whole = render_ids(smollm2, [*QUESTION, {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Go on."}],
                       None)
    assert whole[len(p.ids):len(p.ids) + len(split)] != split                       # what re-rendering would train on


def test_a_template_that_is_not_prefix_stable_is_detected_and_the_ids_kept_exact(smollm2):
    tok = with_template(smollm2, "think")
    conv = Conversations(tok, eos_of(tok))
    p = conv.prompt("t", QUESTION)
    text = "<think>12 * 34 = 408</think> 408"
    reply = tok(text, add_special_tokens=False)["input_ids"] + eos_of(tok)
    conv.reply(p, reply, [0.0] * len(reply), [0] * len(reply), {"role": "assistant", "content": text})
    follow = [*QUESTION, {"role": "assistant", "content": text}, {"role": "user", "content": "And 12 * 35?"}]
    q = conv.prompt("t", follow)
    assert q.ids[:len(p.ids) + len(reply)] == p.ids + reply                       # the reasoning the model saw
    assert q.drift and "<think>" in tok.decode(q.ids) and "<think>" not in tok.decode(render_ids(tok, follow, None))


def test_rewritten_history_or_other_tools_start_a_new_segment_and_say_why(smollm2):
    conv = Conversations(smollm2, eos_of(smollm2))
    p = conv.prompt("t", QUESTION)
    reply = smollm2("408", add_special_tokens=False)["input_ids"] + eos_of(smollm2)
    conv.reply(p, reply, [0.0] * len(reply), [0] * len(reply), {"role": "assistant", "content": "408"})
    summary = [{"role": "system", "content": "Summary: the user asked for 12 * 34."}, {"role": "user", "content": "Again?"}]
    q = conv.prompt("t", summary)
    assert q.parent is None and q.split == "messages[0] differs from the trajectory's (history rewritten)"
    r = conv.prompt("t", [*QUESTION, {"role": "assistant", "content": "408"}, {"role": "user", "content": "ok"}], TOOLS)
    assert r.parent is None and r.split == "the request's tools differ from the trajectory's"
    conv.reply(q, reply, [0.0] * len(reply), [0] * len(reply), {"role": "assistant", "content": "408"})
    segs = conv.finished("t")
    assert len(segs) == 2 and [s.split for s in segs] == ["", q.split]


def test_two_replies_from_one_state_fork_it(smollm2):
    conv = Conversations(smollm2, eos_of(smollm2))
    p = conv.prompt("t", QUESTION)
    a, b = (smollm2(x, add_special_tokens=False)["input_ids"] + eos_of(smollm2) for x in ("408", "four hundred"))
    conv.reply(p, a, [-1.0] * len(a), [0] * len(a), {"role": "assistant", "content": "408"})
    conv.reply(p, b, [-2.0] * len(b), [0] * len(b), {"role": "assistant", "content": "four hundred"})
    # the agent goes on from the second choice: it extends the fork, not the first
    q = conv.prompt("t", [*QUESTION, {"role": "assistant", "content": "four hundred"}, {"role": "user", "content": "?"}])
    assert q.ids[len(p.ids):len(p.ids) + len(b)] == b
    one, two = conv.finished("t")
    assert one.traj.tokens == a and two.traj.tokens == b and two.traj.logps == [-2.0] * len(b)


def test_token_prompts_continue_the_record_they_extend(smollm2):
    conv = Conversations(smollm2, eos_of(smollm2))
    ids = smollm2("2 + 2 =", add_special_tokens=False)["input_ids"]
    p = conv.prompt_ids("t", ids)
    conv.reply(p, [33], [-0.3], [0], {"role": "assistant", "content": "4"})
    q = conv.prompt_ids("t", ids + [33, 30])
    assert q.parent is not None and q.added == [30]
    conv.reply(q, [34], [-0.2], [0], {"role": "assistant", "content": "5"})
    (seg,) = conv.finished("t")
    assert seg.traj.tokens == [33, 30, 34] and seg.traj.sampled == [1.0, 0.0, 1.0]


def test_a_malformed_message_is_named(smollm2):
    conv = Conversations(smollm2, eos_of(smollm2))
    with pytest.raises(ValueError, match=r"messages\[1\]: a message needs a \"role\" string"):
        conv.prompt("t", [QUESTION[0], {"content": "no role"}])
    with pytest.raises(ValueError, match=r"messages\[0\]: tool_calls"):
        conv.prompt("t", [{"role": "assistant", "content": "", "tool_calls": [{"function": "x"}]}])
    assert conv.segments == {}
