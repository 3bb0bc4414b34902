"""core.planner: the memory arithmetic against hand-computed cases."""

from dataclasses import replace

import pytest

from core.config.errors import ConfigError
from core.model_shapes import KNOWN, ModelShape, model_shape
from core.planner import CHUNK_WORK, GB, RunShape, plan


def lines(p):
    return {item: b for item, b, _ in p.lines}


def test_a_7b_models_sharded_training_state_under_fsdp_world_size_8():
    # 7e9 params, one node of 8 GPUs: fp32 masters 4 x 7e9 / 8 = 3.5 GB, fp32 grads 3.5 GB, Adam m + v 7 GB
    m = ModelShape(params=7e9, layers=28, hidden=3584, intermediate=18944, heads=28, kv_heads=4, vocab=152064)
    p = plan(m, RunShape(nnodes=1, gpus_per_node=8, gpu_memory_gb=80))
    got = lines(p)
    assert got["fp32 master weights (4P/W)"] == pytest.approx(3.5 * GB)
    assert got["fp32 gradients (4P/W)"] == pytest.approx(3.5 * GB)
    assert got["AdamW moments (8P/W)"] == pytest.approx(7.0 * GB)
    # offload=full: the three go to the host, 14 GB per GPU
    off = plan(m, RunShape(nnodes=1, gpus_per_node=8, gpu_memory_gb=80, offload="full"))
    assert "AdamW moments (8P/W)" not in lines(off) and lines(off)["(offloaded training state, host, per GPU)"] == pytest.approx(14 * GB)
    # offload=idle: all three on the GPU while training, none while generating; weights + moments (3.5 + 7 GB) are
    # parked on the host meanwhile (the gradients are freed after each step)
    idle = plan(m, RunShape(nnodes=1, gpus_per_node=8, gpu_memory_gb=80, offload="idle"))
    assert lines(idle)["AdamW moments (8P/W)"] == pytest.approx(7.0 * GB)
    assert lines(idle)["(parked while idle training state, host, per GPU)"] == pytest.approx(10.5 * GB)
    assert "training state kept during rollout" not in lines(idle)
    assert idle.total("rollout") == pytest.approx(0.5 * 80 * GB)


def test_qwen25_7b_parameter_count_from_its_config():
    # per layer: 2 h^2 + 2 h (kv x d) + 3 h i + 2 h = 25,690,112 + 3,670,016 + 203,685,888 + 7,168 = 233,053,184
    m = model_shape("Qwen/Qwen2.5-7B")
    assert m.layer_params == 233_053_184
    # 28 x 233,053,184 = 6,525,489,152, + untied embeddings 2 x 152,064 x 3,584 = 1,089,994,752, + the final norm
    # 3,584 = 7,615,487,488 (Qwen reports 7.61B; its q/k/v biases, 129k, are not counted)
    assert m.params == 7_615_487_488


def test_activation_logit_and_kv_terms_by_hand():
    m = model_shape("Qwen/Qwen2.5-32B")  # h 5120, L 64, kv_heads 8, head_dim 128, V 152064
    r = RunShape(nnodes=16, gpus_per_node=8, gpu_memory_gb=80, tokens_per_micro=1000,
                 rollout_tp=4, gpu_memory_utilization=0.8)
    got = lines(plan(m, r))
    # checkpointed: 2 T h L = 2*1000*5120*64 = 655,360,000, + one layer recomputed T (14 h + 4 kvd + 8 i)
    # = 1000 * (71,680 + 4,096 + 221,184) = 296,960,000
    assert got["activations (checkpointed)"] == 952_320_000
    # chunked logits: 6 T V = 912,384,000 bytes + 3 chunks of 2^28 fp32 values
    assert got["logits (6 T V + chunk work)"] == 912_384_000 + 3 * 2**28 * 4 == 912_384_000 + CHUNK_WORK
    # untied embeddings + LM head gathered in bf16 (2 x 2 V h) + the LM head's bf16 gradient (2 V h) = 6 V h
    assert got["embeddings + LM head, bf16 + grad (2kVh + 2Vh)"] == 6 * 152064 * 5120 == 4_671_406_080
    # KV per token at TP 4: 2 x 64 layers x 8 heads x 128 x 2 bytes / 4 = 65,536 bytes
    p = plan(m, r)
    weights = 2 * m.params / 4
    assert p.kv_tokens == pytest.approx((0.8 * 80 * GB - weights - 0.05 * 80 * GB) / 65_536)


