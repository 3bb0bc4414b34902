#!/usr/bin/env bash
# PRIME with SmolLM2-135M-Instruct on CPU: 2 Ray workers, FSDP2 world size 2; actor, rollout, reference and implicit
# PRM colocated.
#   bash recipes/prime/run_smollm2_cpu.sh                  the CPU run: arithmetic (a, b in 1..12), demo_cpu.yaml
#   CONFIG=config bash recipes/prime/run_smollm2_cpu.sh    GSM8K (config.yaml; data from ../shared/data/gsm8k)
# Extra arguments are Hydra overrides, e.g.: bash recipes/prime/run_smollm2_cpu.sh trainer.total_steps=2
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
PY="${PY:-$root/.venv/bin/python}"
CONFIG="${CONFIG:-demo_cpu}"
task=arith folder=arith_v2
[ "$CONFIG" = config ] && task=gsm8k folder=gsm8k
[ -f "outputs/data/$folder/train.parquet" ] || "$PY" "$here/data.py" --task "$task" --out outputs/data
exec "$PY" -m core.cli train "$here" --config-name "$CONFIG" "$@"
