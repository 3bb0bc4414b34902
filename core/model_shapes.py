"""Model shapes for the capacity planner (``core.planner``): from a config.json, a built-in table of the models
our recipes name (planning needs no hub), or the folder a run would load."""

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

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def layer_params(self) -> float:
        """One decoder layer: q, o (h x h), k, v (h x kv_heads x head_dim), gate/up/down (3 h i), 2 norms."""
        kv = self.kv_heads * self.head_dim
        return 2 * self.hidden * self.hidden + 2 * self.hidden * kv + 3 * self.hidden * self.intermediate + 2 * self.hidden

    @staticmethod
    def from_config(c: dict) -> "ModelShape":
        """From a transformers config.json (params counted from the shapes, embeddings included)."""
        h, L, i, V = c["hidden_size"], c["num_hidden_layers"], c["intermediate_size"], c["vocab_size"]
        heads = c["num_attention_heads"]
        kv = c.get("num_key_value_heads") or heads
        tied = bool(c.get("tie_word_embeddings", False))
        shape = ModelShape(0.0, L, h, i, heads, kv, V, tied)
        params = L * shape.layer_params + V * h * (1 if tied else 2) + h
        return ModelShape(float(params), L, h, i, heads, kv, V, tied)


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
    "Qwen/Qwen2.5-0.5B-Instruct": {"hidden_size": 896, "num_hidden_layers": 24, "intermediate_size": 4864,
                                   "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
                                   "tie_word_embeddings": True},
}
for _alias, _base in (("Qwen/Qwen2.5-Math-7B", "Qwen/Qwen2.5-7B"), ("Qwen/Qwen2.5-32B-Instruct", "Qwen/Qwen2.5-32B"),
                      ("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-7B"),
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
    raise KeyError(f"model {name_or_path!r}: no local config.json and not in the planner's table {sorted(KNOWN)}; "
                   f"pass a local folder that holds config.json")
