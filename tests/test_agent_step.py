"""An RL step on agent rollouts (rollout.agent), one process, SmolLM2-135M-Instruct in fp32 with the real
calculator: the trainer's log-probs of the model's tokens equal the rollout engine's (the tool tokens between
turns attended, never scored), the step trains and reports the agent metrics."""

import math

import pytest
import torch

from core.config import (ActorConfig, AdvantageConfig, AgentConfig, AlgoConfig, OptimConfig, RolloutConfig,
                         SamplingParams)
from core.data import arith
from core.train.fsdp import FSDPActor
from core.loop import Roles, generate, logprobs, prompts_from_rows, step, Timer
from core.rollout.worker import RolloutWorker
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
    batch = logprobs(roles, batch, ALGO, timer, update_actor=False)  # every row computed here
    m = batch["response_mask"] > 0
    gaps = (batch["attention_mask"][:, batch["prompts"].shape[1]:] > 0) & ~m
    assert gaps.any()
    torch.testing.assert_close(batch["old_logprobs"][m], batch["rollout_logprobs"][m], atol=2e-3, rtol=0)


def test_a_step_on_agent_rollouts_trains_and_reports_the_agent(roles):
    _, metrics = step(roles, prompts_from_rows(rows()), ALGO)
    for key in ("agent/turns_mean", "agent/tool_calls_mean", "agent/tool_call_rate", "agent/tool_error_rate",
                "agent/tool_token_frac", "agent/response_tokens_mean", "agent/tokens_per_turn_mean",
                "agent/truncated_rate", "response_length/clip_ratio", "actor/pg_loss", "actor/grad_norm"):
        assert math.isfinite(metrics[key]), key
    assert 1.0 <= metrics["agent/turns_mean"] <= 3.0 and 0.0 <= metrics["agent/tool_call_rate"] <= 1.0
    assert metrics["rollout/logprob_diff_max"] < 2e-3 * 10


def ends_in_a_tool_answer(batch):
    """The first trajectory with a tool answer, cut right after that answer (so that no model token reads the
    tool's tokens), and the response columns of its tool tokens."""
    Tp = batch["prompts"].shape[1]
    gaps = (batch["attention_mask"][:, Tp:] > 0) & (batch["response_mask"] == 0)
    b = int(gaps.any(-1).nonzero()[0])
    cols = gaps[b].nonzero().flatten()
    cols = cols[:int((cols.diff() > 1).nonzero()[0]) + 1] if (cols.diff() > 1).any() else cols  # the first answer
    one = batch.index([b])
    end = int(cols[-1]) + 1
    for key, offset in (("attention_mask", Tp), ("response_mask", 0)):
        one[key] = one[key].clone()
        one[key][:, offset + end:] = 0
    one["old_logprobs"] = one["rollout_logprobs"]
    one["advantages"] = one["response_mask"].float()
    return one, cols


def with_tokens(batch, cols, ids):
    out = batch.index([0])
    Tp = batch["prompts"].shape[1]
    out["responses"], out["input_ids"] = batch["responses"].clone(), batch["input_ids"].clone()
    out["responses"][0, cols] = ids
    out["input_ids"][0, Tp + cols] = ids
    return out


def test_the_loss_and_its_gradients_ignore_tool_tokens(roles):
    """A trajectory that ends in a tool answer: the policy loss and every gradient are the same when the tool's
    tokens are replaced by random ones -- the trainer reads only the model's tokens, through the actor's own
    forward (shared prompt, padding removed). Scored as if the model had written them (response_mask 1), the same
    perturbation changes the loss: the check can fail."""
    from core.algos import POLICY_LOSSES, LossNorm
    from core.train.forward import response_logprobs
    from core.models import load_causal_lm

    batch = generate(roles, prompts_from_rows(rows()), ALGO.sampling, Timer())
    assert (batch["num_tool_calls"] > 0).any(), "no tool answer in the batch: the test checks nothing"
    one, cols = ends_in_a_tool_answer(batch)
    noise = torch.randint(100, 40000, (len(cols),), generator=torch.Generator().manual_seed(0))
    perturbed = with_tokens(one, cols, noise)
    model = load_causal_lm("SmolLM2-135M-Instruct", torch.float32)
    cfg = ActorConfig()

    def loss_and_grads(b):
        model.zero_grad()
        logp, _ = response_logprobs(model, b, T, remove_padding=True, share_prompt=True)
        loss, _ = POLICY_LOSSES["vanilla"](logp, b, cfg.loss, LossNorm.of(b["response_mask"]))
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    loss, grads = loss_and_grads(one)
    loss_p, grads_p = loss_and_grads(perturbed)
    torch.testing.assert_close(loss_p, loss, atol=1e-6, rtol=0)
    for name, g in grads.items():
        torch.testing.assert_close(grads_p[name], g, atol=1e-6, rtol=1e-5, msg=name)
    # the tool tokens scored as the model's: now they are in the loss, and the perturbation shows
    for b in (one, perturbed):
        b["response_mask"] = b["response_mask"].clone()
        b["response_mask"][0, cols] = 1
        b["advantages"] = b["response_mask"].float()
    assert abs(float(loss_and_grads(perturbed)[0]) - float(loss_and_grads(one)[0])) > 1e-3


def test_the_reward_sees_each_trajectory_s_turns_and_tool_calls():
    """``extra_info`` as the reward gets it: agent rollouts add num_turns and num_tool_calls (ReTool's bonus reads
    them); the data's own keys stay, and a batch without agent rollouts is passed through unchanged."""
    from core.loop import reward_extra_infos
    from core.protocol import Batch

    batch = Batch({"num_turns": torch.tensor([1, 3]), "num_tool_calls": torch.tensor([0, 2])},
                  {"extra_info": [{"index": 7}, None]})
    assert reward_extra_infos(batch) == [{"index": 7, "num_turns": 1, "num_tool_calls": 0},
                                         {"num_turns": 3, "num_tool_calls": 2}]
    plain = Batch(non_tensors={"extra_info": [{"index": 7}]})
    assert reward_extra_infos(plain) == [{"index": 7}]


def test_agent_metrics_by_hand():
    """Two trajectories after a 2-token prompt: one turn of 3 model tokens; and 2 model tokens, a 3-token tool
    answer, 1 model token (2 turns, 1 call that failed, truncated)."""
    from core.loop import _agent_metrics
    from core.protocol import Batch

    batch = Batch({"prompts": torch.ones(2, 2), "attention_mask": torch.tensor([[1, 1, 1, 1, 1, 0, 0, 0],
                                                                                [1, 1, 1, 1, 1, 1, 1, 1]]),
                   "response_mask": torch.tensor([[1., 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 1]]),
                   "num_turns": torch.tensor([1., 2]), "num_tool_calls": torch.tensor([0., 1]),
                   "num_tool_errors": torch.tensor([0., 1]), "truncated": torch.tensor([0., 1])})
    assert _agent_metrics(batch) == pytest.approx({
        "agent/turns_mean": 1.5, "agent/tool_calls_mean": 0.5, "agent/tool_call_rate": 0.5,
        "agent/tool_error_rate": 1.0, "agent/tool_token_frac": 3 / 9, "agent/response_tokens_mean": 4.5,
        "agent/tokens_per_turn_mean": (3 / 1 + 3 / 2) / 2, "agent/truncated_rate": 0.5})
