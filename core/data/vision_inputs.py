"""Image prompts as model inputs: the processor turns each chat and its images into token ids (every ``<image>``
expanded into the model's image-token run) and the vision tensors of that one prompt; the batch carries those per
sample as ``multi_modal_inputs`` (a dict of tensors, leading dimension 1), which the rollout engine's prefill and
the trainer's forward passes collate.

Two layouts (``core.vision_processors``):
- Idefics3 / SmolVLM: ``pixel_values`` (1, images, 3, H, W) and ``pixel_attention_mask`` (1, images, H, W); rows
  with fewer images are padded with all-zero images, which the model skips.
- Qwen2-VL / Qwen2.5-VL: ``pixel_values`` (patches, D) and ``image_grid_thw`` (images, 3), no batch dimension:
  rows concatenate, in row order, whatever their images' sizes. These models rotate queries and keys by M-RoPE:
  three position ids per token (time, height, width; equal on text), from ``mrope_positions``. After an image the
  text positions run ahead of or behind the token index by a per-row ``delta``, which decoding adds.
"""

from __future__ import annotations

import torch

from core.data.multimodal import PLACEHOLDER


def vision_prompt_ids(processor, chats: list[list[dict]], images: list[list]) -> tuple[list[list[int]], list[dict]]:
    """Token ids of each chat (the chat template with its generation prompt, placeholders expanded) and its vision
    inputs. A prompt whose placeholders and images disagree fails here too, naming its position."""
    ids, inputs = [], []
    for k, (chat, imgs) in enumerate(zip(chats, images)):
        text = processor.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        if text.count(PLACEHOLDER) != len(imgs):
            raise ValueError(f"prompt {k}: {text.count(PLACEHOLDER)} {PLACEHOLDER} placeholder(s) after the chat "
                             f"template, {len(imgs)} image(s)")
        enc = processor(text=[text], images=[list(imgs)] if imgs else None, return_tensors="pt")
        ids.append(enc["input_ids"][0].tolist())
        # token-aligned keys are rebuilt from the ids wherever needed (mrope_positions): not carried
        inputs.append({k: v for k, v in enc.items() if k not in ("input_ids", "attention_mask", "mm_token_type_ids")})
    return ids, inputs


def image_prompt_problem(rollout) -> str | None:
    """Why a rollout config (``RolloutConfig``) cannot take image prompts, or None: for now they run on the embedded
    engine without the agent loop. Checked before Ray (``core.trainer``) and by the rollout worker itself."""
    if rollout.backend != "embedded" or rollout.agent.enable:
        return (f"image prompts run on the embedded engine without the agent loop for now; this run has "
                f"rollout.backend={rollout.backend}, rollout.agent.enable={rollout.agent.enable}")
    return None


def collate(items: list[dict]) -> dict[str, torch.Tensor]:
    """One batch of vision inputs from per-sample dicts. Idefics3 (leading dimension 1): concatenated along the
    batch, each tensor's second dimension (images) zero-padded to the longest; a row without a key (a text-only
    row: {}) gets all-zero images there, which the model skips. Qwen2-VL (``image_grid_thw``): every tensor
    concatenated along its first dimension, text-only rows adding nothing. All text-only -> {}."""
    keys = sorted({k for item in items for k in item})
    if "image_grid_thw" in keys:
        return {key: torch.cat([item[key] for item in items if key in item]) for key in keys}
    out = {}
    for key in keys:
        like = next(item[key] for item in items if key in item)
        most = max(item[key].shape[1] for item in items if key in item)
        out[key] = torch.cat([_pad_images(item[key] if key in item else like[:, :0], most) for item in items])
    return out


def _pad_images(t: torch.Tensor, count: int) -> torch.Tensor:
    if t.shape[1] == count:
        return t
    padded = torch.zeros((t.shape[0], count, *t.shape[2:]), dtype=t.dtype, device=t.device)
    padded[:, :t.shape[1]] = t
    return padded


def rope_index(model):
    """The model's M-RoPE position function (``get_rope_index`` of the Qwen2-VL family's inner model), or None."""
    return getattr(getattr(model, "model", None), "get_rope_index", None)


def mrope_positions(model, input_ids: torch.Tensor, real: torch.Tensor, vision: dict
                    ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """M-RoPE position ids (3, B, T) of rows whose real tokens are ``real`` (B, T; padding gets 0) and each row's
    delta (B,) = its last position + 1 - its real length, from the model's own ``get_rope_index``; None when the
    model has no M-RoPE or the batch no images (the model's 1-D positions are then right). Text tokens count on
    from the image's largest grid side: an image of grid (1, 8, 6) merged 2 x 2 takes 12 tokens but 4 positions,
    so the text after it sits 8 positions behind its index (delta -8)."""
    fn = rope_index(model)
    if fn is None or "image_grid_thw" not in vision:
        return None
    types = (input_ids == model.config.image_token_id).int()
    pos, delta = fn(input_ids, mm_token_type_ids=types, image_grid_thw=vision["image_grid_thw"],
                    attention_mask=real.long())
    return pos, delta.view(-1)


def never_sampled(model) -> list[int]:
    """Token ids a vision-language model must not generate: its image (and video) tokens. One in a response would
    be counted as an image placeholder by the trainer's forward ("image features and image tokens do not match")."""
    cfg = model.config
    return [i for i in (getattr(cfg, "image_token_id", None), getattr(cfg, "video_token_id", None)) if i is not None]
