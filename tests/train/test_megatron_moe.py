"""Mixtures of experts (Mixtral; Qwen2-MoE with its gated shared expert) on Megatron-core with expert parallelism
(CPU, gloo, 2 ranks: each holds 2 of the 4 experts and its own half of the rows; the all-gather token dispatcher
sends tokens to their experts)
against the FSDP actor on one rank, same weights, fp32: log-probs, one PPO update (every metric but the router
loads, which each rank measures on its own tokens) and the weights after it, and the weights the sync sends."""

import os

import pytest
import torch
import torch.multiprocessing as mp

pytest.importorskip("megatron.core")

from core.config import ActorConfig, OptimConfig, SamplingParams  # noqa: E402
from core.worker import free_port  # noqa: E402


def actor_config(model_dir, **kw):
    return ActorConfig(model=str(model_dir), dtype="float32", ppo_mini_batch_size=8, micro_batch_size=2,
                       optim=OptimConfig(lr=1e-2, warmup_steps=0, grad_clip=1.0), **kw)


SHAPES = {"mixtral": dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=64),
          "qwen2_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                            shared_expert_intermediate_size=64, intermediate_size=128)}


@pytest.fixture(scope="module", params=sorted(SHAPES))
def mixtral_dir(request, tmp_path_factory, tiny_model_dir):
    from transformers import AutoConfig, AutoModelForCausalLM

    from core.models import load_tokenizer

    cfg = AutoConfig.for_model(request.param, vocab_size=128, hidden_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, bos_token_id=1, eos_token_id=2,
                               pad_token_id=0, tie_word_embeddings=True, **SHAPES[request.param])
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp(request.param) / "model"
    AutoModelForCausalLM.from_config(cfg).save_pretrained(out)
    load_tokenizer(str(tiny_model_dir)).save_pretrained(out)
    return out


def _megatron(rank: int, port: int, model_dir: str, folder: str) -> None:
    import torch.distributed as dist

    from core.config import MegatronConfig
    from core.train.megatron_actor import MegatronActor
    from core.protocol import Batch
    from core.worker import WorkerContext

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    batch = Batch(torch.load(f"{folder}/batch.pt"))
    mine = batch.index(slice(4 * rank, 4 * rank + 4))          # data parallel: this rank's half of the rows
    actor = MegatronActor(WorkerContext(rank, 2, rank, torch.device("cpu")),
                          actor_config(model_dir, strategy="megatron", megatron=MegatronConfig(ep=2)))
    assert sum(".local_experts." in n for n, _ in actor.model.named_parameters()) == 2 * 2 * 2  # layers x mine x fc
    before = actor.full_state_dict()
    logp = actor.compute_logprobs(mine)["old_logprobs"]
    metrics = actor.update(mine)
    after = actor.full_state_dict()
    torch.save({"before": before, "logp": logp, "metrics": metrics, "after": after}, f"{folder}/megatron{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


def test_moe_with_expert_parallelism_equals_the_fsdp_actor(mixtral_dir, tmp_path):
    from core.config import PlacementConfig, PoolConfig
    from core.train.fsdp import FSDPActor
    from core.rollout.engine import RolloutEngine
    from core.loop import reduce_over_ranks
    from core.models import load_causal_lm, load_tokenizer
    from core.placement import place
    from core.worker import RoleSpec

    tok = load_tokenizer(str(mixtral_dir))
    engine = RolloutEngine(load_causal_lm(str(mixtral_dir), dtype=torch.float32), tok, max_batch_size=8)
    ids = [tok(f"q{i} " + "ab" * i, add_special_tokens=False)["input_ids"] for i in range(4)]
    batch = engine.generate(ids, SamplingParams(n=2, temperature=1.0, max_new_tokens=8, seed=0))
    batch["old_logprobs"] = batch["rollout_logprobs"]
    g = torch.Generator().manual_seed(0)
    batch["advantages"] = torch.randn(len(batch), 1, generator=g) * batch["response_mask"]
    torch.save(dict(batch.tensors), tmp_path / "batch.pt")
    mp.spawn(_megatron, args=(free_port(), str(mixtral_dir), str(tmp_path)), nprocs=2)
    ranks = [torch.load(tmp_path / f"megatron{r}.pt") for r in range(2)]

    placement = place(PlacementConfig({"main": PoolConfig(slots_per_node=1)}, {"actor": "main"}),
                      {"actor": RoleSpec(FSDPActor, {"cfg": actor_config(mixtral_dir)})}, "local")
    try:
        actor = placement["actor"]
        before = actor.call_all(FSDPActor.full_state_dict)[0]
        logp = actor.call_all(FSDPActor.compute_logprobs, batch)[0]["old_logprobs"]
        metrics = actor.call_all(FSDPActor.update, batch)[0]
        after = actor.call_all(FSDPActor.full_state_dict)[0]
    finally:
        placement.shutdown()
    for r in ranks:  # every rank's export: all experts, gathered over EP, in HF's fused layout
        assert sorted(r["before"]) == sorted(before) and all(torch.equal(r["before"][k], before[k]) for k in before)
    m = batch["response_mask"]
    gap = float(((torch.cat([r["logp"] for r in ranks]) - logp).abs() * m).max())
    theirs = reduce_over_ranks([r["metrics"] for r in ranks])   # as the controller combines the ranks' metrics
    print(f"measured EP 2: log-prob max diff {gap:.1e}, grad norm {theirs['actor/grad_norm']:.6f} vs "
          f"{metrics['actor/grad_norm']:.6f}")
    assert gap <= 1e-5
    assert sorted(theirs) == sorted(metrics) and "actor/moe/load_max" in theirs
    for key in metrics:
        if not key.startswith("actor/moe/"):
            assert theirs[key] == pytest.approx(metrics[key], rel=1e-4, abs=1e-6), key
    for k in after:
        torch.testing.assert_close(ranks[0]["after"][k], after[k], atol=2e-4, rtol=0)
    assert any(not torch.equal(before[k], after[k]) for k in after if "experts" in k)
