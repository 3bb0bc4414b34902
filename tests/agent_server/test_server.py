"""The OpenAI-compatible rollout server (core/rollout/agent_server) over real HTTP (uvicorn) with the ``openai`` client, in
front of the embedded engine and SmolLM2-135M-Instruct (fp32), the calculator in the sandbox as the tool backend: the
record is what the engine was prompted with and sampled, and a transformers forward of it gives the engine's
log-probs; bad requests are refused with the field named and nothing recorded; the server listens where it is told
only; a request during a weight update completes."""

import asyncio
import json
import socket
import threading
import time

import pytest
import torch

openai = pytest.importorskip("openai")

from core.rollout.agent_server import AgentServer, Serving  # noqa: E402
from core.config.algo import SamplingParams  # noqa: E402
from core.models import load_causal_lm, load_tokenizer  # noqa: E402
from core.rollout.engine import RolloutEngine  # noqa: E402
from core.tools.builtin import TOOLS  # noqa: E402
from core.tools.sandbox import SandboxLimits  # noqa: E402
from tests.test_agent_loop import ONE_SHOT  # noqa: E402  (the calculator's one-shot conversation)

TEMPERATURE = 0.7
CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}


@pytest.fixture(scope="module")
def served():
    tok = load_tokenizer("SmolLM2-135M-Instruct")
    model = load_causal_lm("SmolLM2-135M-Instruct", torch.float32)
    engine = RolloutEngine(model, tok, pack_weights=False)
    params = SamplingParams(temperature=TEMPERATURE, max_new_tokens=48, seed=5)
    server = AgentServer(engine, tok, run_id="run-a")
    serving = Serving(server, host="127.0.0.1")
    with server.sampling(params, max_len=768):
        yield server, serving, model, tok
    serving.close()


def client(server, tid=None, token=None):
    headers = {"X-Trajectory-Id": tid} if tid else {}
    return openai.AsyncOpenAI(base_url=server.url, api_key=token or server.token, default_headers=headers,
                              max_retries=0)


async def calculator_agent(c, question: str, seen: list) -> str:
    """An agent as users write them: the openai client, OpenAI's tool schema, our sandbox as the tool."""
    messages = ONE_SHOT + [{"role": "user", "content": question}]
    for _ in range(3):
        r = await c.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR], max_tokens=48,
                                            logprobs=True)
        seen.append(r)
        msg = r.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        if not msg.tool_calls:
            return msg.content
        for call in msg.tool_calls:
            out = TOOLS["calculator"](json.loads(call.function.arguments), SandboxLimits(timeout_s=5.0))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": out.text})
    return ""


def calculator_agents(server) -> tuple[list, list, list]:
    """Four calculator agents at once against ``server``: each one's record, the replies it got, its answer."""
    questions = [f"What is {a} * {b}?" for a, b in ((123, 456), (87, 65), (902, 31), (44, 78))]
    tids = [server.start_trajectory(f"q{i}") for i in range(len(questions))]
    seen = [[] for _ in questions]

    async def all_agents():
        return await asyncio.gather(*(calculator_agent(client(server, t), q, s)
                                      for t, q, s in zip(tids, questions, seen)))

    answers = asyncio.run(all_agents())
    return [server.finish(t) for t in tids], seen, answers


@pytest.fixture(scope="module")
def agents(served):
    return calculator_agents(served[0])


def test_the_record_is_what_the_engine_was_prompted_with_and_sampled(agents):
    check_records(*agents[:2])


def check_records(segments: list, seen: list) -> None:
    """Each agent's record against the replies it got: every turn's prompt ids and sampled ids where the record has
    them, their log-probs, its turns and tool calls."""
    assert any(len(s) > 1 for s in seen), "no agent got a tool answer: the test checks nothing"
    for (seg,), responses in zip(segments, seen):
        t = seg.traj
        stream = t.prompt + t.tokens
        for r in responses:  # each turn's prompt is a prefix of the final stream, its tokens right after it
            prompt, got = r.model_extra["prompt_token_ids"], r.choices[0].model_extra["token_ids"]
            assert stream[:len(prompt) + len(got)] == prompt + got
            assert [x.logprob for x in r.choices[0].logprobs.content] == \
                t.logps[len(prompt) - len(t.prompt):len(prompt) - len(t.prompt) + len(got)]
        assert sum(t.sampled) == sum(len(r.choices[0].model_extra["token_ids"]) for r in responses)
        assert t.turns == len(responses) and t.num_calls == sum(len(r.choices[0].message.tool_calls or [])
                                                                for r in responses[:-1])


