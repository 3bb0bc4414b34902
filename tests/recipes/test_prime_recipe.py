"""recipes/prime and core's implicit PRM on tiny real models: the PRM starts as the reference exactly (every process
reward 0) and learns the outcome labels; the recipe's step runs with the PRM updated before or after scoring (and in
that order: after, the first step's rewards are still 0); a resumed run equals the uninterrupted one with the PRM's
weights and optimizer in the checkpoint; the group filter, the data and the configs."""

from pathlib import Path

import pytest
import torch

from core.cli import recipe_module
from core.data.prepare import write_parquet
from core.run import load_recipe_config
from tests.recipes.plans import plan

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "prime"


def prime_module():
    return recipe_module(RECIPE)


# ---------------------------------------------------------------------------------------------- the PRM engine
def test_the_prm_starts_as_the_reference_and_learns_the_outcome_labels(tiny_model_dir):
    """In one process: the prm role (a policy whose loss is implicit_prm) and the frozen reference from the same model.
    Before any update its log-probs are the reference's bit for bit (z = 0, all rewards 0); after 8 updates on one
    batch its cross-entropy has fallen and its implicit reward orders right above wrong answers of each prompt."""
    from core.config import ActorConfig, RunConfig, validate
    from core.train.fsdp import FSDPActor
    from core.implicit_prm import ranking_accuracy
    from core.roles import prm_actor_config
    from core.algos.ops import group_ids
    from core.worker import RoleSpec
    from core.worker_group import LocalWorkerGroup
    from tests.train.test_shared_prompt import UNEVEN, grouped_batch

    cfg = validate(RunConfig, {"actor": {"model": str(tiny_model_dir), "dtype": "float32"},
                               "implicit_prm": {"enable": True, "dtype": "float32", "ppo_mini_batch_size": 6,
                                                "micro_batch_size": 3, "optim": {"lr": 3e-3}, "beta": 0.5}})
    prm_cfg = prm_actor_config(cfg)
    assert prm_cfg.loss.name == "implicit_prm" and prm_cfg.loss.prm_beta == 0.5 and prm_cfg.model == str(tiny_model_dir)
    ref_cfg = ActorConfig(model=str(tiny_model_dir), dtype="float32", trainable=False, micro_batch_size=3)
    b = grouped_batch(**UNEVEN).index(slice(0, 6)).select("input_ids", "attention_mask", "position_ids", "responses",
                                                          "response_mask")
    b["scores"] = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 0.0])
    gid = group_ids(["a", "a", "a", "b", "b", "c"])  # UNEVEN's prompt groups
    group = LocalWorkerGroup({"prm": RoleSpec(FSDPActor, {"cfg": prm_cfg}), "ref": RoleSpec(FSDPActor, {"cfg": ref_cfg})})
    try:
        prm, ref = group.role("prm"), group.role("ref")
        b["ref_logprobs"] = ref.dp_split(FSDPActor.compute_logprobs, b)["old_logprobs"]
        start = prm.dp_split(FSDPActor.compute_logprobs, b)["old_logprobs"]
        assert torch.equal(start, b["ref_logprobs"])
        losses = [prm.call_all(FSDPActor.update, b)[0]["actor/pg_loss"] for _ in range(8)]
        after = prm.dp_split(FSDPActor.compute_logprobs, b)["old_logprobs"]
    finally:
        group.shutdown()
    assert losses[0] == pytest.approx(torch.nn.functional.softplus(torch.tensor(0.0)).item(), abs=1e-6)  # log 2 at z = 0
    assert losses[-1] < 0.5 * losses[0], losses
    z = 0.5 * ((after - b["ref_logprobs"]) * b["response_mask"]).sum(-1)
    assert bool((z[b["scores"] > 0].min() > 0) and (z[b["scores"] == 0].max() < 0)), z
    assert ranking_accuracy(z, b["scores"], gid) == 1.0


