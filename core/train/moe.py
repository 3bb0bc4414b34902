"""Router metrics of mixture-of-experts models (Qwen2-MoE, Mixtral, DeepSeek-V3 shapes in transformers), read by
forward hooks on their top-k routers while the actor updates.

Per MoE layer, over the tokens its router saw (every position the forward ran: padding trimmed by
``remove_padding`` is not run, padding inside the kept columns is): f_i = tokens routed to expert i / (tokens x k),
P_i = mean router probability of expert i, E experts. Logged, averaged over layers and micro-batches:

  moe/load_max    E x max_i f_i   1.0 when every expert takes an equal share; E / k when k experts take everything
  moe/load_min    E x min_i f_i   0.0 when an expert receives no token (a dead expert)
  moe/aux_loss    E x sum_i f_i P_i   the Switch Transformer balance loss (Fedus et al. 2021, eq. 4): 1.0 balanced

Example: E = 4, k = 2, 10 tokens routed to experts {0: 8, 1: 6, 2: 4, 3: 2} of 20 slots: f = (0.4, 0.3, 0.2, 0.1),
load_max = 1.6, load_min = 0.4. transformers' MoE blocks are dropless (no capacity factor): no token is dropped, so
there is no dropped-token figure to log; a capacity-limited router (Megatron's EP with a capacity factor) would add one.
"""

from __future__ import annotations

import torch


def is_router(module: torch.nn.Module) -> bool:
    return type(module).__name__.lower().endswith("topkrouter")


class RouterStats:
    """Hooks on a model's routers that record during training forwards (``module.training``: the actor's update,
    not its log-prob passes): ``reset()`` before an update, ``metrics(prefix)`` after it (empty for a dense model)."""

    def __init__(self, model: torch.nn.Module):
        self.routers = [m for m in model.modules() if is_router(m)]
        for r in self.routers:
            r.register_forward_hook(self._record)
        self.reset()

    def reset(self) -> None:
        self.sums: dict[str, float] = {}
        self.count = 0

    @torch.no_grad()
    def _record(self, module, args, output) -> None:
        if not module.training:
            return
        if isinstance(output, tuple) and len(output) == 2 and output[1].dtype == torch.bool:
            # Megatron-core's TopKRouter: (probabilities, routing map); the logits again from its gating linear
            logits = module.gating(args[0]).detach().float()
            E = logits.shape[-1]
            logits, chosen_map = logits.reshape(-1, E), output[1].reshape(-1, E)
            f = chosen_map.sum(0).float() / chosen_map.sum()
        else:
            logits = (output[0] if isinstance(output, tuple) else output).detach().float()
            E = logits.shape[-1]
            logits = logits.reshape(-1, E)
            k = getattr(module, "top_k", None) or getattr(module, "num_experts_per_tok", 1)
            if isinstance(output, tuple) and len(output) == 3 and not output[2].is_floating_point():
                chosen = output[2]          # the router's own choice (grouped or biased routers differ from a top-k)
            else:
                chosen = logits.topk(k, dim=-1).indices
            f = torch.bincount(chosen.reshape(-1), minlength=E)[:E].float() / chosen.numel()
        P = logits.softmax(-1).mean(0)
        for key, value in (("moe/load_max", E * f.max()), ("moe/load_min", E * f.min()),
                           ("moe/aux_loss", E * (f * P).sum())):
            self.sums[key] = self.sums.get(key, 0.0) + float(value)
        self.count += 1

    def metrics(self, prefix: str = "") -> dict[str, float]:
        return {prefix + k: v / self.count for k, v in self.sums.items()} if self.count else {}


# how checkpoints store what transformers 5 fuses into one (experts, ...) parameter per layer: the MoE block's name
# in the file, each expert's [gate, up] projections (concatenated along their rows) and its down projection
EXPERT_LAYOUTS = (("mlp.", ("gate_proj", "up_proj"), "down_proj"),           # Qwen2/3-MoE, DeepSeek-V3
                  ("block_sparse_moe.", ("w1", "w3"), "w2"))                  # Mixtral


def checkpoint_parts(name: str, experts: int, stored) -> str | list[list[str]] | None:
    """Where parameter ``name`` is in a checkpoint holding the names ``stored``: its own name, or a renamed MoE
    block's (Mixtral's ``block_sparse_moe.gate.weight`` for ``mlp.gate.weight``); for a fused expert parameter
    (``...mlp.experts.gate_up_proj`` (E, 2I, h), ``...experts.down_proj`` (E, h, I)) one list per expert: its
    tensors, concatenated along their rows. None: not in the checkpoint. Example: Mixtral's
    ``model.layers.0.mlp.experts.gate_up_proj`` row e <- [``...block_sparse_moe.experts.e.w1.weight``,
    ``...block_sparse_moe.experts.e.w3.weight``]."""
    if name in stored:
        return name
    for block, gate_up, down in EXPERT_LAYOUTS:
        path = name.replace(".mlp.", f".{block}", 1)
        if path in stored:
            return path
        head, _, leaf = path.rpartition(".experts.")
        parts = {"gate_up_proj": gate_up, "down_proj": (down,)}.get(leaf)
        if parts and all(f"{head}.experts.{e}.{p}.weight" in stored for e in range(experts) for p in parts):
            return [[f"{head}.experts.{e}.{p}.weight" for p in parts] for e in range(experts)]
    return None
