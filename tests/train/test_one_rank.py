"""One rank without FSDP2 (``core.train.one_rank``): the same numbers as FSDP2's mixed precision on one rank.

The twin is the same tiny model wrapped by ``fsdp_wrap`` on a one-rank gloo group. Through the real forward path
(shared-prompt packing, the fused LM head), two micro-batches of gradient accumulation, clipped fused-AdamW steps,
a checkpoint save and load: gradients, norms, parameters and log-probs are bit-identical. The log-probs after each
step also fail if the compute copies were not re-cast after the optimizer wrote the fp32 parameters in place."""

import pytest
import torch


def _batch(vocab: int, seed: int):
    from core.protocol import Batch

    g = torch.Generator().manual_seed(seed)
    G, n, P, R = 2, 3, 7, 5
    prompts = torch.randint(3, vocab, (G, P), generator=g).repeat_interleave(n, 0)
    resp = torch.randint(3, vocab, (G * n, R), generator=g)
    ids = torch.cat([prompts, resp], 1)
    return Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids), "responses": resp,
                  "position_ids": torch.arange(P + R).expand(G * n, -1).contiguous()})


def _compare(rank: int, world: int, port: int, path: str, out: str) -> None:
    import os

    import torch.distributed as dist

    from core.config import OptimConfig
    from core.train import train_attention
    from core.train.forward import response_logprobs
    from core.train.sharding import (adamw_with_warmup, clipped_step, fsdp_wrap, load_sharded_causal_lm,
                                       load_state, save_state)
    from core.models import load_causal_lm
    from core.worker import WorkerContext

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    ctx = WorkerContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    bf16 = torch.bfloat16
    ours = load_sharded_causal_lm(path, ctx, bf16, "none", "actor")
    twin = load_causal_lm(path, dtype=torch.float32)
    twin.set_attn_implementation(train_attention.NAME)
    twin = fsdp_wrap(twin, ctx, bf16, "none")
    o = OptimConfig(lr=1e-2, warmup_steps=0, grad_clip=1.0)
    models = {"ours": ours, "twin": twin}
    optims = {k: adamw_with_warmup(m, o) for k, m in models.items()}
    vocab = ours.config.vocab_size
    log = {"sharded": any(hasattr(p, "device_mesh") for p in ours.parameters()), "ours": [], "twin": []}

    def params(m):
        return {n: (p.to_local() if hasattr(p, "to_local") else p).detach().clone() for n, p in m.named_parameters()}

    def logps(m, seed=9):
        with torch.no_grad():
            return response_logprobs(m.eval(), _batch(vocab, seed), share_prompt=True)[0]

    for key, m in models.items():
        optim, sched = optims[key]
        rec = log[key]
        rec.append(("logp0", logps(m)))
        for step in range(2):
            m.train()
            for micro in range(2):  # accumulation over two micro-batches
                logp, _ = response_logprobs(m, _batch(vocab, 10 * step + micro), share_prompt=True)
                (logp * torch.linspace(-1, 1, logp.shape[1])).sum().backward()
            rec.append((f"grads{step}", {n: (p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad).clone()
                                         for n, p in m.named_parameters()}))
            rec.append((f"norm{step}", clipped_step(m, optim, sched, o.grad_clip)))
            rec.append((f"params{step}", params(m)))
            rec.append((f"logp{step + 1}", logps(m)))
            if step == 0:
                save_state(f"{out}.{key}", m, optim, sched, 0)
        load_state(f"{out}.{key}", m, optim, sched, 0)  # back to after step 0: its log-probs again
        rec.append(("logp_loaded", logps(m)))
    torch.save(log, out)
    dist.destroy_process_group()


@pytest.mark.parametrize("tied", [True, False])
def test_one_rank_equals_fsdp2_on_one_rank(tmp_path, tied):
    import socket

    import torch.multiprocessing as mp

    from core.models import tiny_random_model

    path = tiny_random_model(tmp_path / "m", tie_word_embeddings=tied)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_compare, args=(1, port, str(path), str(tmp_path / "out.pt")), nprocs=1)
    got = torch.load(tmp_path / "out.pt", weights_only=False)
    assert not got["sharded"]  # one rank: plain tensors, no DTensors
    ours, twin = dict(got["ours"]), dict(got["twin"])
    assert ours.keys() == twin.keys()
    for key, value in twin.items():
        if isinstance(value, dict):
            assert value.keys() == ours[key].keys()
            for name, t in value.items():
                assert ours[key][name].dtype == torch.float32 and torch.equal(ours[key][name], t), (key, name)
        elif torch.is_tensor(value):
            assert torch.equal(ours[key], value), key
        else:
            assert ours[key] == value, key
    # the steps moved the policy (so equal log-probs after them are not trivially equal), and the load restored it
    assert not torch.equal(ours["logp1"], ours["logp0"]) and not torch.equal(ours["logp2"], ours["logp1"])
    assert torch.equal(ours["logp_loaded"], ours["logp1"])
