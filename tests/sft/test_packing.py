"""SFT packing (core/sft/packing.py) on a tiny random Llama in fp32: a packed batch's loss and gradients equal
transformers' own loss (``labels``) of each sample run alone, a packed sample's gradients do not depend on its
neighbours, and the packer keeps every sample once within its row budget."""

import pytest
import torch

from core.sft import Sample, collate, pack
from core.train.sft_loss import token_nll


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, torch_dtype=torch.float32, attn_implementation="sdpa")


def samples(seed: int, lengths=(11, 5, 17, 8, 3)) -> list[Sample]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        ids = torch.randint(3, 60, (n,), generator=g).tolist()
        mask = [0] * (n // 3) + [1] * (n - n // 3)            # a context, then the trained turn
        out.append(Sample(ids, mask))
    return out


def grads(model) -> dict[str, torch.Tensor]:
    return {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}


def test_packed_loss_and_gradients_equal_transformers_loss_of_each_sample_alone(model):
    data = samples(1)
    rows = pack(data, max_tokens=20)
    assert len(rows) < len(data)                                  # something was packed together
    model.zero_grad()
    total, count = token_nll(model, collate(data, rows))
    (total / count).backward()
    packed = grads(model)
    # each sample alone through transformers' own loss (labels: -100 where not trained), weighted by its tokens
    model.zero_grad()
    want, n_all = 0.0, sum(sum(s.mask[1:]) for s in data)
    for s in data:
        ids = torch.tensor([s.ids])
        labels = torch.tensor([[t if m else -100 for t, m in zip(s.ids, s.mask)]])
        loss = model(input_ids=ids, labels=labels).loss
        (loss * sum(s.mask[1:]) / n_all).backward()
        want += float(loss.detach()) * sum(s.mask[1:])
    assert int(count) == n_all
    assert abs(float(total.detach()) - want) <= 1e-4 * max(1.0, abs(want))
    for k, g in grads(model).items():
        torch.testing.assert_close(packed[k], g, atol=1e-6, rtol=1e-4)


def test_a_packed_samples_gradients_do_not_depend_on_its_neighbours(model):
    mine = samples(2, lengths=(9,))[0]

    def own_grads(neighbours: list[Sample]) -> dict[str, torch.Tensor]:
        data = [mine] + [Sample(n.ids, [0] * len(n.ids)) for n in neighbours]   # only ``mine`` is trained
        batch = collate(data, [list(range(len(data)))])                         # all in one row, ``mine`` first
        model.zero_grad()
        total, count = token_nll(model, batch)
        (total / count).backward()
        return grads(model)

    a, b = own_grads(samples(3, (6, 4))), own_grads(samples(4, (12, 2, 5)))
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-7, rtol=1e-5)
    # without the block mask the neighbours would leak in: the same sample placed after them differs
    data = samples(3, (6, 4)) + [mine]
    rows = collate([Sample(s.ids, [0] * len(s.ids)) for s in data[:2]] + [mine], [[0, 1, 2]])
    rows.segment[:] = torch.where(rows.segment >= 0, 0, -1)                    # one sample: no blocks
    model.zero_grad()
    total, count = token_nll(model, rows)
    (total / count).backward()
    assert any(not torch.allclose(a[k], g, atol=1e-6) for k, g in grads(model).items())


def test_rows_hold_every_sample_once_within_the_budget():
    data = samples(5, lengths=(7, 13, 2, 9, 9, 1, 20))
    rows = pack(data, max_tokens=20)
    assert sorted(i for row in rows for i in row) == list(range(len(data)))
    assert all(sum(len(data[i].ids) for i in row) <= 20 for row in rows)
    assert len(rows) == 4                                         # 61 tokens: first-fit, longest first
    batch = collate(data, rows)
    assert batch.position_ids[0].tolist()[:20] == list(range(20))       # the 20-token sample fills row 0
    with pytest.raises(ValueError, match="SFT sample 6 has 20 tokens, more than the 19"):
        pack(data, max_tokens=19)
    # for 3 data-parallel ranks: a multiple of 3 rows, every sample still once (none repeated to pad)
    thirds = pack(data, max_tokens=20, multiple=3)
    assert len(thirds) == 6 and sorted(i for row in thirds for i in row) == list(range(len(data)))
    with pytest.raises(ValueError, match="7 SFT samples cannot fill 8 rows"):
        pack(data, max_tokens=20, multiple=8)
