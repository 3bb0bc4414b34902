"""Mixture-of-experts models (tiny random Qwen2-MoE, Mixtral and DeepSeek-V3 from a config) through the embedded
engine, the FSDP2 actor and weight sync, and the router metrics (core/train/moe.py) by hand."""

import pytest
import torch

from core.config import (ActorConfig, AdvantageConfig, AlgoConfig, OptimConfig, PlacementConfig, PoolConfig,
                         RolloutConfig, SamplingParams)
from core.train.moe import RouterStats

CONFIGS = {"qwen2_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                             shared_expert_intermediate_size=64, intermediate_size=128),
           "mixtral": dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=64),
           # multi-head latent attention (keys 24 wide, values 16), one dense layer first, a shared expert
           "deepseek_v3": dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                               n_shared_experts=1, first_k_dense_replace=1, intermediate_size=64, kv_lora_rank=16,
                               q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, n_group=1,
                               topk_group=1, num_key_value_heads=4)}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def moe_dir(request, tmp_path_factory, tiny_model_dir):
    from transformers import AutoConfig, AutoModelForCausalLM

    from core.models import load_tokenizer

    base = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=True)
    cfg = AutoConfig.for_model(request.param, **(base | CONFIGS[request.param]))
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp(request.param) / "model"
    AutoModelForCausalLM.from_config(cfg).save_pretrained(out)
    load_tokenizer(str(tiny_model_dir)).save_pretrained(out)  # the tiny model's character tokenizer
    return request.param, out


class FixedTopKRouter(torch.nn.Module):
    """Routes 10 tokens, k = 2, to experts {0: 8, 1: 6, 2: 4, 3: 2} of the 20 slots, with uniform probabilities."""
    top_k = 2

    def forward(self, x):
        indices = torch.tensor([0] * 8 + [1] * 6 + [2] * 4 + [3] * 2).view(10, 2)
        return torch.zeros(10, 4), torch.full((10, 2), 0.5), indices


def test_router_metrics_by_hand():
    model = torch.nn.Sequential(FixedTopKRouter())
    stats = RouterStats(model)
    model.eval()(torch.zeros(1))          # log-prob passes (eval) are not counted
    assert stats.metrics() == {}
    model.train()(torch.zeros(1))
    # f = (0.4, 0.3, 0.2, 0.1): E max f = 1.6, E min f = 0.4; P = 1/4 each: E sum f P = 1.0
    assert stats.metrics("actor/") == pytest.approx({"actor/moe/load_max": 1.6, "actor/moe/load_min": 0.4,
                                                     "actor/moe/aux_loss": 1.0})
    stats.reset()
    assert stats.metrics() == {}


def test_engine_and_trainer_log_probs_agree_on_moe_models_in_fp32(moe_dir):
    from core.train.forward import response_logprobs
    from core.rollout.engine import RolloutEngine
    from core.models import load_causal_lm, load_tokenizer

    _, path = moe_dir
    tok = load_tokenizer(str(path))
    engine = RolloutEngine(load_causal_lm(str(path), dtype=torch.float32), tok, max_batch_size=8)
    ids = [tok("hello there", add_special_tokens=False)["input_ids"], tok("abc", add_special_tokens=False)["input_ids"]]
    batch = engine.generate(ids, SamplingParams(n=2, temperature=1.0, max_new_tokens=10, seed=1))
    with torch.no_grad():
        ours, _ = response_logprobs(load_causal_lm(str(path), dtype=torch.float32), batch, 1.0, share_prompt=True)
    m = batch["response_mask"]
    assert float(((ours - batch["rollout_logprobs"]).abs() * m).sum() / m.sum()) <= 1e-4  # measured 1.7e-7


def length_reward(data_source, solution_str, ground_truth, extra_info=None):
    return len(solution_str) / 10.0


def test_an_moe_actor_trains_logs_its_routers_and_syncs_its_experts(moe_dir, capfd):
    """FSDP2 (gradient checkpointing: the sharded path, on one in-process rank) with the engine colocated: a GRPO step
    moves the experts and the router, logs the router loads, and the sync leaves the engine equal to the actor."""
    from core.train.fsdp import FSDPActor
    from core.loop import Roles, step
    from core.placement import place
    from core.protocol import Batch
    from core.rollout.worker import RolloutWorker
    from core.worker import RoleSpec

    _, path = moe_dir
    actor = ActorConfig(model=str(path), dtype="float32", ppo_mini_batch_size=8, micro_batch_size=4,
                        gradient_checkpointing=True, optim=OptimConfig(lr=1e-2, warmup_steps=0))
    specs = {"actor": RoleSpec(FSDPActor, {"cfg": actor}),
             "rollout": RoleSpec(RolloutWorker, {"cfg": RolloutConfig(model=str(path), dtype="float32",
                                                                      max_prompt_length=32)})}
    algo = AlgoConfig(sampling=SamplingParams(n=2, temperature=1.0, max_new_tokens=8, seed=0),
                      adv=AdvantageConfig(estimator="grpo"))
    prompts = Batch(non_tensors={"prompt": [[{"role": "user", "content": f"q{i} " + "ab" * i}] for i in range(4)],
                                 "uid": [f"u{i}" for i in range(4)], "data_source": ["t"] * 4,
                                 "ground_truth": ["x"] * 4, "extra_info": [{}] * 4})
    placement = place(PlacementConfig({"main": PoolConfig(slots_per_node=1)}, {"actor": "main", "rollout": "main"}),
                      specs, "local")
    try:
        roles = Roles(actor=placement["actor"], rollout=placement["rollout"])
        before = roles.actor.call_all(FSDPActor.full_state_dict)[0]
        _, metrics = step(roles, prompts, algo, length_reward)
        after = roles.actor.call_all(FSDPActor.full_state_dict)[0]
        engine = roles.rollout.call_all(RolloutWorker.engine_state_dict)[0]
    finally:
        placement.shutdown()
    assert metrics["rollout/logprob_diff_mean"] <= 1e-4
    # loaded shard by shard: the experts stored one by one in the file, fused in the model, equal the full load
    from core.models import load_causal_lm

    full = load_causal_lm(str(path), dtype=torch.float32).state_dict()
    assert all(torch.equal(before[k], full[k]) for k in before)
    assert "loading the full model instead" not in capfd.readouterr().out
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert any("experts" in k for k in moved) and any(k.endswith("gate.weight") for k in moved)
    assert 1.0 <= metrics["actor/moe/load_max"] <= 2.0 and 0.0 <= metrics["actor/moe/load_min"] <= 1.0
    assert metrics["actor/moe/aux_loss"] > 0
    assert set(after) <= set(engine) and all(torch.equal(engine[k], after[k]) for k in after)
