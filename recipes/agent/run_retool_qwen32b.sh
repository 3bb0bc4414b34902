#!/usr/bin/env bash
# ReTool at full scale: Qwen2.5-32B-Instruct (after ReTool's cold-start SFT) on 2 nodes x 8 GPUs (80 GB), multi-turn
# GRPO with a Python code interpreter on DAPO-Math-17k, AIME 2024 mean@30 tracked (paper 67.0; verl's recipe: AIME
# 2025 0.60). Settings: retool_qwen32b.yaml (every field commented), on top of config.yaml.
#
#   bash recipes/agent/run_retool_qwen32b.sh --dry-run [overrides]   resolve the config and print the placement and
#        per-GPU / per-node memory plan; no GPU needed; exit 1 (with the numbers) when it does not fit
#   MODEL=/ckpt/retool-sft bash recipes/agent/run_retool_qwen32b.sh [overrides]   the run, from the Ray head node
#
# MODEL: the cold-start SFT checkpoint (verl-recipe retool/run_qwen2-32b_sft.sh on JoeYing/ReTool-SFT, 6 epochs);
# the default is the untuned Qwen2.5-32B-Instruct, which calls tools far less (the published figures need the SFT).
# Ray multi-node (README "Multi-node"): `ray start --head` on one machine, `ray start --address=<head-ip>:6379` on
# the other, this repository at the same path on both, then run this on the head.
# Data: DAPO-Math-17k from the HF hub (DAPO_MATH_SRC=hub, needs `pip install -e '.[hub]'`) or a local .parquet /
# .jsonl; AIME 2024 from ../shared/data/aime24 (AIME_SRC=DIR or hub).
# Tools run in core's sandbox on the rollout ranks (core/tools/sandbox.py: rlimits, no network, a scratch folder);
# rollout: vLLM TP 4, or the embedded engine (TP 1) where vllm is not importable.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
PY="${PY:-$root/.venv/bin/python}"
dry=0
args=()
[ -n "${MODEL:-}" ] && args+=("actor.model=$MODEL" "rollout.model=$MODEL")
for a in "$@"; do
  if [ "$a" = --dry-run ]; then dry=1; else args+=("$a"); fi
done
run=("$PY" -m core.cli train "$here" --config-name retool_qwen32b)
if [ "$dry" = 1 ]; then
  exec "${run[@]}" --dry-run "${args[@]}"
fi
if ! "$PY" -c "import vllm, core.rollout.vllm_engine" 2>/dev/null; then
  echo "run_retool_qwen32b.sh: vllm is not importable here: falling back to the embedded engine (rollout.backend=embedded, TP 1)"
  args=(rollout.backend=embedded rollout.tensor_parallel_size=1 "${args[@]}")
fi
# the plan first: a run that cannot fit stops here with the numbers
"${run[@]}" --dry-run "${args[@]}"
[ -f outputs/data/retool/train.parquet ] || "$PY" "$here/data.py" --task retool --dapo-src "${DAPO_MATH_SRC:-hub}" \
  --src "${AIME_SRC:-$root/../shared/data}" --out outputs/data
export RAY_ADDRESS="${RAY_ADDRESS:-auto}"
exec "${run[@]}" "${args[@]}"
