"""Processors of the vision-language models we run, without torchvision (transformers' default image processors
and its video-processor registry need it, and it is not a dependency): each turns prompt text with ``<image>``
placeholders and the images into token ids and the model's vision tensors.

- Idefics3 / SmolVLM (``make_idefics3_processor``): transformers' ``Idefics3Processor`` on its PIL image processor;
  ``<image>`` is the model's own image token, expanded into ``<fake_token_around_image><global-img>`` + a fixed
  run of ``<image>`` + ``<fake_token_around_image>``; ``pixel_values`` (1, images, 3, H, W).
- Qwen2-VL / Qwen2.5-VL (``QwenVLProcessor``): ``Qwen2VLImageProcessorPil`` resizes each image to a multiple of
  ``patch_size x merge_size`` within ``[min_pixels, max_pixels]`` and cuts it into patches; each ``<image>``
  becomes ``<|vision_start|>`` + grid_t x grid_h x grid_w / merge_size^2 ``<|image_pad|>`` + ``<|vision_end|>``
  (what Qwen's chat template writes for an image item, then Qwen2VLProcessor's expansion). ``pixel_values``
  (patches, 3 x temporal_patch x patch^2) -- no batch dimension: a prompt's images are concatenated -- and
  ``image_grid_thw`` (images, 3). Example: a 64 x 48 image, patch 8, merge 2 -> grid (1, 6, 8), 48 patches of
  3 x 2 x 8 x 8 = 384 values, 12 ``<|image_pad|>`` tokens.

``load_processor(folder)`` rebuilds whichever the folder saved (``processor_config.json`` for Idefics3,
``preprocessor_config.json`` with a Qwen2-VL image processor for the Qwen family).
"""

from __future__ import annotations

import json
from pathlib import Path

from core.data.multimodal import PLACEHOLDER

QWEN_VISION_TOKENS = ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>")


class QwenVLProcessor:
    """Qwen2-VL / Qwen2.5-VL prompts (see the module docstring): ``tokenizer`` holds the vision tokens,
    ``image_processor`` is a ``Qwen2VLImageProcessorPil``. Returns input_ids, attention_mask, mm_token_type_ids
    (1 on image tokens: the model's M-RoPE needs them), and with images pixel_values and image_grid_thw."""

    def __init__(self, tokenizer, image_processor):
        self.tokenizer, self.image_processor = tokenizer, image_processor
        missing = [t for t in QWEN_VISION_TOKENS[:3] if t not in tokenizer.get_vocab()]
        if missing:
            raise ValueError(f"the tokenizer has no {missing}: not a Qwen2-VL-family tokenizer")
        self.image_token_id = tokenizer.convert_tokens_to_ids("<|image_pad|>")

    def __call__(self, text: list[str], images: list[list] | None = None, return_tensors: str = "pt"):
        from transformers import BatchFeature

        per_text = images or [[] for _ in text]
        flat = [im for imgs in per_text for im in imgs]
        vision = dict(self.image_processor(images=flat, return_tensors="pt")) if flat else {}
        runs = iter((vision["image_grid_thw"].prod(-1) // self.image_processor.merge_size ** 2).tolist()
                    if flat else [])
        expanded = []
        for k, (t, imgs) in enumerate(zip(text, per_text)):
            if t.count(PLACEHOLDER) != len(imgs):
                raise ValueError(f"text {k}: {t.count(PLACEHOLDER)} {PLACEHOLDER} placeholder(s), {len(imgs)} image(s)")
            parts = t.split(PLACEHOLDER)
            expanded.append(parts[0] + "".join(f"<|vision_start|>{'<|image_pad|>' * next(runs)}<|vision_end|>{p}"
                                               for p in parts[1:]))
        enc = self.tokenizer(expanded, return_tensors="pt", padding=True, add_special_tokens=False)
        enc["mm_token_type_ids"] = (enc["input_ids"] == self.image_token_id).int()
        return BatchFeature({**enc, **vision}, tensor_type=return_tensors)

    def save_pretrained(self, path: str | Path) -> None:
        self.tokenizer.save_pretrained(path)
        self.image_processor.save_pretrained(path)


def make_idefics3_processor(tokenizer, image_size: int, image_seq_len: int):
    """Idefics3's processor on its PIL image processor: resize to ``image_size``, no tiling, ``image_seq_len``
    image tokens per image."""
    from transformers import Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    image_processor = Idefics3ImageProcessorPil(do_image_splitting=False, size={"longest_edge": image_size},
                                                max_image_size={"longest_edge": image_size})
    return Idefics3Processor(image_processor=image_processor, tokenizer=tokenizer, image_seq_len=image_seq_len)


def saved_processor(path: Path) -> str | None:
    """Which processor a model folder saved: "idefics3", "qwen_vl", or None (a text-only model)."""
    if (path / "processor_config.json").is_file():
        saved = json.loads((path / "processor_config.json").read_text())
        if "image_seq_len" in saved:
            return "idefics3"
    pre = path / "preprocessor_config.json"
    if pre.is_file() and json.loads(pre.read_text()).get("image_processor_type", "").startswith("Qwen2VL"):
        return "qwen_vl"
    return None


def processor_for(name_or_path: str):
    """The model's processor when it is a vision-language model with one saved, else None (a text-only model:
    prompts go through its chat template alone)."""
    from core.models import resolve_model

    path = Path(resolve_model(name_or_path))
    return load_processor(path) if saved_processor(path) else None


def load_processor(path: str | Path):
    """The folder's processor, rebuilt on the PIL image processors from its saved settings."""
    from core.models import load_tokenizer

    path = Path(path)
    kind = saved_processor(path)
    if kind == "idefics3":
        saved = json.loads((path / "processor_config.json").read_text())
        return make_idefics3_processor(load_tokenizer(str(path)), saved["image_processor"]["size"]["longest_edge"],
                                       saved["image_seq_len"])
    if kind == "qwen_vl":
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        return QwenVLProcessor(load_tokenizer(str(path)), Qwen2VLImageProcessorPil.from_pretrained(str(path)))
    raise ValueError(f"{path}: no processor_config.json (Idefics3) or Qwen2-VL preprocessor_config.json")
