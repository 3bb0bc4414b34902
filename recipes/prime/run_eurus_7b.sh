#!/usr/bin/env bash
# PRIME at the paper's scale: Eurus-2-7B-SFT on one node of 8 GPUs (80 GB), Eurus-2-RL-Data's math rows, AIME 2024 /
# AMC 2023 / Minerva Math tracked (published Eurus-2-7B-PRIME: 26.7 / 57.8 / 38.6). Settings: eurus7b.yaml (every
# field commented), on top of config.yaml.
#
#   bash recipes/prime/run_eurus_7b.sh --dry-run [overrides]   resolve the config and print the placement and per-GPU
#        / per-node memory plan; no GPU needed; exit 1 (with the numbers) when it does not fit
#   bash recipes/prime/run_eurus_7b.sh [overrides]             the run (RAY_ADDRESS: a started cluster, else local)
# Data: Eurus-2-RL-Data from the HF hub (EURUS_SRC=hub, needs `pip install -e '.[hub]'`) or a local .parquet / .jsonl
# (EURUS_SRC=/path/file.parquet); the evaluation sets from ../shared/data (EVAL_SRC=DIR or hub).
# Rollout: vLLM (pip install -e '.[vllm]'); where vllm is not importable the run falls back to the embedded engine.
# Not run by us: no GPU machine has been lent for it (README, "What is measured where").
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
PY="${PY:-$root/.venv/bin/python}"
dry=0
args=()
for a in "$@"; do
  if [ "$a" = --dry-run ]; then dry=1; else args+=("$a"); fi
done
run=("$PY" -m core.cli train "$here" --config-name eurus7b)
if [ "$dry" = 1 ]; then
  exec "${run[@]}" --dry-run "${args[@]}"
fi
if ! "$PY" -c "import vllm, core.rollout.vllm_engine" 2>/dev/null; then
  echo "run_eurus_7b.sh: vllm is not importable here: falling back to the embedded engine (rollout.backend=embedded)"
  args=(rollout.backend=embedded "${args[@]}")
fi
"${run[@]}" --dry-run "${args[@]}"
[ -f outputs/data/eurus_math/train.parquet ] || "$PY" "$here/data.py" --task eurus --src "${EURUS_SRC:-hub}" --out outputs/data
for t in aime24 amc23 minerva_math; do
  [ -f "outputs/data/$t/test.parquet" ] || "$PY" "$here/data.py" --task "$t" --src "${EVAL_SRC:-$root/../shared/data}" --out outputs/data
done
exec "${run[@]}" "${args[@]}"
