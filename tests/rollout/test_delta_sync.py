"""Delta weight syncs (core/weight_delta.py, core/rollout/weight_sync.py, core.roles.sync_across_pools).

- every encoding rebuilds the new bits exactly, and the smallest one travels (the module docstring's worked example);
- split placement (2 FSDP2 actor ranks -> a rollout pool, bf16 engine) over several GRPO steps: after every sync the
  engine's weights equal the trainer's cast bit for bit, the first sync is full and the later ones deltas, and the
  digests are compared every ``sync_hash_every`` deltas;
- a byte flipped in a bucket on its way is caught by its CRC-32: the sync restarts in full and the engine still
  equals the trainer; an update the engine never got is caught by the digest comparison of a checkpoint;
- colocated (2 ranks, fp32 engine, ``sync_delta=always``): the same equalities, deltas smaller than the full sync;
- a resumed run's first sync is full, and a checkpoint compares the digests.
"""

import pytest
import torch

from core.weight_delta import Bucket, apply, checksum, encode


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("change", ["none", "few", "all_small", "all", "signs_and_specials"])
def test_every_encoding_rebuilds_the_new_bits_and_the_smallest_travels(dtype, change):
    g = torch.Generator().manual_seed(0)
    old = (torch.randn(3000, generator=g) * 0.05).to(dtype)
    new = old.clone()
    if change == "few":
        idx = torch.randperm(3000, generator=g)[:40]
        new[idx] = (torch.randn(40, generator=g)).to(dtype)
    elif change == "all_small":  # an fp32 step: every value moves by a few hundred ulps
        new = (old.float() * (1 + 1e-5 * torch.randn(3000, generator=g))).to(dtype)
    elif change == "all":
        new = torch.randn(3000, generator=g).to(dtype)
    elif change == "signs_and_specials":
        new[:5] = -new[:5]
        new[5:10] = torch.tensor([float("nan"), float("inf"), -0.0, 0.0, -float("inf")], dtype=dtype)
    part, changed = encode("w", (3000,), 0, new, old)
    flat = old.clone()
    apply(part, flat)
    bits = {2: torch.int16, 4: torch.int32}[old.element_size()]
    assert torch.equal(flat.view(bits), new.view(bits))
    assert changed == int((new.view(bits) != old.view(bits)).sum())
    assert part.nbytes <= new.numel() * new.element_size()
    if change == "none":
        assert part.nbytes == 0 and part.k == 0
    if change == "all":
        assert part.k == -1


def test_the_docstrings_worked_example_sends_two_low_bytes():
    old = torch.arange(1.0, 9.0)
    xor = torch.tensor([0, 0x1F3, 0x24, 0x3C000000, 0, 0x51, 0, 0x1A0], dtype=torch.int32)
    new = (old.view(torch.int32) ^ xor).view(torch.float32)
    part, changed = encode("w", (8,), 0, new, old)
    assert (part.k, part.nbytes, changed, part.gaps) == (2, 21, 5, 8)
    assert part.index.tolist() == [4] and part.planes.numel() == 16  # position 3 as the gap from -1


@pytest.mark.parametrize("where", [[0, 300, 70000, 70001], [254, 255, 509, 140000], list(range(0, 3000, 7))])
def test_positions_far_apart_get_fillers_that_carry_unchanged_values(where):
    old = torch.zeros(200000, dtype=torch.bfloat16)
    new = old.clone()
    new[where] = 1.0
    part, changed = encode("w", (200000,), 0, new, old)
    flat = old.clone()
    apply(part, flat)
    assert torch.equal(flat, new) and changed == len(where) and part.k == 0
    assert part.values.numel() >= len(where) and part.nbytes <= len(where) * 6  # at most int32 positions + values
    if len(where) > 100:  # gaps of 7: one byte each
        assert part.gaps == 8 and part.nbytes == len(where) * 3
    elif where[1] == 300:  # 300 and 69700 apart: 16-bit gaps, one filler (69700 > 65535): 5 x 4 < 4 x 6
        assert part.gaps == 16 and part.values.numel() == 5


def test_a_part_applies_at_its_offset_and_a_flipped_byte_changes_the_crc():
    full = torch.zeros(10)
    new = torch.arange(1.0, 5.0)
    part, _ = encode("w", (10,), 6, new, torch.zeros(4))
    apply(part, full)
    assert full.tolist() == [0] * 6 + [1, 2, 3, 4]
    bucket = Bucket([part], base="s1").seal()
    part.values.view(torch.uint8)[3] ^= 1
    assert checksum(bucket.parts) != bucket.crc


