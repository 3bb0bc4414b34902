#!/usr/bin/env bash
# The full-scale PPO tier of expected.yaml: recipes/ppo/qwen2_5_0_5b_gsm8k.yaml says what it sets and why.
# It prepares GSM8K when missing, then runs `hybridrl train ppo --config-name qwen2_5_0_5b_gsm8k`.
#   bash recipes/ppo/run_qwen2.5_0.5b_gsm8k.sh [--dry-run] [hydra overrides...]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
PY="${PY:-$root/.venv/bin/python}"
case " $* " in
  *" --dry-run "*) ;;  # only resolve and print the config
  *) [ -f outputs/data/gsm8k/train.parquet ] || "$PY" "$here/data.py" --task gsm8k --out outputs/data ;;
esac
exec "$PY" -m core.cli train "$here" --config-name qwen2_5_0_5b_gsm8k "$@"
