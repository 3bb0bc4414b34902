"""Micro-batching: padding removal drops only all-padding columns and changes no log-prob or gradient; token-budget
groups are sized by the width they run at (longest prompt + longest response)."""

import math

import pytest
import torch

from core.config import ActorConfig, OptimConfig, PolicyLossConfig
from core.train.fsdp import FSDPActor
from core.train.micro_batches import micro_batches
from core.train.forward import response_logprobs, trim_padding
from core.models import load_causal_lm
from core.protocol import Batch
from core.worker import RoleSpec
from core.worker_group import LocalWorkerGroup


def uneven_batch(prompt_lens, response_lens, Tp=8, Tr=6, seed=0):
    """Left-padded prompts of ``prompt_lens`` in width Tp, right-padded responses of ``response_lens`` in Tr."""
    g = torch.Generator().manual_seed(seed)
    B = len(prompt_lens)
    ids = torch.randint(3, 100, (B, Tp + Tr), generator=g)
    attn = torch.zeros(B, Tp + Tr, dtype=torch.long)
    for b, (p, r) in enumerate(zip(prompt_lens, response_lens)):
        attn[b, Tp - p:Tp + r] = 1
    ids = ids * attn
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    return Batch({"input_ids": ids, "attention_mask": attn, "position_ids": pos, "responses": ids[:, Tp:],
                  "response_mask": attn[:, Tp:].float(), "old_logprobs": torch.full((B, Tr), -3.0),
                  "advantages": torch.linspace(-1, 1, B)[:, None].expand(B, Tr).contiguous()})


def test_trim_padding_keeps_exactly_the_used_columns():
    b = uneven_batch([3, 5], [2, 4])          # Tp=8: prompts start at columns 5 and 3; responses end at 8+2, 8+4
    t = trim_padding(b)
    assert t["input_ids"].shape == (2, 5 + 4)  # columns 3..11: prompt width 5, response width 4
    assert torch.equal(t["input_ids"], b["input_ids"][:, 3:12]) and torch.equal(t["responses"], b["responses"][:, :4])
    assert torch.equal(t["attention_mask"].sum(-1), b["attention_mask"].sum(-1))  # no real token dropped


def test_token_budget_groups_by_longest_prompt_plus_longest_response():
    b = uneven_batch([8, 2, 2, 2, 8], [1, 6, 6, 1, 1])
    # rows 0-1 run at 8 + 6 = 14 wide (28 > 20 tokens): alone; rows 1-3 at (2 + 6) x 3 = 24 > 20: rows 1-2;
    # row 3 with 4: (8 + 1) x 2 = 18 <= 20
    groups = micro_batches(b, size=2, max_tokens=20)
    assert [len(g) for g in groups] == [1, 2, 2]


def test_removing_padding_changes_no_logprob(tiny_model_dir):
    model = load_causal_lm(str(tiny_model_dir))
    b = uneven_batch([2, 7, 4], [1, 5, 3])
    with torch.no_grad():
        padded, ent_p = response_logprobs(model, b, 0.9, with_entropy=True, remove_padding=False)
        trimmed, ent_t = response_logprobs(model, b, 0.9, with_entropy=True, remove_padding=True)
    mask = b["response_mask"]
    torch.testing.assert_close(trimmed * mask, padded * mask, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent_t * mask, ent_p * mask, atol=1e-5, rtol=1e-5)
    assert trimmed.shape == padded.shape == (3, 6) and torch.all(trimmed[:, 5:] == 0)  # past the longest: zeros


@pytest.mark.parametrize("budget", [0, 40])
def test_removing_padding_changes_no_loss_or_gradient(tiny_model_dir, budget):
    b = uneven_batch([2, 7, 4, 8, 1, 3], [1, 5, 3, 6, 2, 6])
    results = []
    for remove in (False, True):
        cfg = ActorConfig(model=str(tiny_model_dir), dtype="float32", ppo_mini_batch_size=6, micro_batch_size=2,
                          max_tokens_per_micro=budget, optim=OptimConfig(lr=1e-3), loss=PolicyLossConfig(),
                          remove_padding=remove)
        group = LocalWorkerGroup({"actor": RoleSpec(FSDPActor, {"cfg": cfg})})
        try:
            results.append(group.role("actor").call_all(FSDPActor.update, b)[0])
        finally:
            group.shutdown()
    padded, trimmed = results
    assert trimmed["actor/grad_norm"] == pytest.approx(padded["actor/grad_norm"], rel=1e-5)
    assert trimmed["actor/pg_loss"] == pytest.approx(padded["actor/pg_loss"], rel=1e-5, abs=1e-7)


