"""Capacity planner: per-GPU memory of a colocated RL run (FSDP2 training + a rollout engine) before it starts.

Every term is a formula of the model's shape and the run's settings (bytes; P = parameters, W = FSDP world
size, T = tokens per micro-batch, h = hidden size, L = layers, V = vocabulary, t = rollout tensor parallel size):

training phase, per GPU
    fp32 master weights        4P / W            (on the host with param offload)
    fp32 gradients             4P / W            (on the host with param offload: FSDP2 offloads them together)
    AdamW moments (fp32 m, v)  8P / W            (on the host with optimizer or param offload)
    gathered bf16 layers       2 x 2 P_layer     (the layer being computed and the one prefetched)
    activations                T h L x 2         (checkpointed layer inputs, bf16) + 34 T h (one layer recomputed:
                               Korthikanti et al. 2022, flash attention) -- without checkpointing: 34 T h L
    logits                     8 T V             (fp32 logits and their gradient: the actor projects a micro-batch's
                                                 response tokens onto the vocabulary at once)
rollout phase, per GPU
    the engine's share         gpu_memory_utilization x GPU memory (weights 2P / t, the rest its KV cache), while
    what training keeps        the first three lines above, unless offloaded (colocated: phases alternate; the
                               engine frees its KV cache and weights while training runs)
KV cache per token             2 (K and V) x L x kv_heads x head_dim x 2 bytes / t

Host memory per node: the offloaded shards of its GPUs. ``fits`` checks every phase against the GPU memory
(minus a reserve for the CUDA context and fragmentation) and the offloaded bytes against the host memory.
Unit tests check the arithmetic by hand (tests/test_planner.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

GB = 1e9


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
    "Qwen/Qwen2.5-0.5B-Instruct": {"hidden_size": 896, "num_hidden_layers": 24, "intermediate_size": 4864,
                                   "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
                                   "tie_word_embeddings": True},
}
for _alias, _base in (("Qwen/Qwen2.5-Math-7B", "Qwen/Qwen2.5-7B"), ("Qwen/Qwen2.5-32B-Instruct", "Qwen/Qwen2.5-32B"),
                      ("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-7B")):
    KNOWN[_alias] = KNOWN[_base]


def model_shape(name_or_path: str) -> ModelShape:
    """A local folder's config.json, else the built-in table; an unknown name is an error that lists the table."""
    cfg = Path(name_or_path).expanduser() / "config.json"
    if cfg.is_file():
        return ModelShape.from_config(json.loads(cfg.read_text()))
    if name_or_path in KNOWN:
        return ModelShape.from_config(KNOWN[name_or_path])
    raise KeyError(f"model {name_or_path!r}: no local config.json and not in the planner's table {sorted(KNOWN)}; "
                   f"pass a local folder that holds config.json")


@dataclass(frozen=True)
class RunShape:
    nnodes: int
    gpus_per_node: int
    gpu_memory_gb: float
    host_memory_gb: float = 1000.0
    param_offload: bool = False
    optimizer_offload: bool = False
    gradient_checkpointing: bool = True
    # tokens of one micro-batch (the token budget with dynamic batching)
    tokens_per_micro: int = 16384
    rollout_tp: int = 1
    gpu_memory_utilization: float = 0.5
    # the longest sequence the rollout must hold (prompt + response)
    max_seq_len: int = 4096
    # GB per GPU kept free for the CUDA context, NCCL buffers and fragmentation
    reserve_gb: float = 4.0


@dataclass
class Plan:
    lines: list[tuple[str, float, str]] = field(default_factory=list)   # (item, bytes per GPU, phase / note)
    problems: list[str] = field(default_factory=list)
    kv_tokens: float = 0.0

    @property
    def fits(self) -> bool:
        return not self.problems

    def total(self, phase: str) -> float:
        return sum(b for _, b, p in self.lines if p == phase)

    def text(self) -> str:
        out = [f"  {item:<44} {b / GB:9.2f} GB   {phase}" for item, b, phase in self.lines]
        out.append(f"  {'training phase total':<44} {self.total('train') / GB:9.2f} GB")
        out.append(f"  {'rollout phase total':<44} {self.total('rollout') / GB:9.2f} GB")
        out.append(f"  {'KV cache holds':<44} {self.kv_tokens:9.0f} tokens per rollout replica")
        out.append("fits" if self.fits else "DOES NOT FIT:\n" + "\n".join(f"  - {p}" for p in self.problems))
        return "\n".join(out)


def plan(m: ModelShape, r: RunShape) -> Plan:
    W = r.nnodes * r.gpus_per_node
    gpu = r.gpu_memory_gb * GB
    p = Plan()
    host = 0.0
    sharded = {"fp32 master weights (4P/W)": 4 * m.params / W, "fp32 gradients (4P/W)": 4 * m.params / W,
               "AdamW moments (8P/W)": 8 * m.params / W}
    for item, b in sharded.items():
        offloaded = r.param_offload or (item.startswith("AdamW") and r.optimizer_offload)
        if offloaded:
            host += b
        else:
            p.lines.append((item, b, "train"))
    p.lines.append(("gathered bf16 layers (2 x 2 P_layer)", 4 * m.layer_params, "train"))
    T = r.tokens_per_micro
    act = (2 * T * m.hidden * m.layers + 34 * T * m.hidden) if r.gradient_checkpointing else 34 * T * m.hidden * m.layers
    p.lines.append(("activations" + (" (checkpointed)" if r.gradient_checkpointing else ""), act, "train"))
    p.lines.append(("logits fp32 + grad (8 T V)", 8 * T * m.vocab, "train"))
    resident = sum(b for item, b, phase in p.lines if phase == "train" and item in sharded)
    engine = r.gpu_memory_utilization * gpu
    weights = 2 * m.params / r.rollout_tp
    p.lines.append(("rollout engine (utilization x GPU)", engine, "rollout"))
    if resident:
        p.lines.append(("training state kept during rollout", resident, "rollout"))
    kv_per_token = 2 * m.layers * m.kv_heads * m.head_dim * 2 / r.rollout_tp
    p.kv_tokens = max(0.0, engine - weights - 0.05 * gpu) / kv_per_token  # 5% of the GPU: engine activations
    limit = gpu - r.reserve_gb * GB
    for phase in ("train", "rollout"):
        if p.total(phase) > limit:
            p.problems.append(f"{phase} phase needs {p.total(phase) / GB:.1f} GB per GPU, more than the "
                              f"{limit / GB:.1f} GB available ({r.gpu_memory_gb:g} GB - {r.reserve_gb:g} GB reserve)")
    if weights > engine:
        p.problems.append(f"rollout weights {weights / GB:.1f} GB per GPU (TP {r.rollout_tp}) exceed the engine's "
                          f"{engine / GB:.1f} GB (gpu_memory_utilization {r.gpu_memory_utilization})")
    elif p.kv_tokens < r.max_seq_len:
        p.problems.append(f"the KV cache holds {p.kv_tokens:.0f} tokens, less than one {r.max_seq_len}-token sequence")
    if host * r.gpus_per_node > r.host_memory_gb * GB:
        p.problems.append(f"offloaded state {host * r.gpus_per_node / GB:.0f} GB per node exceeds the host's "
                          f"{r.host_memory_gb:g} GB")
    p.lines.append(("(offloaded to host, per GPU)", host, "host"))
    return p
