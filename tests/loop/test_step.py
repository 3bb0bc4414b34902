"""The GRPO step end to end on a tiny real model: 2 steps on 2 Ray workers (colocated actor/rollout/ref), and a
verl-made GSM8K parquet training without conversion (local backend, one process)."""

import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from core.config import (ActorConfig, AdvantageConfig, AlgoConfig, OptimConfig, PlacementConfig, PolicyLossConfig,
                         PoolConfig, RolloutConfig, SamplingParams)
from core.data.dataset import load_rl_parquet
from core.train.fsdp import FSDPActor
from core.loop import Roles, prompts_from_rows, step
from core.placement import place
from core.rollout.worker import RolloutWorker
from core.worker import RoleSpec

ROOT = Path(__file__).resolve().parents[2]

STEP = AlgoConfig(sampling=SamplingParams(n=2, temperature=1.0, max_new_tokens=8, seed=0),
                  adv=AdvantageConfig(estimator="grpo"))
KEYS = ["reward/mean", "reward/std", "response_length/mean", "response_length/clip_ratio", "actor/pg_loss",
        "actor/kl_loss", "actor/entropy", "actor/grad_norm", "actor/lr", "timing_s/gen", "timing_s/reward",
        "timing_s/old_logprob", "timing_s/ref", "timing_s/adv", "timing_s/update_actor", "timing_s/sync_weights",
        "timing_s/step", "perf/throughput_tokens_per_s", "rollout/logprob_diff_mean", "rollout/logprob_diff_max"]


def char_overlap(data_source, solution_str, ground_truth, extra_info=None):
    """A dense toy reward (a random tiny model almost never prints the answer's digits): share of capitals."""
    chars = solution_str.replace(" ", "")
    return sum(c.isupper() for c in chars) / max(1, len(chars))


def ord_mod7(data_source, solution_str, ground_truth, extra_info=None):
    """A reward that differs between most texts and between ground truths of different lengths (a tiny random
    model's greedy answers to different prompts may be the same)."""
    return (sum(map(ord, solution_str)) + len(ground_truth)) % 7 / 7


def role_specs(model_dir):
    actor = ActorConfig(model=str(model_dir), dtype="float32", ppo_mini_batch_size=8, micro_batch_size=2,
                        optim=OptimConfig(lr=1e-3), loss=PolicyLossConfig(), kl_loss_coef=0.01)
    return {"actor": RoleSpec(FSDPActor, {"cfg": actor}),
            "ref": RoleSpec(FSDPActor, {"cfg": ActorConfig(model=str(model_dir), dtype="float32", trainable=False)}),
            "rollout": RoleSpec(RolloutWorker, {"cfg": RolloutConfig(model=str(model_dir), dtype="float32",
                                                                     max_prompt_length=128)})}


def verl_parquet(path, n=4):
    instruction = 'Let\'s think step by step and output the final answer after "####".'
    rows = [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"What is {i} + {i}? {instruction}"}],
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(2 * i + 10)},
             "extra_info": {"split": "train", "index": i, "answer": f"#### {2 * i + 10}", "question": f"What is {i} + {i}?"}}
            for i in range(n)]
    pd.DataFrame(rows).to_parquet(path)
    return path


def run_steps(placement, rows, n_steps):
    roles = Roles(actor=placement["actor"], rollout=placement["rollout"], ref=placement["ref"])
    return [step(roles, prompts_from_rows(rows), STEP, char_overlap)[1] for _ in range(n_steps)]


@pytest.mark.ray
def test_two_grpo_steps_on_two_ray_workers(tiny_model_dir, tmp_path, ray_shared):
    placement = place(PlacementConfig({"main": PoolConfig(slots_per_node=2)},
                                      {"actor": "main", "rollout": "main", "ref": "main"}), role_specs(tiny_model_dir))
    try:
        metrics = run_steps(placement, load_rl_parquet(verl_parquet(tmp_path / "train.parquet")), 2)
    finally:
        placement.shutdown()
    for m in metrics:
        assert set(KEYS) <= set(m), sorted(set(KEYS) - set(m))
        assert all(math.isfinite(v) for v in m.values())
        assert m["rollout/logprob_diff_max"] < 1e-3  # fp32 engine and trainer agree on every sampled token
        assert 0 < m["reward/mean"] <= 1 and m["actor/grad_norm"] > 0
    assert metrics[0]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)  # policy == reference before any update
    assert metrics[1]["actor/kl_loss"] > 0  # ... and no longer after one


