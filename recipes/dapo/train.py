"""DAPO (Yu et al. 2025, arXiv:2503.14476): its own copy of the RL step, with dynamic sampling and overlong shaping.

    hybridrl train dapo [--config-name demo_cpu] [--dry-run] [hydra overrides]
    python recipes/dapo/train.py [...]                                      (the same, without the CLI)

The step differs from ``core.loop.step`` in one place: generation. Batches of ``data.prompts_per_step`` prompts
(the gen batch) x n are generated, scored and shaped by the overlong penalty, and only groups whose metric varies
are kept, until ``data.train_prompts_per_step`` groups are kept (the surplus is cut). The rest -- old log-probs,
advantages (with truncated IS when ``algo.tis_cap`` is set), the clip-higher / token-mean update, the weight sync
and the step's metrics -- are core's public phases (``core.loop``). No reference, no KL.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Callable


import torch

from core.algos import groups_with_variance, overlong_penalty, scores_to_token_rewards
from core.config import AlgoConfig, SamplingParams
from core.loop import Roles, Timer, advantages, generate, logprobs, score, step_metrics, update
from core.protocol import Batch

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class DAPOConfig:
    """The ``dapo:`` section of this recipe's config (how many groups a step keeps: data.train_prompts_per_step)."""

    # keep a group only if this varies across its samples: acc (the reward's correctness) or score
    filter_metric: str = "acc"
    # give up after this many gen batches in one step (<= 0: no limit)
    max_num_gen_batches: int = 10
    # overlong shaping: the last `overlong_buffer` tokens before max_new_tokens ramp the penalty to -overlong_penalty
    overlong_buffer: int = 4096
    overlong_penalty: float = 1.0


def gen_batch_sampling(sampling: SamplingParams, gen_batch: int) -> SamplingParams:
    """The sampling of a step's ``gen_batch``-th draw (1-based): the first keeps the step's seed, later ones move
    it by a stride past any rank offset (``replica_seed``), so a redraw does not replay the first draw's uniforms."""
    return replace(sampling, seed=sampling.seed + 1_000_000_007 * (gen_batch - 1))


def step(roles: Roles, draw: Callable[[], Batch], cfg: AlgoConfig, reward_fn: Callable, dapo: DAPOConfig,
         train_groups: int, update_actor: bool = True, kl_ctrl=None) -> tuple[Batch, dict[str, float]]:
    timer, n = Timer(), cfg.sampling.n
    kept, kept_rows, gen_batches, groups_seen, failed, lengths, penalties, raw = [], 0, 0, 0, 0, [], [], []
    with timer("step"):
        # 1-2. generate, score, shape and filter gen batches until enough groups vary (dynamic sampling)
        while kept_rows < train_groups * n:
            gen_batches += 1
            if 0 < dapo.max_num_gen_batches < gen_batches:
                raise RuntimeError(f"dapo: {dapo.max_num_gen_batches} gen batches kept only {kept_rows // n} of "
                                   f"{train_groups} groups with varying {dapo.filter_metric}; raise "
                                   f"dapo.max_num_gen_batches or data.prompts_per_step")
            batch = generate(roles, draw(), gen_batch_sampling(cfg.sampling, gen_batches), timer)
            scored = score(roles, batch, cfg, reward_fn, timer)
            length = batch["response_mask"].sum(-1)
            shaped = overlong_penalty(length, cfg.sampling.max_new_tokens, dapo.overlong_buffer, dapo.overlong_penalty)
            unshaped = batch["scores"]  # the reward (with a reward model: core's weighted sum)
            batch["scores"] = unshaped + shaped
            acc = scored.extras.get("acc")
            metric = (unshaped if dapo.filter_metric == "score" or acc is None
                      else torch.tensor([float(a) for a in acc]))
            keep = groups_with_variance(batch["uid"], metric)
            groups_seen, failed = groups_seen + len(batch) // n, failed + scored.num_failed
            lengths.append(length)
            penalties.append(shaped)
            raw.append(unshaped)
            kept.append(batch.index(keep.nonzero().squeeze(-1)))
            kept_rows += len(kept[-1])
        batch = Batch.concat(kept).index(slice(0, train_groups * n))
        batch["token_rewards"] = scores_to_token_rewards(batch["scores"], batch["response_mask"])
        # 3. log-probs under the actor before the update (no reference: DAPO has no KL)
        batch = logprobs(roles, batch, cfg, timer, update_actor, kl_ctrl)
        # 5. advantages by algo.adv.estimator (grpo), truncated IS when algo.tis_cap > 0
        advantages(batch, cfg, timer)
        # 6. policy update (clip-higher, token-mean) and the weight sync
        updates = update(roles, batch, cfg, timer, update_actor)
    all_len, all_pen, every = torch.cat(lengths), torch.cat(penalties), torch.cat(raw)
    # reward/mean: every generated sample's reward before shaping (what the policy scores); the trained batch's
    # shaped scores are biased toward mixed groups by the filter
    return batch, step_metrics(batch, updates, timer, failed, cfg) | {
        "reward/mean": float(every.mean()), "reward/std": float(every.std()),
        "dapo/trained_score_mean": float(batch["scores"].mean()),
        "dapo/num_gen_batches": float(gen_batches), "dapo/kept_group_frac": kept_rows / n / groups_seen,
        "dapo/overlong_frac": float((all_pen < 0).float().mean()),
        "dapo/overlong_penalty_mean": float(all_pen.mean()),
        "dapo/gen_response_length/mean": float(all_len.mean())}


def make_step(cfg, sections: dict) -> Callable:
    """``core.trainer.fit``'s step_fn: this step with the ``dapo:`` section and the groups a step keeps."""
    return partial(step, dapo=sections["dapo"], train_groups=cfg.data.train_prompts_per_step or cfg.data.prompts_per_step)


# this recipe's own config sections (`hybridrl config show dapo` shows them resolved)
SECTIONS = {"dapo": DAPOConfig}


def main(argv: list[str] | None = None) -> int:
    from core.run import main as run

    return run(argv, config_dir=HERE, sections=SECTIONS, make_step=make_step)


if __name__ == "__main__":
    sys.exit(main())
