"""Training throughput: the FSDP2 actor's update and log-prob forward, as tokens/s and MFU against the matmul
peak measured in the same run (the baseline is the hardware).

Full size (``--benchmark``): SmolLM2-135M-Instruct in the faster dtype, one rank (world size 1, in process), a
mini-batch of 16 samples x (48 prompt + 24 response) tokens in 2 micro-batches, one optimizer step. Smoke size:
the tiny random model. FLOPs count what runs: 2 x params per token forward (x3 with backward) for the decoder,
and the tied LM head only on the response positions it projects (``logits_to_keep``).
"""

from __future__ import annotations

import time

import torch

from bench.conftest import median_time
from bench.test_rollout import matmul_flops_per_s
from core.engines.fsdp import ActorConfig, FSDPActor, OptimConfig
from core.models import load_causal_lm, resolve_model
from core.protocol import Batch
from core.worker import RoleSpec
from core.worker_group import LocalWorkerGroup


def synthetic_batch(B: int, Tp: int, Tr: int, vocab: int) -> Batch:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (B, Tp + Tr), generator=g)
    return Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids),
                  "position_ids": torch.arange(Tp + Tr).expand(B, -1).clone(), "responses": ids[:, Tp:],
                  "response_mask": torch.ones(B, Tr), "old_logprobs": torch.full((B, Tr), -2.0),
                  "advantages": torch.randn(B, 1, generator=g).expand(B, Tr).contiguous()})


def forward_flops(model, B: int, Tp: int, Tr: int) -> float:
    """Matmul FLOPs of one forward: the decoder on every token, the LM head on Tr + 1 positions per sample."""
    head = model.get_output_embeddings().weight.numel()
    decoder = sum(p.numel() for p in model.parameters()) - model.get_input_embeddings().weight.numel()
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    decoder -= 0 if tied else head
    return 2 * (decoder * B * (Tp + Tr) + head * B * (Tr + 1))


def test_fsdp_update_and_logprob_throughput_vs_matmul_peak(full_size, report, tiny_model_dir):
    path = resolve_model("SmolLM2-135M-Instruct") if full_size else str(tiny_model_dir)
    B, Tp, Tr, repeat = (16, 48, 24, 3) if full_size else (4, 8, 4, 1)
    peaks = {d: matmul_flops_per_s(d) for d in (torch.float32, torch.bfloat16)}
    best = max(peaks, key=peaks.get)
    model = load_causal_lm(path)
    batch = synthetic_batch(B, Tp, Tr, model.config.vocab_size)
    flops = forward_flops(model, B, Tp, Tr)
    cfg = ActorConfig(model=path, dtype=str(best).replace("torch.", ""), ppo_mini_batch_size=B,
                      micro_batch_size=B // 2, optim=OptimConfig(lr=1e-6))
    group = LocalWorkerGroup({"actor": RoleSpec(FSDPActor, {"cfg": cfg})})
    try:
        actor = group.role("actor")
        t_update = median_time(lambda: actor.call_all(FSDPActor.update, batch), repeat)
        t_logp = median_time(lambda: actor.call_all(FSDPActor.compute_logprobs, batch), repeat)
    finally:
        group.shutdown()
    tokens = B * (Tp + Tr)
    r = report("train", model=path.split("/")[-1], dtype=str(best).replace("torch.", ""),
               samples=B, tokens=tokens, peak_gflops=peaks[best] / 1e9,
               update_s=t_update, update_tok_s=tokens / t_update, update_mfu=3 * flops / t_update / peaks[best],
               logprob_s=t_logp, logprob_tok_s=tokens / t_logp, logprob_mfu=flops / t_logp / peaks[best],
               update_over_logprob=t_update / t_logp)
    # a forward-backward-step costs at least the 3 forwards' worth of matmuls it contains
    assert r["update_s"] > 0 and (r["update_over_logprob"] > 1.5 or not full_size)
