"""DAPO (Yu et al. 2025, arXiv:2503.14476): its own copy of the RL step, with dynamic sampling and overlong shaping.

    python recipes/dapo/train.py --config-dir recipes/dapo [--config-name ...] [hydra overrides]

The step differs from ``core.loop.step`` in one place: generation. Batches of ``data.prompts_per_step`` prompts
(the gen batch) x n are generated, scored and shaped by the overlong penalty, and only groups whose metric varies
are kept, until ``dapo.train_groups`` groups are kept (the surplus is cut). The rest -- old log-probs, GRPO
advantages, the clip-higher / token-mean update, the weight sync -- is core's, through its public API. No KL.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from core.algos import compute_advantages, groups_with_variance, overlong_penalty, scores_to_token_rewards  # noqa: E402
from core.engines.fsdp import FSDPActor  # noqa: E402
from core.engines.rollout import SamplingParams  # noqa: E402
from core.loop import Roles, StepConfig, Timer, reduce_over_ranks, sync_rollout  # noqa: E402
from core.protocol import Batch  # noqa: E402
from core.rewards import sample_names, score_batch  # noqa: E402
from core.roles import RolloutWorker  # noqa: E402
from core.trainer import RunConfig  # noqa: E402


@dataclass(frozen=True)
class DAPOConfig:
    # groups (prompts x n samples) per training step, kept after filtering
    train_groups: int = 8
    # keep a group only if this varies across its samples: acc (the reward's correctness) or score
    filter_metric: str = "acc"
    # give up after this many gen batches in one step (<= 0: no limit)
    max_num_gen_batches: int = 10
    # overlong shaping: the last `overlong_buffer` tokens before max_new_tokens ramp the penalty to -overlong_penalty
    overlong_buffer: int = 4096
    overlong_penalty: float = 1.0


@dataclass(frozen=True)
class DAPORunConfig(RunConfig):
    dapo: DAPOConfig = field(default_factory=DAPOConfig)

    def prompts_trained_per_step(self) -> int:
        return self.dapo.train_groups


def gen_batch_sampling(sampling: SamplingParams, gen_batch: int) -> SamplingParams:
    """The sampling of a step's ``gen_batch``-th draw (1-based): the first keeps the step's seed, later ones move
    it by a stride past any rank offset (``replica_seed``), so a redraw does not replay the first draw's uniforms."""
    return replace(sampling, seed=sampling.seed + 1_000_000_007 * (gen_batch - 1))


def dapo_step(roles: Roles, draw: Callable[[], Batch], cfg: StepConfig, reward_fn: Callable, dapo: DAPOConfig,
              update_actor: bool = True, kl_ctrl=None) -> tuple[Batch, dict[str, float]]:
    timer, t0, n = Timer(), time.perf_counter(), cfg.sampling.n
    kept, kept_rows, gen_batches, groups_seen, lengths, penalties, raw = [], 0, 0, 0, [], [], []
    # 1-2. generate, score, shape and filter gen batches until enough groups vary
    while kept_rows < dapo.train_groups * n:
        gen_batches += 1
        if 0 < dapo.max_num_gen_batches < gen_batches:
            raise RuntimeError(f"dapo: {dapo.max_num_gen_batches} gen batches kept only {kept_rows // n}"
                               f" of {dapo.train_groups} groups with varying {dapo.filter_metric}; raise "
                               f"dapo.max_num_gen_batches or data.prompts_per_step")
        with timer("gen"):
            batch = roles.rollout.dp_split(RolloutWorker.generate, draw(), gen_batch_sampling(cfg.sampling, gen_batches))
        with timer("reward"):
            texts = list(roles.rollout.dp_split(RolloutWorker.decode, batch)["response_text"])
            scored = score_batch(reward_fn, batch["data_source"], texts, batch["ground_truth"], batch["extra_info"],
                                 cfg.reward_workers, cfg.reward_timeout_s, cfg.reward_fallback,
                                 sample_names(batch))
            length = batch["response_mask"].sum(-1)
            shaped = overlong_penalty(length, cfg.sampling.max_new_tokens, dapo.overlong_buffer, dapo.overlong_penalty)
            batch["scores"] = scored.scores + shaped
            acc = scored.extras.get("acc")
            metric = (scored.scores if dapo.filter_metric == "score" or acc is None
                      else torch.tensor([float(a) for a in acc]))
            keep = groups_with_variance(batch["uid"], metric)
        groups_seen += len(batch) // n
        lengths.append(length)
        penalties.append(shaped)
        raw.append(scored.scores)
        kept.append(batch.index(keep.nonzero().squeeze(-1)))
        kept_rows += len(kept[-1])
    batch = Batch.concat(kept).index(slice(0, dapo.train_groups * n))
    batch["token_rewards"] = scores_to_token_rewards(batch["scores"], batch["response_mask"])
    # 3. old log-probs; 5. GRPO advantages; 6. update; 7. sync (no reference, no KL in DAPO)
    with timer("old_logprob"):
        batch = batch.union(roles.actor.dp_split(FSDPActor.compute_logprobs, batch))
    with timer("adv"):
        batch["advantages"], batch["returns"] = compute_advantages(batch, cfg.adv)
    with timer("update_actor"):
        actor = reduce_over_ranks(roles.actor.dp_split(FSDPActor.update, batch))
    with timer("sync_weights"):
        sync = sync_rollout(roles, cfg.sync_timeout_s)
    timer.seconds["step"] = time.perf_counter() - t0
    all_len, all_pen = torch.cat(lengths), torch.cat(penalties)
    mask = batch["response_mask"]
    # reward/mean: every generated sample's reward before shaping (what the policy scores); the trained batch's
    # shaped scores are biased toward mixed groups by the filter
    every = torch.cat(raw)
    return batch, {"reward/mean": float(every.mean()), "reward/std": float(every.std()),
                   "dapo/trained_score_mean": float(batch["scores"].mean()),
                   "response_length/mean": float(mask.sum(-1).mean()), "actor/kl_loss": 0.0, **actor, **sync,
                   "dapo/num_gen_batches": float(gen_batches),
                   "dapo/kept_group_frac": kept_rows / n / groups_seen,
                   "dapo/overlong_frac": float((all_pen < 0).float().mean()),
                   "dapo/overlong_penalty_mean": float(all_pen.mean()),
                   "dapo/gen_response_length/mean": float(all_len.mean()),
                   **{f"timing_s/{k}": v for k, v in timer.seconds.items()}}


def make_step(cfg: DAPORunConfig) -> Callable:
    return lambda roles, draw, algo, reward_fn, **kw: dapo_step(roles, draw, algo, reward_fn, cfg.dapo, **kw)


if __name__ == "__main__":
    from core.train import main

    sys.exit(main(schema=DAPORunConfig, make_step=make_step))
