"""Image prompts through the embedded engine and the trainer's forward (core/data/vision_inputs.py) on the
SmolVLM-class model built from SmolLM2-135M (core/vision_models.py), fp32: the engine's log-probs of what it
sampled equal the trainer's (the verl#2996 check), each prompt is prefilled with its own image even when prompts
share their text, and vision inputs collate with image-count padding."""

import pytest
import torch
from PIL import Image

from core.config import SamplingParams
from core.train.forward import response_logprobs
from core.rollout.engine import RolloutEngine
from core.data.vision_inputs import collate, vision_prompt_ids
from core.vision_models import load_vlm, smolvlm_from_smollm2
from core.vision_processors import load_processor

QUESTION = [{"role": "user", "content": "<image>What colour is the square?"}]


def square(colour, size=(64, 64)):
    return [Image.new("RGB", size, colour)]


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    path = smolvlm_from_smollm2(tmp_path_factory.mktemp("vlm") / "smolvlm")
    model, processor = load_vlm(path), load_processor(path)
    return model, processor, RolloutEngine(model, processor.tokenizer, pack_weights=False)


def test_rollout_and_trainer_log_probs_agree_on_image_prompts_in_fp32(vlm):
    model, processor, engine = vlm
    ids, vision = vision_prompt_ids(processor, [QUESTION] * 3,
                                    [square((255, 0, 0)), square((0, 0, 255), (48, 64)), square((0, 200, 0))])
    batch = engine.generate(ids, SamplingParams(n=2, temperature=1.0, max_new_tokens=12, seed=1), vision=vision)
    batch["multi_modal_inputs"] = [vision[b // 2] for b in range(len(batch))]
    m = batch["response_mask"]
    with torch.no_grad():
        for share_prompt in (False, True):  # the shared-prompt layout falls back to rows for image prompts
            ours, _ = response_logprobs(model, batch, 1.0, remove_padding=True, share_prompt=share_prompt)
            diff = float(((ours - batch["rollout_logprobs"]).abs() * m).sum() / m.sum())
            assert diff <= 1e-4, diff


def test_prompts_with_the_same_text_are_prefilled_with_their_own_images(vlm):
    """Equal token ids, different images: with a shared prefix the second prompt would reuse the first's image
    KV. Greedy, each prompt's response in a batch of both equals its response alone -- and they differ."""
    _, processor, engine = vlm
    images = [square((255, 0, 0)), square((0, 0, 255))]
    ids, vision = vision_prompt_ids(processor, [QUESTION] * 2, images)
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=10)
    both = engine.generate(ids, greedy, vision=vision)
    alone = [engine.generate(ids[k:k + 1], greedy, vision=vision[k:k + 1]) for k in range(2)]
    for k in range(2):
        torch.testing.assert_close(both["rollout_logprobs"][k, :1], alone[k]["rollout_logprobs"][0, :1], atol=1e-5,
                                   rtol=0)
    assert float((both["rollout_logprobs"][0, 0] - both["rollout_logprobs"][1, 0]).abs()) > 1e-4


def test_vision_inputs_collate_with_image_count_padding_and_text_only_rows():
    a = {"pixel_values": torch.ones(1, 2, 3, 4, 4), "pixel_attention_mask": torch.ones(1, 2, 4, 4, dtype=torch.bool)}
    b = {"pixel_values": torch.full((1, 1, 3, 4, 4), 2.0),
         "pixel_attention_mask": torch.ones(1, 1, 4, 4, dtype=torch.bool)}
    out = collate([a, b])
    assert out["pixel_values"].shape == (2, 2, 3, 4, 4) and out["pixel_attention_mask"].dtype == torch.bool
    assert bool((out["pixel_values"][1, 0] == 2).all()) and bool((out["pixel_values"][1, 1] == 0).all())
    assert not out["pixel_attention_mask"][1, 1].any()
    assert collate([{}, {}]) == {}
    mixed = collate([{}, b])  # a text-only row: all-zero images, which the model skips
    assert mixed["pixel_values"].shape == (2, 1, 3, 4, 4) and not mixed["pixel_values"][0].any()


def test_a_prompt_whose_placeholders_and_images_disagree_is_named(vlm):
    _, processor, _ = vlm
    with pytest.raises(ValueError, match=r"prompt 1: 1 <image> placeholder\(s\) after the chat template, 2 image"):
        vision_prompt_ids(processor, [QUESTION] * 2, [square((1, 2, 3)), square((1, 2, 3)) * 2])


def test_image_prompts_are_measured_with_their_image_tokens_and_never_truncated(vlm):
    from core.data.dataset import fit_prompt_lengths

    _, processor, _ = vlm
    rows = [{"prompt": QUESTION, "images": square((255, 0, 0)), "where": "f.parquet: row 1"},
            {"prompt": [{"role": "user", "content": "<image><image>Two?"}], "images": square((1, 2, 3)) * 2,
             "where": "f.parquet: row 2"}]
    ids = [vision_prompt_ids(processor, [r["prompt"]], [r["images"]])[0][0] for r in rows]
    image = processor.tokenizer.convert_tokens_to_ids("<image>")
    assert [x.count(image) for x in ids] == [16, 32]  # each image's run counts in the prompt's length
    lengths = [len(x) for x in ids]
    fitted, note = fit_prompt_lengths(rows, processor.tokenizer, lengths[1], processor=processor)
    assert len(fitted) == 2 and f"longest {lengths[1]}" in note
    for truncation in ("error", "left", "right"):  # a cut would go through an image's tokens: never
        with pytest.raises(ValueError, match=f"f.parquet: row 2: {lengths[1]} tokens"):
            fit_prompt_lengths(rows, processor.tokenizer, lengths[1] - 1, truncation, processor=processor)
    kept, note = fit_prompt_lengths(rows, processor.tokenizer, lengths[1] - 1, filter_overlong=True,
                                    processor=processor)
    assert [r["where"] for r in kept] == ["f.parquet: row 1"] and "1 of 2 prompts" in note
    with pytest.raises(ValueError, match="f.parquet: row 1: image prompts, but the rollout model has no image"):
        fit_prompt_lengths(rows, processor.tokenizer, 512)
