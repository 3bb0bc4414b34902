"""The critic on Megatron-core, ``critic.strategy: megatron``: the policy's backbone as a ``GPTModel`` with TP over
``critic.megatron.tp`` ranks and a scalar value head in place of its output layer
(``core.train.megatron_model.ValueHead``), behind the critic role's methods (``core.train.critic.ValueWorker``:
the value pass and the clipped value-loss update are shared with the FSDP critic). The head starts as the FSDP
critic's does, so both engines train the same critic from the same seed."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from core.config import CriticConfig
from core.train.critic import ValueWorker
from core.train.megatron_model import MegatronEngine, MegatronModel
from core.protocol import Batch
from core.worker import WorkerContext


class MegatronCritic(MegatronEngine, ValueWorker):
    def __init__(self, ctx: WorkerContext, cfg: CriticConfig):
        self.ctx, self.cfg = ctx, cfg
        self.mg = MegatronModel(ctx, cfg.model, cfg.megatron.tp, cfg.dtype, cfg.seed, cfg.optim, cfg.offload,
                                cfg.gradient_checkpointing, value_head=True, role="critic")
        self.model, self.optim, self.sched, self.dp = self.mg.model, self.mg.optim, self.mg.sched, self.mg.dp

    def _values(self, mb: Batch) -> torch.Tensor:
        """V(s_t) for every response token t (B, Tr) in fp32; zeros on trimmed padding columns."""
        out, full = self.mg.forward(mb, self.cfg.remove_padding)          # (B, Tr', 1)
        values = out[..., 0].float()
        return F.pad(values, (0, full - values.shape[1])) if values.shape[1] < full else values

