#!/usr/bin/env bash
# VAPO (its own step: recipes/vapo/train.py: value pre-training, then PPO with the critic) with SmolLM2-135M-Instruct on CPU: 2 Ray workers, FSDP2 world size 2.
#   bash recipes/vapo/run_smollm2_cpu.sh                  the CPU run: arithmetic (a, b in 1..12), demo_cpu.yaml
#   CONFIG=config bash recipes/vapo/run_smollm2_cpu.sh    the paper's data (config.yaml): DAPO-Math-17k (from the HF
#                                                          hub, or DAPO_MATH_SRC=<file>), AIME 2024 (../shared/data)
# Extra arguments are Hydra overrides, e.g.: bash recipes/vapo/run_smollm2_cpu.sh trainer.total_steps=2
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
PY="${PY:-$root/.venv/bin/python}"
CONFIG="${CONFIG:-demo_cpu}"
if [ "$CONFIG" = config ]; then  # the files config.yaml names
  [ -f outputs/data/dapo_math/train.parquet ] || "$PY" "$here/data.py" --task dapo_math --src "${DAPO_MATH_SRC:-hub}" --out outputs/data
  [ -f outputs/data/aime24/test.parquet ] || "$PY" "$here/data.py" --task aime24 --out outputs/data
else
  [ -f outputs/data/arith_v2/train.parquet ] || "$PY" "$here/data.py" --task arith --out outputs/data
fi
exec "$PY" -m core.cli train "$here" --config-name "$CONFIG" "$@"
