"""SPPO (Wu et al. 2024, arXiv:2405.00675) in the form of verl's recipe/sppo: the RL step of this recipe, built from
core's phases.

    hybridrl train sppo [--config-name demo_cpu] [--dry-run] [hydra overrides]
    python recipes/sppo/train.py [...]                                      (the same, without the CLI)

One sample per prompt (``algo.sampling.n: 1``); its advantage is its reward against the soft-mean of the whole
batch's, A_i = R_i - (1/beta) log mean_j exp(beta R_j) (``algo.adv.estimator: sppo``); the loss regresses the
sequence log-ratio onto eta A_i, (sum_t log pi/pi_old - eta A_i)^2, mean over samples (``actor.loss.name: sppo``).
No reference, no KL, no critic. The phases are core's (``core.loop``); this step adds the baseline to the metrics.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from core.config import AlgoConfig
from core.loop import (Roles, Timer, advantages, generate, logprobs, score,
                       step_metrics, update)
from core.protocol import Batch

HERE = Path(__file__).resolve().parent


def step(roles: Roles, draw: Callable[[], Batch], cfg: AlgoConfig, reward_fn: Callable, update_actor: bool = True,
         kl_ctrl=None) -> tuple[Batch, dict[str, float]]:
    """One SPPO step on the next prompt batch (``draw()``); returns the trained batch and the step's metrics."""
    timer = Timer()
    with timer("step"):
        # 1. generate one response per prompt, with the rollout engine's log-probs of the sampled tokens
        batch = generate(roles, draw(), cfg.sampling, timer)
        # 2. score each response with the rule reward; the outcome goes on its last valid token
        scored = score(roles, batch, cfg, reward_fn, timer)
        # 3. log-probs under the actor before the update (the first mini-batch's: from the update's own forward)
        batch = logprobs(roles, batch, cfg, timer, update_actor, kl_ctrl)
        # 4. advantages: each reward against the whole batch's soft-mean (not a group's)
        advantages(batch, cfg, timer)
        # 5. the squared-loss update on every DP rank and the weight sync to the rollout engine
        updates = update(roles, batch, cfg, timer, update_actor)
    mask = batch["response_mask"]
    seq_adv = (batch["advantages"] * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return batch, step_metrics(batch, updates, timer, scored.num_failed, cfg) | {
        "sppo/baseline": float((batch["scores"] - seq_adv).mean())}


def main(argv: list[str] | None = None) -> int:
    from core.run import main as run

    return run(argv, config_dir=HERE, make_step=lambda cfg, sections: step)


if __name__ == "__main__":
    sys.exit(main())
