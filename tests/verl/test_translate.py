"""verl's keys with verl's semantics (core.verl): command lines written in verl's key names, each checked against a
config derived by hand -- the three traps (prompts x n per mini-batch, epochs -> steps, GPU counts -> pools) first."""

import pandas as pd
import pytest

from core.cli import main as cli_main
from core.config import RunConfig, validate
from core.verl.keys import TABLE, lookup
from core.verl.translate import translate, unused_rows
from core.verl.run import BASE

A = "actor_rollout_ref."
# a verl GRPO line as verl's own GRPO scripts write it (the values ours)
GRPO = [f"{A}model.path=SmolLM2-135M-Instruct", "algorithm.adv_estimator=grpo", "data.train_batch_size=32",
        f"{A}rollout.n=5", f"{A}actor.ppo_mini_batch_size=8", f"{A}actor.ppo_micro_batch_size_per_gpu=2",
        f"{A}rollout.name=vllm", "trainer.n_gpus_per_node=8", "trainer.nnodes=2", "trainer.total_epochs=15",
        f"{A}actor.use_kl_loss=True", f"{A}actor.kl_loss_coef=0.001", "trainer.logger=['console']"]


def test_a_mini_batch_of_prompts_becomes_one_of_samples():
    o = translate(GRPO).full
    # verl: 8 prompts per mini-batch, each with n=5 samples -> 40 samples; 32 prompts x 5 = 160 samples a step,
    # so 160 / 40 = 4 optimizer steps, as verl's train_batch_size / ppo_mini_batch_size
    assert o["actor.ppo_mini_batch_size"] == 40 and o["data.prompts_per_step"] == 32 and o["algo.sampling.n"] == 5
    assert o["actor.micro_batch_size"] == 2 and o["actor.max_tokens_per_micro"] == 0  # no dynamic batching


def test_dynamic_batching_takes_the_token_budget():
    o = translate(GRPO + [f"{A}actor.use_dynamic_bsz=True", f"{A}actor.ppo_max_token_len_per_gpu=24576"]).full
    assert o["actor.max_tokens_per_micro"] == 24576


def test_epochs_become_steps_when_the_data_is_loaded(tmp_path):
    """trainer.total_epochs=15 stays epochs; 100 rows at 32 prompts a step: floor(100 / 32) = 3 steps an epoch,
    45 steps (verl's drop_last dataloader); total_training_steps, when given, wins."""
    from core.trainer import epoch_steps

    o = translate(GRPO).full
    assert o["trainer.total_epochs"] == 15 and "trainer.total_steps" not in o
    cfg = validate(RunConfig, {"trainer": {"total_epochs": 15}, "data": {"prompts_per_step": 32}})
    assert epoch_steps(cfg, 100) == 45
    o = translate(GRPO + ["trainer.total_training_steps=7"]).full
    assert o["trainer.total_steps"] == 7 and o["trainer.total_epochs"] == 0


def test_gpu_counts_become_the_pool_and_a_cpu_device_a_cpu_pool():
    o = translate(GRPO).full
    assert (o["placement.pools.main.nnodes"], o["placement.pools.main.slots_per_node"],
            o["placement.pools.main.device"]) == (2, 8, "cuda")  # verl's default device
    o = translate(GRPO + ["trainer.device=cpu", "trainer.n_gpus_per_node=2", "trainer.nnodes=1"]).full
    assert (o["placement.pools.main.nnodes"], o["placement.pools.main.slots_per_node"],
            o["placement.pools.main.device"]) == (1, 2, "cpu")


def test_verls_defaults_fill_what_a_line_leaves_out():
    """verl's own defaults, not ours: gae (so a critic), lr 1e-6, weight decay 0.01, no KL, 1024 prompts, n=1."""
    o = translate([f"{A}model.path=m", f"{A}rollout.name=vllm"]).full
    assert o["algo.adv.estimator"] == "gae" and o["use_critic"] is True and o["critic.model"] == "m"
    assert o["actor.optim.weight_decay"] == 0.01 and o["data.prompts_per_step"] == 1024
    assert o["actor.ppo_mini_batch_size"] == 256 and o["actor.kl_loss_coef"] == 0.0 and o["use_ref"] is False
    assert o["trainer.total_epochs"] == 30 and o["rollout.tensor_parallel_size"] == 2


