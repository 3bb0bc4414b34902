"""The RL dataflow: one ``step()`` that reads top to bottom (``core.trainer.fit`` runs it over the data).

Core branches on which roles exist (reference? critic?), never on an algorithm's name. An algorithm whose
loop differs (DAPO's dynamic sampling, VAPO's value warm-up, SPPO, agents) copies ``step`` into its recipe.
"""

from __future__ import annotations

import hashlib
import json
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np
import torch

from core.algos import (AdaptiveKLController, FixedKLController, apply_kl_reward_penalty, compute_advantages,
                        scores_to_token_rewards, value_targets_explained_variance)
from core.algos.advantages import BASELINE_ESTIMATORS
from core.algos.distill import DISTILL_ESTIMATORS, distill_metrics
from core.algos.filters import pf_ppo_rows
from core.algos.off_policy import OFF_POLICY, off_policy_metrics
from core.config import AlgoConfig, SamplingParams
from core.train.critic import ValueWorker
from core.train.policy import PolicyWorker
from core.train.reward_model import RewardModelWorker
from core.one_step_off import RolloutAhead
from core.streaming import RolloutStream
from core.protocol import Batch
from core.replicas import RolloutReplicas
from core.rewards import ScoredBatch, default_compute_score, sample_names, score_batch
from core.roles import check_across_pools, sync_across_pools
from core.rollout.worker import RolloutWorker
from core.worker_group import Pending, RoleGroup


@dataclass
class Roles:
    """Handles of the roles of a run; ``ref``, ``critic``, ``reward_model``, ``prm`` and ``teacher`` exist only when
    the run asks for them."""

    actor: RoleGroup
    # on a pool of its own (Ray): replicas that may be lost (core.replicas)
    rollout: RoleGroup | RolloutReplicas
    ref: RoleGroup | None = None
    critic: RoleGroup | None = None
    reward_model: RoleGroup | None = None
    # PRIME's implicit process reward model (implicit_prm.enable; core.implicit_prm)
    prm: RoleGroup | None = None
    # on-policy distillation's frozen teacher (teacher.model; core.algos.distill)
    teacher: RoleGroup | None = None
    # trainer.async.mode=one_step_off: the rollout generating the next step's samples during this step's update
    ahead: RolloutAhead | None = None
    # trainer.async.mode=streaming: the rollout generating continuously, across weight updates
    stream: RolloutStream | None = None


class Timer:
    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str):
        t = time.perf_counter()
        yield
        self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t


def reduce_over_ranks(per_rank: list[dict]) -> dict[str, float]:
    """Losses are each rank's part of the mini-batch loss (normalised by global counts): summed. The rest: mean."""
    return {k: float((np.sum if k.endswith("_loss") else np.mean)([m[k] for m in per_rank])) for k in per_rank[0]}


def step(roles: Roles, prompts: Batch, cfg: AlgoConfig, reward_fn: Callable = default_compute_score,
         update_actor: bool = True, kl_ctrl: FixedKLController | AdaptiveKLController | None = None
         ) -> tuple[Batch, dict[str, float]]:
    """One RL step on a batch of prompts (non-tensor keys: prompt, data_source, ground_truth, extra_info, uid).
    ``update_actor=False``: the critic learns, the policy stays (critic warm-up). ``kl_ctrl``: the driver's KL
    controller when KL is a reward penalty (``kl_controller(cfg)``); it is updated here. A recipe whose loop
    differs copies this function into its ``train.py`` and changes the phase that differs: every phase is one
    public call below."""
    timer = Timer()
    with timer("step"):
        # 1. generate n responses per prompt, with the rollout engine's log-probs of the sampled tokens
        batch = generate(roles, prompts, cfg.sampling, timer)
        # 2. score each response with the verifiable reward; the outcome goes on its last valid token (ReMax: and
        #    each prompt's greedy response, its baseline)
        scored = score(roles, batch, cfg, reward_fn, timer)
        if cfg.adv.estimator in BASELINE_ESTIMATORS:
            greedy_baselines(roles, prompts, batch, cfg, reward_fn, timer)
        # 3. log-probs of the same tokens under the actor before the update, and under the reference and the teacher
        #    if any; the actor's first mini-batch's rows are left to its update's own forward when nothing reads them
        batch = logprobs(roles, batch, cfg, timer, update_actor, kl_ctrl)
        # 4. KL to the reference as a reward penalty (with a KL controller); the critic's values (with a critic)
        kl = reward_kl_penalty(batch, kl_ctrl, cfg)
        values(roles, batch, timer)
        # 5. advantages (and returns) from the token rewards, by the configured estimator
        advantages(batch, cfg, timer)
        # 6. critic update, policy update (unless warming up the critic), weight sync to the rollout engine
        updates = update(roles, batch, cfg, timer, update_actor)
    return batch, step_metrics(batch, updates | kl, timer, scored.num_failed, cfg)


