"""actor.offload: a clear error on CPU and for an unknown mode; on a GPU, updates with offload=idle (shards parked in
host memory between calls) and offload=full (FSDP2 CPUOffloadPolicy) see the same losses and gradient norms as
updates without offload, export the same weights, and idle leaves nothing of the model on the GPU between calls."""

import pytest
import torch

from core.config import ActorConfig, OptimConfig, PolicyLossConfig, RolloutConfig, SamplingParams
from core.train.fsdp import FSDPActor
from core.worker import RoleSpec, WorkerContext


@pytest.mark.parametrize("mode", ["idle", "full"])
def test_offload_on_a_cpu_rank_is_a_clear_error(tiny_model_dir, mode):
    cfg = ActorConfig(model=str(tiny_model_dir), dtype="float32", offload=mode)
    with pytest.raises(ValueError, match=rf"actor.offload={mode} moves FSDP shards .* needs a CUDA device; rank 0 runs on cpu"):
        FSDPActor(WorkerContext(0, 1, 0, torch.device("cpu")), cfg)


def test_an_unknown_offload_mode_is_named_in_the_error():
    # a YAML `offload: true` from before the modes existed arrives as a bool
    with pytest.raises(ValueError, match=r"actor.offload must be one of \('none', 'idle', 'full'\), got True"):
        ActorConfig(offload=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_offloaded_updates_equal_the_resident_ones_on_gpu(tiny_model_dir):
    from core.protocol import Batch
    from core.rollout.worker import RolloutWorker
    from core.worker_group import LocalWorkerGroup

    results = {}
    for mode in ("none", "idle", "full"):
        actor = ActorConfig(model=str(tiny_model_dir), dtype="float32", ppo_mini_batch_size=4, micro_batch_size=2,
                            optim=OptimConfig(lr=1e-2), loss=PolicyLossConfig(), offload=mode)
        group = LocalWorkerGroup({"actor": RoleSpec(FSDPActor, {"cfg": actor}),
                                  "rollout": RoleSpec(RolloutWorker, {"cfg": RolloutConfig(
                                      model=str(tiny_model_dir), dtype="float32", max_prompt_length=32)})},
                                 device="cuda")
        try:
            prompts = Batch(non_tensors={"prompt": [[{"role": "user", "content": t}] for t in ("ab", "cde")]})
            batch = group.role("rollout").call_all(RolloutWorker.generate, prompts,
                                                   SamplingParams(n=2, max_new_tokens=6, seed=1))[0]
            metrics, idle_bytes = [], []
            for _ in range(2):   # the second update finds the AdamW moments parked by the first
                b = batch.union(group.role("actor").call_all(FSDPActor.compute_logprobs, batch)[0])
                b["advantages"] = torch.linspace(-1, 1, len(b))[:, None] * b["response_mask"]
                metrics.append(group.role("actor").call_all(FSDPActor.update, b)[0])
                sync = group.role("rollout").call_all(RolloutWorker.sync_weights)[0]
                torch.cuda.synchronize()
                idle_bytes.append(torch.cuda.memory_allocated())
            state = group.role("actor").call_all(FSDPActor.full_state_dict)[0]
            actor_obj = group._host.roles["actor"]
            # offload none on one rank: plain parameters (core/train/one_rank.py); idle / full: FSDP2 shards
            local = [p.to_local() if hasattr(p, "to_local") else p for p in actor_obj.model.parameters()]
            on_gpu = sum(p.numel() * 4 for p in local if p.is_cuda)
            moments = sum(v.numel() * 4 for s in actor_obj.optim.state.values() for k, v in s.items()
                          if torch.is_tensor(v) and k != "step" and v.is_cuda)
            results[mode] = (metrics, sync, state, on_gpu, moments)
        finally:
            group.shutdown()
    m0, _, s0, gpu0, mom0 = results["none"]
    assert gpu0 > 0 and mom0 == 2 * gpu0   # no offload: fp32 weights and both moments stay on the GPU
    for mode in ("idle", "full"):
        m1, sync1, s1, gpu1, mom1 = results[mode]
        assert sync1["sync/buckets"] >= 1
        assert (gpu1, mom1) == (0, 0), mode   # between calls nothing of the training state is on the GPU
        for a, b in zip(m0, m1):
            assert b["actor/grad_norm"] == pytest.approx(a["actor/grad_norm"], rel=1e-4)
            assert b["actor/pg_loss"] == pytest.approx(a["actor/pg_loss"], rel=1e-4, abs=1e-6)
        for k in s0:
            if mode == "idle":   # the same GPU kernels on the same values: bit-identical
                assert torch.equal(s1[k], s0[k]), k
            else:                # the CPU optimizer rounds differently
                torch.testing.assert_close(s1[k], s0[k], atol=1e-5, rtol=1e-4)