def test_a_verl_made_gsm8k_parquet_trains_without_conversion(tiny_model_dir, tmp_path):
    rows = load_rl_parquet(verl_parquet(tmp_path / "verl_gsm8k.parquet"))
    placement = place(PlacementConfig(), role_specs(tiny_model_dir), backend="local")
    try:
        before = placement["actor"].call_all(FSDPActor.full_state_dict)[0]
        metrics = run_steps(placement, rows, 1)[0]
        after = placement["actor"].call_all(FSDPActor.full_state_dict)[0]
    finally:
        placement.shutdown()
    assert metrics["actor/grad_norm"] > 0
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_prompt_uids_are_deterministic_and_distinct_within_a_batch():
    """A resumed run draws the same rows again and must group them the same way: uids from position and content
    (uuid4 gave every run new ones); two rows with the same prompt in one batch still get two groups."""
    rows = [{"prompt": [{"role": "user", "content": c}], "data_source": "d", "ground_truth": "1", "extra_info": {}}
            for c in ("a", "b", "a")]
    uids = prompts_from_rows(rows)["uid"]
    assert list(uids) == list(prompts_from_rows(rows)["uid"]) and len(set(uids)) == 3


def test_a_reward_error_names_the_data_row_and_the_group(tiny_model_dir, tmp_path):
    """The failing sample is named by the file and row its prompt came from, and its uid -- not only its index in
    the step's batch (which row of which file was that?)."""
    from core.rewards import RewardError
    from core.worker_group import LocalWorkerGroup

    path = verl_parquet(tmp_path / "train.parquet")
    rows = load_rl_parquet(path)

    def fails_on_row_3(data_source, solution_str, ground_truth, extra_info=None):
        if extra_info["index"] == 2:
            raise ValueError("cannot parse")
        return 0.0

    group = LocalWorkerGroup(role_specs(tiny_model_dir))
    roles = Roles(actor=group.role("actor"), rollout=group.role("rollout"), ref=group.role("ref"))
    try:
        with pytest.raises(RewardError, match=rf"reward for sample 4 \({path}: row 3, uid 2-[0-9a-f]+\) "
                                              r"\(data_source='openai/gsm8k'\) raised ValueError: cannot parse"):
            step(roles, prompts_from_rows(rows), STEP, fails_on_row_3)
    finally:
        group.shutdown()


def test_bypass_mode_takes_the_rollouts_logprobs_and_reinforce_weighs_the_mismatch(tiny_model_dir):
    """algo.bypass_mode: no old-log-prob pass, ``old_logprobs`` are the engine's; the reinforce loss's metrics are
    the engine-vs-trainer mismatch it corrects (a bf16 engine against the fp32 actor; lr 0 keeps the actor where
    the update's forward saw it): ppo_kl = mean(rollout - trainer), is_weight_mean = mean(min(pi / pi_rollout, 2))."""
    from dataclasses import replace

    from core.algos.ops import masked_mean
    from core.train.policy import PolicyWorker

    specs = role_specs(tiny_model_dir)
    actor = replace(specs["actor"].kwargs["cfg"], optim=OptimConfig(lr=0.0), ppo_mini_batch_size=16,
                    micro_batch_size=16, loss=PolicyLossConfig(name="reinforce"), kl_loss_coef=0.0)
    specs["actor"] = RoleSpec(FSDPActor, {"cfg": actor})
    specs["rollout"] = RoleSpec(RolloutWorker, {"cfg": RolloutConfig(model=str(tiny_model_dir), dtype="bfloat16",
                                                                     max_prompt_length=128)})
    placement = place(PlacementConfig({"main": PoolConfig(slots_per_node=1)},
                                      {"actor": "main", "rollout": "main", "ref": "main"}), specs, "local")
    try:
        roles = Roles(actor=placement["actor"], rollout=placement["rollout"], ref=placement["ref"])
        rows = [{"prompt": [{"role": "user", "content": f"Q{i} " + "xy" * i}], "data_source": "t",
                 "ground_truth": "", "extra_info": {}} for i in range(4)]
        algo = replace(STEP, sampling=replace(STEP.sampling, n=4), bypass_mode=True)
        batch, m = step(roles, prompts_from_rows(rows), algo, char_overlap)
        trainer = roles.actor.dp_split(PolicyWorker.compute_logprobs, batch)["old_logprobs"]
    finally:
        placement.shutdown()
    assert torch.equal(batch["old_logprobs"], batch["rollout_logprobs"]) and "old_from_update" not in batch
    mask, rollout = batch["response_mask"], batch["rollout_logprobs"]
    gap = float(masked_mean(rollout - trainer, mask))
    assert float(((rollout - trainer).abs() * mask).max()) > 1e-3           # the bf16 engine's mismatch
    assert m["actor/ppo_kl"] == pytest.approx(gap, rel=1e-4, abs=1e-7)
    weight = float(masked_mean((trainer - rollout).exp().clamp(max=2.0), mask))
    assert m["actor/is_weight_mean"] == pytest.approx(weight, rel=1e-5) and weight != 1.0


