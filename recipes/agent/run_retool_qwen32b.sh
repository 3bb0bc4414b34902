#!/usr/bin/env bash
# ReTool at full scale: Qwen2.5-32B-Instruct (after ReTool's cold-start SFT) on 2 nodes x 8 GPUs (80 GB), multi-turn
# GRPO with a Python code interpreter on DAPO-Math-17k, AIME 2024 mean@30 tracked (paper 67.0; verl's recipe: AIME
# 2025 0.60). Settings: retool_qwen32b.yaml (every field commented), on top of config.yaml.
#
#   bash recipes/agent/run_retool_qwen32b.sh --dry-run [overrides]   resolve the config and print the placement and
#        per-GPU / per-node memory plan; no GPU needed; exit 1 (with the numbers) when it does not fit
#   MODEL=/ckpt/retool-sft bash recipes/agent/run_retool_qwen32b.sh [overrides]   the run, from the Ray head node
#
# MODEL: the cold-start SFT checkpoint, exported (recipes/sft/run_retool_qwen32b.sh on JoeYing/ReTool-SFT, 6 epochs,
# then hybridrl export <its checkpoints/latest> <folder>); the default is the untuned Qwen2.5-32B-Instruct, which
# calls tools far less (the published figures need the SFT).
# Ray multi-node (README "Multi-node"): `ray start --head` on one machine, `ray start --address=<head-ip>:6379` on
# the other, this repository at the same path on both, then run this on the head.
# Data: the retool dataset, written on the first run by the recipe's data.py when missing (hybridrl data prepare agent
# --config-name retool_qwen32b): DAPO-Math-17k from the HF hub (needs `pip install -e '.[hub]'`) or a local .parquet /
# .jsonl (DAPO_MATH_SRC=FILE); AIME 2024 from ../shared/data/aime24 beside the checkout, else the hub (AIME_SRC=DIR
# holding aime24/test.jsonl, or hub; passed on as HYBRIDRL_DATA_SRC, the default folder core.data.prepare reads).
# Tools run in core's sandbox on the rollout ranks (core/tools/sandbox.py: rlimits, no network, a scratch folder);
# rollout: vLLM TP 4, or the embedded engine (TP 1) where vllm is not importable.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
# the checkout's .venv (make setup), else the python on PATH (an image's; a Ray job's working_dir ships no .venv)
[ -n "${PY:-}" ] || { PY="$root/.venv/bin/python"; [ -x "$PY" ] || PY=python3; }
dry=0
args=()
[ -n "${MODEL:-}" ] && args+=("actor.model=$MODEL" "rollout.model=$MODEL")
for a in "$@"; do
  if [ "$a" = --dry-run ]; then dry=1; else args+=("$a"); fi
done
src=()  # where the run reads the data it writes when missing (default: the dataset's own)
[ -n "${DAPO_MATH_SRC:-}" ] && src+=(--src "retool=$DAPO_MATH_SRC")
[ -n "${AIME_SRC:-}" ] && export HYBRIDRL_DATA_SRC="$AIME_SRC"  # retool reads AIME 2024 from that default folder
run=("$PY" -m core.cli train "$here" --config-name retool_qwen32b "${src[@]}")
if [ "$dry" = 1 ]; then
  exec "${run[@]}" --dry-run "${args[@]}"
fi
if ! "$PY" -c "import vllm, core.rollout.vllm_engine" 2>/dev/null; then
  echo "run_retool_qwen32b.sh: vllm is not importable here: falling back to the embedded engine (rollout.backend=embedded, TP 1)"
  args=(rollout.backend=embedded rollout.tensor_parallel_size=1 "${args[@]}")
fi
# the plan first: a run that cannot fit stops here with the numbers
"${run[@]}" --dry-run "${args[@]}"
export RAY_ADDRESS="${RAY_ADDRESS:-auto}"
exec "${run[@]}" "${args[@]}"
