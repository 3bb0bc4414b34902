"""PPO (Schulman et al. 2017; for LLMs Ouyang et al. 2022): the RL step of this recipe, built from core's phases.

    hybridrl train ppo [--config-name demo_cpu] [--dry-run] [hydra overrides]
    python recipes/ppo/train.py [...]                                       (the same, without the CLI)

A critic (``use_critic: true``) values every response prefix; GAE turns rewards and values into advantages
(``algo.adv.estimator: gae``); KL to the reference can be a reward penalty with an adaptive coefficient
(``algo.kl_in_reward``) or a loss term; the critic warms up alone for ``trainer.critic_warmup`` steps
(``update_actor`` false). Each phase is a public function of ``core.loop``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from core.config import AlgoConfig
from core.loop import (Roles, Timer, advantages, generate, logprobs, reward_kl_penalty,
                       score, step_metrics, update, values)
from core.protocol import Batch

HERE = Path(__file__).resolve().parent


def step(roles: Roles, draw: Callable[[], Batch], cfg: AlgoConfig, reward_fn: Callable, update_actor: bool = True,
         kl_ctrl=None) -> tuple[Batch, dict[str, float]]:
    """One PPO step on the next prompt batch (``draw()``); returns the trained batch and the step's metrics."""
    timer = Timer()
    with timer("step"):
        # 1. generate n responses per prompt, with the rollout engine's log-probs of the sampled tokens
        batch = generate(roles, draw(), cfg.sampling, timer)
        # 2. score each response; the outcome goes on its last valid token
        scored = score(roles, batch, cfg, reward_fn, timer)
        # 3. log-probs under the actor before the update, and under the reference
        batch = logprobs(roles, batch, cfg, timer, update_actor, kl_ctrl)
        # 4. KL to the reference subtracted from the token rewards (algo.kl_in_reward); the critic's values
        kl = reward_kl_penalty(batch, kl_ctrl, cfg)
        values(roles, batch, timer)
        # 5. GAE advantages and returns from the token rewards and values
        advantages(batch, cfg, timer)
        # 6. critic update toward the returns; policy update (after the critic's warm-up) and the weight sync
        updates = update(roles, batch, cfg, timer, update_actor)
    return batch, step_metrics(batch, updates | kl, timer, scored.num_failed, cfg)


def main(argv: list[str] | None = None) -> int:
    from core.run import main as run

    return run(argv, config_dir=HERE, make_step=lambda cfg, sections: step)


if __name__ == "__main__":
    sys.exit(main())
