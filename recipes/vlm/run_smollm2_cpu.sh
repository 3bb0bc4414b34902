#!/usr/bin/env bash
# Vision-language GRPO on CPU: stage 1 aligns a fresh vision side to SmolLM2-135M on captions (align.py, text model
# frozen), stage 2 trains with RL on colour questions about generated pictures (config.yaml); 2 Ray workers.
#   bash recipes/vlm/run_smollm2_cpu.sh [hydra overrides], e.g. trainer.total_steps=2
# ALIGN_STEPS (default 60) sets stage 1's length; MODEL_DIR (default outputs/models/smolvlm_shapes) is where stage 1
# writes the aligned model and stage 2 reads it; an aligned model already there is reused.
# Data: vlm_shapes (generated pictures, no download), written by the recipe's data.py when missing (hybridrl data
# prepare vlm): before stage 1 when it has to run, since align.py reads it, else by stage 2's run itself.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
# the checkout's .venv (make setup), else the python on PATH (an image's; a Ray job's working_dir ships no .venv)
[ -n "${PY:-}" ] || { PY="$root/.venv/bin/python"; [ -x "$PY" ] || PY=python3; }
model="${MODEL_DIR:-outputs/models/smolvlm_shapes}"
dry=0
for a in "$@"; do [ "$a" = --dry-run ] && dry=1; done
if [ "$dry" = 1 ] && [ ! -f "$model/config.json" ]; then
  echo "run_smollm2_cpu.sh: --dry-run: stage 1 (align.py, writing $model) is not run; the plan of stage 2:" >&2
elif [ ! -f "$model/config.json" ]; then  # stage 1 reads the data: write it first (stage 2's run would, too late)
  "$PY" -m core.cli data prepare "$here" --config-name config
  "$PY" "$here/align.py" --steps "${ALIGN_STEPS:-60}" --data outputs/data/vlm_shapes --out "$model"
fi
exec "$PY" -m core.cli train "$here" --config-name config "actor.model=$model" "rollout.model=$model" "$@"