# ---------------------------------------------------------------------------------------------- on Ray
def _roles_and_batch(model_dir, engine_dtype: str, split: bool, hash_every: int = 2):
    from core.config import ActorConfig, OptimConfig, PolicyLossConfig, RolloutConfig
    from core.loop import Roles
    from core.protocol import Batch
    from core.rollout.worker import RolloutWorker
    from core.train.fsdp import FSDPActor
    from core.worker import RoleSpec
    from core.worker_group import ResourcePool, WorkerGroup

    actor = RoleSpec(FSDPActor, {"cfg": ActorConfig(model=str(model_dir), dtype="float32", ppo_mini_batch_size=8,
                                                    micro_batch_size=4, optim=OptimConfig(lr=1e-5),
                                                    loss=PolicyLossConfig())})
    rollout = RoleSpec(RolloutWorker, {"cfg": RolloutConfig(model=str(model_dir), dtype=engine_dtype,
                                                            max_prompt_length=32, sync_bucket_megabytes=0,
                                                            sync_hash_every=hash_every,
                                                            sync_delta="auto" if split else "always")})
    if split:  # half a CPU per rank: the session's Ray has 8
        groups = [WorkerGroup(ResourcePool(slots_per_node=2, cpus_per_slot=0.5), {"actor": actor}, name="train",
                              timeout_s=300),
                  WorkerGroup(ResourcePool(slots_per_node=1, cpus_per_slot=0.5), {"rollout": rollout}, name="gen",
                              timeout_s=300)]
        roles = Roles(actor=groups[0].role("actor"), rollout=groups[1].role("rollout"))
    else:
        groups = [WorkerGroup(ResourcePool(slots_per_node=2, cpus_per_slot=0.5), {"actor": actor, "rollout": rollout},
                              timeout_s=300)]
        roles = Roles(actor=groups[0].role("actor"), rollout=groups[0].role("rollout"))
    batch = Batch(non_tensors={"prompt": [[{"role": "user", "content": f"q{i} " + "ab" * i}] for i in range(4)],
                               "uid": [f"u{i}" for i in range(4)], "data_source": ["x"] * 4,
                               "ground_truth": ["0"] * 4, "extra_info": [{}] * 4})
    return groups, roles, batch


def _reward(source, text, truth, extra=None):
    return sum(map(ord, text)) % 7 / 7  # differs between a prompt's samples: every step has a gradient


def _steps(roles, prompts, algo, n: int) -> list[dict]:
    """``n`` GRPO steps (each ends in a sync); after each the engine equals the trainer. Their metrics."""
    from core.loop import step

    rows = []
    for _ in range(n):
        rows.append(step(roles, prompts, algo, _reward)[1])
        _engine_equals_trainer(roles)
    return rows


def _engine_equals_trainer(roles) -> None:
    from core.rollout.worker import RolloutWorker
    from core.train.fsdp import FSDPActor

    trainer = roles.actor.call_all(FSDPActor.full_state_dict)[0]
    for engine in roles.rollout.call_all(RolloutWorker.engine_state_dict):
        assert engine.keys() == trainer.keys()
        for k, v in trainer.items():
            assert torch.equal(engine[k], v.to(engine[k].dtype)), k


@pytest.mark.ray
def test_split_placement_deltas_keep_the_engine_equal_to_the_trainer_and_a_flipped_byte_forces_a_full_sync(
        tiny_model_dir, ray_shared):
    from core.config import AlgoConfig, SamplingParams
    from core.roles import check_across_pools, sync_across_pools
    from core.rollout.worker import RolloutWorker
    from core.train.fsdp import FSDPActor

    groups, roles, prompts = _roles_and_batch(tiny_model_dir, "bfloat16", split=True)
    algo = AlgoConfig(sampling=SamplingParams(n=2, temperature=1.0, max_new_tokens=8, seed=3))
    try:
        rows = _steps(roles, prompts, algo, 5)
        assert [m["sync/full"] for m in rows] == [1.0, 0.0, 0.0, 0.0, 0.0]
        # sync_hash_every=2: the digests compared at the 2nd and 4th delta (steps 3 and 5)
        assert [m.get("sync/hash_checked", 0.0) for m in rows] == [0.0, 0.0, 1.0, 0.0, 1.0]
        assert all(m["sync/resyncs"] == 0.0 for m in rows)
        full, deltas = rows[0]["sync/megabytes"], [m["sync/megabytes"] for m in rows[1:]]
        assert rows[0]["sync/changed_fraction"] == 1.0 and all(0 < m["sync/changed_fraction"] < 0.5 for m in rows[1:])
        assert all(d < 0.6 * full for d in deltas), (full, deltas)  # ~25% of this tiny model's bf16 values move
        names = [n for b in roles.actor.call_rank0(FSDPActor.bucket_plan, 0) for n in b]
        digest = roles.actor.call_all(FSDPActor.weights_sha256, "bfloat16")[0]
        assert roles.rollout.call_all(RolloutWorker.weights_sha256, names) == [digest]

        # an update, then a sync whose first bucket has a byte flipped on its way
        def flip(buckets):
            part = next(p for b in buckets for p in b.parts if p.values.numel() or p.planes.numel())
            (part.values if part.values.numel() else part.planes).view(torch.uint8)[0] ^= 0x10
            return buckets

        roles.actor.dp_split(FSDPActor.update, _trained_batch(roles, prompts, algo))
        flipped = {"n": 0}

        def once(buckets):
            flipped["n"] += 1
            return flip(buckets) if flipped["n"] == 1 else buckets

        metrics = sync_across_pools(roles.actor, roles.rollout, transit=once)
        assert metrics["sync/resyncs"] == 1.0 and metrics["sync/full"] == 1.0
        _engine_equals_trainer(roles)
        after = sync_across_pools(roles.actor, roles.rollout)  # the full resync is a base for deltas again
        assert after["sync/full"] == 0.0 and after["sync/changed_fraction"] == 0.0

        # the trainer's weights move without a sync: a checkpoint's digest comparison finds it and resyncs
        roles.actor.dp_split(FSDPActor.update, _trained_batch(roles, prompts, algo))
        checked = check_across_pools(roles.actor, roles.rollout)
        assert checked["sync/hash_checked"] == 1.0 and checked["sync/resyncs"] == 1.0 and checked["sync/full"] == 1.0
        _engine_equals_trainer(roles)
        assert check_across_pools(roles.actor, roles.rollout) == {"sync/hash_checked": 1.0}
    finally:
        for g in groups:
            g.shutdown()