# ---------------------------------------------------------------------------------------------- the step's phases
def generate(roles: Roles, prompts: Batch, sampling: SamplingParams, timer: Timer) -> Batch:
    """n samples per prompt row: ``prompts``, ``responses``, masks, ``rollout_logprobs``; non-tensor keys repeated.
    One step off (``roles.ahead``): the samples generated during the last step's update, ``policy_version``,
    ``staleness`` and ``rollout_versions`` too; the next step's generation starts. Streaming (``roles.stream``):
    the stream's next batch of finished groups (``prompts`` is its ``draw()``, no rows of its own), the same keys."""
    with timer("gen"):
        if roles.ahead is not None:
            return roles.ahead.take(prompts, sampling)
        if roles.stream is not None:
            return roles.stream.take(sampling)
        return roles.rollout.dp_split(RolloutWorker.generate, prompts, sampling)


def score(roles: Roles, batch: Batch, cfg: AlgoConfig, reward_fn: Callable, timer: Timer) -> ScoredBatch:
    """Decode and score every response: sets ``scores`` (B,) and ``token_rewards`` (B, R; the score on the last
    valid token). With a reward model, ``rm_scores`` and ``function_scores`` too, and ``scores`` is their weighted
    sum (``algo.reward_function_weight``, ``reward_model_weight``, ``reward_model_sources``). Returns the function's
    scoring (``num_failed``, ``extras`` such as ``acc``); failures name the data row."""
    with timer("reward"):
        # one step off, the batch comes decoded (before the next generation occupied the rollout's processes)
        texts = list(batch["response_text"] if "response_text" in batch
                     else roles.rollout.dp_split(RolloutWorker.decode, batch)["response_text"])
        scored = score_batch(reward_fn, batch["data_source"], texts, batch["ground_truth"], reward_extra_infos(batch),
                             cfg.reward_workers, cfg.reward_timeout_s, cfg.reward_fallback, sample_names(batch))
        batch["scores"] = scored.scores
    if roles.reward_model is not None:
        with timer("reward_model"):
            batch["rm_scores"] = roles.reward_model.dp_split(RewardModelWorker.compute_rm_scores, batch)["rm_scores"]
        scored_here = torch.tensor([not cfg.reward_model_sources or s in cfg.reward_model_sources
                                    for s in batch["data_source"]], dtype=torch.float32)
        batch["function_scores"] = scored.scores
        batch["scores"] = torch.where(scored_here > 0, cfg.reward_function_weight * scored.scores
                                      + cfg.reward_model_weight * batch["rm_scores"], scored.scores)
    batch["token_rewards"] = scores_to_token_rewards(batch["scores"], batch["response_mask"])
    return scored


def greedy_baselines(roles: Roles, prompts: Batch, batch: Batch, cfg: AlgoConfig, reward_fn: Callable,
                     timer: Timer) -> None:
    """``reward_baselines`` (B,): the score of each prompt's greedy response (temperature 0, one sample), on each of
    its n samples -- ReMax's baseline (Li et al. 2023, arXiv:2310.10505), for the estimators that read it
    (``BASELINE_ESTIMATORS``). A failing reward fails the step as in ``score``."""
    with timer("gen_baseline"):
        greedy = replace(cfg.sampling, n=1, temperature=0.0)
        out = roles.rollout.dp_split(RolloutWorker.generate, prompts, greedy)
        texts = list(roles.rollout.dp_split(RolloutWorker.decode, out)["response_text"])
        scored = score_batch(reward_fn, out["data_source"], texts, out["ground_truth"], reward_extra_infos(out),
                             cfg.reward_workers, cfg.reward_timeout_s, cfg.reward_fallback, sample_names(out))
        batch["reward_baselines"] = scored.scores.to(batch["scores"].dtype).repeat_interleave(cfg.sampling.n)


