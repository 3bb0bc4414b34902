"""Stage 1 of this recipe: supervised alignment of the fresh vision side (SigLIP-style encoder + connector) to the
frozen SmolLM2 text model, on captions of training pictures ("A red circle."), before RL. The text model is not
trained here: RL later starts from SmolLM2's own language and a vision side that describes what it sees.

    python recipes/vlm/align.py [--steps 150] [--out outputs/models/smolvlm_shapes]

Writes an HF folder (model, tokenizer, processor) that config.yaml's actor and rollout load, and prints the
caption loss and the held-out caption colour accuracy (greedy, test pictures) before and after.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch

from core.data.dataset import load_rl_parquet
from core.vision_models import load_vlm, smolvlm_from_smollm2
from core.vision_processors import load_processor

HERE = Path(__file__).resolve().parent


def batch_inputs(processor, rows: list[dict]) -> dict[str, torch.Tensor]:
    """The chats (picture, "Describe the picture.", caption) as model inputs with labels on the caption only."""
    tok = processor.tokenizer
    prompts = [tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in rows]
    full = [p + r["ground_truth"] + "<|im_end|>" for p, r in zip(prompts, rows)]
    images = [r["images"] for r in rows]
    enc = processor(text=full, images=images, return_tensors="pt", padding=True)
    # the caption starts after the last assistant header (found in the ids: no second pass through the processor)
    header = tok.encode("<|im_start|>assistant\n", add_special_tokens=False)
    labels = enc["input_ids"].clone()
    labels[enc["attention_mask"] == 0] = -100
    for b, ids in enumerate(enc["input_ids"].tolist()):
        start = max(i for i in range(len(ids)) if ids[i:i + len(header)] == header) + len(header)
        labels[b, :start] = -100
    return dict(enc) | {"labels": labels}


@torch.no_grad()
def caption_accuracy(model, processor, rows: list[dict]) -> float:
    """Greedy captions of held-out pictures: the share that name the right colour (and no other)."""
    from core.config import SamplingParams
    from core.rollout.engine import RolloutEngine
    from core.data.vision_inputs import vision_prompt_ids

    engine = RolloutEngine(model, processor.tokenizer, pack_weights=False, decode_attention=False)
    ids, vision = vision_prompt_ids(processor, [r["prompt"] for r in rows], [r["images"] for r in rows])
    out = engine.generate(ids, SamplingParams(temperature=0.0, max_new_tokens=8), vision=vision)
    texts = engine.decode(out)
    colours = ("red", "green", "blue", "yellow")
    right = [r["extra_info"]["colour"] in t.lower() and sum(c in t.lower() for c in colours) == 1
             for r, t in zip(rows, texts)]
    return sum(right) / len(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="outputs/data/vlm_shapes")
    p.add_argument("--out", default="outputs/models/smolvlm_shapes")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    torch.manual_seed(a.seed)
    out = Path(a.out)
    base = out.with_name(out.name + "_base")  # SmolLM2 + a fresh vision side, built once
    if not (base / "config.json").is_file():
        smolvlm_from_smollm2(base)
    model, processor = load_vlm(base), load_processor(base)
    rows = load_rl_parquet(Path(a.data) / "align.parquet")
    held = [r | {"prompt": [{"role": "user", "content": "<image>Describe the picture."}]}
            for r in load_rl_parquet(Path(a.data) / "test.parquet")[:64]]
    trained = [p_ for n, p_ in model.named_parameters() if "vision_model" in n or "connector" in n]
    for n, p_ in model.named_parameters():
        p_.requires_grad_("vision_model" in n or "connector" in n)
    print(f"align: {sum(t.numel() for t in trained) / 1e6:.2f}M vision + connector parameters trained, text frozen; "
          f"held-out caption colour accuracy before: {caption_accuracy(model, processor, held):.3f}", flush=True)
    optim = torch.optim.AdamW(trained, lr=a.lr, weight_decay=0.0)
    rng, start = random.Random(a.seed), time.time()
    model.train()
    for step in range(1, a.steps + 1):
        loss = model(**batch_inputs(processor, rng.sample(rows, a.batch))).loss
        optim.zero_grad()
        loss.backward()
        optim.step()
        if step % 10 == 0 or step == 1:
            print(f"align step {step}: caption loss {loss.item():.3f} ({time.time() - start:.0f}s)", flush=True)
    model.eval()
    print(f"align: held-out caption colour accuracy after {a.steps} steps: "
          f"{caption_accuracy(model, processor, held):.3f} ({time.time() - start:.0f}s)", flush=True)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    print(f"align: wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