def test_a_32b_run_fits_on_16_nodes_with_offload_and_not_on_one_node_without():
    m = model_shape("Qwen/Qwen2.5-32B")
    big = RunShape(nnodes=16, gpus_per_node=8, gpu_memory_gb=80, offload="full",
                   tokens_per_micro=22528, rollout_tp=4, gpu_memory_utilization=0.8,
                   max_seq_len=22528, host_memory_gb=1500)
    assert plan(m, big).fits, plan(m, big).text()
    one = RunShape(nnodes=1, gpus_per_node=8, gpu_memory_gb=80, tokens_per_micro=22528,
                   rollout_tp=4, gpu_memory_utilization=0.8, max_seq_len=22528)
    p = plan(m, one)
    assert not p.fits
    assert any(s.startswith("train phase needs") and "GB per GPU" in s for s in p.problems), p.problems


def test_a_name_the_run_resolves_through_the_model_cache_is_planned_from_its_config(tmp_path, monkeypatch):
    from core.models import tiny_random_model

    # what core.models.resolve_model finds for a bare name: <cache>/models/<name> (SmolLM2's alias lands there too)
    monkeypatch.setenv("HYBRIDRL_CACHE", str(tmp_path))
    tiny_random_model(tmp_path / "models" / "tiny-llama", vocab_size=128, hidden=64, layers=2)
    m = model_shape("tiny-llama")
    # per layer: 2 x 64^2 + 2 x 64 x (2 x 16) + 3 x 64 x 128 + 2 x 64 = 8192 + 4096 + 24576 + 128 = 36,992;
    # x 2 layers + tied embeddings 128 x 64 + final norm 64 = 73,984 + 8,192 + 64 = 82,240
    assert (m.layer_params, m.params, m.tied) == (36_992, 82_240, True)


def test_an_unknown_model_is_an_error_listing_the_table():
    with pytest.raises(ConfigError, match="not in the planner's table"):
        model_shape("nobody/NoModel-1B")
    assert "Qwen/Qwen2.5-32B" in KNOWN


def test_host_memory_per_node_by_hand_and_its_limit():
    # 32B on 1 node of 8, everything offloaded: 16 P / 8 per GPU = 65.53 GB; vLLM TP 4 sleeping weights 2 P / 4 =
    # 16.38 GB per GPU; x 8 GPUs = 8 x 81.9 = 655.3 GB per node
    m = model_shape("Qwen/Qwen2.5-32B")
    P = m.params
    r = RunShape(nnodes=1, gpus_per_node=8, gpu_memory_gb=80, offload="full",
                 tokens_per_micro=22528, rollout_tp=4, gpu_memory_utilization=0.8, max_seq_len=22528, host_memory_gb=1024)
    p = plan(m, r)
    assert p.host_per_node == pytest.approx(8 * (16 * P / 8 + 2 * P / 4)) == pytest.approx(655.27e9, rel=1e-4)
    assert p.fits, p.text()
    small = plan(m, RunShape(**{**r.__dict__, "host_memory_gb": 512}))
    assert not small.fits and small.problems == [
        "host memory: 655 GB per node (8 GPUs x (65.5 GB offloaded training state + 16.4 GB sleeping engine "
        "weights)) exceeds the node's 512 GB"]
    # 16 nodes: the training state is spread 16x thinner; the sleeping weights are per GPU whatever the size
    big = plan(m, RunShape(**{**r.__dict__, "nnodes": 16}))
    assert big.host_per_node == pytest.approx(8 * (16 * P / 128 + 2 * P / 4))


