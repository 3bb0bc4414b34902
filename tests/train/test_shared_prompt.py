"""Shared-prompt forward: a prompt's samples packed into one row give the standard forward's log-probs, entropies
and gradients (fp32), for SDPA and eager attention, with uneven prompts, responses and group sizes."""

import pytest
import torch

from core.config import ActorConfig, OptimConfig
from core.train.forward import response_logprobs, trim_padding
from core.train.fsdp import FSDPActor
from core.train.shared_prompt import pack, prompt_groups
from core.models import load_causal_lm
from core.worker import RoleSpec
from core.worker_group import LocalWorkerGroup
from tests.train.test_micro_batches import uneven_batch


def grouped_batch(prompt_lens, response_lens, same_as, Tp=8, Tr=6, seed=0):
    """``uneven_batch`` (left-padded prompts, right-padded responses) where row a gets row b's prompt for each
    (a, b) in ``same_as`` (rows of equal prompt lengths)."""
    b = uneven_batch(prompt_lens, response_lens, Tp, Tr, seed)
    ids = b["input_ids"].clone()
    for a, c in same_as:
        ids[a, :Tp] = ids[c, :Tp]
    b["input_ids"] = ids
    return b


# rows 0-2 share a prompt, 3-4 another, 5 is alone, 6 repeats row 0's prompt but not next to it
UNEVEN = dict(prompt_lens=[5, 5, 5, 3, 3, 7, 5], response_lens=[6, 2, 4, 1, 5, 3, 6],
              same_as=[(1, 0), (2, 0), (4, 3), (6, 0)])


def test_groups_are_runs_of_adjacent_rows_with_the_same_prompt():
    assert prompt_groups(grouped_batch(**UNEVEN)) == [[0, 1, 2], [3, 4], [5], [6]]


def test_the_packed_row_holds_the_prompt_once_and_each_response_sees_only_the_prompt_and_itself():
    # 2 rows, one prompt of 2 tokens (width 3: one padding column), responses of 2 and 1 tokens (width 2)
    b = trim_padding(grouped_batch([2, 2], [2, 1], [(1, 0)], Tp=3, Tr=2))
    p = pack(b, [[0, 1]])
    P, R = 2, 2
    assert p["input_ids"].shape == (1, P + 2 * R)                                   # 6 columns, not 2 x 4
    assert torch.equal(p["input_ids"][0], torch.cat([b["input_ids"][0], b["input_ids"][1, P:]]))
    assert p["position_ids"][0, :5].tolist() == [0, 1, 2, 3, 2]  # each response restarts after the prompt
    allowed = p["allowed"][0, 0].int()
    assert allowed.tolist() == [[1, 0, 0, 0, 0, 0],
                                [1, 1, 0, 0, 0, 0],
                                [1, 1, 1, 0, 0, 0],
                                [1, 1, 1, 1, 0, 0],
                                [1, 1, 0, 0, 1, 0],   # response 1 never sees response 0
                                [1, 1, 0, 0, 1, 1]]   # its padding column (output unused) also sees itself
    # logits needed: the prompt's last column (both first tokens), then each slot's first R-1 columns
    assert p["keep"].tolist() == [1, 2, 4]
    assert p["take"].tolist() == [[0, 1], [0, 2]]


