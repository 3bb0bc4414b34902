#!/usr/bin/env bash
# On-policy distillation at the published scale: a Qwen3-8B-Base student (after SFT) distilled from Qwen3-32B on
# 2 nodes x 8 GPUs (80 GB), DAPO-Math-17k prompts, AIME 2024 held out (Thinking Machines: 70%). Settings:
# qwen3_8b_from_32b.yaml (every field commented), on top of config.yaml.
#
#   bash recipes/distill/run_qwen3_8b_from_32b.sh --dry-run [overrides]   resolve the config and print the placement
#        and per-GPU / per-node memory plan (the teacher's lines included); no GPU needed; exit 1 when it does not fit
#   STUDENT=outputs/sft_qwen3_8b/hf bash recipes/distill/run_qwen3_8b_from_32b.sh [overrides]   the run, from the
#        Ray head node of a started cluster (README "Multi-node"); STUDENT: the SFT recipe's exported model (the
#        pipeline in recipes/distill/README.md), default Qwen/Qwen3-8B-Base itself
# Data: written on the first run by the recipe's data.py when missing: DAPO-Math-17k from the HF hub (needs
# `pip install -e '.[hub]'`) or a local file (DAPO_MATH_SRC=/path/file.parquet); AIME 2024 from ../shared/data/aime24
# beside the checkout, else the hub.
# Rollout: vLLM TP 1; where vllm is not importable the run falls back to the embedded engine after the plan.
# Extra arguments are Hydra overrides, e.g. trainer.total_steps=50 teacher.model=Qwen/Qwen3-14B
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
# the checkout's .venv (make setup), else the python on PATH (an image's; a Ray job's working_dir ships no .venv)
[ -n "${PY:-}" ] || { PY="$root/.venv/bin/python"; [ -x "$PY" ] || PY=python3; }
dry=0
args=()
[ -n "${STUDENT:-}" ] && args+=("actor.model=$STUDENT" "rollout.model=$STUDENT")
for a in "$@"; do
  if [ "$a" = --dry-run ]; then dry=1; else args+=("$a"); fi
done
src=()
[ -n "${DAPO_MATH_SRC:-}" ] && src+=(--src "dapo_math=$DAPO_MATH_SRC")
run=("$PY" -m core.cli train "$here" --config-name qwen3_8b_from_32b "${src[@]}")
if [ "$dry" = 1 ]; then
  exec "${run[@]}" --dry-run "${args[@]}"
fi
if ! "$PY" -c "import vllm, core.rollout.vllm_engine" 2>/dev/null; then
  echo "run_qwen3_8b_from_32b.sh: vllm is not importable here: falling back to the embedded engine (rollout.backend=embedded)"
  args=(rollout.backend=embedded "${args[@]}")
fi
# the plan first: a run that cannot fit stops here with the numbers, before 40B of weights load on 16 GPUs
"${run[@]}" --dry-run "${args[@]}"
export RAY_ADDRESS="${RAY_ADDRESS:-auto}"
exec "${run[@]}" "${args[@]}"
