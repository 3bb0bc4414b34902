#!/usr/bin/env bash
# HybridFlow's four-model PPO (actor, critic, reference, reward model) at verl's published scale: Qwen2-7B-Instruct
# with the reward model sfairXC/FsfairX-LLaMA3-RM-v0.1, GSM8K + MATH, one node of 8 GPUs (80 GB). The settings and
# their source: qwen2_7b_rm.yaml (every field commented), on top of config.yaml. Not yet run by us
# (recipes/ppo/README.md).
#
#   bash recipes/ppo/run_qwen2_7b_rm.sh --dry-run [overrides]   resolve the config and print the placement and the
#        per-GPU / per-node memory plan of every pool; no GPU needed; exit 1 (with the numbers) when it does not fit
#   PLACEMENT=split bash recipes/ppo/run_qwen2_7b_rm.sh --dry-run   the same on split pools (qwen2_7b_rm_split.yaml:
#        actor + reference + rollout on 4 GPUs, critic + reward model on the other 4)
#   bash recipes/ppo/run_qwen2_7b_rm.sh [overrides]             the run (Ray starts here, or RAY_ADDRESS=auto)
#
# Data: written on the first run by the recipe's data.py when missing (hybridrl data prepare ppo --config-name
# qwen2_7b_rm): GSM8K from ../shared/data/gsm8k beside the checkout, else the hub (GSM8K_SRC=DIR or hub); MATH from
# the HF hub (needs `pip install -e '.[hub]'`) or MATH_SRC=DIR holding math/{train,test}.jsonl (PLACEMENT=split:
# --config-name qwen2_7b_rm_split, the same files). Models: the three HF ids above, from the hub cache (HF_HOME) or
# local folders passed as actor.model=... critic.model=... reward_model.model=...
# Rollout: vLLM TP 1 (pip install -e '.[vllm]'); where vllm is not importable the run falls back to the embedded
# engine (rollout.backend=embedded) after the plan says it fits.
# Extra arguments are Hydra overrides, e.g. trainer.total_steps=50 algo.kl_in_reward.coef=0
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
# the checkout's .venv (make setup), else the python on PATH (an image's; a Ray job's working_dir ships no .venv)
[ -n "${PY:-}" ] || { PY="$root/.venv/bin/python"; [ -x "$PY" ] || PY=python3; }
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
src=()  # where the run reads the data it writes when missing (default: each dataset's own)
[ -n "${GSM8K_SRC:-}" ] && src+=(--src "gsm8k=$GSM8K_SRC")
[ -n "${MATH_SRC:-}" ] && src+=(--src "math=$MATH_SRC")
run=("$PY" -m core.cli train "$here" --config-name "$config" "${src[@]}")
if [ "$dry" = 1 ]; then
  exec "${run[@]}" --dry-run "${args[@]}"
fi
if ! "$PY" -c "import vllm, core.rollout.vllm_engine" 2>/dev/null; then
  echo "run_qwen2_7b_rm.sh: vllm is not importable here: falling back to the embedded engine (rollout.backend=embedded)"
  args=(rollout.backend=embedded "${args[@]}")
fi
"${run[@]}" --dry-run "${args[@]}"
exec "${run[@]}" "${args[@]}"