def test_kl_switches_and_the_reference():
    o = translate(GRPO).full
    assert o["actor.kl_loss_coef"] == 0.001 and o["use_ref"] is True
    o = translate(GRPO + [f"{A}actor.use_kl_loss=False", "algorithm.use_kl_in_reward=True",
                          "algorithm.kl_ctrl.kl_coef=0.002", "algorithm.kl_ctrl.type=adaptive"]).full
    assert o["actor.kl_loss_coef"] == 0.0 and o["algo.kl_in_reward.coef"] == 0.002
    assert o["algo.kl_in_reward.adaptive"] is True and o["use_ref"] is True


def test_every_key_given_is_accounted_for_and_none_dropped():
    line = GRPO + [f"{A}rollout.gpu_memory_utilization=0.6", "trainer.balance_batch=True",
                   "distillation.enabled=True", "data.prompt_key=prompt", "trainer.totl_epochs=3"]
    tr = translate(line)
    assert len(tr.lines) == len(line)
    assert tr.not_applicable == ["trainer.balance_batch: every data-parallel rank gets the same number of samples"]
    assert tr.unsupported == [
        "distillation.enabled=True: no on-policy distillation",
        "trainer.totl_epochs: no such verl key here; did you mean 'trainer.total_epochs'? (core/verl/keys.py lists "
        "verl's keys and what each is here)"]  # data.prompt_key=prompt is what happens here anyway: accepted


def test_the_translation_validates_into_our_config():
    """Every our-key the table names exists in our schema (a typo in the table would surface in a user's run)."""
    keys = {k for row in TABLE for k in row.ours}
    tree: dict = {}
    for key in keys:
        *parents, leaf = key.split(".")
        node = tree
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = None
    for key in sorted(keys):
        node, parts = RunConfig(), key.split(".")
        for part in parts:
            node = node[part] if isinstance(node, dict) else getattr(node, part if part != "async" else "async_")
    assert validate(RunConfig, translate(GRPO).tree())


def test_every_row_has_a_rule_that_converts_it_and_lookup_finds_prefix_rows():
    assert unused_rows() == []
    assert lookup(f"{A}actor.fsdp_config.reshard_after_forward").kind == "not_applicable"
    assert lookup(f"{A}actor.megatron.tensor_model_parallel_size").ours == ("actor.megatron.tp",)  # its own row
    assert lookup("+ray_kwargs.ray_init.num_cpus").kind == "not_applicable"


def test_the_docs_page_is_generated_from_the_table():
    from pathlib import Path

    from core.verl.docs import page

    doc = Path(BASE).parents[1] / "docs" / "coming-from-verl.md"
    assert doc.read_text() == page(), "regenerate: python -m core.verl.docs > docs/coming-from-verl.md"