def _trained_batch(roles, prompts, algo):
    """A batch the actor can update on: generated, scored, advantages from the rewards' group means."""
    from core.algos import compute_advantages
    from core.config import AdvantageConfig
    from core.rollout.worker import RolloutWorker
    from core.train.fsdp import FSDPActor

    batch = roles.rollout.dp_split(RolloutWorker.generate, prompts, algo.sampling)
    scores = (torch.arange(len(batch)) % 3).float()
    mask = batch["response_mask"]
    batch["token_rewards"] = torch.zeros_like(mask).scatter(1, (mask.sum(-1).long() - 1)[:, None], scores[:, None])
    batch = batch.union(roles.actor.dp_split(FSDPActor.compute_logprobs, batch).select("old_logprobs"))
    batch["advantages"], _ = compute_advantages(batch, AdvantageConfig(estimator="grpo"))
    return batch


@pytest.mark.ray
def test_colocated_deltas_keep_the_engine_equal_to_the_trainer(tiny_model_dir, ray_shared):
    from core.config import AlgoConfig, SamplingParams

    groups, roles, prompts = _roles_and_batch(tiny_model_dir, "float32", split=False, hash_every=1)
    algo = AlgoConfig(sampling=SamplingParams(n=2, temperature=1.0, max_new_tokens=8, seed=3))
    try:
        rows = _steps(roles, prompts, algo, 3)
    finally:
        for g in groups:
            g.shutdown()
    assert [m["sync/full"] for m in rows] == [1.0, 0.0, 0.0]
    assert [m.get("sync/hash_checked", 0.0) for m in rows] == [0.0, 1.0, 1.0]
    # fp32: nearly every value changes, but only in its low bytes
    assert all(m["sync/changed_fraction"] > 0.5 and m["sync/megabytes"] < 0.8 * rows[0]["sync/megabytes"]
               for m in rows[1:])


def test_a_resumed_runs_first_sync_is_full_and_a_checkpoint_compares_the_digests(tmp_path, tiny_model_dir, capsys):
    """One rank in this process (trainer.backend=local): the run saves after step 2 and stops; the rerun resumes
    from that checkpoint with fresh engines, so its first sync (after loading the checkpoint) sends every weight,
    and step 3's is a delta against it."""
    from core.report import read_metrics
    from tests.test_checkpoint import fit_run, write_run

    conf = write_run(tmp_path, tiny_model_dir, total_steps=2, save_freq=2)
    out = tmp_path / "run"
    fit_run(conf, out, "rollout.sync_delta=always")  # colocated: deltas only when asked
    capsys.readouterr()
    fit_run(conf, out, "trainer.total_steps=4", "rollout.sync_delta=always")
    assert "(step 2); rollout weights synced in full" in capsys.readouterr().out
    rows = {m["step"]: m for m in read_metrics(out / "metrics.jsonl")}
    assert [rows[s]["sync/full"] for s in (1, 2, 3, 4)] == [1.0, 0.0, 0.0, 0.0]
    assert rows[3]["sync/megabytes"] <= rows[1]["sync/megabytes"]
    assert rows[2]["sync/hash_checked"] == 1.0 and rows[4]["sync/hash_checked"] == 1.0  # the checkpoints' steps
    assert all(rows[s]["sync/resyncs"] == 0.0 for s in (1, 2, 3, 4) if "sync/resyncs" in rows[s])
