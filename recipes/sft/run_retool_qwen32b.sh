#!/usr/bin/env bash
# ReTool's cold start at full scale (arXiv:2504.11536): Qwen2.5-32B-Instruct on ReTool-SFT's code-interleaved traces,
# 6 epochs, 2 nodes x 8 GPUs (80 GB); AIME 2024 through the agent loop. Settings: retool_qwen32b.yaml (every field
# commented). The pipeline, SFT then RL (this recipe's README):
#   bash recipes/sft/run_retool_qwen32b.sh
#   hybridrl export outputs/retool_sft_qwen2.5_32b/checkpoints/latest outputs/retool_sft_qwen2.5_32b/hf
#   MODEL=outputs/retool_sft_qwen2.5_32b/hf bash recipes/agent/run_retool_qwen32b.sh
#
#   bash recipes/sft/run_retool_qwen32b.sh --dry-run [overrides]   resolve the config and print the placement and
#        per-GPU memory plan; no GPU needed; exit 1 (with the numbers) when it does not fit
#   bash recipes/sft/run_retool_qwen32b.sh [overrides]             the run, from the Ray head node
#
# Data: the retool_sft dataset, written on the first run by the recipe's data.py when missing (hybridrl data prepare
# sft --config-name retool_qwen32b): ReTool-SFT from the HF hub (needs `pip install -e '.[hub]'`) or a local .parquet
# / .jsonl (RETOOL_SFT_SRC=FILE); AIME 2024 from ../shared/data/aime24 beside the checkout, else the hub
# (AIME_SRC=DIR holding aime24/test.jsonl, passed on as HYBRIDRL_DATA_SRC).
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
src=()  # where the run reads the data it writes when missing (default: the dataset's own)
[ -n "${RETOOL_SFT_SRC:-}" ] && src+=(--src "retool_sft=$RETOOL_SFT_SRC")
[ -n "${AIME_SRC:-}" ] && export HYBRIDRL_DATA_SRC="$AIME_SRC"
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
