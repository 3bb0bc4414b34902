"""core/train/megatron_convert.py in pure torch: the q/k/v interleave by hand, HF -> Megatron -> HF exact for
Llama (tied, GQA) and Qwen2 (biases, untied, one KV head) shapes under both layer specs, TP shards equal to slices of
the full tensors (fewer KV heads than TP ranks included; [gate; up] per rank), PP stages renumbered and merged."""

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from core.train.megatron_convert import (Layout, hf_to_megatron, interleave_qkv, megatron_to_hf, pp_merge,
                                           pp_stage, split_qkv, tp_merge, tp_shard)

CONFIGS = {
    "llama": LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=300, tie_word_embeddings=True),
    "qwen2": Qwen2Config(hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=1, vocab_size=300, tie_word_embeddings=False),
}


def hf_weights(name):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(CONFIGS[name])
    return {k: v.detach().clone() for k, v in model.state_dict().items()
            if not (CONFIGS[name].tie_word_embeddings and k == "lm_head.weight")}


def test_qkv_interleave_by_hand():
    L = Layout(layers=1, heads=4, kv_heads=2, head_dim=1, vocab=8, tied=True)
    q, k, v = torch.tensor([[0.], [1.], [2.], [3.]]), torch.tensor([[10.], [11.]]), torch.tensor([[20.], [21.]])
    qkv = interleave_qkv(q, k, v, L)
    assert qkv.flatten().tolist() == [0, 1, 10, 20, 2, 3, 11, 21]       # q0 q1 k0 v0 | q2 q3 k1 v1
    assert [t.flatten().tolist() for t in split_qkv(qkv, L)] == [[0, 1, 2, 3], [10, 11], [20, 21]]
    bias = interleave_qkv(q.flatten(), k.flatten(), v.flatten(), L)      # biases: the same order
    assert bias.tolist() == [0, 1, 10, 20, 2, 3, 11, 21]