def reward_extra_infos(batch: Batch) -> list:
    """Each sample's ``extra_info`` as the reward function gets it: agent rollouts add ``num_turns`` (model turns)
    and ``num_tool_calls``, so a recipe's reward may use them (ReTool's tool-use bonus; verl passes its turn count
    the same way)."""
    if "num_turns" not in batch:
        return list(batch["extra_info"])
    return [dict(e or {}, num_turns=int(t), num_tool_calls=int(c))
            for e, t, c in zip(batch["extra_info"], batch["num_turns"], batch["num_tool_calls"])]


def logprobs(roles: Roles, batch: Batch, cfg: AlgoConfig, timer: Timer, update_actor: bool = True,
             kl_ctrl: FixedKLController | AdaptiveKLController | None = None) -> Batch:
    """``old_logprobs`` under the actor before its update (the PPO ratio's denominator), ``ref_logprobs`` under the
    frozen reference and ``teacher_logprobs`` under the distillation teacher when the run has them. ``update_actor`` and ``kl_ctrl``: the step's (``step``).

    When nothing before ``update`` reads ``old_logprobs`` (``_old_left_to_update``), the rows the actor's update
    reaches before its first optimizer step get theirs from that update's own forward: the same policy, one forward
    fewer (``PolicyWorker.compute_logprobs(leave_to_update=True)``); they are NaN until then, so a phase that reads
    them early fails loudly instead of using stale numbers. ``cfg.bypass_mode`` (verl's): ``old_logprobs`` are the
    rollout engine's, no actor pass -- the loss's ratio is pi / pi_rollout and its weights correct for the engine's
    mismatch (e.g. loss ``reinforce``)."""
    with timer("old_logprob"):
        if cfg.bypass_mode:
            batch["old_logprobs"] = batch["rollout_logprobs"]
        else:
            leave = _old_left_to_update(cfg, update_actor, kl_ctrl)
            batch = batch.union(overlapped(roles, roles.actor.dp_split_async(PolicyWorker.compute_logprobs, batch,
                                                                             leave_to_update=leave)))
    if roles.ref is not None:
        with timer("ref"):
            batch["ref_logprobs"] = overlapped(roles, roles.ref.dp_split_async(PolicyWorker.compute_logprobs,
                                                                               batch))["old_logprobs"]
    if roles.teacher is not None:
        with timer("teacher"):
            batch["teacher_logprobs"] = overlapped(roles, roles.teacher.dp_split_async(PolicyWorker.compute_logprobs,
                                                                                       batch))["old_logprobs"]
    return batch


def reward_kl_penalty(batch: Batch, kl_ctrl: FixedKLController | AdaptiveKLController | None,
                      cfg: AlgoConfig) -> dict[str, float]:
    """KL(old || ref) x beta subtracted from ``token_rewards`` when KL is a reward penalty; its metrics."""
    if kl_ctrl is None:
        return {}
    batch["token_rewards"], metrics = apply_kl_reward_penalty(batch, kl_ctrl, cfg.kl_in_reward.kind)
    return metrics


def values(roles: Roles, batch: Batch, timer: Timer) -> None:
    """``values`` (B, R): the critic's value of every response prefix, when the run has a critic."""
    if roles.critic is not None:
        with timer("values"):
            batch["values"] = roles.critic.dp_split(ValueWorker.compute_values, batch)["values"]


