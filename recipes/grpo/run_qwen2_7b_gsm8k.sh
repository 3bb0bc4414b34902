#!/usr/bin/env bash
# The full-scale GRPO tier of expected.yaml: Qwen2-7B-Instruct on GSM8K, one node of 8 GPUs (80 GB), the setting of
# verl's published baseline (docs/algo/baseline.md: 89.0 with run_qwen2-7b_seq_balance.sh, 89.8 with FSDP2):
# 1024 prompts x n=5 per step, mini-batches of 256 prompts, lr 1e-6, low-var KL loss 0.001, 512 + 1024 tokens,
# 15 epochs of GSM8K train (7,473 prompts -> 7 steps an epoch, 105 steps), held-out test every 5 steps.
# Actor, reference and the embedded rollout engine are colocated on every GPU (FSDP2 over 8 ranks, nccl).
# Not yet run by us: no GPU machine has been lent to this project (README, "What is measured where").
#   bash recipes/grpo/run_qwen2_7b_gsm8k.sh [--dry-run] [hydra overrides...]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
PY="${PY:-$root/.venv/bin/python}"
case " $* " in
  *" --dry-run "*) ;;  # only resolve and print the config
  *) [ -f outputs/data/gsm8k/train.parquet ] || "$PY" "$here/data.py" --task gsm8k --out outputs/data ;;
esac
exec "$PY" -m core.cli train "$here" --config-name config \
    trainer.total_steps=105 trainer.test_freq=5 trainer.output_dir=outputs/grpo_qwen2_7b_gsm8k \
    'data.train_files=[outputs/data/gsm8k/train.parquet]' 'data.val_files=[outputs/data/gsm8k/test.parquet]' \
    data.prompts_per_step=1024 \
    'placement.pools={main: {nnodes: 1, slots_per_node: 8, device: cuda, cpus_per_slot: 8}}' \
    ++placement.pools.main.gpu_memory_gb=80 ++placement.pools.main.host_memory_gb=1024 \
    actor.model=Qwen/Qwen2-7B-Instruct rollout.model=Qwen/Qwen2-7B-Instruct \
    actor.optim.lr=1e-6 actor.optim.warmup_steps=0 actor.ppo_mini_batch_size=1280 actor.micro_batch_size=8 \
    actor.max_tokens_per_micro=24000 actor.gradient_checkpointing=true \
    actor.kl_loss_coef=0.001 actor.kl_loss_type=low_var_kl actor.temperature=1.0 \
    rollout.max_prompt_length=512 rollout.max_batch_size=256 \
    algo.sampling.n=5 algo.sampling.temperature=1.0 algo.sampling.max_new_tokens=1024 "$@"
