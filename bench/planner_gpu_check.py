"""Measured vs planned: the capacity planner's training-phase memory (core/planner.py) against what an FSDP2 actor
actually allocates on one CUDA GPU, for each offload mode.

    python bench/planner_gpu_check.py [--layers 12 --hidden 2048 --tokens 8192]

Builds a random Qwen2-shaped model (bf16 safetensors in a temp folder; no hub), then for offload none / idle / full:
two PPO updates on one sequence of ``--tokens`` tokens (the token budget), gradient checkpointing on. Prints, per
mode, the peak bytes allocated during the second update (moments exist by then) next to the plan's training-phase
total, and what stays allocated between calls. Needs a GPU; not part of the test suite (a GPU is not always here).
"""

from __future__ import annotations

import argparse
import gc
import tempfile

import torch


def build(folder: str, layers: int, hidden: int) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(hidden_size=hidden, num_hidden_layers=layers, intermediate_size=int(hidden * 5.375) // 64 * 64,
                      num_attention_heads=hidden // 128, num_key_value_heads=max(1, hidden // 1024),
                      vocab_size=151936, tie_word_embeddings=False, max_position_embeddings=32768)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(folder)
    del model
    torch.cuda.empty_cache()


def batch_of(tokens: int, prompt: int, vocab: int):
    from core.protocol import Batch

    ids = torch.randint(0, vocab, (1, tokens))
    Tr = tokens - prompt
    return Batch({"input_ids": ids, "attention_mask": torch.ones(1, tokens, dtype=torch.long),
                  "position_ids": torch.arange(tokens)[None], "responses": ids[:, prompt:],
                  "response_mask": torch.ones(1, Tr), "old_logprobs": torch.full((1, Tr), -11.0),
                  "advantages": torch.ones(1, Tr)})


def measure(folder: str, mode: str, tokens: int) -> dict:
    from core.config import ActorConfig, OptimConfig, PolicyLossConfig
    from core.train.fsdp import FSDPActor
    from core.config import ActorConfig, OptimConfig, PolicyLossConfig
    from core.worker import RoleSpec
    from core.worker_group import LocalWorkerGroup

    cfg = ActorConfig(model=folder, dtype="bfloat16", ppo_mini_batch_size=1, micro_batch_size=1,
                      max_tokens_per_micro=tokens, gradient_checkpointing=True, offload=mode,
                      optim=OptimConfig(lr=1e-6), loss=PolicyLossConfig())
    gc.collect()   # the previous mode's actor (reference cycles) must be gone before the baseline is read
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    group = LocalWorkerGroup({"actor": RoleSpec(FSDPActor, {"cfg": cfg})}, device="cuda")
    try:
        b = batch_of(tokens, 256, 151936)
        group.role("actor").call_all(FSDPActor.update, b)
        torch.cuda.synchronize()
        between = torch.cuda.memory_allocated() - base
        torch.cuda.reset_peak_memory_stats()
        group.role("actor").call_all(FSDPActor.update, b)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    finally:
        group.shutdown()
        del group
    return {"peak": peak, "between": between}


def main() -> None:
    from core.model_shapes import model_shape
    from core.planner import GB, RunShape, plan

    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--tokens", type=int, default=8192)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        build(folder, args.layers, args.hidden)
        m = model_shape(folder)
        print(f"model: {m.params / 1e9:.2f}B parameters, {m.layers} layers, hidden {m.hidden}, vocab {m.vocab}; "
              f"{args.tokens} tokens per micro-batch; {torch.cuda.get_device_name(0)}")
        print(f"{'offload':<8} {'planned train GB':>17} {'measured peak GB':>17} {'ratio':>6} {'between calls GB':>17}")
        for mode in ("none", "idle", "full"):
            p = plan(m, RunShape(nnodes=1, gpus_per_node=1, gpu_memory_gb=80, offload=mode,
                                 tokens_per_micro=args.tokens, gradient_checkpointing=True))
            got = measure(folder, mode, args.tokens)
            planned = p.total("train")
            print(f"{mode:<8} {planned / GB:17.2f} {got['peak'] / GB:17.2f} {got['peak'] / planned:6.2f} "
                  f"{got['between'] / GB:17.2f}")


if __name__ == "__main__":
    main()