def advantages(batch: Batch, cfg: AlgoConfig, timer: Timer) -> None:
    """``advantages`` and ``returns`` (B, R) by ``cfg.adv.estimator``; scaled by the off-policy correction's per-token
    weights (``cfg.off_policy_correction``: truncated, masked or sequence-masked IS of pi_old / pi_rollout) when
    ``cfg.tis_cap`` > 0 (the engine samples from a slightly different policy, or from stale weights).
    With ``cfg.pf_ppo.enable`` the batch's rows are then resampled by score, in place (PF-PPO; the draw is seeded
    by the step's sampling seed)."""
    with timer("adv"):
        batch["advantages"], batch["returns"] = compute_advantages(batch, cfg.adv)
        if cfg.tis_cap > 0:
            batch["advantages"] = batch["advantages"] * OFF_POLICY[cfg.off_policy_correction](
                batch["old_logprobs"], batch["rollout_logprobs"], batch["response_mask"], cfg.tis_cap)
        if cfg.pf_ppo.enable:
            if "old_from_update" in batch:
                raise ValueError("algo.pf_ppo resamples the rows after the old log-probs were left to the update's "
                                 "first forward: this step must compute them (core.loop.logprobs)")
            batch.reindex_(pf_ppo_rows(batch, cfg.pf_ppo.method, cfg.pf_ppo.weight_pow,
                                       torch.Generator().manual_seed(cfg.sampling.seed)))


def _old_left_to_update(cfg: AlgoConfig, update_actor: bool = True, kl_ctrl=None) -> bool:
    """May the actor's update fill in its first mini-batch's old log-probs (``logprobs``)? Only
    when the actor updates and nothing before the update reads or reorders them: no KL-in-reward controller, no
    truncated IS, no PF-PPO resampling, no bypass mode (old log-probs are the rollout's there), no estimator that
    reads them (distillation's)."""
    return (update_actor and kl_ctrl is None and cfg.tis_cap == 0 and not cfg.pf_ppo.enable
            and not cfg.bypass_mode and cfg.adv.estimator not in DISTILL_ESTIMATORS)


def update(roles: Roles, batch: Batch, cfg: AlgoConfig, timer: Timer, update_actor: bool = True) -> dict[str, float]:
    """The critic's update toward the returns (with a critic); the actor's PPO epochs on every DP rank and the
    bucketed weight sync to the rollout engine (unless ``update_actor`` is false). Their metrics."""
    out = {}
    if roles.critic is not None:
        with timer("update_critic"):
            out |= reduce_over_ranks(roles.critic.dp_split(ValueWorker.update, batch))
    if update_actor:
        with timer("update_actor"):
            out |= reduce_over_ranks(overlapped(roles, roles.actor.dp_split_async(PolicyWorker.update, batch)))
            if "old_from_update" in batch:  # the old log-probs the update filled in, for the step's metrics
                rows = Batch({"old_from_update": batch["old_from_update"]})
                batch["old_logprobs"] = roles.actor.dp_split(PolicyWorker.update_old_logprobs, rows)["old_logprobs"]
        if roles.ahead is not None:
            with timer("gen_wait"):  # one step off: the next step's generation, unless the update hid all of it
                roles.ahead.wait()
        with timer("sync_weights"):
            out |= sync_rollout(roles, cfg.sync_timeout_s)
        if roles.ahead is not None:
            roles.ahead.synced()
        if roles.stream is not None:
            roles.stream.synced()
    return out


def overlapped(roles: Roles, calls: Pending):
    """The result of a trainer phase's calls; streaming (``roles.stream``), the rollout decodes meanwhile."""
    return roles.stream.overlap(calls) if roles.stream is not None else calls()


def kl_controller(cfg: AlgoConfig) -> FixedKLController | AdaptiveKLController | None:
    """The driver's KL-in-reward controller (None when off); its state goes into checkpoints."""
    k = cfg.kl_in_reward
    if k.coef <= 0:
        return None
    return AdaptiveKLController(k.coef, k.target_kl, k.horizon) if k.adaptive else FixedKLController(k.coef)


def sync_rollout(roles: Roles, timeout_s: float) -> dict[str, float]:
    """The actor's weights into every rollout rank: in each process when colocated, else through the controller."""
    if roles.rollout.group is roles.actor.group:
        return roles.rollout.call_all(RolloutWorker.sync_weights, timeout_s=timeout_s)[0]
    return sync_across_pools(roles.actor, roles.rollout, timeout_s)


