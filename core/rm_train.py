"""``python -m core.rm_train --model M --train pairs.jsonl --val held_out.jsonl --out DIR``: a reward model from
preference pairs, by Bradley-Terry.

Pairs follow TRL's and verl's preference schema, one per row (.jsonl or .parquet): ``chosen`` and ``rejected``,
each a text or a conversation (a list of {role, content} whose last turn is the assistant's), and a ``prompt``
(a text or a conversation) unless the two conversations carry it. Each side goes through the reward model's chat
template as a run feeds it (``core.train.reward_model.conversation_ids``: the prompt with the generation prompt,
the answer's tokens, EOS).

Training: AdamW on -log sigmoid(r_chosen - r_rejected) over mini-batches of pairs, the held-out pair accuracy
before training and after each epoch. Weights and optimizer state are fp32; the forward and backward run in bf16
where bf16 is fast (CUDA, CPUs with bf16 hardware: ``core.models.default_dtype``), else in fp32. One process, or
data-parallel with FSDP2 under ``torchrun --nproc_per_node N -m core.rm_train ...`` (gloo on CPU, NCCL on GPU):
each mini-batch split over the ranks, the same loss as one process (a test checks 2 ranks against 1).

After every epoch the folder ``--out`` is (re)written whole -- the full weights, the tokenizer and ``rm_train.json``
(the accuracy and loss history) -- so a stopped run keeps its last epoch. It loads with
``AutoModelForSequenceClassification`` (``core.train.reward_model``) and serves ``reward_model.model`` in a run.

    torchrun --nproc_per_node 2 -m core.rm_train --model SmolLM2-135M-Instruct --train t.jsonl --val v.jsonl --out rm
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from core.train.fsdp import full_tensor
from core.train.reward_model import batch_scores, bradley_terry_loss, conversation_ids, load_reward_model
from core.models import resolve_dtype
from core.worker import WorkerContext, leave_process_group


def _messages(value, where: str) -> list[dict]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    turns = [dict(t) for t in value] if value is not None else []
    if not turns or not all("role" in t and "content" in t for t in turns):
        raise ValueError(f"{where}: expected a text or a list of {{role, content}} turns, got {value!r:.80}")
    return turns


def _answer(value, where: str) -> tuple[list[dict], str]:
    """(messages before the answer, the answer's text) of a ``chosen`` / ``rejected`` value."""
    if isinstance(value, str):
        return [], value
    turns = _messages(value, where)
    if turns[-1]["role"] != "assistant":
        raise ValueError(f"{where}: a conversation must end with the assistant's turn, ends with {turns[-1]['role']!r}")
    return turns[:-1], str(turns[-1]["content"])


def load_pairs(path: str | Path) -> list[tuple[list[dict], str, str]]:
    """(prompt messages, chosen text, rejected text) per row; a bad row is an error naming the file, row and key."""
    path = Path(path)
    if path.suffix == ".parquet":
        import pandas as pd

        rows = pd.read_parquet(path).to_dict("records")
    else:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    pairs = []
    for i, row in enumerate(rows, 1):
        where = f"{path}: row {i}"
        for key in ("chosen", "rejected"):
            if key not in row:
                raise KeyError(f"{where}: no key {key!r} (keys: {sorted(row)})")
        before_c, chosen = _answer(row["chosen"], f"{where}: key 'chosen'")
        before_r, rejected = _answer(row["rejected"], f"{where}: key 'rejected'")
        if "prompt" in row and row["prompt"] is not None:
            prompt = _messages(row["prompt"], f"{where}: key 'prompt'")
        elif before_c and before_c == before_r:
            prompt = before_c
        else:
            raise KeyError(f"{where}: no 'prompt', and 'chosen' / 'rejected' do not carry the same one")
        pairs.append((prompt, chosen, rejected))
    return pairs


def pair_ids(tokenizer, pairs) -> list[tuple[list[int], list[int]]]:
    """The reward model's input ids of each pair's chosen and rejected answer, encoded as a run feeds it
    (``conversation_ids``: prompt with the generation prompt, answer, EOS)."""
    return [(conversation_ids(tokenizer, p, c), conversation_ids(tokenizer, p, r)) for p, c, r in pairs]


def _autocast(device: torch.device, dtype: torch.dtype):
    return torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)


