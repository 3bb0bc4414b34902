"""SFT on the FSDP2 actor (``PolicyWorker.sft_update``, one rank in-process, fp32, tiny random Llama): the step's
loss is transformers' own loss of the samples (``labels``) before the step, and packed rows give the same loss and
gradient norm as one sample per row, whatever the micro-batches."""

import pytest
import torch

from core.config import ActorConfig, OptimConfig
from core.protocol import Batch
from core.sft import collate, pack
from core.train.fsdp import FSDPActor
from core.worker import RoleSpec
from core.worker_group import LocalWorkerGroup
from tests.sft.test_packing import samples


def sft_step(model_dir, data, rows, micro: int) -> dict:
    cfg = ActorConfig(model=str(model_dir), dtype="float32", micro_batch_size=micro, optim=OptimConfig(lr=1e-3))
    group = LocalWorkerGroup({"actor": RoleSpec(FSDPActor, {"cfg": cfg})})
    try:
        p = collate(data, rows)
        batch = Batch({"input_ids": p.input_ids, "position_ids": p.position_ids, "segment": p.segment,
                       "loss_mask": p.loss_mask})
        return group.role("actor").call_all(FSDPActor.sft_update, batch)[0]
    finally:
        group.shutdown()


@pytest.fixture(scope="module")
def data():
    return samples(7, lengths=(14, 6, 9, 3, 12, 8))


def test_the_step_loss_is_transformers_loss_of_the_samples(tiny_model_dir, data):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, torch_dtype=torch.float32)
    total, n = 0.0, 0
    with torch.no_grad():
        for s in data:
            labels = torch.tensor([[t if m else -100 for t, m in zip(s.ids, s.mask)]])
            k = sum(s.mask[1:])
            total += float(model(input_ids=torch.tensor([s.ids]), labels=labels).loss) * k
            n += k
    m = sft_step(tiny_model_dir, data, pack(data, max_tokens=24), micro=2)
    assert m["sft/tokens"] == n
    assert abs(m["sft/nll_loss"] - total / n) <= 1e-5


def test_packed_rows_equal_one_sample_per_row(tiny_model_dir, data):
    packed = sft_step(tiny_model_dir, data, pack(data, max_tokens=24), micro=2)
    alone = sft_step(tiny_model_dir, data, [[i] for i in range(len(data))], micro=3)
    assert abs(packed["sft/nll_loss"] - alone["sft/nll_loss"]) <= 1e-5
    assert abs(packed["actor/grad_norm"] - alone["actor/grad_norm"]) <= 1e-5 * alone["actor/grad_norm"]
