"""core.checks: sections that disagree fail before Ray, every problem named with its keys and the fix, all at once;
unknown reward data_sources are found at load, naming the file and row. Each case here passed validation before
(every section valid on its own) and failed only after Ray, model loading and a generation -- or never."""

import pytest

from core.checks import ConfigError, check_data_sources, check_run, problems
from core.config import RunConfig, validate


def run_config(**sections) -> RunConfig:
    tree = {"actor": {"model": "m", "temperature": 0.7}, "rollout": {"model": "m"},
            "algo": {"sampling": {"temperature": 0.7}}}
    for key, value in sections.items():
        section, _, field = key.partition("__")
        node = tree.setdefault(section, {})
        for part in field.split("__")[:-1]:
            node = node.setdefault(part, {})
        if field:
            node[field.split("__")[-1]] = value
        else:
            tree[section] = value
    return validate(RunConfig, tree)


def test_a_consistent_config_has_no_problems():
    assert problems(run_config()) == []
    roles = {"actor": "main", "rollout": "main", "ref": "main", "critic": "main"}
    check_run(run_config(use_critic=True, algo__adv__estimator="gae", placement__roles=roles))


@pytest.mark.parametrize("change,message", [
    ({"actor__temperature": 1.0}, "actor.temperature=1.0 but algo.sampling.temperature=0.7: the trainer would score"),
    ({"rollout__model": "other"}, "rollout.model='other' but actor.model='m': the rollout engine receives"),
    ({"algo__adv__estimator": "grpoo"}, "algo.adv.estimator='grpoo' is no advantage estimator; did you mean 'grpo'? (known: decoupled_gae"),
    ({"actor__loss__name": "vanila"}, "actor.loss.name='vanila' is no policy loss; did you mean 'vanilla'? (known:"),
    ({"actor__loss_agg_mode": "token_mean"}, "actor.loss_agg_mode='token_mean' is no loss aggregation; did you mean 'token-mean'? (known:"),
    ({"critic__loss_agg_mode": "mean"}, "critic.loss_agg_mode='mean' is no loss aggregation"),
    ({"actor__kl_loss_type": "k4"}, "actor.kl_loss_type='k4' is no KL kind"),
    ({"algo__kl_in_reward__kind": "kl3"}, "algo.kl_in_reward.kind='kl3' is no KL kind"),
    ({"algo__adv__estimator": "gae"}, "algo.adv.estimator='gae' reads a critic's values but use_critic is false"),
    ({"use_critic": True}, "use_critic is true but algo.adv.estimator='grpo' never reads the critic's values"),
    ({"trainer__async__mode": "one_step_off"}, "trainer.async.mode=one_step_off generates the next step's samples "
     "while the actor updates, so the rollout needs processes of its own (a pool of its own, trainer.backend=ray), "
     "but placement.roles.rollout is the actor's pool 'main'"),
    ({"trainer__async__mode": "streaming", "rollout__backend": "sglang", "placement__pools__main__device": "cuda"},
     "trainer.async.mode=streaming runs on "
     "rollout.backend=embedded (updates between decode steps) or vllm (between chunks of trainer.async.chunk_steps "
     "tokens), got sglang"),
    ({"trainer__async__mode": "streaming", "rollout__backend": "vllm", "rollout__agent__enable": True},
     "trainer.async.mode=streaming with rollout.agent needs rollout.backend=embedded"),
    ({"trainer__async__mode": "streaming", "algo__adv__estimator": "remax"}, "algo.adv.estimator=remax generates a "
     "greedy baseline for the step's prompts"),
    ({"trainer__async__mode": "streaming", "data__prompts_per_step": 3}, "trainer.async.mode=streaming adds each "
     "step's prompts evenly over the rollout's 2 replicas: data.prompts_per_step=3 must divide by 2"),
    ({"actor__loss__name": "dro"}, "actor.loss.name=dro needs actor.loss.dro_beta > 0"),
    ({"actor__loss__reinforce_is": "seq"}, "actor.loss.reinforce_is='seq': one of '' (none), token, sequence"),
    ({"actor__ulysses_sp": 4}, "actor.ulysses_sp=4 does not divide the actor pool's 2 ranks (1 x 2)"),
])
def test_each_disagreement_is_named_with_its_keys_and_fix(change, message):
    with pytest.raises(ConfigError) as e:
        check_run(run_config(**change))
    assert message in str(e.value) and "\n" not in str(e.value)  # one problem, one line


def test_every_problem_is_reported_at_once():
    found = problems(run_config(actor__temperature=1.0, rollout__model="x", algo__adv__estimator="nope"))
    assert len(found) == 3
    with pytest.raises(ConfigError, match=r"^3 problems in the run config:\n- ") as e:
        check_run(run_config(actor__temperature=1.0, rollout__model="x", algo__adv__estimator="nope"))
    assert str(e.value).count("\n- ") == 3


