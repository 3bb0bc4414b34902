"""``python -m core.export <checkpoint> <out_dir> [--dtype bfloat16]``: a checkpoint's actor as a HF model folder.

The folder (config, safetensors weights, tokenizer, generation config) loads with
``AutoModelForCausalLM.from_pretrained`` and is accepted by the rollout engine and ``core.eval`` like any model.
The actor's sharded state (torch.distributed.checkpoint, any number of ranks) is read in this one process, no
process group needed, into the base model named in the checkpoint; the optimizer state is not read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch


def export(checkpoint: str | Path, out_dir: str | Path, dtype: str = "bfloat16") -> Path:
    import torch.distributed.checkpoint as dcp

    from core.checkpoint import driver_state
    from core.models import load_causal_lm, load_tokenizer

    ckpt, out = Path(checkpoint), Path(out_dir)
    if not (ckpt / "actor").is_dir():
        raise FileNotFoundError(f"{ckpt}: no actor/ folder -- not a checkpoint written by trainer.save_freq")
    base = driver_state(ckpt).get("model")
    if not base:
        raise KeyError(f"{ckpt / 'trainer.json'} names no 'model' (written by an older version?)")
    model = load_causal_lm(base, dtype=torch.float32)
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=str(ckpt / "actor"))  # in place, full tensors, from every rank's shards
    model.load_state_dict(state["model"])
    model.to(getattr(torch, dtype)).save_pretrained(out, safe_serialization=True)
    load_tokenizer(base).save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hybridrl export", description=__doc__.split("\n\n")[0],
                                epilog="example:\n  hybridrl export outputs/grpo_smollm2_cpu_demo/checkpoints/step_000020 "
                                       "outputs/hf --dtype bfloat16", formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="a checkpoint folder, e.g. outputs/run/checkpoints/step_000020")
    p.add_argument("out_dir")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    a = p.parse_args(argv)
    print(f"exported to {export(a.checkpoint, a.out_dir, a.dtype)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
