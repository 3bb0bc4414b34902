"""The FSDP2 critic on a tiny real model: values line up with response tokens, padding removal changes nothing,
updates lower the value loss, and a PPO run (GAE, critic warm-up) logs the critic's metrics."""

import pytest
import torch

from core.algos import LossNorm, value_loss
from core.config import CriticConfig, OptimConfig, RunConfig, SamplingParams
from core.models import load_value_model
from core.train.critic import FSDPCritic, response_values
from core.protocol import Batch
from core.worker import RoleSpec
from core.worker_group import LocalWorkerGroup


def batch_of(B=4, Tp=5, Tr=4, vocab=100) -> Batch:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (B, Tp + Tr), generator=g)
    attn = torch.ones_like(ids)
    attn[0, :2] = 0            # a left-padded prompt
    attn[1, Tp + 2:] = 0       # a short response
    attn[2, Tp + 1:] = 0
    mask = attn[:, Tp:].float()
    return Batch({"input_ids": ids, "attention_mask": attn, "position_ids": (attn.cumsum(-1) - 1).clamp(min=0),
                  "responses": ids[:, Tp:], "response_mask": mask,
                  "values": torch.zeros(B, Tr), "returns": torch.linspace(-1, 1, B)[:, None].expand(B, Tr) * mask})


def test_values_are_read_at_the_position_before_each_response_token(tiny_model_dir):
    model = load_value_model(str(tiny_model_dir)).eval()
    b = batch_of()
    with torch.no_grad():
        full = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                     position_ids=b["position_ids"]).logits[..., 0]
        v = response_values(model, b, remove_padding=False)
        trimmed = response_values(model, b, remove_padding=True)
    Tp = b["input_ids"].shape[1] - b["responses"].shape[1]
    torch.testing.assert_close(v, full[:, Tp - 1:-1])
    mask = b["response_mask"] > 0
    torch.testing.assert_close(trimmed[mask], v[mask], rtol=1e-5, atol=1e-5)


def test_critic_updates_lower_the_value_loss(tiny_model_dir):
    cfg = CriticConfig(model=str(tiny_model_dir), dtype="float32", ppo_mini_batch_size=4, micro_batch_size=2,
                       cliprange_value=10.0, optim=OptimConfig(lr=3e-3))
    group = LocalWorkerGroup({"critic": RoleSpec(FSDPCritic, {"cfg": cfg})})
    try:
        critic = group.role("critic")
        b = batch_of()
        losses = []
        for _ in range(8):
            b["values"] = critic.call_all(FSDPCritic.compute_values, b)[0]["values"]
            losses.append(critic.call_all(FSDPCritic.update, b)[0]["critic/vf_loss"])
    finally:
        group.shutdown()
    assert losses[-1] < 0.5 * losses[0], losses


def test_ppo_run_with_a_critic_and_warmup_logs_critic_metrics(tmp_path, tiny_model_dir):
    from core.trainer import fit
    from tests.test_checkpoint import write_run  # the tiny run's data and reward
    from core.run import load_run_config

    conf = write_run(tmp_path, tiny_model_dir, total_steps=3, save_freq=0, critic=True)
    cfg = load_run_config(conf, overrides=[f"trainer.output_dir={tmp_path / 'out'}", "+trainer.critic_warmup=1"])
    assert isinstance(cfg, RunConfig) and cfg.use_critic and isinstance(cfg.algo.sampling, SamplingParams)
    history = fit(cfg)
    assert "actor/grad_norm" not in history[0] and "actor/grad_norm" in history[1]  # step 1: critic only
    for m in history:
        assert m["critic/vf_loss"] > 0 and "timing_s/values" in m
        assert "critic/explained_var" not in m or m["critic/explained_var"] <= 1


def test_explained_variance_by_hand():
    from core.algos import value_targets_explained_variance as ev

    returns, mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]]), torch.ones(2, 2)
    assert ev(returns, torch.full((2, 2), 0.5), mask) == pytest.approx(0.0)   # the mean explains nothing
    assert ev(returns, returns.clone(), mask) == pytest.approx(1.0)           # exact values explain everything
    assert ev(returns, torch.zeros(2, 2), mask) == pytest.approx(0.0)         # a constant offset too: EV ignores it
    assert torch.isnan(torch.tensor(ev(torch.ones(2, 2), torch.zeros(2, 2), mask)))  # nothing to explain


@pytest.mark.parametrize("attention", ["sdpa", "hybridrl_train"])
def test_shared_prompt_values_and_gradients_equal_the_row_by_row_ones(tiny_model_dir, attention):
    """Rows of one prompt packed into one row (the prompt encoded once) give each row's values and the value
    loss's gradients of the plain layout, under SDPA's dense block mask and our training attention by parts."""
    from core.train import train_attention  # noqa: F401  registers the training attention
    from tests.train.test_shared_prompt import UNEVEN, grouped_batch

    model = load_value_model(str(tiny_model_dir))
    model.set_attn_implementation(attention)
    b = grouped_batch(**UNEVEN)
    mask = b["response_mask"]
    b["values"], b["returns"] = torch.zeros_like(mask), torch.linspace(-1, 1, len(mask))[:, None] * mask
    results = []
    for share in (False, True):
        model.zero_grad()
        v = response_values(model, b, remove_padding=True, share_prompt=share)
        value_loss(v, b, 10.0, LossNorm.of(mask))[0].backward()
        results.append((v.detach(), {k: p.grad.clone() for k, p in model.named_parameters()}))
    (plain, g_plain), (shared, g_shared) = results
    assert (plain * mask).abs().sum() > 0
    torch.testing.assert_close(shared * mask, plain * mask, atol=2e-5, rtol=1e-5)
    for k in g_plain:
        torch.testing.assert_close(g_shared[k], g_plain[k], atol=2e-5, rtol=1e-4)
