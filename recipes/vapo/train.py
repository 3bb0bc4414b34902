"""VAPO (Yue et al. 2025, arXiv:2504.05118): its own copy of the RL step, built from core's public phases.

    hybridrl train vapo [--config-name demo_cpu] [--dry-run] [hydra overrides]
    python recipes/vapo/train.py [...]                                      (the same, without the CLI)

PPO with a critic, plus VAPO's seven changes, each a setting of config.yaml except the first:
1. value pre-training: for ``trainer.critic_warmup`` steps the frozen initial policy rolls out and only the critic
   learns, toward Monte-Carlo returns -- this step then skips the actor's log-prob pass too (nothing reads it:
   no policy update, no KL), which is where it differs from ``core.loop.step``;
2. decoupled GAE (critic targets with lam_critic = 1) and 3. length-adaptive GAE (the actor's lam_i = 1 - 1/(alpha
   l_i)): ``algo.adv.estimator: length_adaptive_gae``; 4. clip-higher: ``actor.loss.clip_high``; 5. token-level
   loss: ``actor.loss_agg_mode: token-mean``; 6. positive-example NLL: ``actor.positive_nll_coef``; 7. group
   sampling: ``algo.sampling.n``. No reference, no KL (a config that sets one is refused).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from core.algos import length_adaptive_lambda
from core.checks import ConfigError
from core.config import AlgoConfig
from core.loop import (Roles, Timer, advantages, generate, logprobs, score,
                       step_metrics, update, values)
from core.protocol import Batch

HERE = Path(__file__).resolve().parent


def step(roles: Roles, draw: Callable[[], Batch], cfg: AlgoConfig, reward_fn: Callable, update_actor: bool = True,
         kl_ctrl=None) -> tuple[Batch, dict[str, float]]:
    """One VAPO step on the next prompt batch (``draw()``); ``update_actor`` false: a value pre-training step."""
    timer = Timer()
    with timer("step"):
        # 1. generate n responses per prompt (group sampling), with the engine's log-probs of the sampled tokens
        batch = generate(roles, draw(), cfg.sampling, timer)
        # 2. score each response; the outcome goes on its last valid token
        scored = score(roles, batch, cfg, reward_fn, timer)
        # 3. the actor's log-probs before its update -- policy steps only; the first mini-batch's are left to the
        #    update's own forward
        if update_actor:
            batch = logprobs(roles, batch, cfg, timer, kl_ctrl=kl_ctrl)
        # 4. the critic's value of every response prefix
        values(roles, batch, timer)
        # 5. decoupled, length-adaptive GAE: returns with lam_critic (1: Monte-Carlo), advantages with lam_i
        advantages(batch, cfg, timer)
        # 6. critic update; after pre-training also the policy update (clip-higher, token-mean, + mu x NLL of the
        #    correct samples) and the weight sync
        updates = update(roles, batch, cfg, timer, update_actor)
    if not update_actor:  # no actor pass ran: the rollout-vs-trainer log-prob gap is not measured this step
        batch["old_logprobs"] = batch["rollout_logprobs"]
    metrics = step_metrics(batch, updates, timer, scored.num_failed, cfg)
    if not update_actor:
        metrics = {k: v for k, v in metrics.items() if not k.startswith("rollout/logprob_diff")}
    lam = length_adaptive_lambda(batch["response_mask"], cfg.adv.length_alpha)
    return batch, metrics | {"vapo/value_pretraining": float(not update_actor),
                             "vapo/lam_policy_mean": float(lam.mean()),
                             "vapo/correct_frac": float((batch["scores"] > 0).float().mean())}


def make_step(cfg, sections: dict) -> Callable:
    """``core.trainer.fit``'s step_fn, after the checks of what VAPO does not do (before Ray starts)."""
    if cfg.actor.kl_loss_coef > 0 or cfg.algo.kl_in_reward.coef > 0 or cfg.use_ref:
        raise ConfigError("vapo: VAPO has no reference and no KL term: set actor.kl_loss_coef=0, "
                          "algo.kl_in_reward.coef=0, use_ref=false (or start from recipes/ppo)")
    if not cfg.use_critic or cfg.algo.adv.estimator not in ("length_adaptive_gae", "decoupled_gae"):
        raise ConfigError(f"vapo: needs the critic (use_critic=true) and a decoupled GAE (algo.adv.estimator="
                          f"length_adaptive_gae or decoupled_gae); got use_critic={cfg.use_critic}, "
                          f"estimator={cfg.algo.adv.estimator!r}")
    return step


def main(argv: list[str] | None = None) -> int:
    from core.run import main as run

    return run(argv, config_dir=HERE, make_step=make_step)


if __name__ == "__main__":
    sys.exit(main())
