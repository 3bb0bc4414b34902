"""Multi-turn agent rollouts (core/rollout/agent_loop.py) through the real embedded engine and SmolLM2-135M-Instruct with a
real calculator in the sandbox: the token stream is what the engine saw, the masks cover exactly the model's
tokens, and the rollout's log-probs of those tokens equal a plain transformers forward of the whole stream."""

import pytest
import torch

from core.rollout.agent_loop import agent_generate
from core.config import AgentConfig
from core.config.algo import SamplingParams
from core.rollout.engine import RolloutEngine
from core.models import load_causal_lm, load_tokenizer
from core.tools.chat import tool_response_text

ONE_SHOT = [{"role": "system", "content": "You have a calculator. To use it, write <tool_call>{\"name\": \"calculator\", "
                                          "\"arguments\": {\"expression\": \"...\"}}</tool_call> and wait for the result."},
            {"role": "user", "content": "What is 12 * 34?"},
            {"role": "assistant", "content": "<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": \"12 * 34\"}}</tool_call>"},
            {"role": "tool", "content": "408"},
            {"role": "assistant", "content": "The answer is 408."}]
TEMPERATURE = 0.7


def recording(engine, seen):
    """The engine's session, its ``add`` keeping the ids each turn was given (as ``generate`` below does)."""
    def session(prompts, params, max_len):
        run = engine.session(prompts, params, max_len)
        add = run.add

        def recorded_add(ids, max_new_tokens, seed):
            seen.append(([list(ids)], params))
            return add(ids, max_new_tokens, seed)

        run.add = recorded_add
        return run
    return session


@pytest.fixture(scope="module", params=["continuous", "turn-synchronous"])
def rollout(request):
    tok = load_tokenizer("SmolLM2-135M-Instruct")
    model = load_causal_lm("SmolLM2-135M-Instruct", torch.float32)
    engine = RolloutEngine(model, tok, pack_weights=False)
    prompts = [tok.apply_chat_template(ONE_SHOT + [{"role": "user", "content": f"What is {a} * {b}?"}],
                                       add_generation_prompt=True, tokenize=True, return_dict=False)
               for a, b in ((123, 456), (87, 65), (902, 31), (44, 78))]
    seen = []

    def generate(ids, params):  # the engine itself; the ids it was given are kept for the checks below
        seen.append((ids, params))
        return engine.generate(ids, params)

    cfg = AgentConfig(max_turns=3, max_response_tokens=160, tools=("calculator",), tool_timeout_s=5.0)
    params = SamplingParams(n=2, temperature=TEMPERATURE, max_new_tokens=48, seed=3)
    session = recording(engine, seen) if request.param == "continuous" else None
    batch = agent_generate(generate, tok, engine.eos_ids, engine.pad_id, prompts, params, cfg, session=session)
    return tok, model, prompts, batch, seen, cfg


def rows(batch):
    Tp = batch["prompts"].shape[1]
    for b in range(len(batch)):
        real = batch["attention_mask"][b, Tp:] > 0
        yield b, batch["responses"][b][real].tolist(), batch["response_mask"][b][real].tolist()