def test_a_transformers_forward_of_the_record_gives_the_engine_s_log_probs(served, agents):
    """fp32, one unpadded forward per trajectory: the trainer's log-prob of every model token equals the engine's --
    to fp32 rounding with the engine on PyTorch's ops; the fused CPU kernels' attention differs by its rounding,
    which depends on a token's batch neighbours (up to a few 1e-3 on a token). A record off by one token, or of
    re-tokenised text, is off by whole nats."""
    server, _, model, _ = served
    gaps = []
    for (seg,), _ in zip(*agents[:2]):
        t = seg.traj
        ids = torch.tensor([t.prompt + t.tokens])
        with torch.no_grad():
            logits = model(input_ids=ids).logits.float()[0, len(t.prompt) - 1:-1]
        logp = torch.log_softmax(logits / TEMPERATURE, -1).gather(-1, torch.tensor(t.tokens)[:, None])[:, 0]
        m = torch.tensor(t.sampled) > 0
        gaps.append((logp[m] - torch.tensor(t.logps)[m]).abs())
    gap = torch.cat(gaps)
    kernels = bool(server.loop.engine.fused)
    print(f"[agent server] {len(gap)} model tokens, |trainer - engine| log-prob: mean {gap.mean():.2e}, max "
          f"{gap.max():.2e} (fused CPU kernels {'on' if kernels else 'off'})")
    mean_tol, max_tol = (1e-4, 1e-2) if kernels else (1e-5, 5e-5)
    assert gap.mean() <= mean_tol and gap.max() <= max_tol


def test_a_bad_request_names_the_field_and_records_nothing(served):
    server = served[0]
    tid = server.start_trajectory("bad")

    async def bad(**kw):
        c = client(server, kw.pop("tid", tid), kw.pop("token", None))
        with pytest.raises(openai.APIStatusError) as e:
            await c.chat.completions.create(model="policy", messages=kw.pop("messages", ONE_SHOT[:2]), **kw)
        return e.value.status_code, e.value.body

    cases = {
        "tools[0].type": dict(tools=[{"type": "retrieval"}]),
        "n": dict(n=500),
        "trajectory_id": dict(tid="run-b/q0"),
        "temperature": dict(temperature=0.2),
        "messages": dict(messages=[{"content": "no role"}]),
        "max_tokens": dict(max_tokens=10**6),
    }
    for field, kw in cases.items():
        status, body = asyncio.run(bad(**kw))
        assert status == 400 and body["param"] == field, (field, body)
    assert "not of this run" in asyncio.run(bad(tid="run-b/q0"))[1]["message"]
    status, body = asyncio.run(bad(token="wrong"))
    assert status == 401 and body["param"] == "authorization"
    assert server.finish(tid) == []                                                 # nothing recorded


def test_a_request_during_a_weight_update_waits_and_completes(served):
    server = served[0]
    tid = server.start_trajectory("sync")
    box = {}

    def ask():
        box["r"] = asyncio.run(client(server, tid).chat.completions.create(
            model="policy", messages=ONE_SHOT[:2], max_tokens=8))

    with server.loop.paused():
        asker = threading.Thread(target=ask)
        asker.start()
        time.sleep(1.0)
        assert "r" not in box                                                     # it waits for the update
        server.loop.version = 1                                                   # the new weights' version
    asker.join(timeout=60)
    assert box["r"].choices[0].message.content is not None
    (seg,) = server.finish(tid)
    assert set(seg.traj.versions) == {1.0}


def test_streaming_gives_the_same_reply_as_a_plain_request(served):
    server = served[0]

    async def both():
        a = await client(server, server.start_trajectory("plain")).chat.completions.create(
            model="policy", messages=ONE_SHOT[:2], max_tokens=16, seed=11)
        stream = await client(server, server.start_trajectory("streamed")).chat.completions.create(
            model="policy", messages=ONE_SHOT[:2], max_tokens=16, seed=11, stream=True)
        text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream])
        return a.choices[0].message.content, text

    plain, streamed = asyncio.run(both())
    assert plain and streamed == plain


def test_the_server_listens_on_the_address_it_was_given_only(served):
    server, serving, _, _ = served
    port = serving.port
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass
    with pytest.raises(OSError):                                                  # another address of this host
        socket.create_connection(("127.0.0.2", port), timeout=5)
    async def names():
        return [m.id async for m in client(server).models.list()]

    assert asyncio.run(names()) == ["policy"]


