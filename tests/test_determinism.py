"""``trainer.deterministic`` (``core.determinism``): the configurations it refuses, the weights' digest by hand, and
the CPU demo config run twice -- every logged metric but the timings, and the actor's weights digest after every
step, identical -- and once more with one reduction in another order (the gradient summed over micro-batches of 4
rows instead of 8: the same sum, other roundings), which the comparison catches."""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from core.checks import problems
from core.config import ConfigError
from core.determinism import DIGEST_KEY, weights_sha256
from core.report import read_metrics
from core.run import load_run_config

ROOT = Path(__file__).resolve().parents[1]
VOLATILE = ("timing_s/", "perf/", "sync/")  # a resumed run's first weight sync is full


def demo(*overrides: str):
    return load_run_config(ROOT / "recipes/grpo", "demo_cpu", ["trainer.deterministic=true", *overrides])


def test_the_demo_config_is_deterministic_as_it_is():
    assert problems(demo()) == []


@pytest.mark.parametrize("overrides, key", [
    (["trainer.async.mode=streaming", "trainer.async.overlap_steps=0"], "trainer.async.overlap_steps=0"),
    (["rollout.backend=vllm"], "rollout.backend=vllm"),
])
def test_what_timing_decides_is_refused_naming_its_key(overrides, key):
    found = problems(demo(*overrides))
    assert len(found) == 1 and found[0].startswith("trainer.deterministic=true: " + key), found
    assert problems(load_run_config(ROOT / "recipes/grpo", "demo_cpu", overrides)) == []  # allowed without the flag


def test_an_agent_runner_is_refused():
    cfg = load_run_config(ROOT / "recipes/agent", "openai_cpu", ["trainer.deterministic=true"])
    assert [p for p in problems(cfg) if "runner" in p] == [
        "trainer.deterministic=true: rollout.agent.runner's agents reach the engine in the order their requests "
        "arrive, which timing decides; drop the runner for the built-in agent loop"]


def test_the_digest_by_hand_and_one_flipped_bit():
    a, b = torch.tensor([1.0, -2.0]), torch.tensor([[3]], dtype=torch.int64)
    want = hashlib.sha256(b"w\0torch.float32\0(2,)\0" + a.numpy().tobytes()
                          + b"b\0torch.int64\0(1, 1)\0" + b.numpy().tobytes()).hexdigest()
    assert weights_sha256([[("w", a)], [("b", b)]]) == want
    flipped = a.clone()
    flipped.view(torch.int32)[1] ^= 1  # the last bit of -2.0's mantissa
    assert weights_sha256([[("w", flipped)], [("b", b)]]) != want
    assert weights_sha256([[("w", a.to(torch.bfloat16))], [("b", b)]]) != want  # the dtype is part of it


def test_a_local_run_asks_every_worker_for_the_switch(tmp_path, tiny_model_dir):
    """The flag's environment reaches the process that hosts the roles (here the driver: trainer.backend=local), and a
    step logs the actor's digest; refused configurations stop before anything loads."""
    from tests.test_checkpoint import write_run

    conf = write_run(tmp_path, tiny_model_dir, total_steps=2, save_freq=0)
    code = ("import sys, torch; from core.run import main; main(sys.argv[1:]); "
            "assert torch.are_deterministic_algorithms_enabled()")
    r = subprocess.run([sys.executable, "-c", code, "--config-dir", str(conf), f"trainer.output_dir={tmp_path / 'out'}",
                        "trainer.deterministic=true"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = read_metrics(tmp_path / "out/metrics.jsonl")
    digests = [m[DIGEST_KEY] for m in rows]
    assert len(digests) == 2 and all(len(d) == 64 for d in digests) and digests[0] != digests[1]
    with pytest.raises(ConfigError, match="trainer.deterministic=true: rollout.backend=vllm"):
        from core.checks import check_run

        check_run(load_run_config(conf, overrides=["trainer.deterministic=true", "rollout.backend=vllm"]))


# ------------------------------------------------------------------------------------------- the demo, twice
def train_demo(out: Path, *overrides: str, steps: int = 2) -> dict[int, dict]:
    """``hybridrl train grpo --config-name demo_cpu`` (Ray, the actor's 2 FSDP ranks with the rollout and the
    reference), deterministic; its metrics by step, timings left out."""
    r = subprocess.run([sys.executable, "-m", "core.cli", "train", "grpo", "--config-name", "demo_cpu",
                        f"trainer.total_steps={steps}", "trainer.deterministic=true", f"trainer.output_dir={out}",
                        *overrides], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return {m["step"]: {k: v for k, v in m.items() if not k.startswith(VOLATILE)}
            for m in read_metrics(out / "metrics.jsonl")}


def differences(a: dict[int, dict], b: dict[int, dict]) -> list[str]:
    return [f"step {s} {k}: {a[s].get(k)} vs {b.get(s, {}).get(k)}" for s in sorted(a) for k in sorted(a[s])
            if a[s].get(k) != b.get(s, {}).get(k)]


@pytest.mark.heavy
def test_the_demo_config_repeats_bit_for_bit_and_a_reordered_reduction_is_caught(tmp_path):
    first, second = train_demo(tmp_path / "first"), train_demo(tmp_path / "second")
    assert sorted(first) == [0, 1, 2] and DIGEST_KEY in first[2] and "val/reward/mean" in first[2]
    assert differences(first, second) == [], differences(first, second)
    assert first[1][DIGEST_KEY] != first[2][DIGEST_KEY] and first[2]["actor/grad_norm"] > 0  # the steps trained
    # the named perturbation: the demo's micro-batches of 8 rows made 4 (the gradient's sum in another order)
    other = train_demo(tmp_path / "reordered", "actor.micro_batch_size=4", steps=1)
    found = differences(first, other)
    assert f"step 1 {DIGEST_KEY}" in " ".join(found), found  # caught at the first step it changes
    print("\n".join(found))
    (tmp_path / "differences.json").write_text(json.dumps(found))