def test_the_embedded_engine_keeps_full_weights_and_a_32b_model_does_not_fit_it():
    m = model_shape("Qwen/Qwen2.5-32B")
    r = RunShape(nnodes=16, gpus_per_node=8, gpu_memory_gb=80, offload="full",
                 tokens_per_micro=22528, rollout_tp=4, gpu_memory_utilization=0.8, max_seq_len=22528,
                 rollout_backend="embedded")
    p = plan(m, r)
    # no tensor parallelism: 2 P = 65.5 GB of bf16 weights on every GPU, through the training phase as well
    assert lines(p)["embedded engine weights (2P, kept)"] == pytest.approx(2 * m.params)
    assert not p.fits
    # with the KV cache of 64 slots x 22,528 tokens x 262,144 bytes (2 x 64 layers x 8 x 128 x 2) = 378 GB
    assert p.kv_tokens == 64 * 22528
    assert p.total("rollout") == pytest.approx(2 * m.params + 64 * 22528 * 262_144 + 64 * 152064 * 4)
    assert p.problems[0] == "train phase needs 117.4 GB per GPU, more than the 76.0 GB available (80 GB - 4 GB reserve)"


def test_without_offload_one_node_cannot_hold_a_32b_models_training_state():
    m = model_shape("Qwen/Qwen2.5-32B")
    r = RunShape(nnodes=1, gpus_per_node=8, gpu_memory_gb=80, tokens_per_micro=22528, rollout_tp=4,
                 gpu_memory_utilization=0.8, max_seq_len=22528)
    p = plan(m, r)
    # 16 P / 8 = 65.5 GB of sharded state per GPU stays through both phases: 65.5 + 64 > 76 while generating
    assert lines(p)["AdamW moments (8P/W)"] == pytest.approx(8 * m.params / 8)
    assert p.total("rollout") == pytest.approx(0.8 * 80 * GB + 16 * m.params / 8)
    assert not p.fits and len(p.problems) == 2, p.problems


def test_idle_offload_a_32b_run_fits_16_nodes_and_not_one_and_the_plan_says_full_would():
    # the paper-scale setting (verl's param + optimizer offload): the sharded state is on the GPU while training
    m = model_shape("Qwen/Qwen2.5-32B")
    P = m.params
    r = RunShape(nnodes=16, gpus_per_node=8, gpu_memory_gb=80, offload="idle", tokens_per_micro=22528, rollout_tp=4,
                 gpu_memory_utilization=0.8, max_seq_len=22528, host_memory_gb=1024)
    big = plan(m, r)
    # 16 P / 128 = 4.10 GB of state on top of the offload=full training phase; nothing of it while generating
    full = plan(m, replace(r, offload="full"))
    assert big.total("train") == pytest.approx(full.total("train") + 16 * P / 128)
    assert big.total("rollout") == pytest.approx(0.8 * 80 * GB)
    assert big.fits, big.text()
    # host: 12 P / 128 parked (weights + moments) + 2 P / 4 sleeping vLLM weights, per GPU
    assert big.host_per_node == pytest.approx(8 * (12 * P / 128 + 2 * P / 4))
    one = plan(m, replace(r, nnodes=1))
    # 16 P / 8 = 65.5 GB of state + the 51.9 GB of layers, activations and logits = 117.4 GB > 76 GB
    assert one.total("train") == pytest.approx(full.total("train") + 16 * P / 8)
    assert one.problems == ["train phase needs 117.4 GB per GPU, more than the 76.0 GB available (80 GB - 4 GB reserve)"]
    assert one.hints == ["with offload=full (every shard on the host, the optimizer stepping on the CPU: slower) the "
                         "plan needs 51.9 GB per GPU training, 64.0 GB rollout, 655 GB host per node: it fits"]
    assert "hint: with offload=full" in one.text()


