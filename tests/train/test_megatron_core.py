"""Our HF <-> Megatron conversion against Megatron-core itself (megatron-core 0.16.1, the local layer spec, gloo on
CPU, 2 TP ranks): a ``GPTModel`` loaded with ``tp_shard(hf_to_megatron(hf))`` gives HF's logits, for Llama
(tied, 2 KV heads) and Qwen2 (q/k/v biases, untied, 1 KV head: at TP 2 fewer KV heads than ranks), and the shards
Megatron holds merge back (``tp_merge`` + ``megatron_to_hf``) into HF's weights exactly -- the weight-sync path.

Megatron-core assumes CUDA in three places on this path, so a CPU run needs three shims (the rest is its own code):
``core.train.megatron_actor.megatron_on_cpu`` says which. With them the local spec runs on CPU (the Transformer
Engine spec stays GPU-only); these tests check the layouts, which is what the adapter's load and sync use."""

import os

import pytest
import torch
import torch.multiprocessing as mp

pytest.importorskip("megatron.core")

from core.train.megatron_model import megatron_on_cpu  # noqa: E402
from core.worker import free_port  # noqa: E402

SHAPES = {"llama": dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
          "qwen2": dict(num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=False)}


def hf_model(name):
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    cfg = (LlamaConfig if name == "llama" else Qwen2Config)(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                                           vocab_size=300, rms_norm_eps=1e-6, **SHAPES[name])
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg).eval()


def _run(rank: int, tp: int, port: int, name: str, out: str) -> None:
    import warnings

    import torch.distributed as dist
    import torch.nn.functional as F

    warnings.filterwarnings("ignore", message="Apex is not installed")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=tp)
    megatron_on_cpu()
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    from core.train.megatron_convert import Layout, hf_to_megatron, tp_shard

    parallel_state.initialize_model_parallel(tp, 1)
    hf = hf_model(name)
    L = Layout.from_hf_config(hf.config)
    cfg = TransformerConfig(num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=L.kv_heads,
                            ffn_hidden_size=48, gated_linear_unit=True, activation_func=F.silu, normalization="RMSNorm",
                            add_bias_linear=False, add_qkv_bias=name == "qwen2", layernorm_epsilon=1e-6,
                            use_cpu_initialization=True, params_dtype=torch.float32, tensor_model_parallel_size=tp,
                            bias_dropout_fusion=False, apply_rope_fusion=False, masked_softmax_fusion=False,
                            gradient_accumulation_fusion=False, hidden_dropout=0.0, attention_dropout=0.0)
    model = GPTModel(cfg, get_gpt_layer_local_spec(normalization="RMSNorm"), vocab_size=L.padded_vocab(tp),
                     max_sequence_length=64, share_embeddings_and_output_weights=L.tied, parallel_output=False,
                     position_embedding_type="rope", rotary_base=int(hf.config.rope_parameters["rope_theta"])).eval()
    shard = tp_shard(hf_to_megatron(dict(hf.state_dict()), L, tp), tp, rank)
    model.load_state_dict(shard, strict=False)
    held = {k: v.detach().clone() for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
    ids = torch.randint(0, 300, (2, 10), generator=torch.Generator().manual_seed(1))
    causal = torch.triu(torch.ones(10, 10), diagonal=1).bool()[None, None]
    with torch.no_grad():
        logits = model(ids, torch.arange(10)[None].expand(2, -1), attention_mask=causal)
    torch.save({"keys": sorted(shard), "held": held, "logits": logits, "ids": ids}, f"{out}.{rank}")
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.parametrize("name,tp", [("llama", 2), ("qwen2", 2)])  # TP 2: conversion and shards both
def test_megatron_core_with_our_weights_gives_hfs_logits_and_its_shards_merge_back(name, tp, tmp_path):
    from core.train.megatron_convert import Layout, megatron_to_hf, tp_merge

    out = str(tmp_path / "run")
    mp.spawn(_run, args=(tp, free_port(), name, out), nprocs=tp)
    ranks = [torch.load(f"{out}.{r}") for r in range(tp)]
    hf = hf_model(name)
    # every weight Megatron's model has is one we wrote, and every one we wrote it has
    assert all(sorted(r["held"]) == r["keys"] for r in ranks)
    with torch.no_grad():
        want = hf(ranks[0]["ids"]).logits
    for r in ranks:  # parallel_output=False: every rank has the whole vocabulary's logits, padding included
        assert r["logits"].shape == (2, 10, Layout.from_hf_config(hf.config).padded_vocab(tp))
        torch.testing.assert_close(r["logits"][..., :300], want, atol=1e-5, rtol=0)
    L = Layout.from_hf_config(hf.config)
    back = megatron_to_hf(tp_merge([r["held"] for r in ranks]), L)
    expect = {k: v for k, v in hf.state_dict().items() if not (L.tied and k == "lm_head.weight")}
    assert sorted(back) == sorted(expect) and all(torch.equal(back[k], expect[k]) for k in expect)