def check_rollout(roles: Roles, timeout_s: float) -> dict[str, float]:
    """The rollout engines' weight digests against the trainer's (at a checkpoint, with delta syncs); a mismatch
    is logged and every weight sent again."""
    if roles.rollout.group is roles.actor.group:
        return roles.rollout.call_all(RolloutWorker.check_weights, timeout_s=timeout_s)[0]
    return check_across_pools(roles.actor, roles.rollout, timeout_s)


def step_metrics(batch: Batch, updates: dict[str, float], timer: Timer, num_failed: int,
                 cfg: AlgoConfig) -> dict[str, float]:
    """The metrics of a step's trained batch: reward, response lengths and clip ratio, failed rewards, rollout vs
    trainer log-prob gap, the updates' metrics, the critic's explained variance, the student-teacher gap, phase times (``timer`` must hold
    ``step``) and throughput. A recipe's step adds its own keys to these."""
    mask, scores = batch["response_mask"], batch["scores"]
    lengths = mask.sum(-1)
    # agent rollouts: cut by a turn's or the response's length limit, or by max_turns (not comparable to one turn's)
    clipped = batch["truncated"] > 0 if "truncated" in batch else lengths >= cfg.sampling.max_new_tokens
    diff = (batch["rollout_logprobs"] - batch["old_logprobs"]).abs() * mask
    tokens = float(lengths.sum() + batch["attention_mask"][:, :batch["prompts"].shape[1]].sum())
    return {"reward/mean": float(scores.mean()), "reward/std": float(scores.std()) if len(scores) > 1 else 0.0,
            "reward/num_failed": float(num_failed),
            "response_length/mean": float(lengths.mean()),
            "response_length/clip_ratio": float(clipped.float().mean()),
            "rollout/logprob_diff_mean": float(diff.sum() / mask.sum().clamp(min=1)),
            "rollout/logprob_diff_max": float(diff.max()),
            "actor/kl_loss": 0.0, "actor/pg_loss": 0.0, **updates,
            **_reward_model_metrics(batch), **_agent_metrics(batch),
            **off_policy_metrics(batch, cfg.tis_cap, cfg.off_policy_correction),
            **batch.meta.get("stream", {}),  # streaming: the stream's counters (core.streaming)
            **_explained_variance(batch), **distill_metrics(batch),
            **{f"timing_s/{k}": v for k, v in timer.seconds.items()},
            "perf/throughput_tokens_per_s": tokens / timer.seconds["step"]}


def _reward_model_metrics(batch: Batch) -> dict[str, float]:
    """With a reward model: its mean score, the reward function's mean score of the same samples, and their Pearson
    correlation (where both vary) -- the reward-hacking watch: a rising model score whose correlation with the
    function's falls is the policy gaming the model."""
    if "rm_scores" not in batch:
        return {}
    rm, fn = batch["rm_scores"].double(), batch["function_scores"].double()
    out = {"reward/model_mean": float(rm.mean()), "reward/function_mean": float(fn.mean())}
    if len(rm) > 1 and rm.std() > 0 and fn.std() > 0:
        out["reward/model_function_corr"] = float(torch.corrcoef(torch.stack([rm, fn]))[0, 1])
    return out


def _agent_metrics(batch: Batch) -> dict[str, float]:
    """Agent rollouts (``rollout.agent``): turns and tool calls per trajectory, the share of trajectories that
    called a tool, failed calls per call (refused, crashed, timed out, flooded), the share of the response that is
    tool / template tokens (masked out of the loss), the model's tokens per turn, and the share cut short.
    ``response_length/*`` counts the model's tokens only; ``agent/response_tokens_mean`` all."""
    if "num_turns" not in batch:
        return {}
    calls, errors = batch["num_tool_calls"], batch["num_tool_errors"]
    real = batch["attention_mask"][:, batch["prompts"].shape[1]:].sum(-1).float()
    return {"agent/turns_mean": float(batch["num_turns"].mean()), "agent/tool_calls_mean": float(calls.mean()),
            "agent/tool_call_rate": float((calls > 0).float().mean()),
            "agent/tool_error_rate": float(errors.sum() / calls.sum()) if calls.sum() > 0 else 0.0,
            "agent/tool_token_frac": float(1 - batch["response_mask"].sum() / real.sum().clamp(min=1)),
            "agent/response_tokens_mean": float(real.mean()),
            # the model's tokens per turn (a turn that calls a tool is short; an answer may be long)
            "agent/tokens_per_turn_mean": float((batch["response_mask"].sum(-1)
                                                 / batch["num_turns"].clamp(min=1)).mean()),
            "agent/truncated_rate": float(batch["truncated"].mean())}