def test_the_critic_is_counted_by_its_offload_mode_and_its_update_peak():
    """A 7B actor and a 1.5B critic (another size, as a critic may be) on 8 GPUs: the critic's fp32 weights,
    gradients and moments are 4 x 1.5e9 / 8 = 0.75, 0.75 and 1.5 GB per GPU; kept through the rollout with offload
    none, parked (weights + moments, 2.25 GB) with idle, on the host (3 GB) with full. Its update's transient terms
    count only where they exceed the actor's: none at the same token budget, some at 16x the tokens."""
    actor = ModelShape(params=7e9, layers=28, hidden=3584, intermediate=18944, heads=28, kv_heads=4, vocab=152064)
    critic = ModelShape(params=1.5e9, layers=28, hidden=1536, intermediate=8960, heads=12, kv_heads=2, vocab=151936)
    base = RunShape(nnodes=1, gpus_per_node=8, gpu_memory_gb=80, critic=critic, tokens_per_micro=8192,
                    critic_tokens_per_micro=8192)
    got = lines(plan(actor, base))
    assert got["critic fp32 master weights (4Pc/W)"] == pytest.approx(0.75 * GB)
    assert got["critic fp32 gradients (4Pc/W)"] == pytest.approx(0.75 * GB)
    assert got["critic AdamW moments (8Pc/W)"] == pytest.approx(1.5 * GB)
    assert got["training state kept during rollout"] == pytest.approx((14 + 3) * GB)  # actor 3.5+3.5+7, critic 3
    assert got["critic update, beyond the actor's transient terms"] == 0.0
    idle = lines(plan(actor, replace(base, offload="idle", critic_offload="idle")))
    assert idle["(parked while idle training state, host, per GPU)"] == pytest.approx((10.5 + 2.25) * GB)
    full = lines(plan(actor, replace(base, critic_offload="full")))
    assert "critic AdamW moments (8Pc/W)" not in full
    assert full["(offloaded training state, host, per GPU)"] == pytest.approx(3 * GB)
    assert full["training state kept during rollout"] == pytest.approx(14 * GB)  # the actor's only
    # at 16x the tokens the critic's checkpointed activations (2 T h L + one layer) outgrow the actor's transients
    big = lines(plan(actor, replace(base, critic_tokens_per_micro=16 * 8192)))
    T, c = 16 * 8192, critic
    c_transient = (4 * c.layer_params + 4 * c.vocab * c.hidden + 2 * T * c.hidden * c.layers
                   + T * (14 * c.hidden + 4 * c.kv_heads * c.head_dim + 8 * c.intermediate))
    a_transient = sum(big[k] for k in big if k.startswith(("gathered bf16", "embeddings + LM head", "activations",
                                                           "logits")))
    assert big["critic update, beyond the actor's transient terms"] == pytest.approx(c_transient - a_transient)
    assert c_transient > a_transient


def test_the_reward_model_is_counted_in_bf16_by_its_offload_mode_and_its_forward_peak():
    """A 7B actor and a 1.5B reward model on 8 GPUs: the reward model's bf16 shards are 2 x 1.5e9 / 8 = 0.375 GB per
    GPU (no fp32 master, no gradients, no moments: it is never trained in a run), kept through the rollout with
    offload none, parked with idle, on the host with full. Its forward's transients count only beyond the actor's:
    none at the same token budget, some at 64x."""
    actor = ModelShape(params=7e9, layers=28, hidden=3584, intermediate=18944, heads=28, kv_heads=4, vocab=152064)
    rm = ModelShape(params=1.5e9, layers=28, hidden=1536, intermediate=8960, heads=12, kv_heads=2, vocab=151936)
    base = RunShape(nnodes=1, gpus_per_node=8, gpu_memory_gb=80, reward_model=rm, tokens_per_micro=8192,
                    rm_tokens_per_micro=8192)
    got = lines(plan(actor, base))
    assert got["reward model shards (2Prm/W)"] == pytest.approx(0.375 * GB)
    assert got["training state kept during rollout"] == pytest.approx((14 + 0.375) * GB)
    assert got["reward model forward, beyond the training transients"] == 0.0
    idle = lines(plan(actor, replace(base, offload="idle", rm_offload="idle")))
    assert "training state kept during rollout" not in idle                     # everything parked
    assert idle["(parked while idle training state, host, per GPU)"] == pytest.approx((10.5 + 0.375) * GB)
    full = lines(plan(actor, replace(base, rm_offload="full")))
    assert "reward model shards (2Prm/W)" not in full
    fp32 = lines(plan(actor, replace(base, rm_dtype_bytes=4)))
    assert fp32["reward model shards (4Prm/W)"] == pytest.approx(0.75 * GB)
    # one GPU: no FSDP2 without offload (nothing gathered), FSDP2 with it (two layers and the embeddings gathered)
    solo = replace(base, gpus_per_node=1, gpu_memory_gb=1000, actor=False, rollout=False, rm_tokens_per_micro=1)
    act = 14 * rm.hidden + 4 * rm.kv_heads * rm.head_dim + 8 * rm.intermediate + 2 * rm.hidden
    assert lines(plan(actor, solo))["reward model forward (layers, embeddings, activations)"] == pytest.approx(act)
    idle = lines(plan(actor, replace(solo, rm_offload="idle")))
    assert idle["reward model forward (layers, embeddings, activations)"] == pytest.approx(
        act + 4 * rm.layer_params + 2 * rm.vocab * rm.hidden)
    assert full["(offloaded training state, host, per GPU)"] == pytest.approx(0.375 * GB)
    T = 64 * 8192
    big = lines(plan(actor, replace(base, rm_tokens_per_micro=T)))
    transient = (4 * rm.layer_params + 2 * rm.vocab * rm.hidden + 2 * T * rm.hidden
                 + T * (14 * rm.hidden + 4 * rm.kv_heads * rm.head_dim + 8 * rm.intermediate))
    a_transient = sum(big[k] for k in big if k.startswith(("gathered bf16", "embeddings + LM head", "activations",
                                                           "logits")))
    assert transient > a_transient
    assert big["reward model forward, beyond the training transients"] == pytest.approx(transient - a_transient)


