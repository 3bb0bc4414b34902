"""An RL step on agent rollouts (rollout.agent), one process, SmolLM2-135M-Instruct in fp32 with the real
calculator: the trainer's log-probs of the model's tokens equal the rollout engine's (the tool tokens between
turns attended, never scored), the step trains and reports the agent metrics."""

import math

import pytest
import torch

from core.config import (ActorConfig, AdvantageConfig, AgentConfig, AlgoConfig, OptimConfig, RolloutConfig,
                         SamplingParams)
from core.data import arith
from core.engines.fsdp import FSDPActor
from core.loop import Roles, generate, logprobs, prompts_from_rows, step, Timer
from core.roles import RolloutWorker
from core.worker import RoleSpec
from core.worker_group import LocalWorkerGroup
from tests.test_agent_loop import ONE_SHOT

T = 0.7
ALGO = AlgoConfig(sampling=SamplingParams(n=2, temperature=T, max_new_tokens=48, seed=3),
                  adv=AdvantageConfig(estimator="grpo"))


def rows():
    return [{"prompt": ONE_SHOT + [{"role": "user", "content": f"What is {a} * {b}?"}], "data_source": arith.SOURCE,
             "ground_truth": str(a * b), "extra_info": {}} for a, b in ((123, 456), (87, 65), (902, 31), (44, 78))]


@pytest.fixture(scope="module")
def roles():
    actor = ActorConfig(model="SmolLM2-135M-Instruct", dtype="float32", ppo_mini_batch_size=8, micro_batch_size=4,
                        temperature=T, optim=OptimConfig(lr=1e-6, warmup_steps=0))
    rollout = RolloutConfig(model="SmolLM2-135M-Instruct", dtype="float32", max_prompt_length=256,
                            agent=AgentConfig(enable=True, max_turns=3, max_response_tokens=160))
    group = LocalWorkerGroup({"actor": RoleSpec(FSDPActor, {"cfg": actor}),
                              "rollout": RoleSpec(RolloutWorker, {"cfg": rollout})})
    yield Roles(actor=group.role("actor"), rollout=group.role("rollout"))
    group.shutdown()


def test_the_trainer_scores_the_model_s_tokens_as_the_engine_sampled_them(roles):
    timer = Timer()
    batch = generate(roles, prompts_from_rows(rows()), ALGO.sampling, timer)
    assert (batch["num_turns"] > 1).any(), "no tool answer in the batch: the test checks nothing"
    batch = logprobs(roles, batch, timer)
    m = batch["response_mask"] > 0
    gaps = (batch["attention_mask"][:, batch["prompts"].shape[1]:] > 0) & ~m
    assert gaps.any()
    torch.testing.assert_close(batch["old_logprobs"][m], batch["rollout_logprobs"][m], atol=2e-3, rtol=0)


def test_a_step_on_agent_rollouts_trains_and_reports_the_agent(roles):
    _, metrics = step(roles, prompts_from_rows(rows()), ALGO)
    for key in ("agent/turns_mean", "agent/tool_calls_mean", "agent/tool_call_rate", "agent/tool_error_rate",
                "agent/tool_token_frac", "agent/response_tokens_mean", "actor/pg_loss", "actor/grad_norm"):
        assert math.isfinite(metrics[key]), key
    assert 1.0 <= metrics["agent/turns_mean"] <= 3.0 and 0.0 <= metrics["agent/tool_call_rate"] <= 1.0
    assert metrics["rollout/logprob_diff_max"] < 2e-3 * 10
