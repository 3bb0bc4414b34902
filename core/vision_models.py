"""Vision-language models that run on CPU, built offline.

``smolvlm_from_smollm2``: SmolVLM's architecture (Idefics3: a SigLIP-style
vision encoder, a pixel-shuffle connector, a Llama text model) with SmolLM2-135M-Instruct's weights as the text
model -- SmolVLM's own text backbone is SmolLM2 -- and a small, freshly initialised vision encoder and connector.
No VLM weights are reachable offline, so the vision side starts random: a recipe aligns it first (a short supervised
stage) and then trains with RL.

    path = smolvlm_from_smollm2(out)           # an HF folder: model, tokenizer (+3 image tokens), processor
    model = load_vlm(path, torch.float32)       # Idefics3ForConditionalGeneration
    processor = load_processor(path)            # core.vision_processors: on the PIL image processor

Each image becomes ``<fake_token_around_image><global-img>`` + ``image_seq_len`` ``<image>`` tokens +
``<fake_token_around_image>``: with the defaults a 64 x 64 image is 8 x 8 patches of 8 pixels, pixel-shuffled by
2 into 16 tokens. Images are resized to ``image_size`` and never split into tiles.

``tiny_qwen_vl``: a random Qwen2-VL or Qwen2.5-VL model of a few million parameters with SmolLM2's tokenizer and
Qwen's vision tokens: the inputs of the Qwen family (variable-size images as patches + ``image_grid_thw``, M-RoPE
position ids) through our engine and trainer, in tests.
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
    from core.vision_processors import make_idefics3_processor

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
    make_idefics3_processor(tok, image_size, (image_size // (patch_size * scale_factor)) ** 2).save_pretrained(out)
    return out


def load_vlm(path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(path, dtype=dtype).to(device).eval()


def tiny_qwen_vl(out: str | Path, family: str = "qwen2_vl", hidden: int = 64, layers: int = 2, patch_size: int = 8,
                 max_pixels: int = 64 * 64, seed: int = 0) -> Path:
    """Write a random ``family`` ("qwen2_vl" or "qwen2_5_vl") model with its tokenizer and processor to ``out``:
    text model ``hidden`` wide, ``layers`` deep, 4 heads (M-RoPE: the rotary frequencies split 1/4, 3/8, 3/8 among
    time, height and width), a 2-block vision encoder on ``patch_size`` patches merged 2 x 2, images resized within
    [16 x 16, ``max_pixels``] (Qwen2.5-VL: window attention in block 0, full in block 1)."""
    from transformers import AutoModelForImageTextToText, Qwen2_5_VLConfig, Qwen2VLConfig
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from core.models import load_tokenizer, resolve_model
    from core.vision_processors import QWEN_VISION_TOKENS, QwenVLProcessor

    tok = load_tokenizer(resolve_model("SmolLM2-135M-Instruct"))
    tok.add_special_tokens({"additional_special_tokens": list(QWEN_VISION_TOKENS)})
    text = dict(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=len(tok), tie_word_embeddings=True,
                bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                 "mrope_section": [hidden // 32, 3 * hidden // 64, 3 * hidden // 64]})
    common = dict(patch_size=patch_size, spatial_merge_size=2, temporal_patch_size=2, in_channels=3, num_heads=2)
    if family == "qwen2_vl":
        cfg_class, vision = Qwen2VLConfig, dict(depth=2, embed_dim=32, hidden_size=hidden, mlp_ratio=2, **common)
    elif family == "qwen2_5_vl":
        cfg_class, vision = Qwen2_5_VLConfig, dict(depth=2, hidden_size=32, intermediate_size=64,
                                                   out_hidden_size=hidden, window_size=4 * patch_size,
                                                   fullatt_block_indexes=[1], **common)
    else:
        raise ValueError(f"family {family!r}: qwen2_vl or qwen2_5_vl")
    ids = {f"{name}_token_id": tok.convert_tokens_to_ids(t) for name, t in
           (("vision_start", "<|vision_start|>"), ("image", "<|image_pad|>"), ("vision_end", "<|vision_end|>"),
            ("video", "<|video_pad|>"))}
    cfg = cfg_class(text_config=text, vision_config=vision, tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
                    eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **ids)
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(cfg)
    out = Path(out)
    model.save_pretrained(out)
    image_processor = Qwen2VLImageProcessorPil(min_pixels=16 * 16, max_pixels=max_pixels, patch_size=patch_size,
                                               merge_size=2, temporal_patch_size=2)
    QwenVLProcessor(tok, image_processor).save_pretrained(out)
    return out