def test_the_greedy_sampling_of_validation_is_no_mismatch():
    """temperature 0 (greedy) samples have no tempered distribution to agree with."""
    assert problems(run_config(algo__sampling__temperature=0.0, actor__temperature=1.0)) == []


def test_unknown_data_sources_name_the_file_the_first_row_and_the_count():
    rows = [{"data_source": s} for s in ("openai/gsm8k", "my/task", "openai/gsm8k", "my/task", "typo")]
    with pytest.raises(ConfigError, match=r"data.train_files \['a.parquet'\]: no reward for data_source "
                                          r"'my/task' \(2 rows, the first is row 2\); 'typo' \(1 rows, the first is row 5\)"):
        check_data_sources(rows, "data.train_files ['a.parquet']", custom_reward=False)
    check_data_sources(rows, "x", custom_reward=True)  # a custom reward file decides for itself
    check_data_sources(rows[:1], "x", custom_reward=False)


def test_fit_stops_on_a_disagreement_before_loading_anything(tmp_path):
    """fit() raises before reading the (missing) data or starting Ray."""
    from core.trainer import fit

    cfg = run_config(trainer__backend="ray", trainer__output_dir=str(tmp_path / "out"),
                     data__train_files=[str(tmp_path / "missing.parquet")], actor__temperature=1.0)
    with pytest.raises(ConfigError, match="actor.temperature=1.0"):
        fit(cfg)
    assert not (tmp_path / "out").exists()


def test_a_role_on_an_unknown_pool_and_a_missing_data_file_are_named():
    from core.data.dataset import load_rl_parquet

    with pytest.raises(ValueError, match=r"placement.roles names unknown pool\(s\) \{'actor': 'gpu'\}; pools are \['main'\]"):
        run_config(placement={"roles": {"actor": "gpu", "rollout": "main", "ref": "main"}})
    with pytest.raises(FileNotFoundError, match="data file not found: /nowhere/train.parquet"):
        load_rl_parquet("/nowhere/train.parquet")


def test_a_role_map_naming_one_role_leaves_the_others_where_the_default_puts_them():
    """`placement.roles.rollout=gen` on the command line (the docs' split placement): the actor and the reference stay
    on 'main' (the map once replaced the default whole, and the checks failed with KeyError: 'actor')."""
    pools = {"main": {"slots_per_node": 2}, "gen": {"slots_per_node": 1}}
    cfg = validate(RunConfig, {"placement": {"pools": pools, "roles": {"rollout": "gen"}}})
    assert cfg.placement.roles == {"actor": "main", "ref": "main", "teacher": "main", "rollout": "gen"}
    assert problems(cfg) == []
    cfg = validate(RunConfig, {"placement": {"pools": {"train": {}, "infer": {}}, "roles": {"actor": "train",
                                                                                         "rollout": "infer"}}})
    assert cfg.placement.roles["ref"] == "train"  # no 'main': with the actor
    with pytest.raises(ValueError, match="placement.roles names no pool for the actor"):
        validate(RunConfig, {"placement": {"pools": {"train": {}}, "roles": {"rollout": "train"}}})


def test_a_loss_that_aggregates_its_own_way_refuses_another_mode():
    found = problems(run_config(actor__loss__name="gspo", actor__loss_agg_mode="seq-mean-token-sum"))
    assert found == ["actor.loss.name='gspo' aggregates by seq-mean-token-mean whatever actor.loss_agg_mode says: "
                     "'seq-mean-token-sum' would have no effect; drop actor.loss_agg_mode"]
    assert problems(run_config(actor__loss__name="gspo")) == []
    assert problems(run_config(actor__loss__name="gspo", actor__loss_agg_mode="seq-mean-token-mean")) == []  # its own


@pytest.mark.parametrize("mode,ok", [("token-mean", True), ("seq-mean-token-sum", True),
                                     ("seq-mean-token-mean", False), ("seq-mean-token-sum-norm", False)])
def test_sppo_takes_only_the_modes_whose_loss_it_computes(mode, ok):
    """SPPO's loss is a mean over samples of a per-sample square: verl's recipe calls that "token-mean" (and
    crashes on any other mode); it is our seq-mean-token-sum. The rest are refused before anything starts."""
    found = problems(run_config(actor__loss__name="sppo", actor__loss_agg_mode=mode))
    assert (found == []) == ok, found


