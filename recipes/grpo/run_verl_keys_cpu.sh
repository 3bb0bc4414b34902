#!/usr/bin/env bash
# The CPU demo said in verl's keys and units: verl's GRPO overrides (examples/grpo_trainer), pointed at the
# arithmetic task's parquet files, SmolLM2-135M-Instruct and a CPU pool of 2 ranks. `hybridrl train --verl`
# translates each key (docs/coming-from-verl.md); the run is run_smollm2_cpu.sh's (demo_cpu.yaml): 8 prompts x 4
# samples a step, mini-batches of 4 prompts (verl's unit: 16 samples), 20 steps. expected.yaml's cpu_verl tier.
# Extra arguments are verl overrides, e.g.: bash recipes/grpo/run_verl_keys_cpu.sh trainer.total_training_steps=2
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
# the checkout's .venv (make setup), else the python on PATH (an image's; a Ray job's working_dir ships no .venv)
[ -n "${PY:-}" ] || { PY="$root/.venv/bin/python"; [ -x "$PY" ] || PY=python3; }
case " $* " in  # the arithmetic task's parquet files (a --dry-run writes nothing)
  *" --dry-run "*) ;;
  *) "$PY" -m core.cli data prepare "$here" --config-name demo_cpu ;;
esac
args=()  # verl's keys; our trainer.output_dir (the score bench passes it) is verl's trainer.default_local_dir
for a in "$@"; do
  case "$a" in trainer.output_dir=*) args+=("trainer.default_local_dir=${a#*=}") ;; *) args+=("$a") ;; esac
done
exec "$PY" -m core.cli train --verl \
    algorithm.adv_estimator=grpo \
    algorithm.use_kl_in_reward=False \
    data.train_files=outputs/data/arith_v2/train.parquet \
    data.val_files=outputs/data/arith_v2/test.parquet \
    data.train_batch_size=8 \
    data.max_prompt_length=64 \
    data.max_response_length=32 \
    data.filter_overlong_prompts=True \
    data.truncation=error \
    actor_rollout_ref.model.path=SmolLM2-135M-Instruct \
    actor_rollout_ref.model.enable_gradient_checkpointing=False \
    actor_rollout_ref.actor.optim.lr=2e-5 \
    actor_rollout_ref.actor.optim.lr_warmup_steps=1 \
    actor_rollout_ref.actor.optim.weight_decay=0.0 \
    actor_rollout_ref.actor.ppo_mini_batch_size=4 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.rollout.name=embedded \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.rollout.temperature=0.7 \
    trainer.logger='["console"]' \
    trainer.project_name=hybridrl \
    trainer.experiment_name=grpo_verl_keys_cpu \
    trainer.default_local_dir=outputs/grpo_verl_keys_cpu \
    trainer.device=cpu \
    trainer.n_gpus_per_node=2 \
    trainer.nnodes=1 \
    trainer.save_freq=-1 \
    trainer.test_freq=-1 \
    trainer.total_training_steps=20 \
    "${args[@]}"