def test_the_ppo_gpu_scripts_dry_run_shows_the_critic(capsys):
    from tests.recipes.plans import plan as plan_recipe

    rc, out = plan_recipe(capsys, "ppo", "qwen2_5_0_5b_gsm8k")
    assert rc == 0, out[-2000:]
    assert "critic fp32 master weights (4Pc/W)" in out and "critic AdamW moments (8Pc/W)" in out


def test_split_placement_counts_each_pools_own_roles():
    """Actor + reference on one pool, the vLLM engine on a second, the critic on a third: each pool's plan holds
    its roles only (the training pools no rollout phase, the rollout pool no training state)."""
    m = ModelShape(params=7e9, layers=28, hidden=3584, intermediate=18944, heads=28, kv_heads=4, vocab=152064)
    c = ModelShape(params=1.5e9, layers=28, hidden=1536, intermediate=8960, heads=12, kv_heads=2, vocab=151936)
    colocated = plan(m, RunShape(nnodes=1, gpus_per_node=8, gpu_memory_gb=80, reference=True, critic=c))
    train = plan(m, RunShape(nnodes=1, gpus_per_node=8, gpu_memory_gb=80, reference=True, rollout=False))
    got = lines(train)
    # the actor's and reference's terms are the colocated plan's, and nothing of the engine or the critic
    want = {k: b for k, b in lines(colocated).items() if not k.startswith(("critic", "rollout", "training state kept",
                                                                             "(sleeping"))}
    assert got == want | {"(sleeping engine weights, host, per GPU)": 0.0}
    assert train.total("rollout") == 0 and train.kv_tokens == 0 and "rollout phase total" not in train.text()
    # vLLM alone on 4 GPUs of 40 GB at 0.9, TP 2: 36 GB each; weights 2 x 7e9 / 2 = 7 GB; KV per token
    # 2 x 28 x 4 x 128 x 2 / 2 = 28,672 bytes; the engine sleeps its weights to the host after each rollout
    gen = plan(m, RunShape(nnodes=1, gpus_per_node=4, gpu_memory_gb=40, actor=False, rollout_tp=2,
                           gpu_memory_utilization=0.9))
    assert gen.total("train") == 0 and gen.total("rollout") == pytest.approx(36 * GB)
    assert gen.kv_tokens == pytest.approx((36 - 7 - 2) * GB / 28_672)
    assert lines(gen)["(sleeping engine weights, host, per GPU)"] == pytest.approx(7 * GB)
    assert gen.host_per_node == pytest.approx(4 * 7 * GB) and gen.fits
    awake = plan(m, RunShape(nnodes=1, gpus_per_node=4, gpu_memory_gb=40, actor=False, rollout_tp=2,
                             gpu_memory_utilization=0.9, rollout_sleeps=False))
    assert awake.host_per_node == 0
    # the critic alone on 2 GPUs: 16 x 1.5e9 / 2 = 12 GB of states, and its update's whole transient terms
    crit = lines(plan(m, RunShape(nnodes=1, gpus_per_node=2, gpu_memory_gb=80, actor=False, rollout=False,
                                  critic=c, critic_tokens_per_micro=8192)))
    T = 8192
    transient = (4 * c.layer_params + 4 * c.vocab * c.hidden + 2 * T * c.hidden * c.layers
                 + T * (14 * c.hidden + 4 * c.kv_heads * c.head_dim + 8 * c.intermediate))
    assert crit["critic update (layers, embeddings, activations)"] == pytest.approx(transient)
    assert sum(b for k, b in crit.items() if k.startswith("critic fp32") or k.startswith("critic AdamW")) == \
        pytest.approx(12 * GB)
    assert not any(k.startswith(("fp32 master", "gathered", "rollout")) for k in crit)


