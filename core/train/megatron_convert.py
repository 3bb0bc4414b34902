"""HF <-> Megatron-core weights for the Llama and Qwen2 families, in pure torch: the Megatron adapter loads HF
checkpoints through ``hf_to_megatron`` + ``tp_shard`` / ``pp_stage``, and its weight sync gathers shards back into
HF names (``tp_merge`` + ``megatron_to_hf``) for the rollout engine.

Names of Megatron-core's ``GPTModel`` (the "full" layout below is one TP rank, one PP stage):

  embedding.word_embeddings.weight                         model.embed_tokens.weight      vocab rows split over TP
  decoder.layers.{i}.self_attention.linear_qkv.weight      q, k, v interleaved per query group (below); rows split
  decoder.layers.{i}.self_attention.linear_qkv.bias        the same interleave (Qwen2's q/k/v biases)
  decoder.layers.{i}.self_attention.linear_proj.weight     o_proj                         columns split over TP
  decoder.layers.{i}.mlp.linear_fc1.weight                 [gate; up]: rank r holds [gate_r; up_r]
  decoder.layers.{i}.mlp.linear_fc2.weight                 down_proj                      columns split over TP
  decoder.layers.{i}.input_layernorm.weight                input_layernorm (local spec; Transformer Engine's spec
  decoder.layers.{i}.pre_mlp_layernorm.weight              post_attention_layernorm  fuses them: linear_qkv. /
                                                                                     linear_fc1.layer_norm_weight)
  decoder.final_layernorm.weight                           model.norm.weight
  output_layer.weight                                      lm_head.weight (none when embeddings are tied)

q/k/v interleave: query group g (g < kv_heads) holds its heads_per_group query heads, then its key head, then its
value head: rows [q_g0 .. q_g(m-1), k_g, v_g] x head_dim. Example, 4 query heads, 2 KV heads, head_dim 1: rows
q0 q1 k0 v0 q2 q3 k1 v1. Column-parallel weights are cut into TP equal row blocks of this tensor -- with fewer KV
heads than TP ranks a group's rows span several ranks, which Megatron-core handles by gathering (attention.py,
``get_query_key_value_tensors``). The vocabulary is padded with zero rows to a multiple of
``make_vocab_size_divisible_by`` x TP, as Megatron pads it; the padding is dropped on the way back.

Pipeline stages number their layers from 0 (``pp_stage``): stage s of p holds layers [s L / p, (s + 1) L / p), the
embedding on the first stage, the final norm and output layer on the last (tied embeddings over several stages: the
last stage holds its own copy of the embedding as ``output_layer.weight``, kept equal by Megatron).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

Weights = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Layout:
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    # "local" (Megatron-core's own modules) or "te" (Transformer Engine: norms fused into the next linear)
    spec: str = "local"
    make_vocab_size_divisible_by: int = 128
    # a mixture of experts (Mixtral, Qwen2-MoE): experts per layer (0: a dense MLP), and a gated shared expert
    experts: int = 0
    shared_expert: bool = False

    @staticmethod
    def from_hf_config(cfg, spec: str = "local") -> "Layout":
        heads = cfg.num_attention_heads
        return Layout(cfg.num_hidden_layers, heads, cfg.num_key_value_heads or heads,
                      getattr(cfg, "head_dim", None) or cfg.hidden_size // heads, cfg.vocab_size,
                      bool(cfg.tie_word_embeddings), spec,
                      experts=getattr(cfg, "num_local_experts", 0) or getattr(cfg, "num_experts", 0) or 0,
                      shared_expert=bool(getattr(cfg, "shared_expert_intermediate_size", 0)))

    def padded_vocab(self, tp: int) -> int:
        step = self.make_vocab_size_divisible_by * tp
        return -(-self.vocab // step) * step

    def norm_names(self, i: int) -> tuple[str, str]:
        p = f"decoder.layers.{i}."
        if self.spec == "te":
            return p + "self_attention.linear_qkv.layer_norm_weight", p + "mlp.linear_fc1.layer_norm_weight"
        return p + "input_layernorm.weight", p + "pre_mlp_layernorm.weight"


def interleave_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, L: Layout) -> torch.Tensor:
    """HF's q (heads d, ...), k and v (kv_heads d, ...) -> Megatron's linear_qkv rows (weights or biases)."""
    g, d, rest = L.kv_heads, L.head_dim, q.shape[1:]
    parts = (q.reshape(g, -1, *rest), k.reshape(g, d, *rest), v.reshape(g, d, *rest))
    return torch.cat(parts, dim=1).reshape(-1, *rest)


def split_qkv(qkv: torch.Tensor, L: Layout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g, d, rest = L.kv_heads, L.head_dim, qkv.shape[1:]
    m = L.heads // L.kv_heads
    q, k, v = qkv.reshape(g, (m + 2) * d, *rest).split([m * d, d, d], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.cat([t, t.new_zeros(rows - len(t), *t.shape[1:])]) if rows > len(t) else t


def hf_to_megatron(hf: Weights, L: Layout, tp: int = 1, partial: bool = False) -> Weights:
    """A full HF state dict (Llama / Qwen2 / Mixtral names) -> the full Megatron-core one, vocabulary padded for
    ``tp``. ``partial``: ``hf`` holds some whole layers and / or the embedding, final norm and LM head (a piece of
    a layer-by-layer load), converted as they are."""
    V, out = L.padded_vocab(tp), {}
    if not partial or "model.embed_tokens.weight" in hf:
        out["embedding.word_embeddings.weight"] = _pad_rows(hf["model.embed_tokens.weight"], V)
    if not partial or "model.norm.weight" in hf:
        out["decoder.final_layernorm.weight"] = hf["model.norm.weight"]
    if not L.tied and (not partial or "lm_head.weight" in hf):
        out["output_layer.weight"] = _pad_rows(hf["lm_head.weight"], V)
    layers = (sorted({int(n.split(".")[2]) for n in hf if n.startswith("model.layers.")}) if partial
              else range(L.layers))
    for i in layers:
        a, p = f"model.layers.{i}.", f"decoder.layers.{i}."
        for kind in ("weight", "bias"):
            if a + f"self_attn.q_proj.{kind}" in hf:
                out[p + f"self_attention.linear_qkv.{kind}"] = interleave_qkv(
                    *(hf[a + f"self_attn.{x}_proj.{kind}"] for x in "qkv"), L)
        out[p + "self_attention.linear_proj.weight"] = hf[a + "self_attn.o_proj.weight"]
        if L.experts:  # transformers 5 fuses a layer's experts: gate_up_proj (E, [gate; up], h), down_proj (E, h, i)
            out[p + "mlp.router.weight"] = hf[a + "mlp.gate.weight"]
            for e in range(L.experts):
                out[p + f"mlp.experts.local_experts.{e}.linear_fc1.weight"] = hf[a + "mlp.experts.gate_up_proj"][e]
                out[p + f"mlp.experts.local_experts.{e}.linear_fc2.weight"] = hf[a + "mlp.experts.down_proj"][e]
            if L.shared_expert:  # Qwen2-MoE: a dense expert every token takes, scaled by sigmoid(gate . h)
                s = a + "mlp.shared_expert."
                out[p + "mlp.shared_experts.linear_fc1.weight"] = torch.cat([hf[s + "gate_proj.weight"],
                                                                            hf[s + "up_proj.weight"]])
                out[p + "mlp.shared_experts.linear_fc2.weight"] = hf[s + "down_proj.weight"]
                out[p + "mlp.shared_experts.gate_weight"] = hf[a + "mlp.shared_expert_gate.weight"]
        else:
            out[p + "mlp.linear_fc1.weight"] = torch.cat([hf[a + "mlp.gate_proj.weight"], hf[a + "mlp.up_proj.weight"]])
            out[p + "mlp.linear_fc2.weight"] = hf[a + "mlp.down_proj.weight"]
        pre_attn, pre_mlp = L.norm_names(i)
        out[pre_attn], out[pre_mlp] = hf[a + "input_layernorm.weight"], hf[a + "post_attention_layernorm.weight"]
    return out


def megatron_to_hf(mg: Weights, L: Layout, partial: bool = False) -> Weights:
    """The inverse of ``hf_to_megatron``: HF names, the vocabulary padding dropped. ``partial``: ``mg`` holds some
    whole layers and / or the embedding, final norm and output layer (a sync bucket's part), converted as they are."""
    out = {}
    for name, hf_name in (("embedding.word_embeddings.weight", "model.embed_tokens.weight"),
                          ("decoder.final_layernorm.weight", "model.norm.weight"),
                          ("output_layer.weight", "lm_head.weight")):
        if (not partial or name in mg) and not (L.tied and name == "output_layer.weight"):
            out[hf_name] = mg[name][:L.vocab] if name != "decoder.final_layernorm.weight" else mg[name]
    layers = (sorted({int(n.split(".")[2]) for n in mg if n.startswith("decoder.layers.")}) if partial
              else range(L.layers))
    for i in layers:
        a, p = f"model.layers.{i}.", f"decoder.layers.{i}."
        for kind in ("weight", "bias"):
            if p + f"self_attention.linear_qkv.{kind}" in mg:
                q, k, v = split_qkv(mg[p + f"self_attention.linear_qkv.{kind}"], L)
                out.update({a + f"self_attn.q_proj.{kind}": q, a + f"self_attn.k_proj.{kind}": k,
                            a + f"self_attn.v_proj.{kind}": v})
        out[a + "self_attn.o_proj.weight"] = mg[p + "self_attention.linear_proj.weight"]
        if L.experts:
            out[a + "mlp.gate.weight"] = mg[p + "mlp.router.weight"]
            for kind, fc in (("gate_up_proj", "linear_fc1"), ("down_proj", "linear_fc2")):
                out[a + f"mlp.experts.{kind}"] = torch.stack(
                    [mg[p + f"mlp.experts.local_experts.{e}.{fc}.weight"] for e in range(L.experts)])
            if L.shared_expert:
                s = a + "mlp.shared_expert."
                out[s + "gate_proj.weight"], out[s + "up_proj.weight"] = mg[p + "mlp.shared_experts.linear_fc1.weight"
                                                                             ].chunk(2)
                out[s + "down_proj.weight"] = mg[p + "mlp.shared_experts.linear_fc2.weight"]
                out[a + "mlp.shared_expert_gate.weight"] = mg[p + "mlp.shared_experts.gate_weight"]
        else:
            out[a + "mlp.gate_proj.weight"], out[a + "mlp.up_proj.weight"] = mg[p + "mlp.linear_fc1.weight"].chunk(2)
            out[a + "mlp.down_proj.weight"] = mg[p + "mlp.linear_fc2.weight"]
        pre_attn, pre_mlp = L.norm_names(i)
        out[a + "input_layernorm.weight"], out[a + "post_attention_layernorm.weight"] = mg[pre_attn], mg[pre_mlp]
    return out


def ep_shard(mg: Weights, ep: int, rank: int, experts: int) -> Weights:
    """What expert-parallel rank ``rank`` of ``ep`` holds: its experts [rank E / ep, (rank + 1) E / ep), numbered from
    0 as Megatron's ``local_experts``; every other weight whole."""
    if experts % ep:
        raise ValueError(f"{experts} experts do not split evenly over {ep} expert-parallel ranks")
    per, out = experts // ep, {}
    for name, t in mg.items():
        head, sep, tail = name.partition(".mlp.experts.local_experts.")
        if not sep:
            out[name] = t
            continue
        e, rest = tail.split(".", 1)
        if rank * per <= int(e) < (rank + 1) * per:
            out[f"{head}.mlp.experts.local_experts.{int(e) - rank * per}.{rest}"] = t
    return out


def ep_merge(shards: list[Weights]) -> Weights:
    """The inverse of ``ep_shard`` over every EP rank's weights (rank order)."""
    out = {}
    for rank, shard in enumerate(shards):
        per = len({n.split(".mlp.experts.local_experts.")[1].split(".")[0] for n in shard if is_expert(n)})
        for name, t in shard.items():
            head, sep, tail = name.partition(".mlp.experts.local_experts.")
            if sep:
                e, rest = tail.split(".", 1)
                name = f"{head}.mlp.experts.local_experts.{int(e) + rank * per}.{rest}"
            out.setdefault(name, t)
    return out


def is_expert(name: str) -> bool:
    return ".mlp.experts.local_experts." in name


def tp_dim(name: str) -> int | None:
    """The dimension a Megatron weight is split along over TP ranks (None: replicated)."""
    if name.endswith(("linear_qkv.weight", "linear_qkv.bias", "word_embeddings.weight", "output_layer.weight",
                      "linear_fc1.weight")):
        return 0
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return 1
    return None


def tp_shard(mg: Weights, tp: int, rank: int) -> Weights:
    """What TP rank ``rank`` of ``tp`` holds of a full Megatron state dict."""
    out = {}
    for name, t in mg.items():
        dim = tp_dim(name)
        if dim is None:
            out[name] = t
        elif name.endswith("linear_fc1.weight"):  # [gate; up] -> [gate_r; up_r]
            gate, up = t.chunk(2)
            out[name] = torch.cat([gate.chunk(tp)[rank], up.chunk(tp)[rank]])
        else:
            if t.shape[dim] % tp:
                raise ValueError(f"{name}: {t.shape[dim]} along dim {dim} is not divisible by TP {tp}")
            out[name] = t.chunk(tp, dim)[rank]
    return out


def tp_merge(shards: list[Weights]) -> Weights:
    """The full Megatron state dict from every TP rank's shard (rank order); replicated weights must agree."""
    out = {}
    for name, first in shards[0].items():
        dim = tp_dim(name)
        if dim is None:
            if any(not torch.equal(first, s[name]) for s in shards[1:]):
                raise ValueError(f"{name}: replicated over TP but the ranks' copies differ")
            out[name] = first
        elif name.endswith("linear_fc1.weight"):
            halves = [s[name].chunk(2) for s in shards]
            out[name] = torch.cat([torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])])
        else:
            out[name] = torch.cat([s[name] for s in shards], dim)
    return out