def _explained_variance(batch: Batch) -> dict[str, float]:
    """The critic's explained variance of the returns; absent without a critic or when it is undefined (NaN)."""
    if "values" not in batch:
        return {}
    ev = value_targets_explained_variance(batch["returns"], batch["values"], batch["response_mask"])
    return {"critic/explained_var": ev} if np.isfinite(ev) else {}


def validate(roles: Roles, prompts: Batch, sampling: SamplingParams, reward_fn: Callable = default_compute_score,
             reward_workers: int = 0, reward_timeout_s: float = 10.0, generations: int = 0
             ) -> tuple[dict[str, float], list[dict]]:
    """Held-out prompts through the eval harness (``core.eval.score_samples``), no update: ``sampling.n`` samples
    each with the validation sampling params (greedy by default). Logs ``val/reward/mean`` (mean score of all
    samples), ``val/response_length/mean`` and, per data source, ``val/<data_source>/<metric>`` for pass@1,
    avg@n, maj@n and the response length. A failing reward scores 0 here instead of stopping the run. Returns the
    metrics and the first ``generations`` samples for people to read: question, whole response (tool answers and
    turn markers included), ground truth, prediction, score."""
    from core.eval import score_samples

    batch = roles.rollout.dp_split(RolloutWorker.generate, prompts, sampling)
    texts = list(roles.rollout.dp_split(RolloutWorker.decode, batch)["response_text"])
    owners = [{"data_source": s, "ground_truth": g, "extra_info": e}
              for s, g, e in zip(batch["data_source"], batch["ground_truth"], reward_extra_infos(batch))]
    lengths = batch["response_mask"].sum(-1)
    per_source, samples = score_samples(owners, texts, lengths.long().tolist(), sampling.n, (), reward_fn, None,
                                        reward_workers, reward_timeout_s, fallback=0.0)
    out = {"val/reward/mean": float(np.mean([r["score"] for r in samples])),
           "val/response_length/mean": float(lengths.float().mean())}
    out |= {f"val/{k}": v for k, v in _agent_metrics(batch).items()}  # agent rollouts: tool use on held-out prompts
    for source, metrics in per_source.items():
        out |= {f"val/{source}/{k}": float(v) for k, v in metrics.items() if k not in ("problems", "samples")}
    shown = []
    if generations > 0:
        part = batch.index(slice(0, generations))
        whole = roles.rollout.dp_split(RolloutWorker.decode, part, whole=True)["response_text"]
        shown = [{"question": (o["extra_info"] or {}).get("question") or p[-1]["content"], "response": w,
                  "ground_truth": o["ground_truth"], "pred": s["pred"], "score": s["score"]}
                 for o, p, w, s in zip(owners, part["prompt"], whole, samples)]
    return out, shown


def prompts_from_rows(rows: list[dict]) -> Batch:
    """A prompt batch from verl-schema rows (``core.data.dataset.load_rl_parquet``). Each prompt's uid (its samples'
    group) is its position and a hash of its content: distinct within the batch, and the same when a resumed run
    draws the same rows again (uuid4 made every run's uids differ)."""
    def uid(i: int, row: dict) -> str:
        return f"{i}-{hashlib.sha1(json.dumps(row['prompt'], sort_keys=True, default=str).encode()).hexdigest()[:12]}"

    return Batch(non_tensors={"prompt": [r["prompt"] for r in rows], "data_source": [r["data_source"] for r in rows],
                              "ground_truth": [r["ground_truth"] for r in rows],
                              "extra_info": [r["extra_info"] for r in rows],
                              "uid": [uid(i, r) for i, r in enumerate(rows)]}
                 | {key: [r[key] for r in rows] for key in ("prompt_ids", "where", "images", "messages")
                    if rows and key in rows[0]})

