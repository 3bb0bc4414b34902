#!/usr/bin/env bash
# GRPO, SmolLM2-135M-Instruct, GSM8K, CPU: 2 Ray workers, FSDP2 world size 2, rollout colocated.
# Extra arguments are Hydra overrides, e.g.: bash recipes/grpo/run_smollm2_cpu.sh trainer.total_steps=2
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
PY="${PY:-$root/.venv/bin/python}"
[ -f outputs/data/gsm8k/train.parquet ] || "$PY" "$here/data.py" --out outputs/data
exec "$PY" -m core.train --config-dir "$here" "$@"