@pytest.mark.parametrize("spec", ["local", "te"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_hf_megatron_hf_round_trip_is_exact(name, spec):
    hf = hf_weights(name)
    L = Layout.from_hf_config(CONFIGS[name], spec)
    for tp, padded in ((1, 384), (4, 512)):  # the vocabulary padded to a multiple of 128 x TP with zero rows
        mg = hf_to_megatron(hf, L, tp)
        assert mg["embedding.word_embeddings.weight"].shape == (padded, 32)
        assert not mg["embedding.word_embeddings.weight"][300:].any()
        assert ("output_layer.weight" in mg) == (not L.tied)
        assert ("decoder.layers.0.self_attention.linear_qkv.bias" in mg) == (name == "qwen2")
        assert ("decoder.layers.0.mlp.linear_fc1.layer_norm_weight" in mg) == (spec == "te")
        back = megatron_to_hf(mg, L)
        assert sorted(back) == sorted(hf)
        assert all(torch.equal(back[k], hf[k]) for k in hf)


@pytest.mark.parametrize("name,tp", [("llama", 2), ("llama", 4), ("qwen2", 2)])
def test_tp_shards_are_slices_of_the_full_tensors(name, tp):
    """llama at TP 4 has 2 KV heads for 4 ranks and qwen2 1 for 2: a query group's rows then span ranks."""
    hf = hf_weights(name)
    L = Layout.from_hf_config(CONFIGS[name])
    full = hf_to_megatron(hf, L, tp)
    shards = [tp_shard(full, tp, r) for r in range(tp)]
    for r, shard in enumerate(shards):
        p, a = "decoder.layers.1.", "model.layers.1."
        qkv = full[p + "self_attention.linear_qkv.weight"]
        assert torch.equal(shard[p + "self_attention.linear_qkv.weight"], qkv.chunk(tp)[r])
        assert torch.equal(shard[p + "self_attention.linear_proj.weight"],
                           hf[a + "self_attn.o_proj.weight"].chunk(tp, dim=1)[r])
        assert torch.equal(shard[p + "mlp.linear_fc1.weight"], torch.cat(
            [hf[a + "mlp.gate_proj.weight"].chunk(tp)[r], hf[a + "mlp.up_proj.weight"].chunk(tp)[r]]))
        assert torch.equal(shard[p + "mlp.linear_fc2.weight"], hf[a + "mlp.down_proj.weight"].chunk(tp, dim=1)[r])
        assert torch.equal(shard["embedding.word_embeddings.weight"],
                           full["embedding.word_embeddings.weight"].chunk(tp)[r])
        assert torch.equal(shard["decoder.final_layernorm.weight"], hf["model.norm.weight"])
    merged = tp_merge(shards)
    assert sorted(merged) == sorted(full) and all(torch.equal(merged[k], full[k]) for k in full)
    if name == "llama" and tp == 4:  # rank 0 holds the first half of group 0: q0, and q1's first half ... (d 8)
        d = L.head_dim
        assert torch.equal(shards[0]["decoder.layers.1.self_attention.linear_qkv.weight"][:d],
                           hf["model.layers.1.self_attn.q_proj.weight"][:d])
    shards[1]["decoder.final_layernorm.weight"] = shards[1]["decoder.final_layernorm.weight"] + 1
    with pytest.raises(ValueError, match="decoder.final_layernorm.weight: replicated over TP"):
        tp_merge(shards)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_pp_stages_renumber_their_layers_and_merge_back(name):
    L = Layout.from_hf_config(CONFIGS[name])
    full = hf_to_megatron(hf_weights(name), L)
    stages = [pp_stage(full, L, 2, s) for s in range(2)]
    fc2 = "mlp.linear_fc2.weight"
    assert torch.equal(stages[1][f"decoder.layers.0.{fc2}"], full[f"decoder.layers.2.{fc2}"])
    assert not any(k.startswith("decoder.layers.2.") for s in stages for k in s)
    assert "embedding.word_embeddings.weight" in stages[0] and "embedding.word_embeddings.weight" not in stages[1]
    assert "decoder.final_layernorm.weight" in stages[1] and "decoder.final_layernorm.weight" not in stages[0]
    # tied embeddings: the last stage holds the output layer as its own copy of the embedding
    assert torch.equal(stages[1]["output_layer.weight"], full.get("output_layer.weight",
                                                                  full["embedding.word_embeddings.weight"]))
    merged = pp_merge(stages, L)
    assert sorted(merged) == sorted(full) and all(torch.equal(merged[k], full[k]) for k in full)
    with pytest.raises(ValueError, match="4 layers do not split evenly over 3 pipeline stages"):
        pp_stage(full, L, 3, 0)


@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe"])
def test_moe_experts_round_trip_and_split_over_expert_parallel_ranks(kind):
    """transformers 5 fuses a layer's experts (gate_up_proj (E, 2i, h), down_proj (E, h, i)); Megatron holds one
    linear_fc1 / linear_fc2 per expert and the router as mlp.router (Qwen2-MoE's gated shared expert as
    mlp.shared_experts). EP rank r of 2 holds experts 2r, 2r + 1 as its local experts 0, 1; merging the ranks gives
    the full set back."""
    from transformers import MixtralConfig, Qwen2MoeConfig

    from core.train.megatron_convert import ep_merge, ep_shard

    common = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=300,
                  num_experts_per_tok=2, tie_word_embeddings=False)
    cfg = (MixtralConfig(intermediate_size=16, num_local_experts=4, **common) if kind == "mixtral" else
           Qwen2MoeConfig(num_experts=4, moe_intermediate_size=16, shared_expert_intermediate_size=24, **common))
    torch.manual_seed(0)
    hf = dict(AutoModelForCausalLM.from_config(cfg).state_dict())
    L = Layout.from_hf_config(cfg)
    mg = hf_to_megatron(hf, L)
    fc1 = "decoder.layers.1.mlp.experts.local_experts.{}.linear_fc1.weight"
    assert L.experts == 4 and torch.equal(mg[fc1.format(3)], hf["model.layers.1.mlp.experts.gate_up_proj"][3])
    assert torch.equal(mg["decoder.layers.0.mlp.router.weight"], hf["model.layers.0.mlp.gate.weight"])
    if kind == "qwen2_moe":
        assert torch.equal(mg["decoder.layers.0.mlp.shared_experts.gate_weight"],
                           hf["model.layers.0.mlp.shared_expert_gate.weight"])
    back = megatron_to_hf(mg, L)
    assert sorted(back) == sorted(hf) and all(torch.equal(back[k], hf[k]) for k in hf)
    shards = [ep_shard(mg, 2, r, L.experts) for r in range(2)]
    assert torch.equal(shards[1][fc1.format(0)], mg[fc1.format(2)]) and fc1.format(2) not in shards[1]
    merged = ep_merge(shards)
    assert sorted(merged) == sorted(mg) and all(torch.equal(merged[k], mg[k]) for k in mg)


@pytest.mark.parametrize("kind", ["dense", "mixtral"])
def test_the_layer_by_layer_reader_yields_the_whole_checkpoint_one_layer_at_a_time(kind, tmp_path, tiny_model_dir):
    """core.train.sharding.hf_pieces, what the Megatron roles load through: the tensors outside the layers, then
    one layer per piece, together the model's state dict exactly (Mixtral: the per-expert tensors of the file
    stacked into transformers' fused experts); and the embedding's padding_idx."""
    from transformers import MixtralConfig

    from core.train.sharding import hf_pieces
    from core.models import load_causal_lm

    path = str(tiny_model_dir)
    if kind == "mixtral":
        cfg = MixtralConfig(hidden_size=32, intermediate_size=16, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, vocab_size=300, num_local_experts=4, num_experts_per_tok=2,
                            pad_token_id=0)
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path / "mixtral")
        path = str(tmp_path / "mixtral")
    pad, pieces = hf_pieces(path, "test")
    pieces = list(pieces)
    whole = load_causal_lm(path, dtype=torch.float32)
    tied = whole.config.tie_word_embeddings
    want = {k: v for k, v in whole.state_dict().items() if not (tied and k == "lm_head.weight")}
    assert pad == whole.get_input_embeddings().padding_idx == 0
    assert not any(n.startswith("model.layers.") for n in pieces[0])
    layers = [{n.split(".")[2] for n in p} for p in pieces[1:]]
    assert layers == [{str(i)} for i in range(whole.config.num_hidden_layers)]
    got = {n: t for p in pieces for n, t in p.items()}
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)
