#!/usr/bin/env bash
# On-policy distillation on CPU (config.yaml): SmolLM2-135M-Instruct learns arithmetic from a teacher that scores
# every token it samples. The teacher is the same model after GRPO on the task (teacher_cpu.yaml): weights are never
# committed, so a first run trains it (20 GRPO steps, its held-out curve every 2 steps: the RL side of the
# comparison) and exports it to $TEACHER (default outputs/distill_teacher_cpu/hf); later runs reuse it.
#   bash recipes/distill/run_smollm2_cpu.sh [hydra overrides for the distillation run], e.g. trainer.total_steps=2
#   TEACHER=path/to/hf bash recipes/distill/run_smollm2_cpu.sh     any HF causal LM with SmolLM2's tokenizer
# Data: arith_v2, generated (no download), written on the first run by the recipe's data.py.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
# the checkout's .venv (make setup), else the python on PATH (an image's; a Ray job's working_dir ships no .venv)
[ -n "${PY:-}" ] || { PY="$root/.venv/bin/python"; [ -x "$PY" ] || PY=python3; }
TEACHER="${TEACHER:-outputs/distill_teacher_cpu/hf}"
dry=0  # --dry-run plans the distillation only (its teacher "not there yet" when missing): nothing is trained
for a in "$@"; do [ "$a" = --dry-run ] && dry=1; done
if [ "$dry" = 0 ] && [ ! -f "$TEACHER/config.json" ]; then
  teacher_run="$(dirname "$TEACHER")"
  echo "run_smollm2_cpu.sh: no teacher at $TEACHER: training it (GRPO, teacher_cpu.yaml) into $teacher_run"
  start=$SECONDS
  "$PY" -m core.cli train "$here" --config-name teacher_cpu "trainer.output_dir=$teacher_run" trainer.resume_mode=disable
  "$PY" -m core.cli export "$teacher_run/checkpoints/latest" "$TEACHER" --dtype float32
  echo "run_smollm2_cpu.sh: the teacher took $((SECONDS - start)) s to train and export"
fi
exec "$PY" -m core.cli train "$here" --config-name config "teacher.model=$TEACHER" "$@"
