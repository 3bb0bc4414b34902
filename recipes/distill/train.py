"""On-policy distillation (GKD, Agarwal et al. 2024, arXiv:2306.13649; Thinking Machines' "On-Policy Distillation",
Lu et al. 2025; Qwen3, arXiv:2505.09388): the step of this recipe, built from core's phases.

    hybridrl train distill [--config-name teacher_cpu] [--dry-run] [hydra overrides]
    python recipes/distill/train.py [...]                                      (the same, without the CLI)

The student samples its own responses; a frozen teacher (the ``teacher`` role, ``teacher.model``: any HF causal LM
with the student's tokenizer) scores every sampled token; each token's advantage is the gap between the two
log-probs (``algo.adv.estimator``: distill_reverse_kl, distill_forward_kl or distill_mixed, core.algos.distill), and
the PPO-clipped update follows it. No critic, no reference, no reward needed for the signal (the reward is still
scored, as a metric, or mixed in with ``algo.adv.distill_outcome_coef``). ``teacher_cpu.yaml`` is GRPO on the same
task: it makes the CPU tier's teacher and is the RL run the distillation is compared with.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from core.config import AlgoConfig
from core.loop import Roles, Timer, advantages, generate, logprobs, reward_kl_penalty, score, step_metrics, update
from core.protocol import Batch

HERE = Path(__file__).resolve().parent


def step(roles: Roles, draw: Callable[[], Batch], cfg: AlgoConfig, reward_fn: Callable, update_actor: bool = True,
         kl_ctrl=None) -> tuple[Batch, dict[str, float]]:
    """One distillation step on the next prompt batch (``draw()``); returns the trained batch and its metrics."""
    timer = Timer()
    with timer("step"):
        # 1. the student generates n responses per prompt, with the rollout engine's log-probs of its tokens
        batch = generate(roles, draw(), cfg.sampling, timer)
        # 2. score each response with the verifiable reward (a metric here, unless mixed into the advantage)
        scored = score(roles, batch, cfg, reward_fn, timer)
        # 3. log-probs of the same tokens under the student before the update and under the teacher
        batch = logprobs(roles, batch, cfg, timer, update_actor, kl_ctrl)
        # 4. KL to a reference as a reward penalty, only when algo.kl_in_reward.coef > 0 (this recipe: none)
        kl = reward_kl_penalty(batch, kl_ctrl, cfg)
        # 5. advantages: each token's teacher - student log-prob gap (algo.adv.estimator, core.algos.distill)
        advantages(batch, cfg, timer)
        # 6. student update (PPO-clip epochs on every DP rank) and the weight sync to the rollout engine
        updates = update(roles, batch, cfg, timer, update_actor)
    return batch, step_metrics(batch, updates | kl, timer, scored.num_failed, cfg)


def main(argv: list[str] | None = None) -> int:
    from core.run import main as run

    return run(argv, config_dir=HERE, make_step=lambda cfg, sections: step)


if __name__ == "__main__":
    sys.exit(main())
