#!/usr/bin/env bash
# Vision-language GRPO on CPU: stage 1 aligns a fresh vision side to SmolLM2-135M on captions (align.py, text model
# frozen), stage 2 trains with RL on colour questions about generated pictures (config.yaml); 2 Ray workers.
#   bash recipes/vlm/run_smollm2_cpu.sh [hydra overrides], e.g. trainer.total_steps=2
# ALIGN_STEPS (default 60) sets stage 1's length; MODEL_DIR (default outputs/models/smolvlm_shapes) is where stage 1
# writes the aligned model and stage 2 reads it; an aligned model already there is reused.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
PY="${PY:-$root/.venv/bin/python}"
[ -f outputs/data/vlm_shapes/train.parquet ] || "$PY" "$here/data.py" --out outputs/data
model="${MODEL_DIR:-outputs/models/smolvlm_shapes}"
[ -f "$model/config.json" ] || "$PY" "$here/align.py" --steps "${ALIGN_STEPS:-60}" --data outputs/data/vlm_shapes \
  --out "$model"
exec "$PY" -m core.cli train "$here" --config-name config "actor.model=$model" "rollout.model=$model" "$@"
