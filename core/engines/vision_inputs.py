"""Image prompts as model inputs: the processor turns each chat and its images into token ids (every ``<image>``
expanded into the model's image-token run) and the vision tensors of that one prompt; the batch carries those per
sample as ``multi_modal_inputs`` (a dict of tensors, leading dimension 1), which the rollout engine's prefill and
the trainer's forward passes collate.

Idefics3 / SmolVLM layout: ``pixel_values`` (1, images, 3, H, W) and ``pixel_attention_mask`` (1, images, H, W);
rows with fewer images are padded with all-zero images, which the model skips.
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
        inputs.append({k: v for k, v in enc.items() if k not in ("input_ids", "attention_mask")})
    return ids, inputs


def image_prompt_problem(rollout) -> str | None:
    """Why a rollout config (``RolloutConfig``) cannot take image prompts, or None: for now they run on the embedded
    engine without the agent loop. Checked before Ray (``core.trainer``) and by the rollout worker itself."""
    if rollout.backend != "embedded" or rollout.agent.enable:
        return (f"image prompts run on the embedded engine without the agent loop for now; this run has "
                f"rollout.backend={rollout.backend}, rollout.agent.enable={rollout.agent.enable}")
    return None


def collate(items: list[dict]) -> dict[str, torch.Tensor]:
    """One batch of vision inputs from per-sample dicts (leading dimension 1): concatenated along the batch,
    each tensor's second dimension (images) zero-padded to the longest. A row without a key (a text-only row: {})
    gets all-zero images there, which the model skips; all text-only -> {}."""
    keys = sorted({k for item in items for k in item})
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
