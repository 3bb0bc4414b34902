"""Vision-language GRPO: the RL step of this recipe, built from core's phases (image prompts flow through each
phase as the batch's ``multi_modal_inputs``: the rollout prefills them, the actor's forward passes take them).

    hybridrl train vlm [--config-name config] [--dry-run] [hydra overrides]
    python recipes/vlm/train.py [...]                                      (the same, without the CLI)

The step is GRPO's (``algo.adv.estimator: grpo``): each prompt's n samples form a group. Nothing in it branches on
images: the rollout worker expands each ``<image>`` with the model's processor and hands every sample its vision
inputs; the actor's and the reference's log-prob passes and the update run the model with them.
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
        batch = logprobs(roles, batch, timer, bypass=cfg.bypass_mode)
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
