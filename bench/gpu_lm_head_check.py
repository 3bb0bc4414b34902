"""The fused LM head on a GPU (``python bench/gpu_lm_head_check.py``): a training forward that keeps its blocks'
logits for backward against one that recomputes them, on SmolLM2's head shape (V = 49,152, D = 576) at a long
micro-batch's 4,096 positions, bf16 and fp32: the largest difference of log-probs and gradients between the two, and
the forward + backward time of each (CUDA events, after warm-up). Prints one line per dtype; arguments: block sizes
(logit values per vocabulary block) to compare, the shipped ``GPU_BLOCK_VALUES`` by default."""

import torch

import core.train.lm_head as lm_head
from core.train.lm_head import HeadLogprobs


def main() -> None:
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    M, D, V = 4096, 576, 49152
    for dtype in (torch.bfloat16, torch.float32):
        torch.cuda.reset_peak_memory_stats()
        hidden = torch.randn(M, D, device=dev, generator=g).mul_(2).to(dtype).requires_grad_(True)
        weight = torch.randn(V, D, device=dev, generator=g).mul_(0.05).to(dtype).requires_grad_(True)
        pos = torch.arange(M, device=dev)
        ids = torch.randint(0, V, (M,), device=dev, generator=g)
        w = torch.randn(M, device=dev, generator=g)
        out, times = {}, {}
        for keep in (False, True, False, True):
            def once():
                logp, ent = HeadLogprobs.apply(hidden, weight, pos, ids, 1.0, True, keep)
                grads = torch.autograd.grad((logp * w).sum() + ent.sum(), (hidden, weight))
                return logp, ent, *grads
            for _ in range(2):
                once()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(5):
                res = once()
            end.record()
            torch.cuda.synchronize()
            times.setdefault(keep, []).append(start.elapsed_time(end) / 5)
            out[keep] = res
        diffs = [float((a.detach().float() - b.detach().float()).abs().max()) for a, b in zip(out[False], out[True])]
        equal = all(torch.equal(a, b) for a, b in zip(out[False], out[True]))
        print(f"{dtype}: bit-identical {equal}; max |diff| logp {diffs[0]:.3g} entropy {diffs[1]:.3g} "
              f"grad hidden {diffs[2]:.3g} grad weight {diffs[3]:.3g}; fwd+bwd ms recompute "
              f"{min(times[False]):.2f} keep {min(times[True]):.2f}; peak MB {torch.cuda.max_memory_allocated() / 2**20:.0f}",
              flush=True)


if __name__ == "__main__":
    import sys
    for block in map(int, sys.argv[1:] or [lm_head.GPU_BLOCK_VALUES]):  # block sizes to compare (values)
        lm_head.GPU_BLOCK_VALUES = block
        print(f"GPU_BLOCK_VALUES {block}")
        main()
