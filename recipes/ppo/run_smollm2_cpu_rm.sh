#!/usr/bin/env bash
# PPO against a learned reward model on CPU (demo_cpu_rm.yaml): actor, critic, reference and reward model, all
# colocated on 2 Ray workers. Three stages, each done once (delete its output to redo it):
#   1. preference pairs: the policy's own answers to the arithmetic problems, labelled by the rule (rm_pairs.py)
#   2. the reward model: Bradley-Terry from SmolLM2-135M-Instruct (python -m core.rm_train), its held-out pair
#      accuracy printed and kept in outputs/rm/arith_smollm2/rm_train.json
#   3. PPO on the reward model's score; the rule's truth is only watched (curves.png: reward model vs truth)
# Data: rm_pairs.py draws its problems from core.data.arith itself; stage 3's arithmetic (arith_v2) is written on its
# first run by the recipe's data.py (hybridrl data prepare ppo --config-name demo_cpu_rm).
# Extra arguments are Hydra overrides for stage 3, e.g.: bash recipes/ppo/run_smollm2_cpu_rm.sh trainer.total_steps=2
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
# the checkout's .venv (make setup), else the python on PATH (an image's; a Ray job's working_dir ships no .venv)
[ -n "${PY:-}" ] || { PY="$root/.venv/bin/python"; [ -x "$PY" ] || PY=python3; }
RM="${RM:-outputs/rm/arith_smollm2}"
dry=0
for a in "$@"; do [ "$a" = --dry-run ] && dry=1; done
if [ "$dry" = 1 ] && [ ! -f "$RM/rm_train.json" ]; then
  echo "run_smollm2_cpu_rm.sh: --dry-run: the pairs and the reward model ($RM) are not made; the plan of the PPO run:" >&2
else
  [ -f outputs/data/arith_rm/test.jsonl ] || "$PY" "$here/rm_pairs.py" --out outputs/data/arith_rm
  [ -f "$RM/rm_train.json" ] || "$PY" -m core.rm_train --model SmolLM2-135M-Instruct --out "$RM" \
    --train outputs/data/arith_rm/train.jsonl --val outputs/data/arith_rm/test.jsonl --epochs 1 --lr 1e-5
fi
exec "$PY" -m core.cli train "$here" --config-name demo_cpu_rm reward_model.model="$RM" "$@"
