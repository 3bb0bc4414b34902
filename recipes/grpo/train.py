"""GRPO (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300): the RL step of this recipe, built from core's phases.

    hybridrl train grpo [--config-name demo_cpu] [--dry-run] [hydra overrides]
    python recipes/grpo/train.py [...]                                      (the same, without the CLI)

GRPO needs no critic: each prompt's n samples form a group and a sample's advantage is its score against the
group's (``algo.adv.estimator: grpo``); a KL loss to the reference keeps the policy close (``actor.kl_loss_coef``).
This file is the template of a new algorithm (``hybridrl new myalgo --from grpo``): change the phase that differs
-- e.g. the advantages line -- and keep the rest. Each phase is a public function of ``core.loop``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from core.config import AlgoConfig
from core.loop import (Roles, Timer, advantages, generate, logprobs, reward_kl_penalty,
                       score, step_metrics, update)
from core.protocol import Batch

HERE = Path(__file__).resolve().parent


def step(roles: Roles, draw: Callable[[], Batch], cfg: AlgoConfig, reward_fn: Callable, update_actor: bool = True,
         kl_ctrl=None) -> tuple[Batch, dict[str, float]]:
    """One GRPO step on the next prompt batch (``draw()``); returns the trained batch and the step's metrics."""
    timer = Timer()
    with timer("step"):
        # 1. generate n responses per prompt, with the rollout engine's log-probs of the sampled tokens
        batch = generate(roles, draw(), cfg.sampling, timer)
        # 2. score each response with the verifiable reward; the outcome goes on its last valid token
        scored = score(roles, batch, cfg, reward_fn, timer)
        # 3. log-probs under the actor before the update, and under the reference (for the KL loss)
        batch = logprobs(roles, batch, cfg, timer, update_actor, kl_ctrl)
        # 4. KL to the reference as a reward penalty, only when algo.kl_in_reward.coef > 0 (GRPO: a KL loss instead)
        kl = reward_kl_penalty(batch, kl_ctrl, cfg)
        # 5. advantages: each sample's score against its group's (algo.adv)
        advantages(batch, cfg, timer)
        # 6. policy update (PPO-clip epochs on every DP rank) and the weight sync to the rollout engine
        updates = update(roles, batch, cfg, timer, update_actor)
    return batch, step_metrics(batch, updates | kl, timer, scored.num_failed, cfg)


def main(argv: list[str] | None = None) -> int:
    from core.run import main as run

    return run(argv, config_dir=HERE, make_step=lambda cfg, sections: step)


if __name__ == "__main__":
    sys.exit(main())
