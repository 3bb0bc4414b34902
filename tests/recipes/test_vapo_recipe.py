"""recipes/vapo: the configs carry VAPO's settings, value pre-training leaves the actor and the rollout engine
bit-identical while the critic learns (the recipe's own step, a tiny real model, in-process workers), the tiers
are consistent with the configs, and the full-scale script plans the critic too."""

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from core.cli import recipe_module
from core.data.dataset import load_rl_parquet
from core.data.prepare import write_parquet
from core.expected import load_expected
from core.run import load_recipe_config
from tests.recipes.plans import plan

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "vapo"
EXPECTED = load_expected(RECIPE)


@pytest.mark.parametrize("name", ["config", "demo_cpu", "qwen32b"])
def test_configs_carry_vapos_settings(name):
    from core.roles import role_specs

    cfg, _ = load_recipe_config(RECIPE, name)
    assert set(role_specs(cfg)) == {"actor", "rollout", "critic"} and not cfg.use_ref
    a, adv = cfg.actor, cfg.algo.adv
    assert adv.estimator == "length_adaptive_gae" and adv.lam_critic == 1.0
    assert adv.length_alpha == (0.5 if name == "demo_cpu" else 0.05)  # the CPU run's 10-32 tokens: demo_cpu.yaml
    assert adv.gamma == 1.0 and a.loss.clip_low == 0.2 and a.loss.clip_high == 0.28
    assert a.loss_agg_mode == "token-mean" and a.positive_nll_coef == 0.1 and a.kl_loss_coef == 0
    assert cfg.critic.optim.lr == 2 * a.optim.lr                      # the paper's 2e-6 / 1e-6
    assert 0 < cfg.trainer.critic_warmup < cfg.trainer.total_steps
    assert a.temperature == cfg.algo.sampling.temperature
    recipe_module(RECIPE).make_step(cfg, {})                          # the recipe's own checks pass


def test_the_step_refuses_a_kl_term_or_a_missing_critic():
    from core.checks import ConfigError

    vapo = recipe_module(RECIPE)
    for override, match in [("actor.kl_loss_coef=0.01", "no KL term"), ("use_critic=false", "needs the critic")]:
        cfg, _ = load_recipe_config(RECIPE, "demo_cpu", [override])
        with pytest.raises(ConfigError, match=match):
            vapo.make_step(cfg, {})


def test_cpu_tier_describes_the_demo_config():
    cfg, _ = load_recipe_config(RECIPE, "demo_cpu")
    assert EXPECTED["cpu"]["steps"] == cfg.trainer.total_steps
    assert EXPECTED["full_scale"]["published"]["val/aime24/avg@32"] == 0.604


def test_the_reward_gives_no_partial_credit_so_positive_means_correct():
    reward = recipe_module(RECIPE, "reward")
    assert reward.compute_score("aime24", "so it is 204.\nAnswer: 204", "204")["score"] == 1.0
    assert reward.compute_score("math_dapo", "the answer is 204", "204")["score"] == -1.0
    assert reward.compute_score("openai/gsm8k", "so #### 7", "8")["score"] == 0.0         # format, wrong number
    assert reward.compute_score("hybridrl/arith", "12", "12")["score"] == 1.0


def text_reward(data_source, solution_str, ground_truth, extra_info=None):
    """Right or wrong by the sampled text (a random tiny model never answers): some samples of a batch score 1."""
    acc = sum(map(ord, solution_str)) % 3 == 0
    return {"score": float(acc), "acc": acc}


