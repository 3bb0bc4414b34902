"""core/rollout/gpu_kernels.py: the fused norm goes in only where it reproduces the module, and only for inference.
The check runs on any device: here on CPU (``device_type="cpu"``); on a GPU the engine installs it itself
(tests/rollout/test_decode_graphs.py, marked gpu)."""

import torch

from core.rollout import gpu_kernels
from core.models import load_causal_lm


class GemmaLikeRMSNorm(torch.nn.Module):
    """Gemma's norm scales by 1 + weight: F.rms_norm with ``weight`` computes something else."""

    def __init__(self, width: int):
        super().__init__()
        self.weight, self.eps = torch.nn.Parameter(torch.randn(width) * 0.1), 1e-6

    def forward(self, x):
        y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).to(x.dtype)


def test_llama_norms_are_fused_for_inference_and_give_the_models_logits(tiny_model_dir):
    model = load_causal_lm(str(tiny_model_dir), dtype=torch.bfloat16)
    norms = [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]
    ids = torch.tensor([[5, 9, 17, 33, 4, 60]])
    with torch.no_grad():
        before = model(input_ids=ids).logits.float()
    assert gpu_kernels.install(model, device_type="cpu") == {"norms": len(norms)} and len(norms) == 2 * 2 + 1
    assert gpu_kernels.install(model, device_type="cpu") == {"norms": 0}   # installed once
    with torch.no_grad():
        after = model(input_ids=ids).logits.float()
    assert (after - before).abs().max() <= 0.05 * before.abs().max()      # bf16: rounded once instead of twice
    x = torch.randn(3, norms[0].weight.shape[0], dtype=torch.bfloat16)
    with torch.no_grad():   # the fused path really runs: F.rms_norm's own output, bit for bit
        assert torch.equal(norms[0](x), torch.nn.functional.rms_norm(x, norms[0].weight.shape, norms[0].weight,
                                                                       norms[0].variance_epsilon))
    own = type(norms[0]).forward(norms[0], x)   # under autograd the module's own code runs
    assert torch.equal(norms[0](x), own) and own.requires_grad


def test_a_norm_with_other_math_keeps_its_own_forward():
    norm = GemmaLikeRMSNorm(64).to(torch.bfloat16)
    assert gpu_kernels.install(norm, device_type="cpu") == {"norms": 0} and "forward" not in norm.__dict__
    assert gpu_kernels.install(torch.nn.Linear(4, 4), device_type="cpu") == {"norms": 0}
