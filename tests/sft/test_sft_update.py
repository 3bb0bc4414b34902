"""SFT on the FSDP2 actor (``PolicyWorker.sft_update``, one rank in-process, fp32, tiny random Llama): the step's
loss is transformers' own loss of the samples (``labels``) before the step, packed rows give the same loss and
gradient norm as one sample per row, whatever the micro-batches, and LoRA SFT starts from the base model's loss."""

import pytest
import torch

from core.config import ActorConfig, OptimConfig
from core.protocol import Batch
from core.sft import collate, pack
from core.train.fsdp import FSDPActor
from core.worker import RoleSpec
from core.worker_group import LocalWorkerGroup
from tests.sft.test_packing import samples


def sft_steps(model_dir, data, rows, micro: int, steps: int = 1, lr: float = 1e-3, **actor) -> list[dict]:
    """``steps`` SFT steps on the same batch; each step's metrics."""
    cfg = ActorConfig(model=str(model_dir), dtype="float32", micro_batch_size=micro, optim=OptimConfig(lr=lr), **actor)
    group = LocalWorkerGroup({"actor": RoleSpec(FSDPActor, {"cfg": cfg})})
    try:
        p = collate(data, rows)
        batch = Batch({"input_ids": p.input_ids, "position_ids": p.position_ids, "segment": p.segment,
                       "loss_mask": p.loss_mask})
        return [group.role("actor").call_all(FSDPActor.sft_update, batch)[0] for _ in range(steps)]
    finally:
        group.shutdown()


def sft_step(model_dir, data, rows, micro: int) -> dict:
    return sft_steps(model_dir, data, rows, micro)[0]


@pytest.fixture(scope="module")
def data():
    return samples(7, lengths=(14, 6, 9, 3, 12, 8))


def test_the_step_loss_is_transformers_loss_of_the_samples(tiny_model_dir, data):
    m = sft_step(tiny_model_dir, data, pack(data, max_tokens=24), micro=2)
    assert m["sft/tokens"] == sum(sum(s.mask[1:]) for s in data)
    assert abs(m["sft/nll_loss"] - transformers_loss(tiny_model_dir, data)) <= 1e-5


def transformers_loss(model_dir, data) -> float:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    total, n = 0.0, 0
    with torch.no_grad():
        for s in data:
            labels = torch.tensor([[t if m else -100 for t, m in zip(s.ids, s.mask)]])
            k = sum(s.mask[1:])
            total += float(model(input_ids=torch.tensor([s.ids]), labels=labels).loss) * k
            n += k
    return total / n


def test_lora_sft_starts_from_the_base_models_loss_and_trains_the_adapters(tiny_model_dir, data):
    """LoRA (actor.lora): the adapters start at zero, so the first step's loss is the base model's; then it falls."""
    from core.config import LoraConfig

    first, second, third = sft_steps(tiny_model_dir, data, pack(data, max_tokens=24), micro=2, steps=3, lr=1e-2,
                                     lora=LoraConfig(rank=4))
    assert abs(first["sft/nll_loss"] - transformers_loss(tiny_model_dir, data)) <= 1e-5
    assert third["sft/nll_loss"] < second["sft/nll_loss"] < first["sft/nll_loss"]


def test_packed_rows_equal_one_sample_per_row(tiny_model_dir, data):
    packed = sft_step(tiny_model_dir, data, pack(data, max_tokens=24), micro=2)
    alone = sft_step(tiny_model_dir, data, [[i] for i in range(len(data))], micro=3)
    assert abs(packed["sft/nll_loss"] - alone["sft/nll_loss"]) <= 1e-5
    assert abs(packed["actor/grad_norm"] - alone["actor/grad_norm"]) <= 1e-5 * alone["actor/grad_norm"]
