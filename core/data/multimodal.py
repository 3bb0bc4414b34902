"""Image prompts in verl's multimodal row format: an ``images`` column (a list per row: ``{"bytes": ...}`` or
``{"path": ...}`` dicts as parquet stores them, raw bytes, or PIL images) and ``<image>`` placeholders in the
prompt's text, one per image, in order. Counted against each other at load -- a mismatch is an error naming the
file and row (the "image features and image tokens do not match" failure, caught before any model sees it) -- and
decoded once, to RGB PIL images.

    row = {"prompt": [{"role": "user", "content": "<image>What colour is the shape?"}],
           "images": [{"bytes": png_bytes}], ...}
    images_of(row, "train.parquet: row 3") -> [<PIL.Image RGB>]
    chat_content(row["prompt"]) -> [{"role": "user", "content": [{"type": "image"},
                                                                 {"type": "text", "text": "What colour is the shape?"}]}]
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

PLACEHOLDER = "<image>"


def count_placeholders(messages: list[dict]) -> int:
    """``<image>`` placeholders in a chat's text contents."""
    return sum(m["content"].count(PLACEHOLDER) for m in messages if isinstance(m.get("content"), str))


def _decode(image: Any, where: str):
    from PIL import Image

    if isinstance(image, Image.Image):
        return image.convert("RGB")
    if isinstance(image, dict):
        if image.get("bytes") is not None:
            image = image["bytes"]
        elif image.get("path"):
            image = image["path"]
        else:
            raise ValueError(f"{where}: an image dict needs 'bytes' or 'path', got keys {sorted(image)}")
    try:
        if isinstance(image, (bytes, bytearray)):
            return Image.open(io.BytesIO(image)).convert("RGB")
        if isinstance(image, (str, Path)):
            return Image.open(image).convert("RGB")
    except (OSError, ValueError) as e:
        raise ValueError(f"{where}: cannot decode the image ({type(e).__name__}: {e})") from None
    raise ValueError(f"{where}: an image must be bytes, a path, a {{bytes|path}} dict or a PIL image, "
                     f"got {type(image).__name__}")


def images_of(row: dict, where: str) -> list:
    """The row's images decoded to RGB PIL images, after checking that the prompt has one ``<image>`` per image
    (``where`` names the file and row in every error). A row without images and without placeholders -> []."""
    images = row.get("images")
    if hasattr(images, "tolist"):
        images = images.tolist()
    images = [] if images is None or isinstance(images, float) else list(images)  # float: a NaN cell in parquet
    placeholders = count_placeholders(row["prompt"])
    if placeholders != len(images):
        raise ValueError(f"{where}: the prompt has {placeholders} {PLACEHOLDER} placeholder(s) but 'images' holds "
                         f"{len(images)} image(s); each image needs exactly one {PLACEHOLDER} where it goes")
    return [_decode(image, f"{where}: image {k + 1}") for k, image in enumerate(images)]


def chat_content(messages: list[dict]) -> list[dict]:
    """The chat with each text content split at its placeholders into the structured parts multimodal chat
    templates take: ``{"type": "image"}`` where an image goes, ``{"type": "text", "text": ...}`` around it."""
    out = []
    for m in messages:
        content = m.get("content")
        if not isinstance(content, str) or PLACEHOLDER not in content:
            out.append(dict(m))
            continue
        parts = []
        for k, text in enumerate(content.split(PLACEHOLDER)):
            if k:
                parts.append({"type": "image"})
            if text:
                parts.append({"type": "text", "text": text})
        out.append(dict(m, content=parts))
    return out


def png_bytes(image) -> dict:
    """A PIL image as parquet stores it in verl's format: ``{"bytes": <png>}``."""
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return {"bytes": buf.getvalue()}