def pp_stage(mg: Weights, L: Layout, pp: int, stage: int) -> Weights:
    """What pipeline stage ``stage`` of ``pp`` holds, its layers renumbered from 0."""
    if L.layers % pp:
        raise ValueError(f"{L.layers} layers do not split evenly over {pp} pipeline stages")
    per, out = L.layers // pp, {}
    for name, t in mg.items():
        if name.startswith("decoder.layers."):
            i, rest = name.removeprefix("decoder.layers.").split(".", 1)
            if stage * per <= int(i) < (stage + 1) * per:
                out[f"decoder.layers.{int(i) - stage * per}.{rest}"] = t
        elif name.startswith("embedding.") and stage == 0 or not name.startswith("embedding.") and stage == pp - 1:
            out[name] = t
    if L.tied and pp > 1 and stage == pp - 1 and "embedding.word_embeddings.weight" in mg:
        out["output_layer.weight"] = mg["embedding.word_embeddings.weight"]
    return out


def pp_merge(stages: list[Weights], L: Layout) -> Weights:
    """The full state dict from every pipeline stage's (stage order), layers numbered globally again."""
    out, offset = {}, 0
    for st in stages:
        count = len({n.split(".")[2] for n in st if n.startswith("decoder.layers.")})
        for name, t in st.items():
            if name.startswith("decoder.layers."):
                i, rest = name.removeprefix("decoder.layers.").split(".", 1)
                name = f"decoder.layers.{int(i) + offset}.{rest}"
            out[name] = t
        offset += count
    if L.tied:
        out.pop("output_layer.weight", None)
    return out
