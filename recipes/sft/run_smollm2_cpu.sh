#!/usr/bin/env bash
# SFT of SmolLM2-135M-Instruct on CPU: correct tool-using traces of the agent task (config.yaml), 2 Ray workers,
# FSDP2 world size 2, validated on the task's held-out problems as the agent recipe validates.
#   bash recipes/sft/run_smollm2_cpu.sh [hydra overrides], e.g. trainer.total_steps=2
# Data: agent_traces and agent_mult, generated (no download), written on the first run by the recipe's data.py
# (hybridrl data prepare sft).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
# the checkout's .venv (make setup), else the python on PATH (an image's; a Ray job's working_dir ships no .venv)
[ -n "${PY:-}" ] || { PY="$root/.venv/bin/python"; [ -x "$PY" ] || PY=python3; }
exec "$PY" -m core.cli train "$here" --config-name config "$@"