def test_an_unsupported_key_stops_the_run_before_ray_one_line_each(capsys):
    rc = cli_main(["plan", "--verl", *GRPO, "distillation.enabled=True", "trainer.totl_epochs=3"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("hybridrl: 2 verl key(s) of the command line have no counterpart here:\n"
                                      "- distillation.enabled=True: no on-policy distillation\n"), err


def test_plan_from_verl_keys_shows_our_units(capsys, tmp_path):
    pd.DataFrame([{"data_source": "hybridrl/arith", "prompt": [{"role": "user", "content": "1 + 1?"}],
                   "reward_model": {"style": "rule", "ground_truth": "2"}}]).to_parquet(tmp_path / "t.parquet")
    rc = cli_main(["plan", "--verl", *GRPO, f"data.train_files={tmp_path / 't.parquet'}", "data.val_files=[]",
                   "trainer.device=cpu", "trainer.n_gpus_per_node=2", "trainer.nnodes=1", f"{A}rollout.name=embedded",
                   f"trainer.default_local_dir={tmp_path / 'out'}"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "samples per step           160  (= prompts x n=5)" in out
    assert "mini-batches per step      4 x 40 samples" in out  # verl's 32 / 8 prompts = 4 updates


@pytest.mark.parametrize("script_line", ["ppo_mini_batch_size=8 with n=5"])
def test_a_verl_value_given_to_our_own_key_is_not_converted(script_line):
    """The trap without --verl: our key takes samples, so verl's 8 would be 8 samples (a fifth of verl's batch)."""
    cfg = validate(RunConfig, {"actor": {"ppo_mini_batch_size": 8}, "algo": {"sampling": {"n": 5}}})
    assert cfg.actor.ppo_mini_batch_size == 8 and translate(GRPO).full["actor.ppo_mini_batch_size"] == 40


def test_a_gae_line_places_the_critic_and_the_critic_follows_the_actor(capsys, tmp_path):
    """verl's quickstart shape: gae (verl's default) makes a critic; its mini-batch and micro-batching follow the
    actor's when absent; it gets a pool (every role on verl's one pool) -- a critic without one is refused."""
    line = [f"{A}model.path=SmolLM2-135M-Instruct", f"{A}rollout.name=embedded", "data.train_batch_size=256",
            f"{A}actor.ppo_mini_batch_size=64", f"{A}actor.ppo_micro_batch_size_per_gpu=4", "trainer.device=cpu",
            "trainer.n_gpus_per_node=2", "trainer.logger=console", f"trainer.default_local_dir={tmp_path}"]
    o = translate(line).full
    assert o["use_critic"] and o["placement.roles.critic"] == "main"
    assert o["critic.ppo_mini_batch_size"] == 64 and o["critic.loss_agg_mode"] == "token-mean"
    assert cli_main(["plan", "--verl", *line]) == 0, capsys.readouterr()
    from core.checks import problems

    cfg = validate(RunConfig, {"use_critic": True, "algo": {"adv": {"estimator": "gae"}}})
    assert any("no pool for critic" in p for p in problems(cfg))


def test_warmup_counts_optimizer_steps_here():
    """verl warms up over RL steps; ours over optimizer steps: 10 x ceil(1024 / 256) x 1 = 40."""
    o = translate(GRPO + ["data.train_batch_size=1024", f"{A}actor.ppo_mini_batch_size=256",
                          f"{A}actor.optim.lr_warmup_steps=10"]).full
    assert o["actor.optim.warmup_steps"] == 40


def test_values_hydra_reads_back_as_written():
    """A value with ~, ( or a quote is quoted for Hydra; a name that looks like a number stays a string."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    tr = translate(GRPO + ["trainer.experiment_name=20240601", "data.train_files=~/data/x.parquet",
                           "trainer.project_name=qwen3(8b)'s"])
    parsed = {o.key_or_group: o.value() for o in OverridesParser.create().parse_overrides(tr.overrides())}
    assert parsed["trainer.experiment_name"] == "20240601" and parsed["data.train_files"] == ["~/data/x.parquet"]
    assert parsed["trainer.project_name"] == "qwen3(8b)'s"


def test_a_given_key_is_not_overridden_by_an_absent_aliass_default_and_null_is_verls_default():
    o = translate(GRPO + ["reward.reward_model.enable=True", "reward.reward_model.model_path=rm"]).full
    assert o["use_reward_model"] is True and o["placement.roles.reward_model"] == "main"
    o = translate(GRPO + [f"{A}actor.optim.lr_warmup_steps=null", "data.val_files=null",
                          f"{A}model.target_modules=all-linear"]).full
    assert o["actor.optim.warmup_steps"] == 0 and o["data.val_files"] == []  # null files: none
    assert "actor.lora.target_modules" not in o


def test_ulysses_takes_the_actors_when_above_one_and_sapo_reads_the_actor_level_taus():
    o = translate(GRPO + [f"{A}actor.ulysses_sequence_parallel_size=1",
                          f"{A}actor.fsdp_config.ulysses_sequence_parallel_size=4", f"{A}actor.tau_pos=0.9"]).full
    assert o["actor.ulysses_sp"] == 4 and o["actor.loss.sapo_tau_pos"] == 0.9


def test_the_verl_keys_demo_is_the_demo():
    """recipes/grpo/run_verl_keys_cpu.sh, translated, is demo_cpu.yaml's run: every key equal but the names, the
    trackers, the reward file (the same registry reward) and knobs this run never reads."""
    import dataclasses
    import re
    from pathlib import Path

    from core.run import load_recipe_config

    recipe = Path(BASE).parents[1] / "recipes" / "grpo"
    keys = [k.replace("'", "") for k in re.findall(r"^    ([a-z_.]+=\S+) \\$", (recipe / "run_verl_keys_cpu.sh")
                                                   .read_text(), re.M)]
    tr = translate(keys)
    ours, _ = load_recipe_config(BASE, "config", tr.overrides())
    demo, _ = load_recipe_config(recipe, "demo_cpu")

    def flat(tree, key=""):
        if isinstance(tree, dict):
            return {k: x for n, sub in tree.items() for k, x in flat(sub, f"{key}.{n}" if key else n).items()}
        return {key: tree}

    a, b = flat(dataclasses.asdict(ours)), flat(dataclasses.asdict(demo))
    differ = {k for k in a if a[k] != b[k]}
    assert differ == {"trainer.output_dir", "trainer.log_val_generations", "trainer.save_keep", "trainer.logger",
                      "trainer.experiment_name", "actor.loss.kl_cov_coef", "algo.kl_in_reward.kind", "reward.path"}
