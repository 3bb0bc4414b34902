"""core/vision_models.py: the small SmolVLM-class model built offline from SmolLM2-135M-Instruct -- its text
model is SmolLM2 exactly, the processor expands each <image> into the image-token run without torchvision, and
the model's output depends on the image."""

import pytest
import torch
from PIL import Image

from core.models import load_causal_lm, load_tokenizer
from core.vision_models import load_vlm, smolvlm_from_smollm2
from core.vision_processors import load_processor

PROMPT = "<|im_start|>user\n<image>What colour is the square?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    path = smolvlm_from_smollm2(tmp_path_factory.mktemp("vlm") / "smolvlm")
    return load_vlm(path), load_processor(path)


def test_text_only_the_model_is_smollm2_exactly(vlm):
    model, _ = vlm
    tok = load_tokenizer("SmolLM2-135M-Instruct")
    ids = tok("<|im_start|>user\nWhat is 3 + 4?<|im_end|>", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        ours = model(input_ids=ids, output_hidden_states=True)
        theirs = load_causal_lm("SmolLM2-135M-Instruct")(input_ids=ids, output_hidden_states=True)
    assert ours.logits.shape[-1] == theirs.logits.shape[-1] + 3  # the three image tokens
    torch.testing.assert_close(ours.hidden_states[-1], theirs.hidden_states[-1], atol=0, rtol=0)
    # the LM head's wider matmul (3 more rows) may block its sums differently on some CPUs: 2.7e-5 seen
    torch.testing.assert_close(ours.logits[..., :theirs.logits.shape[-1]], theirs.logits, atol=1e-4, rtol=0)


def test_each_image_becomes_its_token_run_and_the_output_depends_on_it(vlm):
    model, processor = vlm
    tok = processor.tokenizer
    logits = []
    for colour in ((255, 0, 0), (0, 0, 255)):
        enc = processor(text=[PROMPT], images=[[Image.new("RGB", (90, 40), colour)]], return_tensors="pt")
        assert enc["pixel_values"].shape == (1, 1, 3, 64, 64)  # resized to 64 (longest edge), padded, not tiled
        run = tok.convert_tokens_to_ids(["<fake_token_around_image>", "<global-img>"] + ["<image>"] * 16
                                        + ["<fake_token_around_image>"])
        ids = enc["input_ids"][0].tolist()
        assert ids.count(tok.convert_tokens_to_ids("<image>")) == 16
        start = ids.index(run[0])
        assert ids[start:start + len(run)] == run
        with torch.no_grad():
            logits.append(model(**enc).logits[0, -1])
    assert float((logits[0] - logits[1]).abs().max()) > 1e-3

