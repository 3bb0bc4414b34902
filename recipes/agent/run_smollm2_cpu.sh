#!/usr/bin/env bash
# Multi-turn tool-calling GRPO with SmolLM2-135M-Instruct on CPU: 2 Ray workers, FSDP2 world size 2, rollout
# colocated; multiplication of two- and three-digit numbers with a calculator (config.yaml).
#   bash recipes/agent/run_smollm2_cpu.sh [hydra overrides], e.g. trainer.total_steps=2
# Data: agent_mult, generated (no download), written on the first run by the recipe's data.py
# (hybridrl data prepare agent).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
# the checkout's .venv (make setup), else the python on PATH (an image's; a Ray job's working_dir ships no .venv)
[ -n "${PY:-}" ] || { PY="$root/.venv/bin/python"; [ -x "$PY" ] || PY=python3; }
exec "$PY" -m core.cli train "$here" --config-name config "$@"