def _context() -> WorkerContext:
    """This process's place: under ``torchrun`` (WORLD_SIZE > 1) the process group is started here (gloo on CPU,
    NCCL on GPU) and the model is sharded with FSDP2; otherwise one process, world size 1."""
    world, rank, local = (int(os.environ.get(k, d)) for k, d in (("WORLD_SIZE", 1), ("RANK", 0), ("LOCAL_RANK", 0)))
    device = torch.device(f"cuda:{local}") if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo",
                                device_id=device if device.type == "cuda" else None)
    return WorkerContext(rank, world, local, device)


def _sum_over_ranks(x: float, ctx: WorkerContext) -> float:
    if ctx.world_size == 1:
        return x
    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t)


@torch.no_grad()
def pair_accuracy(model, pairs_ids, pad_id: int, batch: int = 16, dtype: torch.dtype = torch.float32,
                  ctx: WorkerContext | None = None) -> float:
    """Share of pairs whose chosen side scores higher (the held-out metric); ``dtype``: the autocast dtype. With
    several ranks each scores every world_size-th pair, in as many forwards as every other rank (FSDP2 gathers
    layers collectively: a rank with no pairs left reruns its first and counts nothing)."""
    ctx = ctx or WorkerContext(0, 1, 0, next(model.parameters()).device)
    model.eval()
    mine = pairs_ids[ctx.rank::ctx.world_size]
    passes = -(-len(pairs_ids[0::ctx.world_size]) // batch)
    right = 0.0
    for i in range(passes):
        part = mine[i * batch:(i + 1) * batch]
        run = part or mine[:1] or pairs_ids[:1]
        with _autocast(ctx.device, dtype):
            s = batch_scores(model, [c for c, _ in run] + [r for _, r in run], pad_id, ctx.device)
        right += float((s[:len(part)] > s[len(run):len(run) + len(part)]).sum())
    return _sum_over_ranks(right, ctx) / max(len(pairs_ids), 1)


def save(model, tok, out: str | Path, history: dict, ctx: WorkerContext, architecture: str) -> None:
    """The HF folder (full weights gathered from the shards, rank 0 writes), replacing ``out`` only once it is
    complete: an interrupted save leaves the previous epoch's folder whole."""
    state = {n: full_tensor(p).cpu() for n, p in model.named_parameters()}  # every rank: the gathers are collective
    if ctx.rank == 0:
        out, partial = Path(out), Path(f"{out}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        model.save_pretrained(partial, state_dict=state, safe_serialization=True)
        config = json.loads((partial / "config.json").read_text())  # FSDP2 renamed the class: FSDP<name>
        (partial / "config.json").write_text(json.dumps(config | {"architectures": [architecture]}, indent=2))
        tok.save_pretrained(partial)
        (partial / "rm_train.json").write_text(json.dumps(history, indent=1))
        shutil.rmtree(out, ignore_errors=True)
        partial.rename(out)
    if ctx.world_size > 1:
        dist.barrier()


def train(model_name: str, train_pairs, val_pairs, out: str | Path | None = None, epochs: int = 1,
          lr: float = 1e-5, batch: int = 8, seed: int = 0, dtype: torch.dtype | None = None,
          log_every: int = 0) -> dict:
    """Bradley-Terry training; returns {"val_accuracy_start", "val_accuracy", "train_loss"} per epoch's end, and
    writes ``out`` after every epoch. ``dtype``: the compute dtype (autocast; with FSDP2 also its parameter
    dtype); None = bf16 where it is fast, else fp32. ``log_every``: print the mean loss of every so many optimizer
    steps (0 = only at the end). Under ``torchrun`` each mini-batch of ``batch`` pairs is split over the ranks and
    its loss is the same mean over the whole mini-batch as in one process."""
    from core.train.sharding import fsdp_wrap
    from core.models import default_dtype, load_tokenizer

    ctx = _context()
    if batch % ctx.world_size:
        raise ValueError(f"--batch {batch} pairs must divide over the {ctx.world_size} ranks")
    if len(train_pairs) < batch:
        raise ValueError(f"{len(train_pairs)} training pairs: fewer than one mini-batch (--batch {batch})")
    say = print if ctx.rank == 0 and log_every else (lambda *a, **k: None)
    torch.manual_seed(seed)
    model, tok = load_reward_model(model_name).to(ctx.device), load_tokenizer(model_name)
    dtype = default_dtype(ctx.device) if dtype is None else dtype
    architecture = type(model).__name__
    if ctx.world_size > 1:
        model = fsdp_wrap(model, ctx, dtype, "none")
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    model.config.pad_token_id = pad
    train_ids, val_ids = pair_ids(tok, train_pairs), pair_ids(tok, val_pairs)
    optim = torch.optim.AdamW(model.parameters(), lr=lr)
    history = {"val_accuracy_start": pair_accuracy(model, val_ids, pad, dtype=dtype, ctx=ctx), "val_accuracy": [],
               "train_loss": [], "compute_dtype": str(dtype).removeprefix("torch."), "world_size": ctx.world_size}
    say(f"{len(train_ids)} train pairs, {len(val_ids)} held-out pairs, {ctx.world_size} rank(s); held-out pair "
        f"accuracy before training {history['val_accuracy_start']:.3f} (compute dtype {history['compute_dtype']})",
        flush=True)
    order = list(range(len(train_ids)))
    steps = len(order) // batch  # a last mini-batch smaller than --batch is dropped (it would not split evenly)
    for epoch in range(epochs):
        random.Random(seed + epoch).shuffle(order)
        model.train()
        losses = []
        for i in range(steps):
            part = [train_ids[j] for j in order[i * batch:(i + 1) * batch]][ctx.rank::ctx.world_size]
            with _autocast(ctx.device, dtype):
                s = batch_scores(model, [c for c, _ in part] + [r for _, r in part], pad, ctx.device)
            loss, _ = bradley_terry_loss(s[:len(part)], s[len(part):])  # this rank's mean: FSDP2 averages ranks
            optim.zero_grad()
            loss.backward()
            optim.step()
            losses.append(_sum_over_ranks(loss.item(), ctx) / ctx.world_size)
            if log_every and len(losses) % log_every == 0:
                say(f"epoch {epoch + 1} step {len(losses)}/{steps}: loss {sum(losses[-log_every:]) / log_every:.4f}",
                    flush=True)
        history["train_loss"].append(sum(losses) / len(losses))
        history["val_accuracy"].append(pair_accuracy(model, val_ids, pad, dtype=dtype, ctx=ctx))
        say(f"epoch {epoch + 1}: train loss {history['train_loss'][-1]:.4f}, held-out pair accuracy "
            f"{history['val_accuracy'][-1]:.3f}", flush=True)
        if out is not None:
            save(model, tok, out, history, ctx, architecture)
    return history


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m core.rm_train", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="HF id or folder: a causal LM (gets a new score head) or an RM")
    p.add_argument("--train", required=True, help="preference pairs (.jsonl / .parquet)")
    p.add_argument("--val", required=True, help="held-out pairs: accuracy before and after each epoch")
    p.add_argument("--out", required=True, help="the reward model's folder")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--batch", type=int, default=8, help="pairs per optimizer step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=20, help="print the mean loss of every N optimizer steps")
    p.add_argument("--dtype", default="auto", help="compute dtype under autocast: auto (bf16 where fast), bfloat16, float32")
    a = p.parse_args(argv)
    dtype = None if a.dtype == "auto" else resolve_dtype(a.dtype)
    h = train(a.model, load_pairs(a.train), load_pairs(a.val), a.out, a.epochs, a.lr, a.batch, a.seed, dtype,
              log_every=a.log_every)
    leave_process_group()
    if int(os.environ.get("RANK", 0)) == 0:
        print(f"held-out pair accuracy {h['val_accuracy_start']:.3f} -> {h['val_accuracy'][-1]:.3f}; "
              f"train loss per epoch {', '.join(f'{x:.4f}' for x in h['train_loss'])}; written to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
