"""``python -m core.export <checkpoint> <out_dir> [--dtype bfloat16] [--adapter-only]``: a checkpoint's actor as a HF
model folder (``<checkpoint>``: a ``step_*`` folder, or a run's ``checkpoints/latest``: the newest complete one).

The folder (config, safetensors weights, tokenizer, generation config) loads with
``AutoModelForCausalLM.from_pretrained`` and is accepted by the rollout engine and ``core.eval`` like any model.
The actor's sharded state (torch.distributed.checkpoint, any number of ranks) is read in this one process, no
process group needed, into the base model named in the checkpoint; the optimizer state is not read. A LoRA actor
(``actor.lora``) is exported merged (W + (alpha / r) B A: a plain model), or with ``--adapter-only`` as a peft
adapter folder (adapter_model.safetensors + adapter_config.json; ``PeftModel.from_pretrained(base, folder)``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch


def export(checkpoint: str | Path, out_dir: str | Path, dtype: str = "bfloat16", adapter_only: bool = False) -> Path:
    import torch.distributed.checkpoint as dcp

    from core.checkpoint import LATEST, driver_state
    from core.config import LoraConfig
    from core.train import lora
    from core.models import load_causal_lm, load_tokenizer

    ckpt, out = Path(checkpoint), Path(out_dir)
    if ckpt.is_file() and ckpt.name == LATEST:  # <output_dir>/checkpoints/latest: the newest complete checkpoint
        ckpt = ckpt.parent / ckpt.read_text().strip()
    if not (ckpt / "actor").is_dir():
        raise FileNotFoundError(f"{ckpt}: no actor/ folder -- not a checkpoint written by trainer.save_freq")
    driver = driver_state(ckpt)
    base = driver.get("model")
    if not base:
        raise KeyError(f"{ckpt / 'trainer.json'} names no 'model' (written by an older version?)")
    adapters = LoraConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in driver["lora"].items()}
                          ) if driver.get("lora") else None
    if adapter_only and adapters is None:
        raise ValueError(f"{ckpt}: --adapter-only, but the actor was fully fine-tuned (no actor.lora)")
    model = load_causal_lm(base, dtype=torch.float32)
    if adapters is not None:
        lora.inject(model, adapters)
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=str(ckpt / "actor"))  # in place, full tensors, from every rank's shards
    model.load_state_dict(state["model"])
    out.mkdir(parents=True, exist_ok=True)
    if adapter_only:
        lora.save_adapter(model, adapters, base, out)
        return out
    if adapters is not None:  # merged: a plain model of the base's class
        weights = lora.merged(dict(model.state_dict()), lora.scales(model))
        model = load_causal_lm(base, dtype=torch.float32)
        model.load_state_dict(weights, strict=False)
    model.to(getattr(torch, dtype)).save_pretrained(out, safe_serialization=True)
    load_tokenizer(base).save_pretrained(out)
    return out


def parser() -> argparse.ArgumentParser:
    """``hybridrl export``'s arguments."""
    p = argparse.ArgumentParser(prog="hybridrl export", description="write a checkpoint's actor as a Hugging Face model "
                                "folder (config, safetensors, tokenizer, generation config): it loads with "
                                "AutoModelForCausalLM.from_pretrained, the rollout engine and hybridrl eval",
                                epilog="example:\n  hybridrl export outputs/grpo_smollm2_cpu_demo/checkpoints/step_000020 "
                                       "outputs/hf --dtype bfloat16", formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="a checkpoint folder, e.g. outputs/run/checkpoints/step_000020")
    p.add_argument("out_dir", help="the folder to write (created)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"],
                   help="the weights' dtype in the folder (default: bfloat16)")
    p.add_argument("--adapter-only", action="store_true", help="a LoRA actor's adapters as a peft folder")
    return p


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    print(f"exported to {export(a.checkpoint, a.out_dir, a.dtype, a.adapter_only)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
