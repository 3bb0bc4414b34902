#!/usr/bin/env bash
# SPPO at verl's published scale: Qwen2.5-7B-Instruct on one node of 4 GPUs (80 GB), MATH train, MATH test tracked
# (verl's recipe/sppo: 46.6 -> 65.6). Settings: qwen7b_math.yaml (every field commented), on top of config.yaml.
#
#   bash recipes/sppo/run_qwen2.5_7b_math.sh --dry-run [overrides]   resolve the config, list the importable
#        backends and print the per-GPU / per-node memory plan; no GPU needed; exit 1 (with the numbers) when it
#        does not fit, e.g.: bash recipes/sppo/run_qwen2.5_7b_math.sh --dry-run trainer.n_gpus_per_node=1
#   bash recipes/sppo/run_qwen2.5_7b_math.sh [overrides]             the run (Ray starts here, or RAY_ADDRESS=auto)
#
# Data: written on the first run by the recipe's data.py when missing (hybridrl data prepare sppo --config-name
# qwen7b_math): MATH train + test from the HF hub (needs `pip install -e '.[hub]'`) or MATH_SRC=DIR holding
# math/{train,test}.jsonl; Minerva's 272 problems from ../shared/data/minerva_math beside the checkout, else the hub.
# Rollout: vLLM TP 1 (pip install -e '.[vllm]'; verl uses SGLang, whose adapter here has not run); where vllm is not
# importable the run falls back to the embedded engine (rollout.backend=embedded) after the plan says it fits.
# Extra arguments are Hydra overrides, e.g. trainer.total_steps=50 actor.optim.lr=2e-6
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
# the checkout's .venv (make setup), else the python on PATH (an image's; a Ray job's working_dir ships no .venv)
[ -n "${PY:-}" ] || { PY="$root/.venv/bin/python"; [ -x "$PY" ] || PY=python3; }
dry=0
args=()
for a in "$@"; do
  if [ "$a" = --dry-run ]; then dry=1; else args+=("$a"); fi
done
run=("$PY" -m core.cli train "$here" --config-name qwen7b_math ${MATH_SRC:+--src "math=$MATH_SRC"})
if [ "$dry" = 1 ]; then
  exec "${run[@]}" --dry-run "${args[@]}"
fi
if ! "$PY" -c "import vllm, core.rollout.vllm_engine" 2>/dev/null; then
  echo "run_qwen2.5_7b_math.sh: vllm is not importable here: falling back to the embedded engine (rollout.backend=embedded)"
  args=(rollout.backend=embedded "${args[@]}")
fi
"${run[@]}" --dry-run "${args[@]}"
exec "${run[@]}" "${args[@]}"