def test_the_dry_run_of_a_split_placement_plans_every_pool_and_fails_on_the_one_that_does_not_fit(capsys):
    from tests.recipes.plans import plan as plan_recipe

    split = ["++placement.pools.gen={nnodes: 1, slots_per_node: 1, device: cuda, gpu_memory_gb: 40, host_memory_gb: 512}",
             "++placement.pools.crit={nnodes: 1, slots_per_node: 1, device: cuda, gpu_memory_gb: 24, host_memory_gb: 512}",
             "placement.roles.rollout=gen", "placement.roles.critic=crit", "++rollout.backend=vllm",
             "++rollout.gpu_memory_utilization=0.9"]
    rc, text = plan_recipe(capsys, "ppo", "qwen2_5_0_5b_gsm8k", *split)
    assert rc != 0, text[-2000:]
    main, gen, crit = (text.split(f"pool '{name}' (")[1] for name in ("main", "gen", "crit"))
    assert main.startswith("actor, ref):") and "rollout engine" not in main.split("pool 'gen'")[0]
    assert gen.startswith("rollout):") and "rollout engine (0.9 x GPU; weights 2P/1)" in gen.split("pool 'crit'")[0]
    assert crit.startswith("critic):") and "critic AdamW moments (8Pc/W)" in crit
    assert "DOES NOT FIT" in crit and "24 GB - 4 GB reserve" in crit and text.count("\nfits") == 2


def test_one_rank_without_checkpointing_plans_whole_bf16_copies_instead_of_gathered_layers():
    """``sharding.unsharded``: one rank, no offload, no activation checkpointing -> no FSDP2; each policy model
    keeps a bf16 copy of all its weights (2P), the actor's and the reference's, also through the rollout."""
    m = ModelShape(params=1e9, layers=16, hidden=2048, intermediate=8192, heads=16, kv_heads=4, vocab=32000)
    r = RunShape(nnodes=1, gpus_per_node=1, gpu_memory_gb=80, gradient_checkpointing=False, reference=True)
    got = lines(plan(m, r))
    assert got["bf16 compute copies, one rank (2P per policy model)"] == pytest.approx(2 * 2 * 1e9)
    assert got["LM head bf16 gradient (2Vh)"] == 2 * 32000 * 2048
    assert "gathered bf16 layers (2 x 2 P_layer)" not in got
    fsdp = lines(plan(m, replace(r, gradient_checkpointing=True)))
    assert "gathered bf16 layers (2 x 2 P_layer)" in fsdp and "bf16 compute copies, one rank (2P per policy model)" not in fsdp
    two = lines(plan(m, replace(r, gpus_per_node=2)))
    assert "bf16 compute copies, one rank (2P per policy model)" not in two


