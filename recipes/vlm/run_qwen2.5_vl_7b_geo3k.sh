#!/usr/bin/env bash
# Vision-language GRPO at full scale: Qwen2.5-VL-7B-Instruct on Geometry3K, one node of 8 GPUs (80 GB), verl's
# settings (n 5, KL loss 0.01, 512 prompts per step, mini-batches of 128 prompts, 1024 prompt / 2048 response
# tokens, 15 epochs); published baseline 65.4 on the geo3k test set (verl docs/algo/baseline.md). Settings:
# geo3k_qwen7b.yaml (every field commented), on top of config.yaml. Not yet run by us
# (recipes/vlm/README.md).
#
#   bash recipes/vlm/run_qwen2.5_vl_7b_geo3k.sh --dry-run [overrides]   resolve the config, print the placement and
#        the per-GPU / per-node memory plan (vision tower included); no GPU needed; exit 1 when it does not fit
#   bash recipes/vlm/run_qwen2.5_vl_7b_geo3k.sh [overrides]             the run (Ray: this node, or RAY_ADDRESS)
#
# Data: written on the first run by the recipe's data.py when missing (hybridrl data prepare vlm --config-name
# geo3k_qwen7b): Geometry3K from the HF hub (the default: needs `pip install -e '.[hub]'` and a network) or a folder
# holding the hub's parquet files (GEO3K_SRC=/path/to/geometry3k).
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
run=("$PY" -m core.cli train "$here" --config-name geo3k_qwen7b ${GEO3K_SRC:+--src "geo3k=$GEO3K_SRC"})
if [ "$dry" = 1 ]; then
  exec "${run[@]}" --dry-run "${args[@]}"
fi
# the plan first: a run that cannot fit stops here with the numbers
"${run[@]}" --dry-run "${args[@]}"
exec "${run[@]}" "${args[@]}"
