"""Model shapes for the capacity planner (``core.planner``): from a config.json, a built-in table of the models
our recipes name (planning needs no hub), or the folder a run would load. A vision-language config (one with a
``vision_config``) adds its vision tower and connector: parameters counted exactly on the meta device with
transformers' own class for it, blocks, width and how many patches make one image token."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelShape:
    params: float
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool = False
    # a vision-language model's vision tower + connector (counted in ``params`` too), its blocks, width, MLP width,
    # and patches per image token (Qwen2-VL: spatial_merge_size^2; Idefics3: scale_factor^2)
    vision_params: float = 0.0
    vision_layers: int = 0
    vision_hidden: int = 0
    vision_intermediate: int = 0
    vision_merge: int = 1
    # a mixture-of-experts model: parameters one token uses (its top-k of the experts), experts, experts per token,
    # and one layer's parameters, all experts included (0: a dense model)
    active_params: float = 0.0
    experts: int = 0
    experts_per_token: int = 0
    moe_layer_params: float = 0.0
    # config.json's head_dim where it is not hidden / heads (Qwen3-32B: 64 heads of 128 on a hidden size of 5120)
    attention_head_dim: int = 0

    @property
    def head_dim(self) -> int:
        return self.attention_head_dim or self.hidden // self.heads

    @property
    def layer_params(self) -> float:
        """One decoder layer: q, o (h x heads x head_dim), k, v (h x kv_heads x head_dim), gate/up/down (3 h i), 2 norms (an MoE
        layer: counted on the meta device, every expert included)."""
        if self.moe_layer_params:
            return self.moe_layer_params
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return 2 * self.hidden * q + 2 * self.hidden * kv + 3 * self.hidden * self.intermediate + 2 * self.hidden

    @staticmethod
    def from_config(c: dict) -> "ModelShape":
        """From a transformers config.json (params counted from the shapes, embeddings included; a vision-language
        model's text part from its ``text_config`` or, in older files, its top level)."""
        t = {**c, **(c.get("text_config") or {})}
        h, L, i, V = t["hidden_size"], t["num_hidden_layers"], t["intermediate_size"], t["vocab_size"]
        heads = t["num_attention_heads"]
        kv = t.get("num_key_value_heads") or heads
        tied = bool(c.get("tie_word_embeddings", t.get("tie_word_embeddings", False)))
        head_dim = int(t.get("head_dim") or 0)
        shape = ModelShape(0.0, L, h, i, heads, kv, V, tied, attention_head_dim=head_dim)
        params = float(L * shape.layer_params + V * h * (1 if tied else 2) + h)
        if any(t.get(k) for k in MOE_KEYS):
            moe = moe_shape(c)
            # activations: a token goes through k experts (and the shared ones): that MLP width
            return ModelShape(moe.pop("params"), L, h, moe.pop("active_width"), heads, kv, V, tied,
                              attention_head_dim=head_dim, **moe)
        vision = vision_shape(c) if "vision_config" in c else {}
        return ModelShape(params + vision.get("vision_params", 0.0), L, h, i, heads, kv, V, tied,
                          attention_head_dim=head_dim, **vision)


def meta_model(c: dict, auto_class: str):
    """The model of config.json ``c`` on the meta device (no memory, no weights), by transformers' ``auto_class``."""
    import torch
    import transformers

    with torch.device("meta"):
        return getattr(transformers, auto_class).from_config(transformers.AutoConfig.for_model(**c))


MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


def moe_shape(c: dict) -> dict:
    """A mixture-of-experts config.json, counted on the meta device with its transformers class: all parameters,
    the ones a token uses (the others' experts excluded: total - expert parameters x (1 - k / E)), per layer, and
    the MLP width a token goes through (k x the expert width + the shared experts')."""
    model = meta_model(c, "AutoModelForCausalLM")
    total = sum(p.numel() for p in model.parameters())
    expert = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    E = next(c[k] for k in MOE_KEYS if c.get(k))
    k = c["num_experts_per_tok"]
    width = c.get("moe_intermediate_size") or c["intermediate_size"]
    shared = c.get("shared_expert_intermediate_size") or c.get("n_shared_experts", 0) * width
    outside = sum(p.numel() for n, p in model.named_parameters() if ".layers." not in n)
    return {"params": float(total), "active_params": float(total - expert * (1 - k / E)), "experts": E,
            "experts_per_token": k, "moe_layer_params": float(total - outside) / c["num_hidden_layers"],
            "active_width": k * width + shared}


def vision_shape(c: dict) -> dict:
    """The vision side of a vision-language config.json: the parameters outside the language model and its head,
    counted on the meta device (no memory, no weights) with the architecture's own transformers class."""
    model = meta_model(c, "AutoModelForImageTextToText")
    text = ("language_model.", "text_model.", "lm_head.")
    params = sum(p.numel() for n, p in model.named_parameters() if not any(k in n for k in text))
    v = c["vision_config"]
    hidden = v.get("embed_dim") or v["hidden_size"]   # Qwen2-VL: embed_dim is the width, hidden_size its output
    return {"vision_params": float(params), "vision_layers": v.get("depth") or v["num_hidden_layers"],
            "vision_hidden": hidden,
            "vision_intermediate": v.get("intermediate_size") or int(v.get("mlp_ratio", 4) * hidden),
            "vision_merge": v.get("spatial_merge_size", 0) ** 2 or c.get("scale_factor", 1) ** 2}


# shapes of models our recipes name, for planning without the hub (config.json values)
KNOWN: dict[str, dict] = {
    "Qwen/Qwen2.5-32B": {"hidden_size": 5120, "num_hidden_layers": 64, "intermediate_size": 27648,
                         "num_attention_heads": 40, "num_key_value_heads": 8, "vocab_size": 152064},
    "Qwen/Qwen2.5-7B": {"hidden_size": 3584, "num_hidden_layers": 28, "intermediate_size": 18944,
                        "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064},
    "Qwen/Qwen2-7B-Instruct": {"hidden_size": 3584, "num_hidden_layers": 28, "intermediate_size": 18944,
                               "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064},
    # Llama-3-8B(-Instruct) and reward models built on it (a score head in place of the LM head)
    "meta-llama/Meta-Llama-3-8B-Instruct": {"hidden_size": 4096, "num_hidden_layers": 32, "intermediate_size": 14336,
                                            "num_attention_heads": 32, "num_key_value_heads": 8,
                                            "vocab_size": 128256},
    # verl's VLM baseline (geo3k); its config.json as published: text fields at the top level
    "Qwen/Qwen2.5-VL-7B-Instruct": {"model_type": "qwen2_5_vl", "hidden_size": 3584, "num_hidden_layers": 28,
                                    "intermediate_size": 18944, "num_attention_heads": 28, "num_key_value_heads": 4,
                                    "vocab_size": 152064, "tie_word_embeddings": False,
                                    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
                                    "vision_config": {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420,
                                                      "num_heads": 16, "in_chans": 3, "out_hidden_size": 3584,
                                                      "patch_size": 14, "spatial_merge_size": 2,
                                                      "temporal_patch_size": 2, "window_size": 112,
                                                      "fullatt_block_indexes": [7, 15, 23, 31]}},
    # mixture-of-experts shapes: Mixtral 46.7B / 12.9B active, DeepSeek-V3 671B / 37B (its multi-token
    # prediction module is not in transformers' model)
    "mistralai/Mixtral-8x7B-Instruct-v0.1": {"model_type": "mixtral", "hidden_size": 4096, "num_hidden_layers": 32,
                                             "intermediate_size": 14336, "num_attention_heads": 32,
                                             "num_key_value_heads": 8, "vocab_size": 32000, "num_local_experts": 8,
                                             "num_experts_per_tok": 2, "tie_word_embeddings": False},
    "deepseek-ai/DeepSeek-V3": {"model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61,
                                "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_attention_heads": 128,
                                "num_key_value_heads": 128, "vocab_size": 129280, "n_shared_experts": 1,
                                "n_routed_experts": 256, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
                                "n_group": 8, "topk_group": 4, "kv_lora_rank": 512, "q_lora_rank": 1536,
                                "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
                                "tie_word_embeddings": False},
    # verl's reference scripts' model (examples/*_trainer/run_qwen3_8b_fsdp.sh); head_dim 128 = hidden / heads
    "Qwen/Qwen3-8B": {"hidden_size": 4096, "num_hidden_layers": 36, "intermediate_size": 12288,
                      "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 151936,
                      "tie_word_embeddings": False},
    # on-policy distillation's published teacher (Thinking Machines' reasoning run: Qwen3-32B -> Qwen3-8B-Base)
    "Qwen/Qwen3-32B": {"hidden_size": 5120, "num_hidden_layers": 64, "intermediate_size": 25600,
                       "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
                       "tie_word_embeddings": False},
    "Qwen/Qwen2.5-0.5B-Instruct": {"hidden_size": 896, "num_hidden_layers": 24, "intermediate_size": 4864,
                                   "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
                                   "tie_word_embeddings": True},
}
for _alias, _base in (("Qwen/Qwen2.5-Math-7B", "Qwen/Qwen2.5-7B"), ("Qwen/Qwen2.5-32B-Instruct", "Qwen/Qwen2.5-32B"),
                      ("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-7B"), ("Qwen/Qwen3-8B-Base", "Qwen/Qwen3-8B"),
                      # PRIME's SFT model: Qwen2.5-Math-7B-Base fine-tuned, the same architecture
                      ("PRIME-RL/Eurus-2-7B-SFT", "Qwen/Qwen2.5-7B"),
                      ("sfairXC/FsfairX-LLaMA3-RM-v0.1", "meta-llama/Meta-Llama-3-8B-Instruct")):
    KNOWN[_alias] = KNOWN[_base]


def model_shape(name_or_path: str) -> ModelShape:
    """A local folder's config.json, else the built-in table, else the folder the run itself would load
    (``core.models.resolve_model``: the model cache, SmolLM2 from its wheel); an unknown name is an error that
    lists the table."""
    cfg = Path(name_or_path).expanduser() / "config.json"
    if cfg.is_file():
        return ModelShape.from_config(json.loads(cfg.read_text()))
    if name_or_path in KNOWN:
        return ModelShape.from_config(KNOWN[name_or_path])
    from core.models import ModelNotFoundError, resolve_model

    try:
        cfg = Path(resolve_model(name_or_path)) / "config.json"
    except ModelNotFoundError:
        cfg = None
    if cfg is not None and cfg.is_file():
        return ModelShape.from_config(json.loads(cfg.read_text()))
    from core.config.errors import ConfigError

    raise ConfigError(f"model {name_or_path!r}: no local config.json and not in the planner's table {sorted(KNOWN)}; "
                      f"pass a local folder that holds config.json")
