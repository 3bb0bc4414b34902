"""The vocabulary of logged metrics: every key a run logs (``metrics.jsonl`` and the trackers), when and what it
means. ``docs/guide/metrics.md`` is generated from this table (``core/docgen.py``), and ``tests/test_docs.py`` checks
it both ways: every key a real GRPO run logs matches a row and every *every step* row is logged by it, and every
metric key written in core's code matches a row. ``<name>`` stands for any one part of a key (``val/<name>/<name>``:
any ``val/`` key of two parts or more). A recipe's own keys (``dapo/*``, ``vapo/*``) are on its recipe page."""

from __future__ import annotations

import re

EVERY_STEP = "every step"

# (section title, a line about it or "", [(key, when it is logged, meaning)])
METRICS: list[tuple[str, str, list[tuple[str, str, str]]]] = [
    ('Reward and responses', '', [
        ('reward/mean', EVERY_STEP,
         ("mean score of the step's trained samples (the reward function's, weighed with a reward model's when "
          'there is one)')),
        ('reward/std', EVERY_STEP,
         'their standard deviation'),
        ('reward/num_failed', EVERY_STEP,
         'samples whose reward call raised or timed out and were scored by `algo.reward_fallback`'),
        ('reward/model_mean', 'with a reward model',
         "the reward model's mean score"),
        ('reward/function_mean', 'with a reward model',
         "the reward function's mean score of the same samples"),
        ('reward/model_function_corr', 'with a reward model',
         ('Pearson correlation of the two: a rising model score whose correlation falls is the policy gaming '
          'the model')),
        ('response_length/mean', EVERY_STEP,
         "mean response length in the model's tokens"),
        ('response_length/clip_ratio', EVERY_STEP,
         'share of responses cut at `algo.sampling.max_new_tokens` (agent rollouts: at a limit or `max_turns`)'),
    ]),
    ('Rollout', '', [
        ('rollout/logprob_diff_mean', EVERY_STEP,
         ("mean over response tokens of the absolute gap between the rollout engine's log-probs and the "
          "trainer's (bf16 vs fp32 engines show their rounding here)")),
        ('rollout/logprob_diff_max', EVERY_STEP,
         'the largest such gap'),
        ('rollout/policy_version', 'async (`trainer.async.mode`: one_step_off, streaming)',
         "the weight version of the samples' oldest tokens (mean)"),
        ('rollout/staleness_mean', 'async',
         "updates between the samples' oldest tokens' weights and the policy that trains on them"),
        ('rollout/staleness_max', 'async',
         'the largest staleness'),
        ('rollout/partial_frac', 'async',
         'share of samples whose tokens come from more than one weight version (streaming: partial rollouts)'),
        ('rollout/ratio_dev/<name>', 'async, once the old log-probs exist',
         '`staleness_<k>`: mean |pi_old / pi_rollout - 1| over the tokens drawn k versions back'),
        ('rollout/stale_dropped', 'streaming (`trainer.async.mode=streaming`)',
         'groups dropped over `trainer.async.max_staleness` since the last step (`on_stale: drop`)'),
        ('rollout/buffered_groups', 'streaming',
         'finished groups left in the buffer after the step took its batch'),
        ('rollout/in_flight_groups', 'streaming',
         'groups still queued or generating after the take'),
        ('rollout/replicas_lost', 'the rollout on a pool of its own (Ray)',
         'rollout replicas whose process died so far; the run goes on with the others (`rollout.min_replicas`)'),
        ('rollout/groups_requeued', 'the rollout on a pool of its own (Ray)',
         "prompt groups run again on another replica this step: a lost replica's, with their own seeds"),
        ('rollout/tis_weight_mean', 'with an off-policy correction (`algo.tis_cap` > 0)',
         'mean per-token weight of `algo.off_policy_correction` (truncated, masked or sequence-masked IS)'),
        ('rollout/tis_clip_frac', 'with an off-policy correction',
         'share of tokens whose weight is not their ratio pi_old / pi_rollout: clipped by the cap, or masked'),
    ]),
    ('Actor and critic', '', [
        ('actor/pg_loss', EVERY_STEP,
         'the policy loss (0 on a step that does not update the actor)'),
        ('actor/kl_loss', EVERY_STEP,
         'the KL-to-reference loss term (`actor.kl_loss_coef`, `actor.kl_loss_type`)'),
        ('actor/entropy', EVERY_STEP,
         'mean entropy of the policy over response tokens'),
        ('actor/grad_norm', EVERY_STEP,
         "gradient norm before clipping (mean over the step's updates)"),
        ('actor/lr', EVERY_STEP,
         'the learning rate'),
        ('actor/nonfinite_grad_frac', EVERY_STEP,
         "share of the step's updates whose gradient norm was inf/nan (their optimizer step skipped)"),
        ('actor/<name>', 'by policy loss',
         ("the loss's own statistics, e.g. `actor/pg_clipfrac`, `actor/ppo_kl` (the mean approximate KL to the "
          'old policy), `actor/is_weight_mean` ([Algorithms](../algorithms.md))')),
        ('actor/nll_loss', '`actor.positive_nll_coef` > 0',
         "VAPO's positive-example NLL term"),
        ('actor/reward_kl_penalty', 'KL in the reward (`algo.kl_in_reward`)',
         'the mean KL penalty subtracted from the rewards'),
        ('actor/reward_kl_penalty_coeff', 'KL in the reward',
         "its coefficient (the adaptive controller's current value)"),
        ('actor/moe/<name>', 'mixture-of-experts models',
         'router load statistics'),
        ('actor/weights_sha256', '`trainer.deterministic`',
         ("sha256 of the actor's full weights after the step (a string): two runs that repeat bit for bit log the "
          'same digest at every step; the first step where they differ is where a change begins')),
        ('critic/vf_loss', 'with a critic',
         'the clipped value loss'),
        ('critic/vf_clipfrac', 'with a critic',
         'share of values the clip bound'),
        ('critic/vpred_mean', 'with a critic',
         'mean predicted value'),
        ('critic/grad_norm', 'with a critic',
         "the critic's gradient norm"),
        ('critic/lr', 'with a critic',
         'its learning rate'),
        ('critic/explained_var', 'with a critic',
         'explained variance of the returns by the values'),
        ('prm/<name>', "with PRIME's implicit PRM",
         "the implicit PRM's loss, accuracy and reward statistics"),
        ('distill/reverse_kl', 'with a distillation teacher',
         "mean over response tokens of log pi_student - log pi_teacher of the sampled token: the sampled reverse KL "
         "(0 when the student says what the teacher would)"),
        ('distill/teacher_logprob_mean', 'with a distillation teacher',
         "the teacher's mean log-prob of the student's tokens"),
    ]),
    ('Weight sync, time and throughput', '', [
        ('sync/seconds', EVERY_STEP,
         'wall time of the actor -> rollout weight sync'),
        ('sync/megabytes', EVERY_STEP,
         'bytes sent (a delta sync: its encoded bytes)'),
        ('sync/buckets', EVERY_STEP,
         'buckets they went in'),
        ('sync/peak_bucket_megabytes', EVERY_STEP,
         'the largest bucket'),
        ('sync/full', EVERY_STEP,
         '1 when every weight was sent as values (the first sync, after a resume or a failed check, '
         '`rollout.sync_delta=never`, colocated under `auto`, a LoRA or Megatron actor), 0 for a delta sync'),
        ('sync/changed_fraction', 'delta syncs (`rollout.sync_delta`)',
         "share of the synced weight values (in the rollout engine's dtype) that differ from the last sync's "
         '(1 on the first sync)'),
        ('sync/resyncs', 'delta syncs (`rollout.sync_delta`)',
         'full resyncs this step: a bucket failed its CRC-32 or base check, or a weight digest differed from the '
         "trainer's (each is logged)"),
        ('sync/hash_checked', 'delta syncs: every `rollout.sync_hash_every` and at checkpoints',
         "1: the rollout engines' weight digests were compared with the trainer's"),
        ('sync/<name>', EVERY_STEP,
         "the sync's memory readings (peak and retained process memory)"),
        ('timing_s/step', EVERY_STEP,
         "the whole step's wall time"),
        ('timing_s/<name>', EVERY_STEP,
         ("each phase's wall time: `gen`, `reward`, `old_logprob`, `ref`, `adv`, `update_actor`, "
          '`sync_weights`; with the roles or features that add them: `values`, `update_critic`, `reward_model`,'
          ' `gen_baseline`, `gen_wait`, `teacher`')),
        ('perf/throughput_tokens_per_s', EVERY_STEP,
         'prompt and response tokens of the step per second of the step'),
    ]),
    ('Agents', '', [
        ('agent/turns_mean', 'agent rollouts (`rollout.agent`)',
         'turns per trajectory'),
        ('agent/tool_calls_mean', 'agent rollouts',
         'tool calls per trajectory'),
        ('agent/tool_call_rate', 'agent rollouts',
         'share of trajectories that called a tool'),
        ('agent/tool_error_rate', 'agent rollouts',
         'failed calls per call (refused, crashed, timed out, flooded)'),
        ('agent/tool_token_frac', 'agent rollouts',
         'share of the response that is tool output and template tokens (masked out of the loss)'),
        ('agent/response_tokens_mean', 'agent rollouts',
         'all response tokens, tool output included'),
        ('agent/tokens_per_turn_mean', 'agent rollouts',
         "the model's tokens per turn"),
        ('agent/truncated_rate', 'agent rollouts',
         'share of trajectories cut short'),
    ]),
    ('Held-out validation', ('Logged before the first step, every `trainer.test_freq` steps and after the last, on '
                             '`data.val_files`, sampled with `algo.val_sampling` (greedy by default).'), [
        ('val/reward/mean', 'at validation',
         'mean score on the held-out prompts'),
        ('val/response_length/mean', 'at validation',
         'mean held-out response length'),
        ('val/<name>/pass@1', 'at validation',
         'per `data_source`: share of problems whose first sample scores > 0'),
        ('val/<name>/<name>', 'at validation',
         'per `data_source`: `avg@n`, `maj@n`, `pass@k` with several samples ([Evaluation](evaluation.md))'),
        ('val/agent/<name>', 'at validation, agent rollouts',
         'the `agent/*` keys on held-out prompts'),
    ]),
    ('Supervised fine-tuning', 'A run of `recipes/sft` (`PolicyWorker.sft_update`) logs these instead of the RL keys.', [
        ('sft/nll_loss', 'SFT runs',
         "mean negative log-likelihood (nats) of the step's trained tokens (the assistant's), over all DP ranks"),
        ('sft/tokens', 'SFT runs',
         "the step's trained tokens"),
    ]),
]


def pattern(key: str) -> re.Pattern:
    """A row's key as a regex: ``<name>`` is one part of a key; ``<name>/<name>`` at the end, two parts or more."""
    text = re.escape(key).replace("<name>/<name>", ".+").replace("<name>", "[^/]+")
    return re.compile(text + "$")


def documented(key: str) -> bool:
    """Whether a logged key matches a row of the table."""
    return any(pattern(k).match(key) for _, _, rows in METRICS for k, _, _ in rows)