def test_flat_rows_hold_each_prompt_once_and_the_real_response_tokens_only():
    """Groups of 3, 2, 1 and 1 rows with uneven prompts and responses: one row of exactly the real tokens, and
    ``keep`` / ``take`` find each response token's predicting position in it."""
    b = trim_padding(grouped_batch(**UNEVEN))
    groups = prompt_groups(b)
    padded, flat = pack(b, groups), pack(b, groups, flat=True)
    P = b["input_ids"].shape[1] - b["responses"].shape[1]
    lengths = b["attention_mask"][:, P:].sum(-1).tolist()
    real = sum(int(b["attention_mask"][g[0], :P].sum()) for g in groups) + sum(lengths)
    assert flat["input_ids"].shape == (1, real) and real < padded["input_ids"].numel()
    R = b["responses"].shape[1]
    for row in range(len(b)):
        for t in range(lengths[row]):
            # the token at the kept position is the one before response token t (the prompt's last, or t - 1)
            at = flat["input_ids"][0, flat["keep"][flat["take"][row, t]]]
            before = b["input_ids"][row, P + t - 1]
            assert at == before, (row, t)
            assert flat["position_ids"][0, flat["keep"][flat["take"][row, t]]] == b["position_ids"][row, P + t - 1]
    assert flat["take"].shape == (len(b), R)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_shared_prompt_forward_gives_the_standard_logprobs_entropy_and_gradients(tiny_model_dir, attention):
    model = load_causal_lm(str(tiny_model_dir))
    model.set_attn_implementation(attention)
    b = grouped_batch(**UNEVEN)
    mask = b["response_mask"]
    results = []
    for share in (False, True):
        model.zero_grad()
        logp, ent = response_logprobs(model, b, 0.9, with_entropy=True, share_prompt=share)
        (logp * mask * torch.arange(1.0, 8.0)[:, None]).sum().add((ent * mask).sum()).backward()
        results.append((logp.detach() * mask, ent.detach() * mask, [p.grad.clone() for p in model.parameters()]))
    (lp0, e0, g0), (lp1, e1, g1) = results
    assert lp0.abs().max() > 1  # real log-probs, not zeros
    torch.testing.assert_close(lp1, lp0, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(e1, e0, atol=1e-5, rtol=1e-5)
    for a, c in zip(g1, g0):
        torch.testing.assert_close(a, c, atol=1e-5, rtol=1e-4)


def test_a_response_that_could_see_another_would_change_its_logprobs(tiny_model_dir, monkeypatch):
    """The check above can fail: let every slot see every earlier column and the log-probs move."""
    import core.train.shared_prompt as sp

    model = load_causal_lm(str(tiny_model_dir))
    b = grouped_batch(**UNEVEN)
    with torch.no_grad():
        exact, _ = response_logprobs(model, b, share_prompt=True)
        real_pack = sp.pack

        def leaky(batch, groups, **kw):
            p = real_pack(batch, groups, **kw)
            W = p["allowed"].shape[-1]
            p["allowed"] = p["allowed"] | torch.ones(W, W, dtype=torch.bool).tril()
            return p

        monkeypatch.setattr(sp, "pack", leaky)
        leaked, _ = response_logprobs(model, b, share_prompt=True)
    mask = b["response_mask"]
    assert (exact * mask - leaked * mask).abs().max() > 1e-3


def old_logprobs_and_update(model_dir, b, share: bool):
    cfg = ActorConfig(model=str(model_dir), dtype="float32", ppo_mini_batch_size=7, micro_batch_size=4,
                      optim=OptimConfig(lr=1e-3), share_prompt=share)
    group = LocalWorkerGroup({"actor": RoleSpec(FSDPActor, {"cfg": cfg})})
    try:
        old = group.role("actor").call_all(FSDPActor.compute_logprobs, b)[0]["old_logprobs"]
        return old, group.role("actor").call_all(FSDPActor.update, b)[0]
    finally:
        group.shutdown()


def test_the_actor_update_is_the_same_with_and_without_sharing(tiny_model_dir):
    b = grouped_batch(**UNEVEN)
    results = [old_logprobs_and_update(tiny_model_dir, b, share) for share in (False, True)]
    (old0, m0), (old1, m1) = results
    torch.testing.assert_close(old1 * b["response_mask"], old0 * b["response_mask"], atol=1e-5, rtol=1e-5)
    assert m1["actor/grad_norm"] == pytest.approx(m0["actor/grad_norm"], rel=1e-5)
    assert m1["actor/pg_loss"] == pytest.approx(m0["actor/pg_loss"], rel=1e-5, abs=1e-7)
