#!/usr/bin/env bash
# The full-scale GRPO-LoRA tier of expected.yaml: recipes/grpo/qwen2_5_0_5b_lora_gsm8k.yaml says what it sets and why.
# It runs `hybridrl train grpo --config-name qwen2_5_0_5b_lora_gsm8k`.
# Data: GSM8K, written on the first run by the recipe's data.py when missing (hybridrl data prepare grpo
# --config-name qwen2_5_0_5b_lora_gsm8k): from ../shared/data/gsm8k beside the checkout, else the hub. --dry-run only
# resolves the config and prints the plan; it writes no data.
#   bash recipes/grpo/run_qwen2_5_0_5b_lora_gsm8k.sh [--dry-run] [hydra overrides...]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
# the checkout's .venv (make setup), else the python on PATH (an image's; a Ray job's working_dir ships no .venv)
[ -n "${PY:-}" ] || { PY="$root/.venv/bin/python"; [ -x "$PY" ] || PY=python3; }
exec "$PY" -m core.cli train "$here" --config-name qwen2_5_0_5b_lora_gsm8k "$@"
