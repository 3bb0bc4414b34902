"""The whole run config (``RunConfig``), in the shape of a recipe's yaml: one field per top-level section.

    trainer: TrainerConfig   data: DataConfig   placement: PlacementConfig   actor: ActorConfig
    use_ref, use_critic      critic: CriticConfig   rollout: RolloutConfig   algo: AlgoConfig   reward: RewardConfig
    use_reward_model         reward_model: RewardModelConfig   implicit_prm: ImplicitPRMConfig   tools: ToolsConfig
    teacher: TeacherConfig

A recipe with a section of its own (DAPO's ``dapo:``) keeps it as a dataclass in its train.py, validated beside
this one (``core.run.load_recipe_config``), not as a subclass.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from core.config.algo import AlgoConfig
from core.config.ranges import Count, PositiveInt, check_fields
from core.config.roles import (ActorConfig, CriticConfig, ImplicitPRMConfig, RewardModelConfig, RolloutConfig,
                               TeacherConfig)
from core.config.schema import PlacementConfig, TrainerConfig


@dataclass(frozen=True)
class DataConfig:
    # verl-schema parquet files to train on
    train_files: list[str] = field(default_factory=list)
    # prompts per RL step (each sampled n times); with a filtering step (DAPO), prompts per draw (gen batch)
    prompts_per_step: PositiveInt = 8
    # prompts whose samples one step trains on, for a recipe's step that filters and redraws (DAPO's dynamic
    # sampling keeps this many groups); 0 = prompts_per_step. Core's step trains every prompt it draws.
    train_prompts_per_step: Count = 0
    # shuffle the prompts each epoch (seeded by trainer.seed)
    shuffle: bool = True
    # use only the first N rows (0 = all)
    limit: Count = 0
    # held-out verl-schema parquet scored greedily before training, every trainer.test_freq steps and at the end
    val_files: list[str] = field(default_factory=list)
    # use only the first N held-out rows (0 = all)
    val_limit: Count = 0
    # drop prompts longer than rollout.max_prompt_length tokens at load (counted) instead of applying truncation
    filter_overlong_prompts: bool = False
    # a prompt longer than rollout.max_prompt_length: error (names file, row, length) | left (keep its last
    # tokens) | right (keep its first)
    truncation: str = "error"

    def __post_init__(self):
        check_fields(self)


@dataclass(frozen=True)
class RewardConfig:
    # a Python file with a custom reward function (empty: the built-in registry keyed by data_source)
    path: str = ""
    # the function's name in that file
    name: str = "compute_score"


@dataclass(frozen=True)
class ToolsConfig:
    # where model-written code runs (agent tools, code rewards; core.tools.isolation): namespaces (bubblewrap: a
    # read-only view of the interpreter only, no network, uid nobody, cgroup limits; refused where namespaces
    # cannot be made) | process (rlimits and seccomp only: the tool reads every file the worker can)
    isolation: Literal["namespaces", "process"] = "namespaces"

    def __post_init__(self):
        check_fields(self)


@dataclass(frozen=True)
class RunConfig:
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    # a frozen reference policy (for the KL loss); off when actor.kl_loss_coef is 0 and this is false
    use_ref: bool = True
    # a value model (for GAE-style advantages: algo.adv.estimator gae and its variants)
    use_critic: bool = False
    critic: CriticConfig = field(default_factory=CriticConfig)
    # a reward model scoring (prompt, response) pairs beside the reward function (algo.reward_model_weight ...)
    use_reward_model: bool = False
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    # PRIME's implicit process reward model, trained online (a role of its own: placement.roles.prm)
    implicit_prm: ImplicitPRMConfig = field(default_factory=ImplicitPRMConfig)
    # on-policy distillation's frozen teacher (a role of its own: placement.roles.teacher; teacher.model set)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    tools: ToolsConfig = field(default_factory=ToolsConfig)

    def __post_init__(self):
        check_fields(self)
        a = self.trainer.async_
        # stale samples: truncated IS by default (not in bypass mode: the loss weighs by pi / pi_rollout there)
        if a.mode != "sync" and self.algo.tis_cap == 0 and a.tis_cap > 0 and not self.algo.bypass_mode:
            object.__setattr__(self, "algo", replace(self.algo, tis_cap=a.tis_cap))

    def has_reference(self) -> bool:
        """A frozen reference policy is placed: asked for, or needed by a KL loss, a KL reward penalty or an implicit
        PRM (its rewards are log-ratios to the reference)."""
        return (self.use_ref or self.actor.kl_loss_coef > 0 or self.algo.kl_in_reward.coef > 0
                or self.implicit_prm.enable)

    def placed_roles(self) -> dict[str, str]:
        """{role: pool} of the roles this run has (``placement.roles`` may name more: a recipe's map covers the
        reference, critic and reward model whether or not a run turns them on)."""
        has = {"actor": True, "rollout": True, "ref": self.has_reference(), "critic": self.use_critic,
               "reward_model": self.use_reward_model, "prm": self.implicit_prm.enable, "teacher": bool(self.teacher.model)}
        return {role: pool for role, pool in self.placement.roles.items() if has.get(role, False)}
