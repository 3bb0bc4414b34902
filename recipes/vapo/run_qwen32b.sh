#!/usr/bin/env bash
# VAPO at paper scale: Qwen2.5-32B base on 16 nodes x 8 GPUs (80 GB), DAPO-Math-17k, AIME 2024 avg@32 tracked
# (paper 60.4). Settings: qwen32b.yaml (every field commented), on top of config.yaml.
#
#   bash recipes/vapo/run_qwen32b.sh --dry-run [overrides]   resolve the config, list the importable backends and
#        print the placement and per-GPU / per-node memory plan; no GPU needed; exit 1 (with the numbers) when it
#        does not fit, e.g.: bash recipes/vapo/run_qwen32b.sh --dry-run trainer.nnodes=1
#   bash recipes/vapo/run_qwen32b.sh [overrides]             the run, from the Ray head node of a started cluster
#   MODEL=<folder> bash recipes/vapo/run_qwen32b.sh            the policy from a cold-start SFT checkpoint, exported
#        (recipes/sft, then hybridrl export <its checkpoints/latest> <folder>); the value model stays critic.model
#
# Ray multi-node (README "Multi-node"), on every machine with this repository at the same path:
#   head:     ray start --head --port=6379 --num-gpus=8
#   workers:  ray start --address=<head-ip>:6379 --num-gpus=8
#   then on the head: bash recipes/vapo/run_qwen32b.sh   (RAY_ADDRESS defaults to auto: the running cluster)
# Data: written on the first run by the recipe's data.py when missing (hybridrl data prepare vapo --config-name
# qwen32b): DAPO-Math-17k from the HF hub (needs `pip install -e '.[hub]'`) or a local .parquet / .jsonl
# (DAPO_MATH_SRC=/path/file.parquet); AIME 2024 from ../shared/data/aime24 beside the checkout, else the hub
# (AIME_SRC=DIR holding aime24/test.jsonl, or hub).
# Rollout: vLLM TP 4 (pip install -e '.[vllm]'; core/rollout/vllm_engine.py); where vllm is not importable the run
# falls back to the embedded engine (rollout.backend=embedded, TP 1) -- and stops at the plan if that does not fit
# (it does not for 32B).
# Extra arguments are Hydra overrides, e.g. trainer.total_steps=200 actor.optim.lr=2e-6
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
src=()  # where the run reads the data it writes when missing (default: each dataset's own)
[ -n "${DAPO_MATH_SRC:-}" ] && src+=(--src "dapo_math=$DAPO_MATH_SRC")
[ -n "${AIME_SRC:-}" ] && src+=(--src "aime24=$AIME_SRC")
run=("$PY" -m core.cli train "$here" --config-name qwen32b "${src[@]}")
if [ "$dry" = 1 ]; then
  exec "${run[@]}" --dry-run "${args[@]}"
fi
# without vllm, fall back to the embedded engine
if ! "$PY" -c "import vllm, core.rollout.vllm_engine" 2>/dev/null; then
  echo "run_qwen32b.sh: vllm is not importable here: falling back to the embedded engine (rollout.backend=embedded, TP 1)"
  args=(rollout.backend=embedded rollout.tensor_parallel_size=1 "${args[@]}")
fi
# the plan first: a run that cannot fit stops here with the numbers, not after loading 32B weights on 128 GPUs
"${run[@]}" --dry-run "${args[@]}"
export RAY_ADDRESS="${RAY_ADDRESS:-auto}"
exec "${run[@]}" "${args[@]}"
