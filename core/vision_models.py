"""A small vision-language model that runs on CPU, built offline: SmolVLM's architecture (Idefics3: a SigLIP-style
vision encoder, a pixel-shuffle connector, a Llama text model) with SmolLM2-135M-Instruct's weights as the text
model -- SmolVLM's own text backbone is SmolLM2 -- and a small, freshly initialised vision encoder and connector.
No VLM weights are reachable offline, so the vision side starts random: a recipe aligns it first (a short supervised
stage) and then trains with RL.

    path = smolvlm_from_smollm2(out)           # an HF folder: model, tokenizer (+3 image tokens), processor
    model = load_vlm(path, torch.float32)       # Idefics3ForConditionalGeneration
    processor = load_processor(path)            # Idefics3Processor on the PIL image processor (no torchvision)

Each image becomes ``<fake_token_around_image><global-img>`` + ``image_seq_len`` ``<image>`` tokens +
``<fake_token_around_image>``: with the defaults a 64 x 64 image is 8 x 8 patches of 8 pixels, pixel-shuffled by
2 into 16 tokens. Images are resized to ``image_size`` and never split into tiles.
"""

from __future__ import annotations

from pathlib import Path

import torch

IMAGE_TOKENS = ("<fake_token_around_image>", "<image>", "<global-img>")


def smolvlm_from_smollm2(out: str | Path, image_size: int = 64, patch_size: int = 8, scale_factor: int = 2,
                         vision_hidden: int = 192, vision_layers: int = 2, vision_heads: int = 4,
                         seed: int = 0) -> Path:
    """Write the model to ``out`` (see the module docstring); returns ``out``. The text model's weights are
    SmolLM2's exactly; the three new token embeddings start at the mean of the others."""
    from transformers import AutoModelForCausalLM, Idefics3Config, Idefics3ForConditionalGeneration

    from core.models import load_tokenizer, resolve_model

    if image_size % (patch_size * scale_factor):
        raise ValueError(f"image_size {image_size} must be a multiple of patch_size x scale_factor "
                         f"({patch_size} x {scale_factor})")
    text_path = resolve_model("SmolLM2-135M-Instruct")
    tok = load_tokenizer(text_path)
    tok.add_special_tokens({"additional_special_tokens": list(IMAGE_TOKENS)})
    text = AutoModelForCausalLM.from_pretrained(text_path, dtype=torch.float32)
    cfg = Idefics3Config(text_config=text.config.to_dict() | {"vocab_size": len(tok)},
                         vision_config=dict(hidden_size=vision_hidden, intermediate_size=4 * vision_hidden,
                                            num_hidden_layers=vision_layers, num_attention_heads=vision_heads,
                                            image_size=image_size, patch_size=patch_size),
                         image_token_id=tok.convert_tokens_to_ids("<image>"), scale_factor=scale_factor,
                         tie_word_embeddings=text.config.tie_word_embeddings, pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    model = Idefics3ForConditionalGeneration(cfg)
    with torch.no_grad():
        old = text.model.embed_tokens.weight
        embed = model.model.text_model.embed_tokens.weight
        embed[: len(old)] = old
        embed[len(old):] = old.mean(0)
        missing, unexpected = model.model.text_model.load_state_dict(
            {k: v for k, v in text.model.state_dict().items() if k != "embed_tokens.weight"}, strict=False)
        if unexpected or set(missing) != {"embed_tokens.weight"}:
            raise RuntimeError(f"SmolLM2 -> Idefics3 text model: missing {missing}, unexpected {unexpected}")
        if not cfg.tie_word_embeddings:
            model.lm_head.weight[: len(old)] = text.lm_head.weight
    out = Path(out)
    model.save_pretrained(out)
    processor = make_processor(tok, image_size, (image_size // (patch_size * scale_factor)) ** 2)
    processor.save_pretrained(out)
    return out


def make_processor(tokenizer, image_size: int, image_seq_len: int):
    """Idefics3's processor on its PIL image processor (transformers' default one needs torchvision): resize to
    ``image_size``, no tiling, ``image_seq_len`` image tokens per image."""
    from transformers import Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    image_processor = Idefics3ImageProcessorPil(do_image_splitting=False, size={"longest_edge": image_size},
                                                max_image_size={"longest_edge": image_size})
    return Idefics3Processor(image_processor=image_processor, tokenizer=tokenizer, image_seq_len=image_seq_len)


def load_vlm(path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
    from transformers import Idefics3ForConditionalGeneration

    return Idefics3ForConditionalGeneration.from_pretrained(path, dtype=dtype).to(device).eval()


def processor_for(name_or_path: str):
    """The model's processor when it is a vision-language model with one saved (``processor_config.json``), else
    None (a text-only model: prompts go through its chat template alone)."""
    from core.models import resolve_model

    path = Path(resolve_model(name_or_path))
    return load_processor(path) if (path / "processor_config.json").is_file() else None


def load_processor(path: str | Path):
    """The folder's processor (``processor_config.json``), rebuilt on the PIL image processor from its saved sizes."""
    import json

    from core.models import load_tokenizer

    saved = json.loads((Path(path) / "processor_config.json").read_text())
    return make_processor(load_tokenizer(str(path)), saved["image_processor"]["size"]["longest_edge"],
                          saved["image_seq_len"])
