#!/usr/bin/env bash
# PRIME with SmolLM2-135M-Instruct on CPU: 2 Ray workers, FSDP2 world size 2; actor, rollout, reference and implicit
# PRM colocated.
#   bash recipes/prime/run_smollm2_cpu.sh                  the CPU run: arithmetic (a, b in 1..12), demo_cpu.yaml
#   CONFIG=config bash recipes/prime/run_smollm2_cpu.sh    GSM8K (config.yaml; from ../shared/data/gsm8k, else the hub)
# Data: the files the config names, written on the first run by the recipe's data.py when missing
# (hybridrl data prepare prime --config-name "$CONFIG"; the arithmetic is generated, no download).
# Extra arguments are Hydra overrides, e.g.: bash recipes/prime/run_smollm2_cpu.sh trainer.total_steps=2
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
# the checkout's .venv (make setup), else the python on PATH (an image's; a Ray job's working_dir ships no .venv)
[ -n "${PY:-}" ] || { PY="$root/.venv/bin/python"; [ -x "$PY" ] || PY=python3; }
CONFIG="${CONFIG:-demo_cpu}"
exec "$PY" -m core.cli train "$here" --config-name "$CONFIG" "$@"
