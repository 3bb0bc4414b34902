"""Each recipe's full-scale script (``recipes/*/run_*.sh`` but the ``run_smollm2_cpu*.sh`` CPU tiers) run for real:
``bash <script> <overrides>`` as a subprocess, not ``--dry-run``, the script's own code path (its plan first, its
fallback to the embedded engine where vllm is not importable, its ``hybridrl train``), made tiny by Hydra overrides:
a tiny random model for every role, tiny parquet data written here (nothing downloads), one CPU pool of 1 node x 2
slots, 2 prompts x 2 samples of 4 tokens, 2 steps, a checkpoint at step 2.

``RAY_ADDRESS=local``: the scripts that export ``RAY_ADDRESS=auto`` by default (dapo, vapo, agent) would otherwise
join whatever cluster ``/tmp/ray/ray_current_cluster`` names -- on a shared machine a stale file from someone else's
Ray makes ``ray.init`` retry the dead GCS forever. ``local`` is what core/worker_group.py::init_ray treats as a fresh
local Ray, and the scripts keep a RAY_ADDRESS that is set.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"

# script -> (extra overrides, what its output must show of its own path); PLAN: the script plans (--dry-run) before
# its run, so the plan's "effective sizes" shows twice (the plan's and the run's); the grpo and ppo-0.5b scripts are
# a bare ``hybridrl train``
FALLBACK = "vllm is not importable here: falling back to the embedded engine"
PLAN = "PLAN"
SCRIPTS = {
    "dapo/run_qwen32b.sh": (["++dapo.overlong_buffer=2"], [PLAN, FALLBACK]),
    "grpo/run_qwen2_7b_gsm8k.sh": ([], []),
    "grpo/run_qwen2_5_0_5b_lora_gsm8k.sh": (["++actor.lora.rank=4", "++actor.lora.alpha=8"], []),
    "ppo/run_qwen2.5_0.5b_gsm8k.sh": (["__critic__"], []),
    "ppo/run_qwen2_7b_rm.sh": (["__critic__", "__reward_model__"], [PLAN, FALLBACK]),
    "vapo/run_qwen32b.sh": (["__critic__"], [PLAN, FALLBACK]),
    "prime/run_eurus_7b.sh": (["__implicit_prm__"], [PLAN, FALLBACK]),
    "sppo/run_qwen2.5_7b_math.sh": ([], [PLAN, FALLBACK]),
    "vlm/run_qwen2.5_vl_7b_geo3k.sh": (["__vlm__"], [PLAN]),
    "agent/run_retool_qwen32b.sh": ([], [PLAN, FALLBACK]),
    "sft/run_s1_qwen32b.sh": (["++trainer.total_epochs=0", "__sft__"], [PLAN, FALLBACK]),
    "sft/run_retool_qwen32b.sh": (["++trainer.total_epochs=0", "__sft__"], [PLAN, FALLBACK]),
    "distill/run_qwen3_8b_from_32b.sh": (["__teacher__"], [PLAN, FALLBACK]),
}


@pytest.mark.heavy
def test_every_full_scale_script_is_listed():
    found = {str(p.relative_to(RECIPES)) for p in RECIPES.glob("*/run_*.sh")
             if not p.name.startswith("run_smollm2_cpu") and p.name != "run_verl_keys_cpu.sh"}
    assert found == set(SCRIPTS)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, tiny_model_dir):
    from core.scaffold import tiny_data

    tmp = tmp_path_factory.mktemp("fullscale")
    tiny_data(tmp)  # train.parquet (8 arithmetic prompts) and reward.py (a score that varies with the text)
    import pandas as pd

    pd.read_parquet(tmp / "train.parquet").head(2).to_parquet(tmp / "val.parquet")
    return tmp, Path(tiny_model_dir)


@pytest.fixture(scope="module")
def tiny_sft(tiny, tmp_path_factory):
    """The tiny rows with their conversations (``messages``: the question and its answer), for the SFT scripts."""
    import pandas as pd

    from core.scaffold import tiny_data

    tmp = tmp_path_factory.mktemp("fullscale_sft")
    tiny_data(tmp, conversations=True)
    pd.read_parquet(tmp / "train.parquet").head(2).to_parquet(tmp / "val.parquet")
    return tmp, tiny[1]


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory):
    from PIL import Image

    from core.data.multimodal import png_bytes
    from core.data.prepare import write_parquet
    from core.vision_models import tiny_qwen_vl

    tmp = tmp_path_factory.mktemp("fullscale_vlm")
    model = tiny_qwen_vl(tmp / "model", family="qwen2_5_vl")
    rows = [{"data_source": "hybridrl/arith", "prompt": [{"role": "user", "content": f"<image>{a} + {a} = ?"}],
             "ability": "vision", "reward_model": {"style": "rule", "ground_truth": str(2 * a)},
             "images": [png_bytes(Image.new("RGB", (32 + 8 * (a % 3), 32), (40 * a, 0, 255 - 40 * a)))],
             "extra_info": {"index": a}} for a in range(1, 5)]
    write_parquet(rows, tmp / "train.parquet")
    write_parquet(rows[:2], tmp / "val.parquet")
    return tmp, Path(model)


def overrides(script: str, data: Path, model: Path, out: Path) -> list[str]:
    extra, _ = SCRIPTS[script]
    sizes = {
        "trainer.total_steps": 2, "trainer.save_freq": 2, "trainer.test_freq": 0, "trainer.output_dir": out,
        "trainer.logger": "[console,jsonl]",
        "data.train_files": f"[{data / 'train.parquet'}]", "data.val_files": f"[{data / 'val.parquet'}]",
        "data.prompts_per_step": 2, "data.train_prompts_per_step": 2, "data.limit": 0, "data.truncation": "left",
        "algo.sampling.n": 2, "algo.sampling.max_new_tokens": 4, "algo.val_sampling.n": 1,
        "algo.val_sampling.max_new_tokens": 4, "algo.reward_workers": 1,
        "rollout.max_prompt_length": 64, "rollout.max_batch_size": 8,
        "placement.pools.main.nnodes": 1, "placement.pools.main.slots_per_node": 2,
        "placement.pools.main.device": "cpu", "placement.pools.main.cpus_per_slot": 1.0,
        "placement.pools.main.gpu_memory_gb": 0, "placement.pools.main.host_memory_gb": 0,
    }
    roles = ["actor", "rollout"] + [r.strip("_") for r in extra if r in ("__critic__", "__reward_model__",
                                                                           "__implicit_prm__", "__teacher__")]
    for role in roles:
        sizes |= {f"{role}.model": model, f"{role}.dtype": "float32"}
    for role in ("actor", "critic"):
        if role in roles:
            sizes |= {f"{role}.ppo_mini_batch_size": 4, f"{role}.micro_batch_size": 2,
                      f"{role}.max_tokens_per_micro": 0, f"{role}.gradient_checkpointing": "false",
                      f"{role}.offload": "none"}
    for role in ("reward_model", "implicit_prm", "teacher"):
        if role in roles:
            sizes |= {f"{role}.offload": "none"}  # (its max_tokens_per_micro: the yaml's; 0 is no value here)
    args = [f"++{k}={v}" for k, v in sizes.items()]
    return args + [e for e in extra if not e.startswith("__")]


@pytest.mark.heavy
@pytest.mark.parametrize("script", list(SCRIPTS))
def test_full_scale_script_runs_two_steps_and_saves_at_tiny_size(script, tiny, tiny_vlm, tiny_sft, tmp_path):
    extra = SCRIPTS[script][0]
    data, model = tiny_vlm if "__vlm__" in extra else tiny_sft if "__sft__" in extra else tiny
    out = tmp_path / "out"
    args = overrides(script, data, model, out)
    args += [f"++reward.path={tiny[0] / 'reward.py'}", "++reward.name=compute_score"]  # the tiny varying reward
    env = {**os.environ, "PY": sys.executable, "RAY_ADDRESS": "local", "PYTHONUNBUFFERED": "1"}
    start = time.monotonic()
    run = subprocess.run(["bash", str(RECIPES / script), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    wall = time.monotonic() - start
    text = run.stdout + run.stderr
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("steps:")]  # no tqdm bars
    print(f"\n[{script}] exit {run.returncode} in {wall:.1f} s\n" + "\n".join(lines[-20:]))
    assert run.returncode == 0, text[-6000:]
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert {1, 2} <= set(steps), steps
    assert (out / "checkpoints" / "step_000002").is_dir(), sorted(p.name for p in out.rglob("*"))
    # the script's own path: its plan printed by its --dry-run before the run (a second "effective sizes"), and
    # its fallback to the embedded engine where vllm is not importable
    for shown in SCRIPTS[script][1]:
        if shown == PLAN:
            assert text.count("effective sizes") >= 2, "the plan (--dry-run) was not printed before the run"
        else:
            assert shown in text


@pytest.mark.ray
@pytest.mark.multinode
def test_the_headline_script_runs_for_real_on_two_nodes(tiny, tmp_path_factory):
    """``bash recipes/dapo/run_qwen32b.sh`` without --dry-run on a 2-node Ray cluster of network namespaces
    (tests/multinode.py), the driver on the head as a user starts it there: its plan, the vLLM fallback, one rank on
    each node, 2 steps and a checkpoint."""
    from tests.multinode import Cluster

    data, model = tiny
    base = tmp_path_factory.mktemp("c")  # a short path: Ray's socket paths under it are at most 107 bytes
    out = base / "out"
    args = overrides("dapo/run_qwen32b.sh", data, model, out)
    args = [a for a in args if not a.startswith(("++placement.pools.main.nnodes", "++placement.pools.main.slots"))]
    args += ["++placement.pools.main.nnodes=2", "++placement.pools.main.slots_per_node=1",
             f"++reward.path={data / 'reward.py'}", "++reward.name=compute_score"]
    with Cluster(base, cpus=[1, 1]) as cluster:
        start = time.monotonic()
        run = cluster.run(["bash", str(RECIPES / "dapo/run_qwen32b.sh"), *args], node=0, timeout_s=600,
                          env={"PY": sys.executable, "PYTHONUNBUFFERED": "1"})
        wall = time.monotonic() - start
        text = run.stdout + run.stderr
        lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("steps:")]
        print(f"\n[dapo/run_qwen32b.sh on {cluster.kind}: {cluster.ips}] exit {run.returncode} in {wall:.1f} s\n"
              + "\n".join(lines[-25:]))
        assert run.returncode == 0, text[-6000:]
    assert "falling back to the embedded engine" in text and text.count("effective sizes") >= 2
    assert "pool 'main': 2 node(s) x 1 cpu rank(s)" in text or "2 node(s) x 1" in text
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert {1, 2} <= set(steps) and (out / "checkpoints" / "step_000002").is_dir()
