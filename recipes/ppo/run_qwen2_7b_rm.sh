#!/usr/bin/env bash
# HybridFlow's four-model PPO (actor, critic, reference, reward model) at verl's published scale: Qwen2-7B-Instruct
# with the reward model sfairXC/FsfairX-LLaMA3-RM-v0.1, GSM8K + MATH, one node of 8 GPUs (80 GB). The settings and
# their source: qwen2_7b_rm.yaml (every field commented), on top of config.yaml. Not yet run by us: no GPU machine
# with these models has been lent to this project.
#
#   bash recipes/ppo/run_qwen2_7b_rm.sh --dry-run [overrides]   resolve the config and print the placement and the
#        per-GPU / per-node memory plan of every pool; no GPU needed; exit 1 (with the numbers) when it does not fit
#   PLACEMENT=split bash recipes/ppo/run_qwen2_7b_rm.sh --dry-run   the same on split pools (qwen2_7b_rm_split.yaml:
#        actor + reference + rollout on 4 GPUs, critic + reward model on the other 4)
#   bash recipes/ppo/run_qwen2_7b_rm.sh [overrides]             the run (Ray starts here, or RAY_ADDRESS=auto)
#
# Data: GSM8K from ../shared/data/gsm8k (GSM8K_SRC=DIR or hub); MATH from the HF hub (MATH_SRC=hub, needs
# `pip install -e '.[hub]'`) or MATH_SRC=DIR holding math/{train,test}.jsonl. Models: the three HF ids above,
# from the hub cache (HF_HOME) or local folders passed as actor.model=... critic.model=... reward_model.model=...
# Rollout: vLLM TP 1 (pip install -e '.[vllm]'); where vllm is not importable the run falls back to the embedded
# engine (rollout.backend=embedded) after the plan says it fits.
# Extra arguments are Hydra overrides, e.g. trainer.total_steps=50 algo.kl_in_reward.coef=0
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
PY="${PY:-$root/.venv/bin/python}"
case "${PLACEMENT:-colocated}" in
  colocated) config=qwen2_7b_rm ;;
  split) config=qwen2_7b_rm_split ;;
  *) echo "run_qwen2_7b_rm.sh: PLACEMENT must be colocated or split, got '$PLACEMENT'" >&2; exit 2 ;;
esac
dry=0
args=()
for a in "$@"; do
  if [ "$a" = --dry-run ]; then dry=1; else args+=("$a"); fi
done
run=("$PY" -m core.cli train "$here" --config-name "$config")
if [ "$dry" = 1 ]; then
  exec "${run[@]}" --dry-run "${args[@]}"
fi
if ! "$PY" -c "import vllm, core.rollout.vllm_engine" 2>/dev/null; then
  echo "run_qwen2_7b_rm.sh: vllm is not importable here: falling back to the embedded engine (rollout.backend=embedded)"
  args=(rollout.backend=embedded "${args[@]}")
fi
"${run[@]}" --dry-run "${args[@]}"
[ -f outputs/data/gsm8k/train.parquet ] || "$PY" "$here/data.py" --task gsm8k --src "${GSM8K_SRC:-$root/../shared/data}" --out outputs/data
[ -f outputs/data/math/train.parquet ] || "$PY" "$here/data.py" --task math --src "${MATH_SRC:-hub}" --out outputs/data
exec "${run[@]}" "${args[@]}"
