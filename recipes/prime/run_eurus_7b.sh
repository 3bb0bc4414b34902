#!/usr/bin/env bash
# PRIME at the paper's scale: Eurus-2-7B-SFT on one node of 8 GPUs (80 GB), Eurus-2-RL-Data's math rows, AIME 2024 /
# AMC 2023 / Minerva Math tracked (published Eurus-2-7B-PRIME: 26.7 / 57.8 / 38.6). Settings: eurus7b.yaml (every
# field commented), on top of config.yaml.
#
#   bash recipes/prime/run_eurus_7b.sh --dry-run [overrides]   resolve the config and print the placement and per-GPU
#        / per-node memory plan; no GPU needed; exit 1 (with the numbers) when it does not fit
#   bash recipes/prime/run_eurus_7b.sh [overrides]             the run (RAY_ADDRESS: a started cluster, else local)
# Data: written on the first run by the recipe's data.py when missing (hybridrl data prepare prime --config-name
# eurus7b): Eurus-2-RL-Data from the HF hub (needs `pip install -e '.[hub]'`) or a local .parquet / .jsonl
# (EURUS_SRC=/path/file.parquet); the evaluation sets (aime24, amc23, minerva_math) from ../shared/data beside the
# checkout, else the hub (EVAL_SRC=DIR or hub).
# Rollout: vLLM (pip install -e '.[vllm]'); where vllm is not importable the run falls back to the embedded engine.
# Not run by us (recipes/prime/README.md).
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
src=()  # where the run reads the data it writes when missing (default: each dataset's own)
[ -n "${EURUS_SRC:-}" ] && src+=(--src "eurus_math=$EURUS_SRC")
if [ -n "${EVAL_SRC:-}" ]; then
  for t in aime24 amc23 minerva_math; do src+=(--src "$t=$EVAL_SRC"); done
fi
run=("$PY" -m core.cli train "$here" --config-name eurus7b "${src[@]}")
if [ "$dry" = 1 ]; then
  exec "${run[@]}" --dry-run "${args[@]}"
fi
if ! "$PY" -c "import vllm, core.rollout.vllm_engine" 2>/dev/null; then
  echo "run_eurus_7b.sh: vllm is not importable here: falling back to the embedded engine (rollout.backend=embedded)"
  args=(rollout.backend=embedded "${args[@]}")
fi
"${run[@]}" --dry-run "${args[@]}"
exec "${run[@]}" "${args[@]}"
