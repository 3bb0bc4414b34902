"""core.planner: the memory arithmetic against hand-computed cases."""

import pytest

from core.planner import GB, KNOWN, ModelShape, RunShape, model_shape, plan


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
    # everything offloaded: the three go to the host, 14 GB per GPU
    off = plan(m, RunShape(nnodes=1, gpus_per_node=8, gpu_memory_gb=80, param_offload=True))
    assert "AdamW moments (8P/W)" not in lines(off) and lines(off)["(offloaded to host, per GPU)"] == pytest.approx(14 * GB)


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
    # checkpointed: 2 T h L + 34 T h = 2*1000*5120*64 + 34*1000*5120 = 655,360,000 + 174,080,000
    assert got["activations (checkpointed)"] == 829_440_000
    assert got["logits fp32 + grad (8 T V)"] == 8 * 1000 * 152064
    # KV per token at TP 4: 2 x 64 layers x 8 heads x 128 x 2 bytes / 4 = 65,536 bytes
    p = plan(m, r)
    weights = 2 * m.params / 4
    assert p.kv_tokens == pytest.approx((0.8 * 80 * GB - weights - 0.05 * 80 * GB) / 65_536)


def test_a_32b_run_fits_on_16_nodes_with_offload_and_not_on_one_node_without():
    m = model_shape("Qwen/Qwen2.5-32B")
    big = RunShape(nnodes=16, gpus_per_node=8, gpu_memory_gb=80, param_offload=True, optimizer_offload=True,
                   tokens_per_micro=22528, rollout_tp=4, gpu_memory_utilization=0.8,
                   max_seq_len=22528, host_memory_gb=1500)
    assert plan(m, big).fits, plan(m, big).text()
    one = RunShape(nnodes=1, gpus_per_node=8, gpu_memory_gb=80, tokens_per_micro=22528,
                   rollout_tp=4, gpu_memory_utilization=0.8, max_seq_len=22528)
    p = plan(m, one)
    assert not p.fits
    assert any(s.startswith("train phase needs") and "GB per GPU" in s for s in p.problems), p.problems


def test_an_unknown_model_is_an_error_listing_the_table():
    with pytest.raises(KeyError, match="not in the planner's table"):
        model_shape("nobody/NoModel-1B")
    assert "Qwen/Qwen2.5-32B" in KNOWN