def test_remax_scores_each_prompts_greedy_response_as_the_baseline(tiny_model_dir):
    """algo.adv.estimator=remax in core's step: each prompt's greedy response (temperature 0, one sample) is
    generated and scored, its score is ``reward_baselines`` on the prompt's n samples, and the advantage is the
    return minus it (ReMax, no whitening)."""
    from dataclasses import replace

    from core.rollout.worker import RolloutWorker as RW

    placement = place(PlacementConfig({"main": PoolConfig(slots_per_node=1)},
                                      {"actor": "main", "rollout": "main", "ref": "main"}),
                      role_specs(tiny_model_dir), "local")
    try:
        roles = Roles(actor=placement["actor"], rollout=placement["rollout"], ref=placement["ref"])
        rows = [{"prompt": [{"role": "user", "content": f"Q{i} " + "xy" * i}], "data_source": "t",
                 "ground_truth": "g" * (i + 1), "extra_info": {}} for i in range(3)]
        prompts = prompts_from_rows(rows)
        greedy = roles.rollout.dp_split(RW.generate, prompts, replace(STEP.sampling, n=1, temperature=0.0))
        texts = roles.rollout.dp_split(RW.decode, greedy)["response_text"]
        want = [ord_mod7("t", t, r["ground_truth"]) for t, r in zip(texts, rows)]
        algo = replace(STEP, sampling=replace(STEP.sampling, n=3), adv=AdvantageConfig(estimator="remax"))
        batch, m = step(roles, prompts, algo, ord_mod7)
    finally:
        placement.shutdown()
    assert len(set(want)) == 3                                     # distinct: a baseline on another prompt fails
    assert batch["reward_baselines"].tolist() == pytest.approx([w for w in want for _ in range(3)])
    mask = batch["response_mask"]
    returns = batch["token_rewards"].flip(-1).cumsum(-1).flip(-1) * mask
    torch.testing.assert_close(batch["advantages"], (returns - batch["reward_baselines"][:, None]) * mask)
    assert "timing_s/gen_baseline" in m


def test_pf_ppo_resamples_the_step_batch_in_place_after_the_advantages():
    """algo.pf_ppo (max_min): after the advantages phase the step's batch (the caller's object) holds only its best-
    and worst-scored rows, every column moved together, the draw seeded by the step's sampling seed; a batch whose
    old log-probs were left to the update is refused (the rows would no longer be the update's first ones)."""
    from dataclasses import replace

    from core.config import PFPPOConfig
    from core.loop import Timer, advantages
    from core.protocol import Batch

    def batch_of():
        scores = torch.tensor([0.0, 0.5, 1.0, 0.25, 1.0, 0.0, 0.75, 0.5])
        mask = torch.ones(8, 3)
        return Batch({"scores": scores, "token_rewards": torch.zeros(8, 3).index_put_((torch.arange(8),
                      torch.full((8,), 2)), scores), "response_mask": mask, "row": torch.arange(8)},
                     {"uid": ["a", "a", "b", "b", "c", "c", "d", "d"]})

    cfg = replace(STEP, adv=AdvantageConfig(estimator="grpo"), pf_ppo=PFPPOConfig(enable=True, method="max_min"))
    b = batch_of()
    advantages(b, cfg, Timer())
    assert len(b) == 8 and set(b["scores"].tolist()) == {0.0, 1.0}
    assert torch.equal(b["scores"], batch_of()["scores"][b["row"]])       # the rows moved whole
    again = batch_of()
    advantages(again, cfg, Timer())
    assert torch.equal(again["row"], b["row"])                              # seeded by the step's sampling seed
    left = batch_of()
    left["old_from_update"] = torch.ones(8, dtype=torch.bool)
    with pytest.raises(ValueError, match="algo.pf_ppo resamples the rows after the old log-probs were left"):
        advantages(left, cfg, Timer())


@pytest.mark.parametrize("recipe", ["grpo", "ppo"])
def test_a_recipes_step_leaves_the_first_minibatchs_old_logprobs_to_the_update(tiny_model_dir, recipe):
    """The saved forward comes with the public step piece (``core.loop.logprobs``), so a recipe's copy of the step
    has it without knowing of it: the first mini-batch's rows (8 of 16) come back from the update filled in."""
    from core.cli import recipe_module

    module = recipe_module(ROOT / "recipes" / recipe)
    placement = place(PlacementConfig({"main": PoolConfig(slots_per_node=1)},
                                      {"actor": "main", "rollout": "main", "ref": "main"}),
                      role_specs(tiny_model_dir), "local")
    rows = [{"prompt": [{"role": "user", "content": f"Q{i} " + "xy" * i}], "data_source": "t", "ground_truth": "",
             "extra_info": {}} for i in range(8)]
    try:
        roles = Roles(actor=placement["actor"], rollout=placement["rollout"], ref=placement["ref"])
        draw = lambda: prompts_from_rows(rows)  # noqa: E731
        batch, m = module.step(roles, draw, STEP, char_overlap)
    finally:
        placement.shutdown()
    assert batch["old_from_update"].sum() == 8 and torch.isfinite(batch["old_logprobs"]).all()
    assert m["timing_s/old_logprob"] > 0 and math.isfinite(m["actor/pg_loss"])