# ---------------------------------------------------------------------------------------------- the recipe's step
def tiny_prime_run(tmp_path: Path, model_dir: Path, extra: str = "") -> Path:
    rows = [{"data_source": "t", "prompt": [{"role": "user", "content": f"{a} + {a}?"}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": str(2 * a)}, "extra_info": {"index": a}} for a in range(16)]
    write_parquet(rows, tmp_path / "train.parquet")
    # labels in {0, 1} that vary with the sampled text (the tiny random model never answers right)
    (tmp_path / "reward.py").write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                                        "    return float(sum(map(ord, solution_str)) % 2)\n")
    conf = tmp_path / "conf"
    conf.mkdir(exist_ok=True)
    (conf / "config.yaml").write_text(f"""
trainer: {{backend: local, total_steps: 2, output_dir: {tmp_path / 'out'}}}
data: {{train_files: ["{tmp_path / 'train.parquet'}"], prompts_per_step: 4, train_prompts_per_step: 2}}
placement: {{roles: {{actor: main, rollout: main, ref: main, prm: main}}}}
actor: {{model: "{model_dir}", dtype: float32, ppo_mini_batch_size: 8, micro_batch_size: 4, optim: {{lr: 0.001}}}}
implicit_prm: {{enable: true, dtype: float32, ppo_mini_batch_size: 8, micro_batch_size: 4, optim: {{lr: 0.003}},
               beta: 0.5}}
rollout: {{model: "{model_dir}", dtype: float32, max_prompt_length: 32}}
algo: {{sampling: {{n: 4, temperature: 1.0, max_new_tokens: 6}}, adv: {{estimator: prime}}}}
reward: {{path: "{tmp_path / 'reward.py'}"}}
prime: {{accuracy_lower_bound: 0.2, accuracy_upper_bound: 0.8}}
{extra}""")
    return conf


def fit_prime(conf: Path, *overrides: str) -> list[dict]:
    from core.trainer import fit

    prime = prime_module()
    cfg, sections = load_recipe_config(conf, overrides=list(overrides), sections={"prime": prime.PRIMEConfig})
    return fit(cfg, prime.make_step(cfg, sections))


def test_the_prm_updated_after_scoring_gives_zero_rewards_at_the_first_step_and_before_does_not(tmp_path,
                                                                                                tiny_model_dir):
    conf = tiny_prime_run(tmp_path, tiny_model_dir)
    after = fit_prime(conf, "implicit_prm.update=after", f"trainer.output_dir={tmp_path / 'after'}")
    before = fit_prime(conf, f"trainer.output_dir={tmp_path / 'before'}")
    frozen = fit_prime(conf, "implicit_prm.update=none", f"trainer.output_dir={tmp_path / 'none'}")
    # scored before its first update the PRM is the reference: every process reward is exactly 0
    assert after[0]["prm/implicit_reward_mean"] == 0.0 and after[0]["prm/process_reward_mean"] == 0.0
    assert before[0]["prm/implicit_reward_mean"] != 0.0 and before[0]["prm/process_reward_mean"] != 0.0
    assert all(m["prm/implicit_reward_mean"] == 0.0 and "prm/loss" not in m for m in frozen)
    assert after[1]["prm/implicit_reward_mean"] != 0.0  # ... and learned from step 1 by step 2
    for m in before + after:
        assert m["prm/loss"] > 0 and m["prm/grad_norm"] > 0 and "timing_s/update_prm" in m and "timing_s/prm" in m
        assert 0 <= m["prime/passed_group_frac"] <= 1 and "actor/grad_norm" in m
        assert "actor/loss" not in m and "prm/pg_loss" not in m


def test_a_resumed_run_equals_the_uninterrupted_one_with_the_prm_in_the_checkpoint(tmp_path, tiny_model_dir):
    conf = tiny_prime_run(tmp_path, tiny_model_dir)
    whole = fit_prime(conf, "trainer.total_steps=3", f"trainer.output_dir={tmp_path / 'whole'}")
    out = tmp_path / "cut"
    fit_prime(conf, "trainer.total_steps=2", "trainer.save_freq=2", f"trainer.output_dir={out}")
    assert (out / "checkpoints" / "step_000002" / "prm").is_dir()
    resumed = fit_prime(conf, "trainer.total_steps=3", "trainer.save_freq=2", f"trainer.output_dir={out}")
    keys = [k for k in whole[2] if k.startswith(("prm/", "actor/", "reward/", "prime/"))]
    assert "prm/loss" in keys and "prm/implicit_reward_mean" in keys
    assert {k: resumed[-1][k] for k in keys} == {k: whole[2][k] for k in keys}


def test_keep_groups_puts_the_mid_accuracy_groups_first_and_keeps_the_size():
    prime = prime_module()
    from core.protocol import Batch

    # n 2; group accuracies 1, 0.5, 0, 0.5 -> groups 1 and 3 pass and are kept, in order
    b = Batch({"scores": torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0]),
               "response_mask": torch.ones(8, 3)}, {"uid": ["a", "a", "b", "b", "c", "c", "d", "d"]})
    kept, passed = prime.keep_groups(b, 2, 2, prime.PRIMEConfig(), max_new_tokens=3)
    assert list(kept["uid"]) == ["b", "b", "d", "d"] and passed == 0.5
    # too few pass: the failing ones fill up, in their order
    kept, _ = prime.keep_groups(b, 2, 3, prime.PRIMEConfig(), max_new_tokens=3)
    assert list(kept["uid"]) == ["b", "b", "d", "d", "a", "a"]
    # filter off: the first groups as drawn
    kept, passed = prime.keep_groups(b, 2, 2, prime.PRIMEConfig(filter_accuracy=False), max_new_tokens=3)
    assert list(kept["uid"]) == ["a", "a", "b", "b"] and passed == 1.0
    # a response cut at the limit puts its group last when filter_truncated
    b["response_mask"] = torch.tensor([[1, 1, 0]] * 8, dtype=torch.float32)
    b["response_mask"][2] = 1
    kept, passed = prime.keep_groups(b, 2, 2, prime.PRIMEConfig(filter_truncated=True), max_new_tokens=3)
    assert list(kept["uid"]) == ["d", "d", "a", "a"] and passed == 0.25
    with pytest.raises(ValueError, match="accuracy_lower_bound <= accuracy_upper_bound"):
        prime.PRIMEConfig(accuracy_lower_bound=0.9, accuracy_upper_bound=0.1)