def test_a_trajectory_gets_what_is_left_of_its_budget_and_nothing_outside_a_rollout(served):
    server = served[0]
    tid = server.start_trajectory("budget")
    server.budget = 6

    async def two_turns():
        c = client(server, tid)
        first = await c.chat.completions.create(model="policy", messages=ONE_SHOT[:2], max_tokens=40, seed=2)
        follow = [*ONE_SHOT[:2], first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "?"}]
        with pytest.raises(openai.BadRequestError, match="response tokens are spent"):
            await c.chat.completions.create(model="policy", messages=follow, max_tokens=40)
        return first

    try:
        first = asyncio.run(two_turns())
    finally:
        server.budget = 1 << 30
    assert len(first.choices[0].model_extra["token_ids"]) <= 6
    (seg,) = server.finish(tid)
    assert len(seg.traj.tokens) <= 6 and seg.traj.turns == 1


def test_agent_programs_run_n_per_row_seeded_by_their_row_and_their_records_make_the_batch(served):
    """``run_agents`` (rollout.agent.runner): n agents per row at once, each trajectory seeded by its place in the
    batch -- the same tokens whatever runs beside it, so twice gives the same batch -- and an agent that raises
    answers nothing while the others go on."""
    from core.rollout.agent_server.runner import agents_batch, run_agents
    from core.rollout.sampling import sequence_seeds

    server, _, _, tok = served

    async def one_turn(client, row):
        if row["extra_info"]["fail"]:
            raise RuntimeError("the agent's own bug")
        r = await client.chat.completions.create(model="policy", messages=row["prompt"], max_tokens=12)
        return r.choices[0].message.content

    rows = [{"prompt": ONE_SHOT[:1] + [{"role": "user", "content": f"What is {a} * 7?"}], "extra_info": {"fail": f}}
            for a, f in ((31, False), (45, False), (52, True))]
    seeds = sequence_seeds(9, 3 * 2)
    first, again = (asyncio.run(run_agents(one_turn, server, rows, 2, c, seeds, call)) for c, call in ((6, 0), (1, 1)))
    assert [bool(r.error) for r in first] == [False] * 4 + [True] * 2 and "the agent's own bug" in first[4].error
    assert [r.answer for r in first] == [r.answer for r in again] and first[0].answer != first[1].answer
    prompts = [tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True, return_dict=False)
               for r in rows]
    batch = agents_batch(first, prompts, 2, pad_id=0)
    assert len(batch) == 6 and batch["response_mask"].sum(-1).tolist() == \
        [float(len(r.segments[-1].traj.tokens)) if r.segments else 0.0 for r in first]
    assert batch["num_turns"].tolist() == [1.0] * 4 + [0.0] * 2


def test_what_a_runner_returns_beside_its_answer_reaches_the_metrics_and_the_reward(served):
    """A runner's dict: ``tool_errors`` is its sample's count of failed tool calls (agent/tool_error_rate), any other
    key reaches the reward (``extra_info["agent"]``); a count that is not one is the agent's error."""
    from core.rollout.agent_server.runner import agents_batch, run_agents

    server, _, _, tok = served

    async def judged(client, row):
        r = await client.chat.completions.create(model="policy", messages=row["prompt"], max_tokens=4)
        return {"answer": r.choices[0].message.content, "tool_errors": row["errors"], "verdict": "checked"}

    rows = [{"prompt": ONE_SHOT[:2], "errors": e} for e in (2, "two")]
    runs = asyncio.run(run_agents(judged, server, rows, 1, 2, [1, 2], 7))
    assert runs[0].answer and runs[0].extras == {"verdict": "checked"} and not runs[0].error
    assert runs[1].answer == "" and "tool_errors='two'" in runs[1].error
    prompt = tok.apply_chat_template(ONE_SHOT[:2], add_generation_prompt=True, tokenize=True, return_dict=False)
    assert agents_batch(runs, [prompt] * 2, 1, pad_id=0)["num_tool_errors"].tolist() == [2.0, 0.0]


def test_a_requests_stop_strings_end_its_sequence_in_the_engine(served):
    """A request's ``stop`` ends its sequence at the token that completes it (the engine's rule, ``Run.add``): no
    stop string before the last token, and one in the whole reply unless it ran to its limit or EOS."""
    server, _, _, tok = served
    tid = server.start_trajectory("stop")

    async def ask():
        return await client(server, tid).chat.completions.create(model="policy", messages=ONE_SHOT[:2], max_tokens=40,
                                                                  stop=["e", "a"], seed=4)

    r = asyncio.run(ask())
    ids = r.choices[0].model_extra["token_ids"]
    before, text = (tok.decode(x, skip_special_tokens=True) for x in (ids[:-1], ids))
    assert "e" not in before and "a" not in before and ("e" in text or "a" in text), text
    (seg,) = server.finish(tid)
    assert seg.traj.tokens == r.choices[0].model_extra["token_ids"]
