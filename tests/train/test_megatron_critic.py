"""core/train/megatron_critic.py on CPU (Megatron-core 0.16.1, 2 gloo ranks at TP 2, fp32) against the FSDP critic
on one rank, same backbone and seed: the value head starts equal, so the values, one clipped value-loss update
(every metric) and the values after it agree."""

import os

import pytest
import torch
import torch.multiprocessing as mp

pytest.importorskip("megatron.core")

from core.config import CriticConfig, OptimConfig, SamplingParams  # noqa: E402
from core.worker import free_port  # noqa: E402


def critic_config(model_dir, **kw):
    return CriticConfig(model=str(model_dir), dtype="float32", ppo_mini_batch_size=8, micro_batch_size=2,
                        optim=OptimConfig(lr=1e-3, warmup_steps=0, grad_clip=1.0), cliprange_value=0.2, **kw)


def _megatron(rank: int, port: int, model_dir: str, folder: str) -> None:
    import torch.distributed as dist

    from core.config import MegatronConfig
    from core.train.megatron_critic import MegatronCritic
    from core.protocol import Batch
    from core.worker import WorkerContext

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    batch = Batch(torch.load(f"{folder}/batch.pt"))
    critic = MegatronCritic(WorkerContext(rank, 2, rank, torch.device("cpu")),
                            critic_config(model_dir, strategy="megatron", megatron=MegatronConfig(tp=2)))
    before = critic.compute_values(batch)["values"]
    metrics = critic.update(batch)
    after = critic.compute_values(batch)["values"]
    if rank == 0:
        torch.save({"before": before, "metrics": metrics, "after": after}, f"{folder}/megatron.pt")
    dist.barrier()
    dist.destroy_process_group()


def test_megatron_critic_at_tp2_equals_the_fsdp_critic(tiny_model_dir, tmp_path):
    from core.config import PlacementConfig, PoolConfig
    from core.train.critic import FSDPCritic, ValueWorker
    from core.rollout.engine import RolloutEngine
    from core.models import load_causal_lm, load_tokenizer
    from core.placement import place
    from core.worker import RoleSpec

    tok = load_tokenizer(str(tiny_model_dir))
    engine = RolloutEngine(load_causal_lm(str(tiny_model_dir), dtype=torch.float32), tok, max_batch_size=8)
    ids = [tok(f"q{i} " + "ab" * i, add_special_tokens=False)["input_ids"] for i in range(4)]
    ids[1] = [tok.pad_token_id] + ids[1]  # the pad id as a real token (HF's padding_idx semantics)
    batch = engine.generate(ids, SamplingParams(n=2, temperature=1.0, max_new_tokens=8, seed=0))
    g = torch.Generator().manual_seed(0)
    batch["values"] = torch.randn(batch["response_mask"].shape, generator=g) * 0.1 * batch["response_mask"]
    batch["returns"] = torch.randn(batch["response_mask"].shape, generator=g) * batch["response_mask"]
    torch.save(dict(batch.tensors), tmp_path / "batch.pt")
    mp.spawn(_megatron, args=(free_port(), str(tiny_model_dir), str(tmp_path)), nprocs=2)
    theirs = torch.load(tmp_path / "megatron.pt")

    placement = place(PlacementConfig({"main": PoolConfig(slots_per_node=1)}, {"critic": "main"}),
                      {"critic": RoleSpec(FSDPCritic, {"cfg": critic_config(tiny_model_dir)})}, "local")
    try:
        critic = placement["critic"]
        before = critic.call_all(ValueWorker.compute_values, batch)[0]["values"]
        metrics = critic.call_all(ValueWorker.update, batch)[0]
        after = critic.call_all(ValueWorker.compute_values, batch)[0]["values"]
    finally:
        placement.shutdown()
    m = batch["response_mask"]
    print(f"measured critic TP 2: value max diff {float(((theirs['before'] - before).abs() * m).max()):.1e}")
    assert float(((theirs["before"] - before).abs() * m).max()) <= 1e-5 and float(before.abs().max()) > 0
    assert sorted(theirs["metrics"]) == sorted(metrics)
    for key in metrics:
        assert theirs["metrics"][key] == pytest.approx(metrics[key], rel=1e-4, abs=1e-6), key
    assert metrics["critic/grad_norm"] > 0
    assert float(((theirs["after"] - after).abs() * m).max()) <= 1e-4       # one AdamW step on both
    assert float(((after - before).abs() * m).max()) > 1e-3                    # which moved the values
