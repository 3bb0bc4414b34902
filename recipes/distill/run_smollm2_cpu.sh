#!/usr/bin/env bash
# On-policy distillation on CPU (config.yaml): SmolLM2-135M-Instruct learns arithmetic from a teacher that scores
# every token it samples. The teacher is the same model after GRPO on the task (teacher_cpu.yaml): weights are never
# committed, so a first run trains it into $TEACHER_RUN (default outputs/distill_teacher_cpu: 20 GRPO steps, its
# held-out curve every 2 steps, the RL side of the comparison) and exports it to $TEACHER_RUN/hf; later runs reuse it.
#   bash recipes/distill/run_smollm2_cpu.sh [hydra overrides for the distillation run], e.g. trainer.total_steps=2
#   TEACHER=path/or/hub-id bash recipes/distill/run_smollm2_cpu.sh   your own teacher (SmolLM2's tokenizer): nothing
#                                                                     is trained first
#   --dry-run plans the distillation only (the GRPO teacher "not there yet" when missing)
# Data: arith_v2, generated (no download), written on the first run by the recipe's data.py.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
# the checkout's .venv (make setup), else the python on PATH (an image's; a Ray job's working_dir ships no .venv)
[ -n "${PY:-}" ] || { PY="$root/.venv/bin/python"; [ -x "$PY" ] || PY=python3; }
dry=0
for a in "$@"; do [ "$a" = --dry-run ] && dry=1; done
teacher="${TEACHER:-}"
if [ -z "$teacher" ]; then  # the GRPO teacher: trained and exported once
  teacher_run="${TEACHER_RUN:-outputs/distill_teacher_cpu}"
  teacher="$teacher_run/hf"
  if [ "$dry" = 0 ] && [ ! -f "$teacher/config.json" ]; then
    echo "run_smollm2_cpu.sh: no teacher at $teacher: training it (GRPO, teacher_cpu.yaml) into $teacher_run"
    start=$SECONDS
    "$PY" -m core.cli train "$here" --config-name teacher_cpu "trainer.output_dir=$teacher_run" trainer.resume_mode=disable
    "$PY" -m core.cli export "$teacher_run/checkpoints/latest" "$teacher" --dtype float32
    echo "run_smollm2_cpu.sh: the teacher took $((SECONDS - start)) s to train and export"
  fi
fi
exec "$PY" -m core.cli train "$here" --config-name config "teacher.model=$teacher" "$@"