def test_token_budget_logprobs_come_back_in_the_callers_row_order(tiny_model_dir):
    # rows are sorted by length for the budget and must be unsorted: compare with a plain count split
    b = uneven_batch([2, 7, 4, 8, 1, 3], [1, 5, 3, 6, 2, 6])
    out = []
    for budget in (0, 30):
        cfg = ActorConfig(model=str(tiny_model_dir), dtype="float32", micro_batch_size=2, max_tokens_per_micro=budget)
        group = LocalWorkerGroup({"actor": RoleSpec(FSDPActor, {"cfg": cfg})})
        try:
            out.append(group.role("actor").call_all(FSDPActor.compute_logprobs, b)[0]["old_logprobs"])
        finally:
            group.shutdown()
    mask = b["response_mask"]
    torch.testing.assert_close(out[1] * mask, out[0] * mask, atol=1e-5, rtol=1e-5)


def test_gradient_checkpointing_changes_no_loss_or_gradient(tiny_model_dir):
    # activations recomputed in backward: the same numbers, less memory
    b = uneven_batch([2, 7, 4, 8], [1, 5, 3, 6])
    results = []
    for checkpointing in (False, True):
        cfg = ActorConfig(model=str(tiny_model_dir), dtype="float32", ppo_mini_batch_size=4, micro_batch_size=2,
                          optim=OptimConfig(lr=1e-3), gradient_checkpointing=checkpointing)
        group = LocalWorkerGroup({"actor": RoleSpec(FSDPActor, {"cfg": cfg})})
        try:
            results.append(group.role("actor").call_all(FSDPActor.update, b)[0])
        finally:
            group.shutdown()
    assert results[1]["actor/grad_norm"] == pytest.approx(results[0]["actor/grad_norm"], rel=1e-5)
    assert results[1]["actor/pg_loss"] == pytest.approx(results[0]["actor/pg_loss"], rel=1e-5, abs=1e-7)


def test_epoch_reshuffles_differ_between_updates_and_replay_from_the_rng_state():
    """The reshuffle seed of each update's later epochs comes from the process's torch RNG (saved in checkpoints):
    a new permutation every update (cfg.seed + epoch repeated one), the same after restoring the RNG state."""
    from core.train.micro_batches import reshuffle_seed

    torch.manual_seed(0)
    seeds = [reshuffle_seed(2) for _ in range(4)]
    torch.manual_seed(0)
    assert [reshuffle_seed(2) for _ in range(4)] == seeds and len(set(seeds)) == 4
    state = torch.get_rng_state()
    assert reshuffle_seed(1) == 0 and torch.equal(torch.get_rng_state(), state)  # one epoch: nothing drawn


def test_a_nonfinite_gradient_skips_the_optimizer_and_the_schedule():
    """The step is skipped and so is the LR schedule (it counts real updates); a finite one moves both."""
    from core.train.sharding import adamw_with_warmup, clipped_step

    model = torch.nn.Linear(3, 2)
    optim, sched = adamw_with_warmup(model, OptimConfig(lr=0.1, warmup_steps=4))
    before = [p.detach().clone() for p in model.parameters()]
    model(torch.ones(1, 3)).sum().backward()
    model.weight.grad[0, 0] = float("nan")
    assert math.isnan(clipped_step(model, optim, sched, 1.0))
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters())) and sched.last_epoch == 0
    model(torch.ones(1, 3)).sum().backward()
    assert math.isfinite(clipped_step(model, optim, sched, 1.0)) and sched.last_epoch == 1
    assert not torch.equal(before[0], model.weight)
