"""The router in front of two replicas' rollout servers (two embedded engines of SmolLM2-135M-Instruct, each served
on uvicorn; the router on uvicorn too; the ``openai`` client): every request of a trajectory reaches the replica
that opened it, a new trajectory opens on the least-loaded replica, and what the router refuses reaches no replica."""

import asyncio
import threading
import time
from contextlib import ExitStack

import pytest
import torch

openai = pytest.importorskip("openai")

from core.config.algo import SamplingParams  # noqa: E402
from core.models import load_causal_lm, load_tokenizer  # noqa: E402
from core.rollout.agent_server import AgentServer, Router, Serving  # noqa: E402
from core.rollout.engine import RolloutEngine  # noqa: E402
from tests.agent_server.test_server import calculator_agent  # noqa: E402
from tests.test_agent_loop import ONE_SHOT  # noqa: E402


@pytest.fixture(scope="module")
def routed():
    tok = load_tokenizer("SmolLM2-135M-Instruct")
    params = SamplingParams(temperature=0.7, max_new_tokens=48, seed=5)
    replicas = [AgentServer(RolloutEngine(load_causal_lm("SmolLM2-135M-Instruct", torch.float32), tok,
                                          pack_weights=False), tok, run_id=f"run-r{r}") for r in range(2)]
    router = Router(replicas)
    servings = [Serving(s) for s in replicas] + [Serving(router)]
    with ExitStack() as stack:
        for s in replicas:
            stack.enter_context(s.sampling(params, max_len=768))
        yield router, replicas
    for s in servings:
        s.close()


def client(router, tid=None, token=None):
    return openai.AsyncOpenAI(base_url=router.url, api_key=token or router.token, max_retries=0,
                              default_headers={"X-Trajectory-Id": tid} if tid else {})


def test_a_trajectory_stays_on_the_replica_that_opened_it_and_trajectories_spread_over_both(routed):
    router, replicas = routed
    questions = [f"What is {a} * {b}?" for a, b in ((123, 456), (87, 65), (902, 31), (44, 78), (19, 23), (7, 88))]
    tids = [router.start_trajectory(f"q{i}") for i in range(len(questions))]
    homes = [router.replica_of(t) for t in tids]
    assert sorted(homes) == [0, 0, 0, 1, 1, 1]                   # none in flight yet: the fewest open trajectories
    seen = [[] for _ in questions]

    async def all_agents():
        return await asyncio.gather(*(calculator_agent(client(router, t), q, s)
                                      for t, q, s in zip(tids, questions, seen)))

    asyncio.run(all_agents())
    assert any(len(s) > 1 for s in seen)                         # multi-turn agents (a tool round at least)
    for tid, home, replies in zip(tids, homes, seen):
        assert replicas[1 - home].conversations.finished(tid) == []     # the other replica never saw it
        segments = router.finish(tid)                                   # the record, from its replica
        assert len(segments) == 1 and segments[0].traj.turns == len(replies)
        stream = segments[0].traj.prompt + segments[0].traj.tokens
        for r in replies:  # each turn's prompt and tokens are in the one record (its replica answered every turn)
            prompt, got = r.model_extra["prompt_token_ids"], r.choices[0].model_extra["token_ids"]
            assert stream[:len(prompt) + len(got)] == prompt + got
    assert router.in_flight == [0, 0] and router.opened == [0, 0]


def test_a_new_trajectory_opens_on_the_replica_with_fewer_requests_in_flight(routed):
    router, replicas = routed
    first = router.start_trajectory("busy")
    busy = router.replica_of(first)
    box = {}

    def ask():
        box["r"] = asyncio.run(client(router, first).chat.completions.create(
            model="policy", messages=ONE_SHOT[:2], max_tokens=8))

    with replicas[busy].loop.paused():                           # its request waits in the replica, in flight
        asker = threading.Thread(target=ask)
        asker.start()
        deadline = time.time() + 30
        while router.in_flight[busy] == 0 and time.time() < deadline:
            time.sleep(0.01)
        assert router.in_flight[busy] == 1
        later = [router.start_trajectory(f"later{i}") for i in range(2)]
        # both on the other replica, though it then holds more open trajectories than the busy one
        assert [router.replica_of(t) for t in later] == [1 - busy, 1 - busy]
    asker.join(timeout=60)
    assert box["r"].choices[0].message.content is not None
    for tid in [first, *later]:
        router.finish(tid)


def test_what_the_router_refuses_reaches_no_replica(routed):
    router, replicas = routed
    tid = router.start_trajectory("refused")
    home = replicas[router.replica_of(tid)]

    async def ask(c, **extra):
        return await c.chat.completions.create(model="policy", messages=ONE_SHOT[:2], max_tokens=4, **extra)

    with pytest.raises(openai.AuthenticationError):                     # no router token: 401
        asyncio.run(ask(client(router, tid, token="wrong")))
    with pytest.raises(openai.AuthenticationError):                     # the router's token is not a replica's
        asyncio.run(ask(openai.AsyncOpenAI(base_url=home.url, api_key=router.token, max_retries=0,
                                           default_headers={"X-Trajectory-Id": tid})))
    with pytest.raises(openai.BadRequestError) as e:                    # a replica's own id the router did not open
        asyncio.run(ask(client(router, home.start_trajectory("direct"))))
    assert e.value.body["param"] == "trajectory_id"
    with pytest.raises(openai.BadRequestError) as e:                    # no trajectory at all
        asyncio.run(ask(client(router)))
    assert e.value.body["param"] == "trajectory_id"
    # a replica's own refusal passes through: a field named, and the trajectory still has no record
    with pytest.raises(openai.BadRequestError) as e:
        asyncio.run(ask(client(router, tid), n=10_000))
    assert e.value.body["param"] == "n"
    assert router.finish(tid) == [] and router.in_flight == [0, 0]


def test_a_streamed_reply_passes_through_the_router_unchanged(routed):
    router, _ = routed

    async def both():
        a = await client(router, router.start_trajectory("plain")).chat.completions.create(
            model="policy", messages=ONE_SHOT[:2], max_tokens=12, seed=3)
        stream = await client(router, router.start_trajectory("streamed")).chat.completions.create(
            model="policy", messages=ONE_SHOT[:2], max_tokens=12, seed=3, stream=True)
        return a.choices[0].message.content, "".join([c.choices[0].delta.content or "" async for c in stream])

    plain, streamed = asyncio.run(both())
    assert plain and streamed == plain

    async def names():
        return [m.id async for m in client(router).models.list()]

    assert asyncio.run(names()) == ["policy"]
