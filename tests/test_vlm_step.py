"""Image prompts end to end on 2 Ray ranks (actor + rollout colocated, FSDP2 world size 2), fp32, with the
SmolVLM-class model built from SmolLM2-135M and a tiny Qwen2-VL (variable-size images as patches, M-RoPE): rows
with one or two images of different sizes split over the DP ranks with their vision inputs, the rollout's log-probs
equal the trainer's (mean |diff| <= 1e-4, the verl#2996 check) before and after an update -- which moves the vision
tower and connector too, so the second check fails if the weight sync skips them."""

import pytest
import torch
from PIL import Image

from core.config import (ActorConfig, AdvantageConfig, AlgoConfig, OptimConfig, PlacementConfig, PoolConfig,
                         RolloutConfig, SamplingParams)
from core.data.multimodal import png_bytes
from core.data.prepare import write_parquet
from core.data.dataset import load_rl_parquet
from core.train.fsdp import FSDPActor
from core.loop import Roles, prompts_from_rows, step
from core.placement import place
from core.rollout.worker import RolloutWorker
from core.vision_models import smolvlm_from_smollm2, tiny_qwen_vl
from core.worker import RoleSpec

ALGO = AlgoConfig(sampling=SamplingParams(n=2, temperature=1.0, max_new_tokens=8, seed=0),
                  adv=AdvantageConfig(estimator="grpo"))
COLOURS = [(255, 0, 0), (0, 0, 255), (0, 160, 0), (230, 230, 0)]


def length_reward(data_source, solution_str, ground_truth, extra_info=None):
    return len(solution_str) / 40.0


# per family: how a sample's vision inputs count its images, and names in its vision tower and its connector
FAMILIES = {"smolvlm": (lambda v: int(v["pixel_values"].shape[1]), "vision_model", "connector"),
            "qwen2_vl": (lambda v: int(v["image_grid_thw"].shape[0]), "visual.blocks", "visual.merger")}


@pytest.fixture(scope="module")
def ray_session(ray_shared):
    yield


# the SmolVLM-class model carries SmolLM2-135M's real size (~50 s here): under make test-heavy; the tiny Qwen2-VL runs
# the same path in make test
@pytest.fixture(scope="module", params=[pytest.param("smolvlm", marks=pytest.mark.heavy), "qwen2_vl"])
def vlm_dir(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param) / "model"
    return request.param, smolvlm_from_smollm2(folder) if request.param == "smolvlm" else tiny_qwen_vl(folder)


def image_rows(tmp_path):
    rows = []
    for i, colour in enumerate(COLOURS):
        second = [Image.new("RGB", (32, 48), COLOURS[-1 - i])] if i % 2 else []
        images = [Image.new("RGB", (64 - 8 * i, 64), colour)] + second
        content = "".join("<image>" for _ in images) + "What colours do you see?"
        rows.append({"data_source": "t", "prompt": [{"role": "user", "content": content}], "ability": "vision",
                     "reward_model": {"style": "rule", "ground_truth": "x"},
                     "images": [png_bytes(im) for im in images]})
    write_parquet(rows, tmp_path / "images.parquet")
    return load_rl_parquet(tmp_path / "images.parquet")


@pytest.mark.ray
def test_image_prompts_train_on_two_ray_ranks_with_rollout_and_trainer_in_agreement(ray_session, vlm_dir, tmp_path):
    family, vlm_dir = vlm_dir
    images_of, tower, connector = FAMILIES[family]
    actor = ActorConfig(model=str(vlm_dir), dtype="float32", ppo_mini_batch_size=8, micro_batch_size=2,
                        optim=OptimConfig(lr=1e-3, warmup_steps=0))
    specs = {"actor": RoleSpec(FSDPActor, {"cfg": actor}),
             "rollout": RoleSpec(RolloutWorker, {"cfg": RolloutConfig(model=str(vlm_dir), dtype="float32",
                                                                      max_prompt_length=96)})}
    rows = image_rows(tmp_path)
    placement = place(PlacementConfig({"main": PoolConfig(slots_per_node=2)}, {"actor": "main", "rollout": "main"}),
                      specs)
    try:
        roles = Roles(actor=placement["actor"], rollout=placement["rollout"])
        before = placement["actor"].call_all(FSDPActor.full_state_dict)[0]
        batch, first = step(roles, prompts_from_rows(rows), ALGO, length_reward)
        after = placement["actor"].call_all(FSDPActor.full_state_dict)[0]
        _, second = step(roles, prompts_from_rows(rows), ALGO, length_reward)
    finally:
        placement.shutdown()
    # each sample kept its own prompt's images through the DP split: 1 or 2 images, in row order
    assert [images_of(v) for v in batch["multi_modal_inputs"]] == [1, 1, 2, 2, 1, 1, 2, 2]
    for m in (first, second):
        assert m["rollout/logprob_diff_mean"] <= 1e-4, m["rollout/logprob_diff_mean"]
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert any(tower in k for k in moved) and any(connector in k for k in moved)


def test_a_change_of_the_vision_weights_alone_reaches_the_engine(vlm_dir, tmp_path):
    """Only the vision tower and connector of the actor change; after the real sync (in-process placement) the
    engine's greedy log-probs on an image prompt move, on a text-only prompt they stay bit-identical."""
    from core.loop import sync_rollout

    family, vlm_dir = vlm_dir
    _, tower, connector = FAMILIES[family]
    specs = {"actor": RoleSpec(FSDPActor, {"cfg": ActorConfig(model=str(vlm_dir), dtype="float32")}),
             "rollout": RoleSpec(RolloutWorker, {"cfg": RolloutConfig(model=str(vlm_dir), dtype="float32",
                                                                      max_prompt_length=96)})}
    rows = image_rows(tmp_path)[:1]
    rows.append(dict(rows[0], prompt=[{"role": "user", "content": "No picture: what colours?"}], images=[]))
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=4)
    placement = place(PlacementConfig({"main": PoolConfig(slots_per_node=1)}, {"actor": "main", "rollout": "main"}),
                      specs, "local")
    try:
        roles = Roles(actor=placement["actor"], rollout=placement["rollout"])

        def logprobs():
            out = roles.rollout.call_all(RolloutWorker.generate, prompts_from_rows(rows), greedy)[0]
            return out["rollout_logprobs"]

        before = logprobs()
        actor_model = placement.groups[0]._host.roles["actor"].model
        with torch.no_grad():
            changed = [p.add_(0.05) for n, p in actor_model.named_parameters() if tower in n or connector in n]
        assert changed
        sync_rollout(roles, 60.0)
        after = logprobs()
    finally:
        placement.shutdown()
    assert float((before[0] - after[0]).abs().max()) > 1e-3   # the image prompt sees the new vision weights
    assert torch.equal(before[1], after[1])                    # text alone: untouched
