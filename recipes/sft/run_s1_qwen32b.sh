#!/usr/bin/env bash
# SFT at full scale, as s1 (arXiv:2501.19393): Qwen2.5-32B-Instruct on s1K's 1,000 reasoning traces, 5 epochs,
# 2 nodes x 8 GPUs (80 GB); AIME 2024 before and after (published: 50.0 without budget forcing). Settings:
# s1_qwen32b.yaml (every field commented).
#
#   bash recipes/sft/run_s1_qwen32b.sh --dry-run [overrides]   resolve the config and print the placement and
#        per-GPU memory plan; no GPU needed; exit 1 (with the numbers) when it does not fit
#   bash recipes/sft/run_s1_qwen32b.sh [overrides]             the run, from the Ray head node
#
# Data: the s1k dataset, written on the first run by the recipe's data.py when missing (hybridrl data prepare sft
# --config-name s1_qwen32b): s1K from the HF hub (needs `pip install -e '.[hub]'`) or a local .parquet / .jsonl
# (S1K_SRC=FILE); AIME 2024 from ../shared/data/aime24 beside the checkout, else the hub (AIME_SRC=DIR holding
# aime24/test.jsonl, passed on as HYBRIDRL_DATA_SRC). The exported last checkpoint (hybridrl export) is an RL
# recipe's MODEL, e.g. MODEL=<folder> bash recipes/agent/run_retool_qwen32b.sh.
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
[ -n "${S1K_SRC:-}" ] && src+=(--src "s1k=$S1K_SRC")
[ -n "${AIME_SRC:-}" ] && export HYBRIDRL_DATA_SRC="$AIME_SRC"
run=("$PY" -m core.cli train "$here" --config-name s1_qwen32b "${src[@]}")
if [ "$dry" = 1 ]; then
  exec "${run[@]}" --dry-run "${args[@]}"
fi
if ! "$PY" -c "import vllm, core.rollout.vllm_engine" 2>/dev/null; then
  echo "run_s1_qwen32b.sh: vllm is not importable here: falling back to the embedded engine (rollout.backend=embedded, TP 1)"
  args=(rollout.backend=embedded rollout.tensor_parallel_size=1 "${args[@]}")
fi
# the plan first: a run that cannot fit stops here with the numbers
"${run[@]}" --dry-run "${args[@]}"
export RAY_ADDRESS="${RAY_ADDRESS:-auto}"
exec "${run[@]}" "${args[@]}"
