"""``python -m core.rm_train --model M --train pairs.jsonl --val held_out.jsonl --out DIR``: a reward model from
preference pairs, by Bradley-Terry.

Pairs follow TRL's and verl's preference schema, one per row (.jsonl or .parquet): ``chosen`` and ``rejected``,
each a text or a conversation (a list of {role, content} whose last turn is the assistant's), and a ``prompt``
(a text or a conversation) unless the two conversations carry it. Each side goes through the reward model's chat
template as a run feeds it (``core.engines.reward_model.conversation_ids``: the prompt with the generation prompt,
the answer's tokens, EOS).

Training: one process (this first version: no FSDP2; a model that fits one device), AdamW on
-log sigmoid(r_chosen - r_rejected) over mini-batches of pairs, the held-out pair accuracy before and after each
epoch. The folder written loads with ``AutoModelForSequenceClassification`` (``core.engines.reward_model``), with
its tokenizer, and serves ``reward_model.model`` in a run.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch

from core.engines.reward_model import batch_scores, bradley_terry_loss, conversation_ids, load_reward_model


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


@torch.no_grad()
def pair_accuracy(model, pairs_ids, pad_id: int, batch: int = 16) -> float:
    """Share of pairs whose chosen side scores higher (the held-out metric)."""
    model.eval()
    right = 0.0
    for i in range(0, len(pairs_ids), batch):
        part = pairs_ids[i:i + batch]
        s = batch_scores(model, [c for c, _ in part] + [r for _, r in part], pad_id, next(model.parameters()).device)
        right += float((s[:len(part)] > s[len(part):]).sum())
    return right / max(len(pairs_ids), 1)


def train(model_name: str, train_pairs, val_pairs, out: str | Path | None = None, epochs: int = 1,
          lr: float = 1e-5, batch: int = 8, seed: int = 0) -> dict:
    """Bradley-Terry training; returns {"val_accuracy_start", "val_accuracy", "train_loss"} per epoch's end."""
    from core.models import load_tokenizer

    torch.manual_seed(seed)
    model, tok = load_reward_model(model_name), load_tokenizer(model_name)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    model.config.pad_token_id = pad
    train_ids, val_ids = pair_ids(tok, train_pairs), pair_ids(tok, val_pairs)
    optim = torch.optim.AdamW(model.parameters(), lr=lr)
    history = {"val_accuracy_start": pair_accuracy(model, val_ids, pad), "val_accuracy": [], "train_loss": []}
    order = list(range(len(train_ids)))
    for epoch in range(epochs):
        random.Random(seed + epoch).shuffle(order)
        model.train()
        losses = []
        for i in range(0, len(order), batch):
            part = [train_ids[j] for j in order[i:i + batch]]
            s = batch_scores(model, [c for c, _ in part] + [r for _, r in part], pad, device)
            loss, _ = bradley_terry_loss(s[:len(part)], s[len(part):])
            optim.zero_grad()
            loss.backward()
            optim.step()
            losses.append(loss.item())
        history["train_loss"].append(sum(losses) / len(losses))
        history["val_accuracy"].append(pair_accuracy(model, val_ids, pad))
    if out is not None:
        model.cpu().save_pretrained(out, safe_serialization=True)
        tok.save_pretrained(out)
        (Path(out) / "rm_train.json").write_text(json.dumps(history, indent=1))
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
    a = p.parse_args(argv)
    h = train(a.model, load_pairs(a.train), load_pairs(a.val), a.out, a.epochs, a.lr, a.batch, a.seed)
    print(f"held-out pair accuracy {h['val_accuracy_start']:.3f} -> {h['val_accuracy'][-1]:.3f}; "
          f"train loss per epoch {', '.join(f'{x:.4f}' for x in h['train_loss'])}; written to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
