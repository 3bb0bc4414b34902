#!/usr/bin/env bash
# The project's GPU checks in one run, for a GPU machine (torch, transformers, peft; no Ray, no vLLM, no hub):
#   bash bench/gpu_session.sh MODEL_DIR [WHEELS_DIR]
# MODEL_DIR holds a model's config.json and tokenizer files, no weights (SmolLM2-135M's weights are 270 MB and a
# command carries 64 MiB): random weights of that architecture are made on the GPU; with EOS ignored, decoding
# them is the same work. WHEELS_DIR: wheels installed first (the transformers version CPU tests ran with).
# Each step's log goes to $OUT (or ./gpu-out); one failing step does not stop the others.
set -u
MODEL_SRC=$1
WHEELS=${2:-}
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
if [ -n "$WHEELS" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
  | tee -a "$OUT/gpu.txt"

# random weights of MODEL_SRC's architecture, bf16, saved beside its tokenizer
python3 - "$MODEL_SRC" /tmp/bench-model <<'EOF' 2>&1 | tee "$OUT/model.log"
import shutil, sys
from pathlib import Path
import torch
from transformers import AutoConfig, AutoModelForCausalLM
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
shutil.copytree(src, dst, dirs_exist_ok=True)
torch.manual_seed(0)
with torch.device("cuda"):
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src), dtype=torch.bfloat16)
model.save_pretrained(dst)
print("random", type(model).__name__, sum(p.numel() for p in model.parameters()) / 1e6, "M parameters at", dst)
EOF

# the tests marked gpu (those that need Ray skip themselves: none here)
[ -n "${SKIP_TESTS:-}" ] || timeout 240 python3 -m pytest -q -rs -m gpu -p no:cacheprovider --continue-on-collection-errors \
  tests/rollout/test_decode_graphs.py tests/train/test_fsdp_offload.py 2>&1 | tee "$OUT/gpu_tests.log"

# rollout throughput: ours (CUDA graphs), ours eager, transformers generate; batch 64 and 256, 64 new tokens
HYBRIDRL_BENCH_MODEL=/tmp/bench-model timeout 300 python3 -m pytest -q -s -p no:cacheprovider \
  bench/test_rollout.py --benchmark 2>&1 | tee "$OUT/bench_rollout.log"
cp bench/results/rollout.json "$OUT/" 2>/dev/null

# where a decode step's time goes (64 rows, 64 new tokens, after a warm run): the whole generate call, one
# recorded graph replayed alone, then the replay's kernels profiled
python3 - <<'EOF' 2>&1 | tee "$OUT/decode_parts.log"
import time
import torch
from torch.profiler import ProfilerActivity, profile
from bench.test_rollout import prompts
from core.config import SamplingParams
from core.rollout.engine import RolloutEngine
from core.models import load_causal_lm, load_tokenizer
tok = load_tokenizer("/tmp/bench-model")
model = load_causal_lm("/tmp/bench-model", dtype=torch.bfloat16, device=torch.device("cuda"))
ids = prompts(tok, 64)
p = SamplingParams(n=1, temperature=1.0, max_new_tokens=64, ignore_eos=True, seed=0)
def timed(fn, k):
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(k):
        fn()
    torch.cuda.synchronize(); return (time.perf_counter() - t) / k * 1e3
e = RolloutEngine(model, tok, max_batch_size=64)
e.generate(ids, p)
ms = timed(lambda: e.generate(ids, p), 3)
g, _ = e.graphs._graphs[64]
print(f"fused {e.fused}: generate 64 x 64 {ms:.1f} ms ({4096 / ms * 1e3:.0f} tok/s); replay {timed(g.replay, 100):.3f} ms")
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(20):
        g.replay()
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15, max_name_column_width=70))
EOF
echo "gpu_session done"
