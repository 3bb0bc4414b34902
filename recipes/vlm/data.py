"""Data for this recipe -> verl-schema parquet with images under --out.

  --task shapes  the CPU tier: a 64 x 64 picture of one shape (square, circle or triangle) in one of four colours
                 (red, green, blue, yellow) at a random place and size on a grey background; the question asks its
                 colour, so the answer needs the image (chance: 1 in 4). Held out by content: a picture's
                 (colour, shape, x, y, size) whose sha256 starts with 0 or 1 (1/8) is a test picture; training
                 pictures are drawn from the rest. Also `align.parquet`: captions ("A red circle.") of other
                 training pictures for the connector's supervised alignment (align.py).  -> vlm_shapes/
                 And `test_blank.parquet`: the test questions with every picture replaced by the empty grey
                 background (data source hybridrl/vlm_shapes_blank): the policy must be at chance there (the proof
                 that it reads the image).

Usage: python recipes/vlm/data.py [--out outputs/data] [--seed 0]
"""

from __future__ import annotations

import argparse
import hashlib
import random
from pathlib import Path

from PIL import Image, ImageDraw

from core.data.multimodal import png_bytes
from core.data.prepare import write_parquet

SOURCE = "hybridrl/vlm_shapes"
FOLDER = "vlm_shapes"
SIZE = 64
COLOURS = {"red": (215, 35, 35), "green": (35, 165, 45), "blue": (40, 70, 215), "yellow": (225, 205, 30)}
SHAPES = ("square", "circle", "triangle")
BACKGROUND = (190, 190, 190)
QUESTION = "<image>What colour is the shape in the picture? Answer with one word."
CAPTION_PROMPT = "<image>Describe the picture."


def held_out(colour: str, shape: str, x: int, y: int, size: int) -> bool:
    return hashlib.sha256(f"{colour}:{shape}:{x}:{y}:{size}".encode()).hexdigest()[0] in "01"


def draw(colour: str | None, shape: str, x: int, y: int, size: int) -> Image.Image:
    """The picture; ``colour=None``: the empty background (the blank control)."""
    image = Image.new("RGB", (SIZE, SIZE), BACKGROUND)
    if colour is not None:
        pen, box = ImageDraw.Draw(image), (x, y, x + size, y + size)
        fill = COLOURS[colour]
        if shape == "square":
            pen.rectangle(box, fill=fill)
        elif shape == "circle":
            pen.ellipse(box, fill=fill)
        else:
            pen.polygon([(x + size // 2, y), (x, y + size), (x + size, y + size)], fill=fill)
    return image


def pictures(split: str, count: int, seed: int = 0) -> list[tuple]:
    """``count`` distinct (colour, shape, x, y, size) of ``split``, drawn by a generator seeded with the split; the
    test split cycles through the colours (as many of each: a policy blind to the picture scores 1/4 at best)."""
    rng, out, seen = random.Random(f"vlm-shapes-{split}-{seed}"), [], set()
    while len(out) < count:
        size = rng.randint(14, 40)
        colour = list(COLOURS)[len(out) % len(COLOURS)] if split == "test" else rng.choice(list(COLOURS))
        key = (colour, rng.choice(SHAPES), rng.randint(0, SIZE - size), rng.randint(0, SIZE - size), size)
        if key in seen or held_out(*key) != (split == "test"):
            continue
        seen.add(key)
        out.append(key)
    return out


def row(key: tuple, split: str, index: int, blank: bool = False, caption: bool = False) -> dict:
    colour, shape = key[0], key[1]
    image = draw(None if blank else colour, *key[1:])
    prompt = CAPTION_PROMPT if caption else QUESTION
    return {"data_source": SOURCE + ("_blank" if blank else ""), "prompt": [{"role": "user", "content": prompt}],
            "ability": "vision", "images": [png_bytes(image)],
            "reward_model": {"style": "rule", "ground_truth": f"A {colour} {shape}." if caption else colour},
            "extra_info": {"split": split, "index": index, "colour": colour, "shape": shape, "blank": blank}}


def write(out: str | Path, train: int = 2000, test: int = 96, align: int = 2000, seed: int = 0) -> dict[str, Path]:
    folder, paths = Path(out) / FOLDER, {}
    train_keys = pictures("train", train + align, seed)
    test_keys = pictures("test", test, seed)
    parts = {"train": [row(k, "train", i) for i, k in enumerate(train_keys[:train])],
             "align": [row(k, "align", i, caption=True) for i, k in enumerate(train_keys[train:])],
             "test": [row(k, "test", i) for i, k in enumerate(test_keys)],
             "test_blank": [row(k, "test", i, blank=True) for i, k in enumerate(test_keys)]}
    for name, rows in parts.items():
        paths[name] = folder / f"{name}.parquet"
        write_parquet(rows, paths[name])
        print(f"vlm_shapes {name}: {len(rows)} rows -> {paths[name]}")
    return paths


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="outputs/data")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    write(a.out, seed=a.seed)