def test_overrides_of_keys_the_yaml_leaves_out_take_effect_and_typos_are_named():
    """Hydra refuses `key=value` for a key its yaml does not spell out ("To append to your config use +key=..."),
    also for a schema field left at its default. Such overrides are now added, and validation names typos."""
    from pathlib import Path

    from core.run import load_run_config

    ppo = Path(__file__).resolve().parents[1] / "recipes" / "ppo"
    assert "backend:" not in (ppo / "config.yaml").read_text().split("rollout:")[1].split("\n\n")[0]
    cfg = load_run_config(ppo, "config", ["rollout.backend=vllm", "placement.pools.gen={nnodes: 1, slots_per_node: 1}",
                                          "placement.roles.rollout=gen"])
    assert cfg.rollout.backend == "vllm" and cfg.placement.pools["gen"].slots_per_node == 1
    assert cfg.placement.roles["rollout"] == "gen"
    with pytest.raises(ValueError, match=r"^actor.micro_batch_sise: unknown key; did you mean 'micro_batch_size'\? \(set on the command line"):
        load_run_config(ppo, "config", ["actor.micro_batch_sise=3"])


def test_megatron_layout_must_fit_the_actor_pool_and_what_cannot_run_is_named_before_ray():
    from core.config import ActorConfig, MegatronConfig
    from core.train.megatron_actor import run_problem

    assert problems(run_config(actor__strategy="megatron", actor__megatron={"tp": 2})) == []  # default pool: 2 ranks
    found = problems(run_config(actor__strategy="megatron", actor__megatron={"tp": 2, "pp": 2}))
    assert found == ["actor.megatron tp=2 x pp=2 = 4 ranks per model replica does not divide the actor pool's 2 "
                     "ranks (1 x 2); change tp / pp or the pool"]
    with pytest.raises(ValueError, match="actor.megatron is set but actor.strategy='fsdp': set strategy: megatron"):
        run_config(actor__megatron={"tp": 2})
    with pytest.raises(ValueError, match=r"actor.strategy must be one of \('fsdp', 'megatron'\), got 'deepspeed'"):
        run_config(actor__strategy="deepspeed")
    mg = ActorConfig(model="m", strategy="megatron", megatron=MegatronConfig(tp=2))
    assert run_problem(mg, "llama", 4, images=False) is None
    assert "expert parallelism needs a mixture of experts; m is dense" in run_problem(
        ActorConfig(model="m", strategy="megatron", megatron=MegatronConfig(ep=2)), "llama", 4, images=False)
    assert run_problem(ActorConfig(model="m", strategy="megatron", megatron=MegatronConfig(ep=2)), "mixtral", 4) is None
    assert "tp: 1, pp: 1" in run_problem(mg, "mixtral", 4)
    assert "mixes dense and MoE layers" in run_problem(mg, "qwen2_moe", 4, dense_layers=True)
    assert "max_tokens_per_micro 0" in run_problem(ActorConfig(model="m", strategy="megatron", max_tokens_per_micro=64,
                                                               megatron=MegatronConfig(ep=2)), "mixtral", 4)
    assert "critic runs tensor parallelism only" in run_problem(
        ActorConfig(model="m", strategy="megatron", megatron=MegatronConfig(pp=2)), "llama", 4, name="critic")
    assert run_problem(ActorConfig(model="m", strategy="megatron", megatron=MegatronConfig(pp=2)), "llama", 4,
                       layers=3) == "actor.megatron.pp=2 does not divide m's 3 layers"
    assert run_problem(mg, "gemma", 4, images=False) == ("actor.strategy=megatron converts llama, qwen2, mixtral and "
                                                        "qwen2_moe models; m is 'gemma'")
    critic = run_config(use_critic=True, algo__adv__estimator="gae", critic__strategy="megatron",
                        critic__megatron={"tp": 4}, placement={"roles": {"actor": "main", "rollout": "main",
                                                                         "critic": "main"}})
    assert problems(critic) == ["critic.megatron tp=4 x pp=1 = 4 ranks per model replica does not divide the "
                                "critic pool's 2 ranks (1 x 2); change tp / pp or the pool"]
    assert run_problem(mg, "llama", 3, images=False) == "actor.megatron.tp=2 does not divide m's 3 attention heads"
    assert "no vision tower path" in run_problem(mg, "qwen2", 4, images=True)


@pytest.mark.parametrize("mode", ["one_step_off", "streaming"])
def test_async_runs_turn_truncated_is_on_unless_the_run_sets_its_own(mode):
    """Their samples are stale: algo.tis_cap 0 becomes trainer.async.tis_cap (2); a cap set is kept;
    trainer.async.tis_cap=0 leaves it off. The YAML key is ``async`` (a Python keyword: the field is async_)."""
    assert run_config(trainer__async__mode=mode).algo.tis_cap == 2.0
    assert run_config(trainer__async__mode=mode, algo__tis_cap=5.0).algo.tis_cap == 5.0
    assert run_config(trainer__async__mode=mode, trainer__async__tis_cap=0.0).algo.tis_cap == 0.0
    assert run_config().algo.tis_cap == 0.0
    with pytest.raises(ValueError, match=r"trainer.async.mdoe: unknown key; did you mean 'mode'\?"):
        run_config(trainer__async__mdoe="sync")
    with pytest.raises(ValueError, match=r"trainer.async.mode"):
        run_config(trainer__async__mode="fully_async")
