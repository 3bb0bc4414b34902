"""Low-rank adapters on the FSDP actor (``actor.lora``, via peft): y = W x + (alpha / r) B A x on each target linear,
W frozen, A (r, in) and B (out, r) trained -- Hu et al. 2021, arXiv:2106.09685.

- Built on the meta device with the rest of the model (``core.train.sharding``): peft's layers are injected
  before sharding; the base weights are read from the checkpoint under their HF names (peft calls them
  ``<module>.base_layer.weight``), the adapters drawn as peft draws them (A kaiming-uniform with a = sqrt(5), B
  zeros: the model starts as the base model) from the process's seeded RNG, the same on every rank.
- The reference policy is the same module with its adapters off (``adapters_off``): no second model in memory.
- The rollout engine gets merged weights in HF names: W + (alpha / r) B A, computed from the full tensors
  (``merged``) -- never merged in place, so nothing has to be undone.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch

from core.train.policy import PolicyWorker
from core.protocol import Batch

ADAPTER = "default"  # peft's adapter name


def inject(model: torch.nn.Module, cfg) -> torch.nn.Module:
    """Adds LoRA layers of ``cfg`` (``core.config.LoraConfig``) to ``model`` in place; only they train."""
    from peft import LoraConfig, inject_adapter_in_model

    inject_adapter_in_model(LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, target_modules=list(cfg.target_modules),
                                       lora_dropout=0.0, bias="none"), model, adapter_name=ADAPTER)
    for name, p in model.named_parameters():
        p.requires_grad_(is_adapter(name))
    return model


def is_adapter(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def export_name(name: str) -> str:
    """The engine weight a parameter goes into: an adapted linear's base weight and both its adapters make one."""
    return name.split(".lora_")[0] + ".weight" if is_adapter(name) else hf_name(name)


def hf_name(name: str) -> str:
    """A parameter's name in the checkpoint (and the engine): peft's wrapped linear keeps its weight as base_layer."""
    return name.replace(".base_layer.", ".")


def fresh_adapters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Each adapter's initial value on the host, drawn as peft's ``reset_lora_parameters``: A kaiming-uniform
    (a = sqrt(5)), B zeros. Parameter order and this process's RNG decide the values: every rank draws the same."""
    out = {}
    for name, p in model.named_parameters():
        if ".lora_A." in name:
            t = torch.empty(p.shape)
            torch.nn.init.kaiming_uniform_(t, a=math.sqrt(5))
            out[name] = t
        elif ".lora_B." in name:
            out[name] = torch.zeros(p.shape)
    return out


def scales(model: torch.nn.Module) -> dict[str, float]:
    """alpha / r of each adapted linear, by the name of its module."""
    from peft.tuners.lora import LoraLayer

    return {name: m.scaling[ADAPTER] for name, m in model.named_modules() if isinstance(m, LoraLayer)}


def merged(full: dict[str, torch.Tensor], scale: dict[str, float]) -> dict[str, torch.Tensor]:
    """Full parameters by model name -> the engine's weights by HF name: W + scale B A for each adapted linear, the
    other weights as they are, no adapter tensors."""
    out = {}
    for name, t in full.items():
        if is_adapter(name):
            continue
        module = name.removesuffix(".base_layer.weight")
        if module != name and module in scale:
            a, b = full[f"{module}.lora_A.{ADAPTER}.weight"], full[f"{module}.lora_B.{ADAPTER}.weight"]
            t = t + scale[module] * (b.to(t.dtype) @ a.to(t.dtype))
        out[hf_name(name)] = t
    return out


def save_adapter(model: torch.nn.Module, cfg, base: str, out) -> None:
    """The adapters in peft's folder format: adapter_model.safetensors with peft's names
    (``base_model.model.<module>.lora_A.weight``) and adapter_config.json."""
    from peft import LoraConfig
    from safetensors.torch import save_file

    tensors = {"base_model.model." + n.replace(f".{ADAPTER}.", "."): t.detach().contiguous()
               for n, t in model.state_dict().items() if is_adapter(n)}
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, target_modules=list(cfg.target_modules), lora_dropout=0.0,
               bias="none", task_type="CAUSAL_LM", base_model_name_or_path=base).save_pretrained(str(out))


@contextmanager
def adapters_off(model: torch.nn.Module):
    """The base model's forward: every LoRA layer skips its adapter (requires_grad untouched)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    before = [m._disable_adapters for m in layers]
    for m in layers:
        m._disable_adapters = True
    try:
        yield
    finally:
        for m, was in zip(layers, before):
            m._disable_adapters = was



class LoraReference(PolicyWorker):
    """A LoRA actor's reference policy: the colocated actor's own module with its adapters off (no second model in
    memory). Placed on the actor's pool (``core.checks``)."""

    def __init__(self, ctx, cfg=None):
        self.ctx, self.cfg = ctx, cfg

    @torch.no_grad()
    def compute_logprobs(self, batch: Batch, with_entropy: bool = False, leave_to_update: bool = False) -> Batch:
        actor = self.ctx.colocated["actor"]
        with adapters_off(actor.model):
            return actor.compute_logprobs(batch, with_entropy)