def tiny_config(tmp_path, model_dir):
    rows = [{"data_source": "t", "prompt": [{"role": "user", "content": f"{a} + {a}?"}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": str(2 * a)}, "extra_info": {"index": a}}
            for a in range(8)]
    write_parquet(rows, tmp_path / "train.parquet")
    rows = load_rl_parquet([str(tmp_path / "train.parquet")])  # as the trainer reads them
    m = str(model_dir)
    cfg, _ = load_recipe_config(RECIPE, "demo_cpu", [
        "trainer.backend=local", f"trainer.output_dir={tmp_path / 'out'}", f"data.train_files=[{tmp_path / 'train.parquet'}]",
        "data.val_files=[]", "data.prompts_per_step=4", f"actor.model={m}", f"critic.model={m}", f"rollout.model={m}",
        "actor.dtype=float32", "critic.dtype=float32", "rollout.dtype=float32", "rollout.max_prompt_length=32",
        "actor.micro_batch_size=4", "critic.micro_batch_size=4", "algo.sampling.max_new_tokens=6",
        "actor.optim.lr=1e-3", "critic.optim.lr=1e-3", "actor.optim.warmup_steps=0"])
    return cfg, rows


def test_value_pretraining_leaves_actor_and_rollout_bit_identical_while_the_critic_learns(tmp_path, tiny_model_dir):
    from core.train.fsdp import FSDPActor
    from core.loop import Roles, prompts_from_rows
    from core.placement import place
    from core.rollout.worker import RolloutWorker
    from core.roles import role_specs

    vapo = recipe_module(RECIPE)
    cfg, rows = tiny_config(tmp_path, tiny_model_dir)
    step = vapo.make_step(cfg, {})
    placement = place(cfg.placement, role_specs(cfg), "local")
    try:
        roles = Roles(actor=placement["actor"], rollout=placement["rollout"], critic=placement["critic"])
        critic_model = placement.groups[0]._host.roles["critic"].model

        def weights():
            return (roles.actor.call_all(FSDPActor.full_state_dict)[0],
                    {k: v.clone() for k, v in roles.rollout.call_all(RolloutWorker.engine_state_dict)[0].items()},
                    {k: v.detach().clone() for k, v in critic_model.state_dict().items()})

        actor0, rollout0, critic0 = weights()
        for i in range(2):  # value pre-training
            algo = replace(cfg.algo, sampling=replace(cfg.algo.sampling, seed=i))
            _, m = step(roles, lambda: prompts_from_rows(rows[:4]), algo, text_reward, update_actor=False)
            assert m["vapo/value_pretraining"] == 1.0 and m["critic/vf_loss"] > 0 and "critic/explained_var" in m
            assert "actor/grad_norm" not in m and "timing_s/old_logprob" not in m and "timing_s/sync_weights" not in m
        actor1, rollout1, critic1 = weights()
        assert all(torch.equal(actor0[k], actor1[k]) for k in actor0)
        assert all(torch.equal(rollout0[k], rollout1[k]) for k in rollout0)
        assert any(not torch.equal(critic0[k], critic1[k]) for k in critic0)
        # a policy step after it: the actor moves, the engine follows, the NLL of the correct samples is logged
        b, m = step(roles, lambda: prompts_from_rows(rows[4:]), cfg.algo, text_reward, update_actor=True)
        actor2, rollout2, _ = weights()
        assert m["vapo/value_pretraining"] == 0.0 and "actor/nll_loss" in m and 0 < m["vapo/correct_frac"] < 1
        assert any(not torch.equal(actor1[k], actor2[k]) for k in actor1)
        assert all(torch.equal(actor2[k], rollout2[k]) for k in actor2 if k in rollout2)
        lam = [max(0.0, 1 - 1 / (cfg.algo.adv.length_alpha * float(n))) for n in b["response_mask"].sum(-1)]
        assert m["vapo/lam_policy_mean"] == pytest.approx(sum(lam) / len(lam))  # demo alpha 0.5, l <= 6 tokens
    finally:
        placement.shutdown()


def test_full_scale_script_plans_the_critic_too(capsys):
    rc, out = plan(capsys, "vapo", "qwen32b")
    assert "Qwen/Qwen2.5-32B on 128 cuda rank(s)" in out, out[-3000:]
    assert "critic" in out and rc == 0, out[-3000:]