# ---------------------------------------------------------------------------------------------- checks, data, configs
def test_the_config_checks_name_what_prime_needs():
    from core.checks import problems
    from core.config import RunConfig, validate

    def found(tree):
        return "\n".join(problems(validate(RunConfig, tree)))

    assert "placement.roles has no pool for prm" in found({"implicit_prm": {"enable": True}})
    assert "implicit_prm.enable is false" in found({"algo": {"adv": {"estimator": "prime"}}})
    assert "is the implicit PRM's loss" in found({"actor": {"loss": {"name": "implicit_prm"}}})
    assert "must start from that model" in found({"implicit_prm": {"enable": True, "model": "other"},
                                                  "placement": {"roles": {"actor": "main", "rollout": "main",
                                                                          "ref": "main", "prm": "main"}}})
    ok = {"implicit_prm": {"enable": True}, "algo": {"adv": {"estimator": "prime"}},
          "placement": {"roles": {"actor": "main", "rollout": "main", "ref": "main", "prm": "main"}}}
    assert found(ok) == "" and validate(RunConfig, ok | {"use_ref": False}).has_reference()  # the PRM needs it
    with pytest.raises(ValueError, match="implicit_prm.update must be one of"):
        validate(RunConfig, {"implicit_prm": {"update": "sometimes"}})


def test_a_label_outside_zero_one_is_named_before_the_prm_trains():
    from core.config import ImplicitPRMConfig
    from core.implicit_prm import process_rewards
    from core.loop import Roles, Timer
    from core.protocol import Batch

    b = Batch({"ref_logprobs": torch.zeros(2, 3), "scores": torch.tensor([1.0, -1.0]), "response_mask": torch.ones(2, 3)},
              {"uid": ["a", "a"], "data_source": ["math_dapo", "math_dapo"]})
    with pytest.raises(ValueError, match=r"sample 1 \(data_source 'math_dapo'\) scored -1"):
        process_rewards(Roles(actor=None, rollout=None), b, ImplicitPRMConfig(enable=True), Timer())


@pytest.mark.parametrize("name", ["config", "demo_cpu", "eurus7b"])
def test_recipe_configs_validate_with_an_implicit_prm(name):
    from core.checks import check_run
    from core.plan_report import effective_sizes
    from core.roles import role_specs

    cfg, sections = load_recipe_config(RECIPE, name, sections={"prime": prime_module().PRIMEConfig})
    check_run(cfg, own_step=True)  # its train.py step filters the oversampled groups
    assert cfg.implicit_prm.enable and cfg.algo.adv.estimator == "prime" and {"prm", "ref"} <= set(role_specs(cfg))
    assert cfg.actor.kl_loss_coef == 0 and sections["prime"].accuracy_lower_bound == 0.2
    assert cfg.data.train_prompts_per_step < cfg.data.prompts_per_step  # oversampled
    assert f"samples per step           {cfg.data.train_prompts_per_step * cfg.algo.sampling.n}" in effective_sizes(cfg, 2)


def test_the_recipe_reward_gives_labels_in_zero_one():
    reward = recipe_module(RECIPE, "reward")
    assert reward.compute_score("hybridrl/arith", "so 12", "12")["score"] == 1.0
    assert reward.compute_score("numina_olympiads", "so \\boxed{\\frac12}", "0.5")["score"] == 1.0
    assert reward.compute_score("numina_olympiads", "so \\boxed{3}", "0.5")["score"] == 0.0
    assert reward.compute_score("openai/gsm8k", "#### 70", "72")["score"] == pytest.approx(0.1)


def test_eurus_math_rows_keep_math_and_name_a_bad_row():
    data = recipe_module(RECIPE, "data")
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "What is 1+1?"}]
    recs = [{"data_source": "numina_math", "prompt": msgs, "ability": "math", "reward_model": {"ground_truth": "2"}},
            {"data_source": "codecontests", "prompt": msgs, "ability": "code", "reward_model": {"ground_truth": "{}"}}]
    rows = data.eurus_math_rows(recs, "e.parquet")
    assert len(rows) == 1 and rows[0]["prompt"] == msgs and rows[0]["reward_model"]["ground_truth"] == "2"
    assert rows[0]["data_source"] == "numina_math"
    with pytest.raises(ValueError, match=r"e.parquet: row 2: no reward_model.ground_truth"):
        data.eurus_math_rows([recs[0], {**recs[0], "reward_model": {}}], "e.parquet")


def test_run_eurus_7b_dry_run_fits_on_one_node_with_the_prm_planned(capsys):
    rc, out = plan(capsys, "prime", "eurus7b")
    assert rc == 0, out
    assert "prm -> main" in out and "implicit PRM AdamW moments (8P/W)" in out
    assert out.rstrip().endswith("fits")