def test_the_stream_is_what_the_engine_saw_turn_by_turn(rollout):
    tok, _, prompts, batch, seen, cfg = rollout
    assert (batch["num_turns"] > 1).any(), "no trajectory got a tool answer: the test checks nothing"
    assert all(p.stop == ("</tool_call>",) and p.n == 1 for _, p in seen)
    for b, stream, _ in rows(batch):
        prompt = prompts[b // 2]
        # every turn's engine input is this trajectory's prompt + a prefix of its final stream
        inputs = [ids for call, _ in seen for ids in call if ids[:len(prompt)] == prompt
                  and ids[len(prompt):] == stream[:len(ids) - len(prompt)]]
        assert len(inputs) >= int(batch["num_turns"][b]) and len(stream) <= cfg.max_response_tokens


def test_the_masks_cover_exactly_the_model_s_tokens(rollout):
    tok, _, _, batch, _, _ = rollout
    Tp = batch["prompts"].shape[1]
    fragment = tool_response_text(tok, ["X"])
    head, tail = fragment.split("X")
    for b, stream, sampled in rows(batch):
        gaps, run = [], []
        for token, m in zip(stream, sampled):
            if m == 0:
                run.append(token)
            elif run:
                gaps.append(run)
                run = []
        gaps += [run] if run else []
        assert len(gaps) <= batch["num_tool_calls"][b]  # one answer fragment per turn that called tools
        for gap in gaps:  # each gap is one tool answer in the template: closes the turn, tool message, reopens
            text = tok.decode(gap)
            assert text.startswith(head) and text.endswith(tail)
        assert batch["num_turns"][b] == len(gaps) + 1
    zero = batch["response_mask"] == 0
    assert (batch["rollout_logprobs"][zero] == 0).all()
    real = batch["attention_mask"][:, Tp:] > 0
    assert (batch["response_mask"][~real] == 0).all() and (real.sum(-1) >= batch["response_mask"].sum(-1)).all()
    pos = batch["position_ids"]
    assert torch.equal(pos, (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0))


def test_rollout_log_probs_of_model_tokens_equal_a_forward_of_the_whole_stream(rollout):
    """fp32: the engine's log-prob of each sampled token (temperature-scaled) equals transformers' on the final
    stream -- the tool tokens in between are attended and positioned as the engine had them."""
    _, model, _, batch, _, _ = rollout
    Tp = batch["prompts"].shape[1]
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits.float()
    logp = torch.log_softmax(logits[:, Tp - 1:-1] / TEMPERATURE, -1).gather(-1, batch["responses"][..., None])[..., 0]
    m = batch["response_mask"] > 0
    torch.testing.assert_close(logp[m], batch["rollout_logprobs"][m], atol=2e-3, rtol=0)


def test_a_trajectory_is_truncated_exactly_when_its_last_turn_did_not_end_at_eos(rollout):
    """``truncated`` (the agent's response_length/clip_ratio): 0 when the last model token is EOS, else 1."""
    tok, _, _, batch, _, _ = rollout
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    for b, stream, sampled in rows(batch):
        last_model_token = [t for t, m in zip(stream, sampled) if m][-1]
        assert batch["truncated"][b] == float(last_model_token != eos)
    assert batch["truncated"].sum() < len(batch)  # at least one trajectory answered at EOS


@pytest.mark.heavy  # ~22 s
def test_continuous_turns_join_the_running_batch_and_sample_from_their_own_seeds():
    """Continuous batching across turns: a trajectory's next turn starts while other trajectories' first turns
    are still decoding, and its turns draw from its own seed (seed, trajectory, turn), so
    the same call twice gives the same rollouts, and the first two prompts' trajectories are the same whether the
    third runs beside them or not (with one generator for the batch, which rows share a step -- and so
    each row's draws -- would depend on the others). fp32."""
    tok = load_tokenizer("SmolLM2-135M-Instruct")
    engine = RolloutEngine(load_causal_lm("SmolLM2-135M-Instruct", torch.float32), tok, pack_weights=False)
    prompts = [tok.apply_chat_template(ONE_SHOT + [{"role": "user", "content": f"What is {a} * {b}?"}],
                                       add_generation_prompt=True, tokenize=True, return_dict=False)
               for a, b in ((123, 456), (87, 65), (902, 31))]
    cfg = AgentConfig(max_turns=3, max_response_tokens=160, tools=("calculator",), tool_timeout_s=5.0)
    params = SamplingParams(n=2, temperature=TEMPERATURE, max_new_tokens=48, seed=11)

    def run(ps, session=engine.session):
        return agent_generate(engine.generate, tok, engine.eos_ids, engine.pad_id, ps, params, cfg, session=session)

    events = []  # (engine step, "add" | "finish", is a first turn)

    def logged(ps, p, max_len):  # the engine's session, its adds and finished sequences logged by step
        sess, steps, first_turn = engine.session(ps, p, max_len), [0], {}
        add, step = sess.add, sess.step

        def logged_add(ids, max_new_tokens, seed):
            seq = add(ids, max_new_tokens, seed)
            first_turn[seq] = list(ids) in prompts
            events.append((steps[0], "add", first_turn[seq]))
            return seq

        def logged_step():
            steps[0] += 1
            done = step()
            events.extend((steps[0], "finish", first_turn[s]) for s in done)
            return done

        sess.add, sess.step = logged_add, logged_step
        return sess

    every, again, first = run(prompts, logged), run(prompts), run(prompts[:2])
    # continuous: a second turn joined the batch while some first turn was still decoding
    later_turn_starts = [s for s, kind, first_turn in events if kind == "add" and not first_turn]
    last_first_turn_end = max(s for s, kind, first_turn in events if kind == "finish" and first_turn)
    assert later_turn_starts and min(later_turn_starts) < last_first_turn_end, events
    assert torch.equal(every["responses"], again["responses"])
    assert (every["num_turns"][:4] > 1).any(), "no tool answer in the first two prompts: the check is weaker"
    for b in range(4):
        ours = every["responses"][b][every["attention_mask"][b, every["prompts"].shape[1]:] > 0]
        alone = first["responses"][b][first["attention_mask"][b, first["prompts"].shape[1]:] > 0]
        assert ours.tolist() == alone.tolist()
