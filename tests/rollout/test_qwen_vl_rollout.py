"""The Qwen2-VL family's inputs through the embedded engine and the trainer's forward (core/data/vision_inputs.py),
on tiny random Qwen2-VL and Qwen2.5-VL models (core/vision_models.tiny_qwen_vl), fp32: images of different sizes
become different numbers of patches and image tokens, positions are M-RoPE's (three per token, the text after an
image offset by a per-row delta that decoding must add), and the engine's log-probs of what it sampled equal the
trainer's (the verl#2996 check). Image tokens are never sampled."""

import pytest
import torch
from PIL import Image

from core.config import SamplingParams
from core.train.forward import response_logprobs
from core.rollout.engine import RolloutEngine
from core.data.vision_inputs import collate, mrope_positions, vision_prompt_ids
from core.vision_models import load_vlm, tiny_qwen_vl
from core.vision_processors import load_processor

ONE = [{"role": "user", "content": "<image>What colour is it?"}]
TWO = [{"role": "user", "content": "Compare <image> with <image>."}]
TEXT = [{"role": "user", "content": "No picture here."}]


def picture(colour, size):
    return Image.new("RGB", size, colour)


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl"])
def qwen(request, tmp_path_factory):
    path = tiny_qwen_vl(tmp_path_factory.mktemp(request.param) / "model", request.param)
    model, processor = load_vlm(path), load_processor(path)
    return model, processor, RolloutEngine(model, processor.tokenizer, pack_weights=False)


def test_images_of_different_sizes_become_their_own_patch_and_token_counts(qwen):
    model, processor, _ = qwen
    ids, vision = vision_prompt_ids(processor, [ONE, ONE, TWO, TEXT],
                                    [[picture((255, 0, 0), (48, 64))], [picture((0, 0, 255), (64, 64))],
                                     [picture((9, 9, 9), (32, 16)), picture((0, 200, 0), (64, 48))], []])
    # 8-pixel patches merged 2 x 2: 64 x 48 -> grid (1, 8, 6), 48 patches of 3 x 2 x 8 x 8, 12 image tokens
    assert vision[0]["image_grid_thw"].tolist() == [[1, 8, 6]] and vision[0]["pixel_values"].shape == (48, 384)
    assert vision[1]["image_grid_thw"].tolist() == [[1, 8, 8]]
    assert vision[2]["image_grid_thw"].tolist() == [[1, 2, 4], [1, 6, 8]] and vision[3] == {}
    pad = processor.image_token_id
    assert [x.count(pad) for x in ids] == [12, 16, 2 + 12, 0]
    both = collate(vision)  # rows concatenate in row order; the text-only row adds nothing
    assert both["pixel_values"].shape == (48 + 64 + 8 + 48, 384)
    assert both["image_grid_thw"].tolist() == [[1, 8, 6], [1, 8, 8], [1, 2, 4], [1, 6, 8]]
    # M-RoPE by hand for row 0: the image's 12 tokens take positions s..s+3 (its largest merged side is 4), so
    # the text after it runs 8 positions behind its index
    row = torch.tensor([ids[0]])
    pos, delta = mrope_positions(model, row, torch.ones_like(row), collate(vision[:1]))
    s = ids[0].index(pad)
    assert pos[:, 0, :s].tolist() == [list(range(s))] * 3
    assert pos[0, 0, s:s + 12].tolist() == [s] * 12                                  # one time step
    assert pos[1, 0, s:s + 12].tolist() == [s + i // 3 for i in range(12)]           # rows of 3 merged patches
    assert pos[2, 0, s:s + 12].tolist() == [s + i % 3 for i in range(12)]
    assert pos[:, 0, s + 12].tolist() == [s + 4] * 3 and int(delta) == -8


def test_rollout_and_trainer_log_probs_agree_on_image_prompts_in_fp32(qwen):
    """Sampled at T 1 from prompts of one image (two sizes), two images and none, 2 samples each: the trainer's
    log-probs of the sampled tokens, with M-RoPE positions over prompt + response, equal the engine's (which
    prefilled with the prompt's M-RoPE positions and decoded at index + delta). Decoding without the delta:
    5e-4 to 7e-4 (checked); with it 4e-7."""
    model, processor, engine = qwen
    ids, vision = vision_prompt_ids(processor, [ONE, TWO, ONE, TEXT],
                                    [[picture((255, 0, 0), (48, 64))],
                                     [picture((9, 9, 9), (32, 16)), picture((0, 200, 0), (64, 48))],
                                     [picture((0, 0, 255), (64, 32))], []])
    batch = engine.generate(ids, SamplingParams(n=2, temperature=1.0, max_new_tokens=12, seed=1), vision=vision)
    batch["multi_modal_inputs"] = [vision[b // 2] for b in range(len(batch))]
    m = batch["response_mask"]
    with torch.no_grad():
        for remove_padding in (False, True):
            ours, _ = response_logprobs(model, batch, 1.0, remove_padding=remove_padding, share_prompt=True)
            diff = float(((ours - batch["rollout_logprobs"]).abs() * m).sum() / m.sum())
            assert diff <= 1e-4, diff


def test_image_tokens_are_never_sampled_and_log_probs_stay_under_the_full_distribution(qwen):
    model, processor, engine = qwen
    V = model.config.text_config.vocab_size
    logits = torch.zeros(4, V)
    banned = [model.config.image_token_id, model.config.video_token_id]
    logits[:, banned] = 20.0                      # nearly all the mass on the image tokens
    logits[:, 7] = 5.0
    for temperature in (0.0, 1.0):
        tok, logp = engine.sample(logits, SamplingParams(n=1, temperature=temperature), torch.rand(4))
        assert not set(tok.tolist()) & set(banned)
        full = logits.log_softmax(-1).gather(-1, tok[:, None]).squeeze(-1)
        torch.testing.assert_close(logp, full)