def test_a_vision_language_model_counts_its_vision_tower_and_its_activations_by_hand():
    m = model_shape("Qwen/Qwen2.5-VL-7B-Instruct")
    # vision tower by hand: patch embedding 3 x 2 x 14 x 14 x 1280 = 1,505,280; per block 2 norms 2,560 + qkv
    # 1280 x 3840 + 3840 + proj 1280^2 + 1280 + gate/up 2 x (1280 x 3420 + 3420) + down 3420 x 1280 + 1280
    # = 19,702,200, x 32 = 630,470,400; merger: norm 1,280 + 5120^2 + 5120 + 5120 x 3584 + 3584 = 44,574,464
    assert m.vision_params == 1_505_280 + 630_470_400 + 44_574_464 == 676_550_144
    # + the text model as Qwen2.5-7B's: 8,292,037,632 (Qwen reports 8.29B)
    assert m.params == 7_615_487_488 + 676_550_144
    assert (m.vision_layers, m.vision_hidden, m.vision_intermediate, m.vision_merge) == (32, 1280, 3420, 4)
    r = RunShape(nnodes=1, gpus_per_node=8, gpu_memory_gb=80, tokens_per_micro=1000, max_seq_len=3072,
                 max_prompt_len=1024)
    # patches: at most 4 per prompt token, a third of the micro-batch's tokens: Tv = 4 x 1000 / 3 = 1333.3;
    # checkpointed 2 Tv hv Lv = 109,226,667 + one block Tv (18 x 1280 + 8 x 3420) = 67,200,000
    got = lines(plan(m, r))["vision encoder activations (checkpointed)"]
    assert got == pytest.approx(2 * 4000 / 3 * 1280 * 32 + 4000 / 3 * 50_400)
    assert not [k for k in lines(plan(model_shape("Qwen/Qwen2.5-7B"), r)) if k.startswith("vision")]


def test_mixture_of_experts_total_and_active_parameters_by_hand():
    m = model_shape("mistralai/Mixtral-8x7B-Instruct-v0.1")
    # per layer: attention 2 x 4096^2 + 2 x 4096 x 1024 = 41,943,040; 8 experts x 3 x 4096 x 14336 = 1,409,286,144;
    # router 8 x 4096 = 32,768; 2 norms 8,192 -> 1,451,270,144; x 32 + untied embeddings 2 x 32000 x 4096 + the
    # final norm = 46,702,792,704 (Mistral: 46.7B)
    assert m.layer_params == 1_451_270_144 and m.params == 46_702_792_704
    # a token uses 2 of the 8 experts: minus 32 x 1,409,286,144 x 6/8 = 12,879,925,248 (Mistral: 12.9B)
    assert m.active_params == 46_702_792_704 - 32 * 1_409_286_144 * 6 // 8 == 12_879_925_248
    assert (m.experts, m.experts_per_token, m.intermediate) == (8, 2, 2 * 14336)
    ds = model_shape("deepseek-ai/DeepSeek-V3")  # DeepSeek: 671B total, 37B activated per token
    assert round(ds.params / 1e9) == 671 and round(ds.active_params / 1e9, 1) == 37.6
    assert (ds.experts, ds.experts_per_token, ds.intermediate) == (256, 8, 8 * 2048 + 2048)


