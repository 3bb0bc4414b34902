"""LoRA actors (core/train/lora.py, actor.lora): the actor starts as its base model; an update moves only the
adapters, so every adapted weight the engine receives moves by a matrix of rank <= r and nothing else moves; the
reference is the same module with its adapters off and stays the base model; a weight sync changes the engine to
W + (alpha / r) B A exactly (a sync that did nothing fails here); after the first sync only the adapted linears
are sent. fp32, one in-process rank, the sharded (FSDP2)
path and the one-rank path."""

import pytest
import torch

pytest.importorskip("peft")

from core.config import (ActorConfig, LoraConfig, OptimConfig, PlacementConfig, PoolConfig, RolloutConfig,  # noqa: E402
                         SamplingParams)


@pytest.mark.parametrize("sharded", [False, True], ids=["one-rank", "fsdp2"])
def test_lora_trains_only_low_rank_updates_its_reference_is_the_base_and_the_sync_lands(sharded, tiny_model_dir):
    from core.train.fsdp import FSDPActor
    from core.train.lora import LoraReference
    from core.train.policy import PolicyWorker
    from core.placement import place
    from core.rollout.worker import RolloutWorker
    from core.worker import RoleSpec

    path = str(tiny_model_dir)
    lora = LoraConfig(rank=4, alpha=8.0)
    actor = ActorConfig(model=path, dtype="float32", ppo_mini_batch_size=8, micro_batch_size=4, lora=lora,
                        gradient_checkpointing=sharded, optim=OptimConfig(lr=5e-2, warmup_steps=0))
    base = ActorConfig(model=path, dtype="float32", trainable=False)
    specs = {"actor": RoleSpec(FSDPActor, {"cfg": actor}), "ref": RoleSpec(LoraReference),
             "base": RoleSpec(FSDPActor, {"cfg": base}),
             "rollout": RoleSpec(RolloutWorker, {"cfg": RolloutConfig(model=path, dtype="float32")})}
    pool = PlacementConfig({"main": PoolConfig(slots_per_node=1)}, {r: "main" for r in specs})
    placement = place(pool, specs, "local")
    try:
        act, ref, plain, rollout = (placement[r] for r in ("actor", "ref", "base", "rollout"))
        engine = rollout.call_all(RolloutWorker.engine_state_dict)[0]
        from core.protocol import Batch

        prompts = Batch(non_tensors={"prompt": [[{"role": "user", "content": f"q{i} " + "ab" * i}] for i in range(4)]})
        batch = rollout.call_all(RolloutWorker.generate, prompts, SamplingParams(n=2, max_new_tokens=8, seed=0))[0]
        g = torch.Generator().manual_seed(0)
        batch["advantages"] = torch.randn(len(batch), 1, generator=g) * batch["response_mask"]
        start = act.call_all(PolicyWorker.compute_logprobs, batch)[0]["old_logprobs"]
        want = plain.call_all(PolicyWorker.compute_logprobs, batch)[0]["old_logprobs"]
        assert torch.equal(start, want)                                  # B = 0: the base model, exactly
        assert torch.equal(ref.call_all(PolicyWorker.compute_logprobs, batch)[0]["old_logprobs"], want)
        before = act.call_all(PolicyWorker.full_state_dict)[0]         # the engine's weights (HF names, merged)
        assert sorted(before) == sorted(engine) and all(torch.equal(before[k], engine[k]) for k in engine)
        megabytes = lambda names: sum(engine[k].numel() * engine[k].element_size() for k in names) / 2**20  # noqa
        first = rollout.call_all(RolloutWorker.sync_weights)[0]          # the first sync sends every weight
        assert first["sync/megabytes"] == pytest.approx(megabytes(engine))
        batch["old_logprobs"] = start
        metrics = act.call_all(PolicyWorker.update, batch)[0]
        after = act.call_all(PolicyWorker.full_state_dict)[0]
        moved = [k for k in after if not torch.equal(after[k], before[k])]
        targets = lora.target_modules
        assert moved and all(k.split(".")[-2] in targets for k in moved)        # only adapted linears move
        assert all(int(torch.linalg.matrix_rank(after[k] - before[k])) <= lora.rank for k in moved)
        assert metrics["actor/grad_norm"] > 0
        now = act.call_all(PolicyWorker.compute_logprobs, batch)[0]["old_logprobs"]
        assert not torch.equal(now, start)
        assert torch.equal(ref.call_all(PolicyWorker.compute_logprobs, batch)[0]["old_logprobs"], want)  # still base
        sync = rollout.call_all(RolloutWorker.sync_weights)[0]
        engine = rollout.call_all(RolloutWorker.engine_state_dict)[0]
        # later syncs send only the adapted linears (the frozen embedding and norms are there already)
        adapted = [k for k in after if k.split(".")[-2] in targets]
        assert sync["sync/megabytes"] == pytest.approx(megabytes(adapted)) and megabytes(adapted) < megabytes(after)
        for k in after:  # W + (alpha / r) B A, as the actor computes it
            torch.testing.assert_close(engine[k], after[k], rtol=0, atol=0)
        assert any(not torch.equal(engine[k], before[k]) for k in moved)
        # the merged weights are the model the actor trains: the engine samples what the actor scores
        fresh = rollout.call_all(RolloutWorker.generate, prompts, SamplingParams(n=2, max_new_tokens=8, seed=1))[0]
        scored = act.call_all(PolicyWorker.compute_logprobs, fresh)[0]["old_logprobs"]
        m = fresh["response_mask"]
        assert float(((scored - fresh["rollout_logprobs"]).abs() * m).max()) < 1e-4
    finally:
        placement.shutdown()
