"""Data for this recipe -> verl-schema parquet with images under outputs/data (``hybridrl data prepare vlm`` writes
what a config names; ``python recipes/vlm/data.py --help`` lists the datasets).

  vlm_shapes  the CPU tier: a 64 x 64 picture of one shape (square, circle or triangle) in one of four colours (red,
              green, blue, yellow) at a random place and size on a grey background; the question asks its colour, so
              the answer needs the image (chance: 1 in 4). Held out by content: a picture's (colour, shape, x, y,
              size) whose sha256 starts with 0 or 1 (1/8) is a test picture; training pictures are drawn from the
              rest. Also `align.parquet`: captions ("A red circle.") of other training pictures for the connector's
              supervised alignment (align.py). -> vlm_shapes/ And `test_blank.parquet`: the test questions with every
              picture replaced by the empty grey background (data source hybridrl/vlm_shapes_blank): the policy must
              be at chance there (the proof that it reads the image).
  geo3k       the full-scale script's data: Geometry3K (hiyouga/geometry3k: 2,101 train / 601 test problems, one
              diagram each, the problem text starting with <image>) as verl's examples/data_preprocess/geo3k.py writes
              it: the problem + verl's instruction (think in <think> </think>, answer in \\boxed{}), the answer as
              ground truth. The hub (needs `datasets` and a network) or --src geo3k=DIR, a folder holding the hub's
              parquet files (data/{train,test}-00000-of-00001.parquet, or {train,test}.parquet). The test split is
              held out by content too: a train row whose problem text and image bytes equal a test row's is dropped
              (the count is printed). -> geo3k/
"""

from __future__ import annotations

import hashlib
import random
import sys
from pathlib import Path

from PIL import Image, ImageDraw

from core.data.multimodal import png_bytes
from core.data.prepare import write_parquet
from core.data.recipe_data import Dataset, data_cli

GEO3K = "hiyouga/geometry3k"
# verl's examples/data_preprocess/geo3k.py instruction, appended to every problem
GEO3K_INSTRUCTION = (r"You FIRST think about the reasoning process as an internal monologue and then provide the final "
                     r"answer. The reasoning process MUST BE enclosed within <think> </think> tags. The final answer "
                     r"MUST BE put in \boxed{}.")

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


def geo3k_records(split: str, src: str) -> tuple[list[dict], str]:
    """Geometry3K's raw rows of ``split`` and where they came from: the hub, or a folder of its parquet files."""
    if src == "hub":
        try:
            import datasets
        except ImportError:
            raise RuntimeError("--src hub needs `datasets` (pip install -e '.[hub]') and a network; or pass the "
                               "folder of a downloaded copy") from None
        rows = [dict(r) for r in datasets.load_dataset(GEO3K, split=split)]
        return [dict(r, images=[png_bytes(im) for im in r["images"]]) for r in rows], f"hub:{GEO3K}[{split}]"
    import pyarrow.parquet as pq

    for path in (Path(src) / "data" / f"{split}-00000-of-00001.parquet", Path(src) / f"{split}.parquet"):
        if path.is_file():
            return pq.read_table(path).to_pylist(), str(path)
    raise FileNotFoundError(f"geo3k {split}: no {split}-00000-of-00001.parquet under {Path(src) / 'data'} nor "
                            f"{split}.parquet in {src} (--src DIR of the hub's files, or --src hub)")


def geo3k_rows(records: list[dict], split: str, where: str) -> list[dict]:
    """verl-schema rows; a record without problem / answer / images names ``where`` and its row (1-based)."""
    rows = []
    for i, r in enumerate(records):
        missing = [k for k in ("problem", "answer", "images") if r.get(k) in (None, "", [])]
        if missing:
            raise ValueError(f"{where}: row {i + 1}: no {', '.join(missing)}")
        rows.append({"data_source": GEO3K, "ability": "math", "images": list(r["images"]),
                     "prompt": [{"role": "user", "content": f"{r['problem']} {GEO3K_INSTRUCTION}"}],
                     "reward_model": {"style": "rule", "ground_truth": str(r["answer"])},
                     "extra_info": {"split": split, "index": i, "answer": str(r["answer"]), "question": r["problem"]}})
    return rows


def content_key(row: dict) -> str:
    """A row's content: its problem text and its images' bytes."""
    digest = hashlib.sha256(row["extra_info"]["question"].encode())
    for image in row["images"]:
        digest.update(image["bytes"] if isinstance(image, dict) else bytes(image))
    return digest.hexdigest()


def write_geo3k(out: str | Path, src: str) -> dict[str, Path]:
    """``<out>/geo3k/{train,test}.parquet``; train rows whose content is a test row's are dropped."""
    records, where = geo3k_records("test", src)
    test = geo3k_rows(records, "test", where)
    records, where = geo3k_records("train", src)
    train = geo3k_rows(records, "train", where)
    held = {content_key(r) for r in test}
    kept = [r for r in train if content_key(r) not in held]
    paths = {"train": Path(out) / "geo3k" / "train.parquet", "test": Path(out) / "geo3k" / "test.parquet"}
    for name, rows in (("train", kept), ("test", test)):
        write_parquet(rows, paths[name])
        print(f"geo3k {name}: {len(rows)} rows -> {paths[name]}")
    print(f"geo3k train: {len(train) - len(kept)} row(s) dropped, their problem and image equal a test row's")
    return paths


DATASETS = {
    "vlm_shapes": Dataset(lambda out, src: write(out), "a shape's colour in a 64 x 64 picture, test held out by "
                                                       "content; the caption set and the blank control"),
    "geo3k": Dataset(lambda out, src: write_geo3k(out, src or "hub"),
                     "Geometry3K as verl prepares it (the hub, or --src geo3k=DIR)"),
}

if __name__ == "__main__":
    sys.exit(data_cli(DATASETS, __doc__))