def test_megatron_layout_by_hand_and_the_dapo_32b_dry_run_at_tp8_pp2(capsys):
    """actor.strategy megatron: each rank holds 1/(tp pp) of the model in fp32 with fp32 gradients and unsharded
    AdamW moments; activations split over TP with pp micro-batches in flight; vocab-parallel logits."""
    # 8e9 params on 2 nodes x 8 GPUs at TP 4 x PP 2 (G = 8, DP 2): fp32 weights 4 x 8e9 / 8 = 4 GB, gradients 4 GB,
    # moments 8 GB (not divided by DP), bf16 autocast copy 2 GB
    m = ModelShape(params=8e9, layers=32, hidden=4096, intermediate=14336, heads=32, kv_heads=8, vocab=128256)
    r = RunShape(nnodes=2, gpus_per_node=8, gpu_memory_gb=80, strategy="megatron", tp=4, pp=2, tokens_per_micro=8192)
    got = lines(plan(m, r))
    assert got["fp32 master weights (4P/G)"] == pytest.approx(4 * GB)
    assert got["AdamW moments (8P/G, not sharded over DP)"] == pytest.approx(8 * GB)
    assert got["bf16 autocast weight copies (2P/G)"] == pytest.approx(2 * GB)
    # recomputed: pp x 2 T h L/pp (each layer's bf16 input, 2 in flight) + one layer, T (8h + (6h + 4 kvd + 8i) / tp)
    T, h = 8192, 4096
    layer = T * (8 * h + (6 * h + 4 * 8 * 128 + 8 * 14336) / 4)
    assert got["activations, 2 micro-batch(es) in flight (recomputed)"] == pytest.approx(2 * 2 * T * h * 16 + layer)
    assert got["vocab-parallel logits (16 T V / tp)"] == pytest.approx(16 * T * 128256 / 4)
    # a Megatron critic of the same shape at TP 4: its states over 4 GPUs (FSDP2 would spread them over all 16)
    crit = lines(plan(m, replace(r, critic=m, critic_shards=4)))
    assert crit["critic fp32 master weights (4Pc/G)"] == pytest.approx(8 * GB)
    assert crit["critic AdamW moments (8Pc/G)"] == pytest.approx(16 * GB)
    # a grid that does not divide the pool is named
    bad = plan(m, replace(r, tp=3))
    assert "Megatron tp 3 x pp 2 = 6 GPUs per model replica does not divide the pool's 16" in bad.problems[0]

    from tests.recipes.plans import plan as plan_recipe

    rc, out = plan_recipe(capsys, "dapo", "qwen32b", "actor.strategy=megatron", "actor.megatron.tp=8",
                          "actor.megatron.pp=2")
    assert rc == 0, out[-2000:]
    assert "Megatron TP 8 x PP 2 x DP 8, offload idle" in out and "\nfits" in out
    # 32.76B / 16 = 2.05B parameters per GPU: 8.19 GB of fp32 weights
    assert "fp32 master weights (4P/G)                              8.19 GB" in out


def test_lora_counts_adapter_gradients_and_moments_only_and_no_reference_model():
    """Qwen2.5-0.5B-shaped (verl's GRPO-LoRA anchor: r 32, all linear layers), 8 GPUs: adapters 32 x (9 x 896 + 2 x
    128 + 3 x 4864) x 24 = 17.6M; AdamW moments 8 x 17.6M / 8 = 17.6 MB per GPU instead of 8P/W = 0.49 GB; no
    reference shards (the actor with its adapters off)."""
    from core.planner import lora_params

    m = ModelShape(params=0.494e9, layers=24, hidden=896, intermediate=4864, heads=14, kv_heads=2, vocab=151936,
                   tied=True)
    assert lora_params(m, 32, RunShape(1, 8, 80).lora_targets) == 32 * (9 * 896 + 2 * 128 + 3 * 4864) * 24
    Pa = lora_params(m, 32, RunShape(1, 8, 80).lora_targets)
    full = lines(plan(m, RunShape(1, 8, 80, reference=True)))
    got = lines(plan(m, RunShape(1, 8, 80, reference=True, lora_rank=32)))
    assert got["AdamW moments, adapters (8Pa/W)"] == pytest.approx(8 * Pa / 8)
    assert got["fp32 gradients, adapters only (4Pa/W)"] == pytest.approx(4 * Pa / 8)
    assert "reference fp32 shards (4P/W)" in full and not any(k.startswith("reference") for k in got)


def test_ulysses_divides_a_micro_batchs_activations_and_logits_over_its_group():
    """actor.ulysses_sp = 4: each GPU holds a quarter of the micro-batch's positions (Qwen2.5-0.5B-shaped, 32k tokens
    per micro-batch, checkpointed): the activation and logit terms (bar the fixed chunk work) are a quarter, the
    rest unchanged."""
    from core.planner import CHUNK_WORK

    m = ModelShape(params=0.494e9, layers=24, hidden=896, intermediate=4864, heads=14, kv_heads=2, vocab=151936,
                   tied=True)
    one = lines(plan(m, RunShape(1, 8, 80, tokens_per_micro=32768)))
    four = lines(plan(m, RunShape(1, 8, 80, tokens_per_micro=32768, ulysses_sp=4)))
    act = "activations (checkpointed)"
    assert four[act] == pytest.approx(one[act] / 4)
    logits = "logits (6 T V + chunk work)"
    assert four[logits] - CHUNK_WORK == pytest.approx((one[logits] - CHUNK_WORK) / 4)
    assert {k: v for k, v in four.items() if k not in (act, logits)} == {k: v for k, v in one.items()
                                                                          if k not in (act, logits)}
