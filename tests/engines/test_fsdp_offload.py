"""actor.offload (FSDP2 CPUOffloadPolicy): a clear error on CPU; on a GPU, an update with offload sees the same
loss and gradient norm as one without, and the weights it exports equal the non-offloaded actor's."""

import pytest
import torch

from core.algos import PolicyLossConfig
from core.engines.fsdp import ActorConfig, FSDPActor, OptimConfig
from core.worker import RoleSpec, WorkerContext


def test_offload_on_a_cpu_rank_is_a_clear_error(tiny_model_dir):
    cfg = ActorConfig(model=str(tiny_model_dir), dtype="float32", offload=True)
    with pytest.raises(ValueError, match=r"actor.offload .* needs a CUDA device; rank 0 runs on cpu"):
        FSDPActor(WorkerContext(0, 1, 0, torch.device("cpu")), cfg)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_offloaded_update_equals_the_resident_one_on_gpu(tiny_model_dir):
    from core.engines.rollout import SamplingParams
    from core.roles import RolloutConfig, RolloutWorker
    from core.worker_group import LocalWorkerGroup

    results = {}
    for offload in (False, True):
        actor = ActorConfig(model=str(tiny_model_dir), dtype="float32", ppo_mini_batch_size=4, micro_batch_size=2,
                            optim=OptimConfig(lr=1e-2), loss=PolicyLossConfig(), offload=offload)
        group = LocalWorkerGroup({"actor": RoleSpec(FSDPActor, {"cfg": actor}),
                                  "rollout": RoleSpec(RolloutWorker, {"cfg": RolloutConfig(
                                      model=str(tiny_model_dir), dtype="float32", max_prompt_length=32)})},
                                 device="cuda")
        try:
            from core.protocol import Batch

            prompts = Batch(non_tensors={"prompt": [[{"role": "user", "content": t}] for t in ("ab", "cde")]})
            batch = group.role("rollout").call_all(RolloutWorker.generate, prompts,
                                                   SamplingParams(n=2, max_new_tokens=6, seed=1))[0]
            batch = batch.union(group.role("actor").call_all(FSDPActor.compute_logprobs, batch)[0])
            batch["advantages"] = torch.linspace(-1, 1, len(batch))[:, None] * batch["response_mask"]
            metrics = group.role("actor").call_all(FSDPActor.update, batch)[0]
            sync = group.role("rollout").call_all(RolloutWorker.sync_weights)[0]
            state = group.role("actor").call_all(FSDPActor.full_state_dict)[0]
            results[offload] = (metrics, sync, state)
        finally:
            group.shutdown()
    (m0, _, s0), (m1, sync1, s1) = results[False], results[True]
    assert m1["actor/grad_norm"] == pytest.approx(m0["actor/grad_norm"], rel=1e-4)
    assert m1["actor/pg_loss"] == pytest.approx(m0["actor/pg_loss"], rel=1e-4, abs=1e-6)
    assert sync1["sync/buckets"] >= 1
    for k in s0:
        torch.testing.assert_close(s1[k], s0[k], atol=1e-5, rtol=1e-4)
