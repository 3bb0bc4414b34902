#!/usr/bin/env bash
# The full-scale GRPO-LoRA tier of expected.yaml: Qwen2.5-0.5B-Instruct on GSM8K with rank-32 adapters on every
# linear layer, one node of 2 GPUs -- verl's published GRPO-LoRA baseline (docs/algo/baseline.md: 54.3, log
# "Qwen2.5-0.5B-bsz64_2-prompt512-resp1024-lorarank32-score0.543": 64 prompts per step, 2 GPUs, 512 + 1024 tokens,
# rank 32) with verl's LoRA reference settings (docs/advance/ppo_lora.rst: alpha 32, all linear layers, lr 3e-5,
# n = 5). 15 epochs of GSM8K train (7,473 prompts -> 116 steps an epoch), held-out test every 50 steps. The
# reference policy is the actor with its adapters off (no second model); the rollout gets merged weights, after the
# first sync only the adapted linears. Not yet run by us: no GPU machine has been lent to this project.
#   bash recipes/grpo/run_qwen2_5_0_5b_lora_gsm8k.sh [--dry-run] [hydra overrides...]
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
    trainer.total_steps=1740 trainer.test_freq=50 trainer.output_dir=outputs/grpo_qwen2_5_0_5b_lora_gsm8k \
    'data.train_files=[outputs/data/gsm8k/train.parquet]' 'data.val_files=[outputs/data/gsm8k/test.parquet]' \
    data.prompts_per_step=64 \
    'placement.pools={main: {nnodes: 1, slots_per_node: 2, device: cuda, cpus_per_slot: 8}}' \
    ++placement.pools.main.gpu_memory_gb=80 ++placement.pools.main.host_memory_gb=512 \
    actor.model=Qwen/Qwen2.5-0.5B-Instruct rollout.model=Qwen/Qwen2.5-0.5B-Instruct \
    actor.lora.rank=32 actor.lora.alpha=32 \
    actor.optim.lr=3e-5 actor.optim.warmup_steps=0 actor.ppo_mini_batch_size=160 actor.micro_batch_size=16 \
    actor.max_tokens_per_micro=16000 actor.gradient_checkpointing=true \
    actor.kl_loss_coef=0.001 actor.kl_loss_type=low_var_kl actor.temperature=1.0 \
    rollout.max_prompt_length=512 rollout.max_batch_size=320 \
    algo.sampling.n=5 algo.sampling.temperature=1.0 algo.sampling.max_new_tokens=1024 "$@"
