"""PRIME (Cui et al. 2025, arXiv:2502.01456): RL with dense rewards from an implicit process reward model.

    hybridrl train prime [--config-name demo_cpu] [--dry-run] [hydra overrides]
    python recipes/prime/train.py [...]                                       (the same, without the CLI)

The step differs from ``core.loop.step`` in two places. After scoring, the oversampled gen batch
(``data.prompts_per_step`` prompts) is cut to ``data.train_prompts_per_step`` groups, those whose accuracy lies within
``prime.accuracy_lower_bound .. upper_bound`` first (verl's ``filter_and_downsample``). After the log-probs, the
implicit PRM (core's ``prm`` role, ``implicit_prm:``) learns from the kept samples' outcome labels and gives every
response token a process reward (``core.implicit_prm.process_rewards``); the advantages (``algo.adv.estimator:
prime``) are leave-one-out baselines on those and on the outcome, summed, returned and whitened. The rest -- the PPO
update, the weight sync, the step's metrics -- are core's public phases.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable


import torch

from core.config import AlgoConfig, ImplicitPRMConfig
from core.implicit_prm import process_rewards
from core.loop import (Roles, Timer, advantages, generate, logprobs, reward_kl_penalty,
                       score, step_metrics, update)
from core.protocol import Batch

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class PRIMEConfig:
    """The ``prime:`` section: which groups of the oversampled gen batch a step trains on (verl's data.* keys)."""

    # put groups whose mean accuracy is outside [lower, upper] last (verl: filter_accuracy, accuracy_lower_bound /
    # accuracy_upper_bound; with n = 4 the defaults keep groups of 1-3 right answers)
    filter_accuracy: bool = True
    accuracy_lower_bound: float = 0.2
    accuracy_upper_bound: float = 0.8
    # also put last the groups with a response cut at algo.sampling.max_new_tokens (verl: filter_truncate)
    filter_truncated: bool = False

    def __post_init__(self):
        if not 0 <= self.accuracy_lower_bound <= self.accuracy_upper_bound <= 1:
            raise ValueError(f"prime: need 0 <= accuracy_lower_bound <= accuracy_upper_bound <= 1, got "
                             f"{self.accuracy_lower_bound}, {self.accuracy_upper_bound}")


def keep_groups(batch: Batch, n: int, groups: int, prime: PRIMEConfig, max_new_tokens: int) -> tuple[Batch, float]:
    """The first ``groups`` prompt groups (n adjacent rows each) after a stable sort that puts the groups passing the
    filters first; returns them and the share of the gen batch's groups that passed. When fewer pass than are
    needed, failing groups fill the batch (verl's downsampling: the step's size never changes).
    Example: n 2, group accuracies [1, 0.5, 0, 0.5], 2 groups kept -> groups 1 and 3 (passed 0.5)."""
    acc = batch["scores"].reshape(-1, n).mean(-1)
    passed = torch.ones_like(acc, dtype=torch.bool)
    if prime.filter_accuracy:
        passed &= (acc >= prime.accuracy_lower_bound) & (acc <= prime.accuracy_upper_bound)
    if prime.filter_truncated:
        passed &= batch["response_mask"].sum(-1).reshape(-1, n).amax(-1) < max_new_tokens
    order = torch.argsort((~passed).to(torch.int8), stable=True)[:groups]
    rows = (order[:, None] * n + torch.arange(n)).flatten()
    return batch.index(rows), float(passed.float().mean())


def step(roles: Roles, draw: Callable[[], Batch], cfg: AlgoConfig, reward_fn: Callable, prime: PRIMEConfig,
         prm: ImplicitPRMConfig, train_groups: int, update_actor: bool = True, kl_ctrl=None
         ) -> tuple[Batch, dict[str, float]]:
    timer, n = Timer(), cfg.sampling.n
    with timer("step"):
        # 1. generate n responses for each prompt of the (oversampled) gen batch
        batch = generate(roles, draw(), cfg.sampling, timer)
        # 2. score each response with the verifier: its outcome label in [0, 1], on its last valid token
        scored = score(roles, batch, cfg, reward_fn, timer)
        every = batch["scores"]
        # 3. keep train_groups groups, those of mid accuracy first (PRIME's filter)
        batch, passed = keep_groups(batch, n, train_groups, prime, cfg.sampling.max_new_tokens)
        # 4. log-probs under the actor before the update and under the reference (the implicit PRM's baseline)
        batch = logprobs(roles, batch, cfg, timer, update_actor, kl_ctrl)
        kl = reward_kl_penalty(batch, kl_ctrl, cfg)
        # 5. the implicit PRM learns from the outcome labels (implicit_prm.update) and gives each token its reward
        prm_metrics = process_rewards(roles, batch, prm, timer)
        # 6. advantages: leave-one-out on the process rewards and on the outcome, summed, returned, whitened
        advantages(batch, cfg, timer)
        # 7. policy update (PPO clip) and the weight sync to the rollout engine
        updates = update(roles, batch, cfg, timer, update_actor)
    # reward/mean: every generated sample's (what the policy scores); the trained batch leans to mid-accuracy groups
    return batch, step_metrics(batch, updates | kl | prm_metrics, timer, scored.num_failed, cfg) | {
        "reward/mean": float(every.mean()), "reward/std": float(every.std()),
        "prime/trained_score_mean": float(batch["scores"].mean()), "prime/passed_group_frac": passed}


def make_step(cfg, sections: dict) -> Callable:
    """``core.trainer.fit``'s step_fn: this step with the ``prime:`` section, the run's implicit PRM config and the
    groups a step trains on."""
    return partial(step, prime=sections["prime"], prm=cfg.implicit_prm,
                   train_groups=cfg.data.train_prompts_per_step or cfg.data.prompts_per_step)


# this recipe's own config sections (`hybridrl config show prime` shows them resolved)
SECTIONS = {"prime": PRIMEConfig}


def main(argv: list[str] | None = None) -> int:
    from core.run import main as run

    return run(argv, config_dir=HERE, sections=SECTIONS, make_step=make_step)


if __name__ == "__main__":
    sys.exit(main())
