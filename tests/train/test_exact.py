"""``rollout.exact_logprobs`` (``core.train.exact``): the trainer's log-probs of the embedded engine's samples equal
the engine's bit for bit (fp32 and bf16, CPU kernels), its gradients are the ordinary ones, a run's rollout-vs-trainer gap
reads 0, and skipping the old-log-prob pass (``algo.bypass_mode``) then changes no metric."""

import pytest
import torch

from core.config import SamplingParams
from core.models import load_causal_lm, load_tokenizer
from core.protocol import Batch
from core.rollout.engine import RolloutEngine
from core.train.exact import available, response_logprobs_exact
from core.train.forward import response_logprobs

pytestmark = pytest.mark.skipif(bool(available()), reason=f"the exact forward: {available()}")

PROMPTS = ["system: be brief. user: hi", "system: be brief. user: a longer prompt here", "xyz"]
KEYS = ("input_ids", "attention_mask", "position_ids", "responses")


@pytest.fixture(scope="module")
def sampled(tiny_model_dir):
    """n=2 samples of 3 prompts (two sharing a prefix the engine prefills once) at temperature 0.8, fp32."""
    return sample(tiny_model_dir, torch.float32)


def sample(model_dir, dtype: torch.dtype, **params) -> Batch:
    tok = load_tokenizer(str(model_dir))
    engine = RolloutEngine(load_causal_lm(str(model_dir), dtype=dtype), tok, max_batch_size=4, exact=True)
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in PROMPTS]
    return engine.generate(ids, SamplingParams(n=2, temperature=0.8, max_new_tokens=12, seed=3, **params))


def test_top_k_and_top_p_restrict_the_draw_not_the_logprobs(tiny_model_dir):
    """Sampled with top-k and top-p, the engine's log-probs are still the full distribution's on the sampler
    kernel's arithmetic: the exact forward's, bit for bit."""
    sampled = sample(tiny_model_dir, torch.float32, top_k=5, top_p=0.9)
    batch, mask = Batch({k: sampled[k] for k in KEYS}), sampled["response_mask"].bool()
    exact, _ = response_logprobs_exact(load_causal_lm(str(tiny_model_dir)), batch, 0.8)
    assert torch.equal(exact[mask], sampled["rollout_logprobs"][mask]) and mask.sum() > 30


@pytest.mark.parametrize("dtype, ordinary_gap", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)])
def test_the_trainers_logprobs_are_the_engines_bit_for_bit(sampled, tiny_model_dir, dtype, ordinary_gap):
    """bf16: the engine's linears on our packed kernel (vdpbf16ps where the CPU has AVX512-BF16, its sums in the
    same order elsewhere), the trainer's on the same."""
    sampled = sampled if dtype == torch.float32 else sample(tiny_model_dir, dtype)
    model = load_causal_lm(str(tiny_model_dir), dtype=dtype)  # the trainer's own copy of the weights
    batch, mask = Batch({k: sampled[k] for k in KEYS}), sampled["response_mask"].bool()
    exact, _ = response_logprobs_exact(model, batch, 0.8, remove_padding=False)
    assert torch.equal(exact[mask], sampled["rollout_logprobs"][mask])
    assert mask.sum() > 30 and bool((exact[~mask] == 0).all())
    # the ordinary forward's layouts: all-padding columns dropped; each prompt encoded once for its n responses
    for layout in ({"remove_padding": True}, {"remove_padding": True, "share_prompt": True}):
        assert torch.equal(response_logprobs_exact(model, batch, 0.8, **layout)[0], exact), layout
    with torch.no_grad():  # the ordinary forward (torch's matmuls and attention) is not: that is the point
        ordinary, _ = response_logprobs(model, batch, 0.8)
    gap = (ordinary[mask] - sampled["rollout_logprobs"][mask]).abs().max()
    assert 0 < gap < ordinary_gap
    # one row alone gives the same bits as in the batch (the trainer's batching does not matter either)
    alone, _ = response_logprobs_exact(model, batch.index(slice(2, 3)), 0.8)
    assert torch.equal(alone[0], exact[2])


def test_one_forward_converts_its_mask_once_for_all_layers(sampled, tiny_model_dir, monkeypatch):
    """Every layer gets transformers' same mask: one fp32 conversion serves them all (each layer's backward keeps
    it), where one per layer was held (B, 1, L, T) x layers until backward."""
    import core.train.exact as exact

    made, convert = [], exact._convert
    monkeypatch.setattr(exact, "_convert", lambda *a: made.append(a[1:]) or convert(*a))
    model = load_causal_lm(str(tiny_model_dir))
    assert model.config.num_hidden_layers > 1
    response_logprobs_exact(model, Batch({k: sampled[k] for k in KEYS}), 0.8, remove_padding=False)
    assert len(made) == 1
    # a causal call (no mask) after the last mask object is gone, its conversion still held: the causal mask
    q = torch.zeros(1, 1, 3, 8)
    gone = torch.ones(1, 1, 3, 3, dtype=torch.bool).tril()
    held = exact._additive(gone.logical_not(), q, q)
    del gone
    assert torch.equal(exact._additive(None, q, q), convert(None, 3, 3)) and held.min() < 0


@pytest.mark.parametrize("share_prompt", [False, True])
def test_its_gradients_are_the_ordinary_forwards(sampled, tiny_model_dir, share_prompt):
    batch, mask = Batch({k: sampled[k] for k in KEYS}), sampled["response_mask"]
    grads = []
    for fn in (lambda m, b, t: response_logprobs_exact(m, b, t, share_prompt=share_prompt),
               lambda m, b, t: response_logprobs(m, b, t, remove_padding=False)):
        model = load_causal_lm(str(tiny_model_dir))
        logp, _ = fn(model, batch, 0.8)
        ((logp * mask).sum() / mask.sum()).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert grads[0].abs().max() > 0
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-6)


def run_steps(tmp_path, tiny_model_dir, name: str, *overrides: str) -> dict[int, dict]:
    from tests.test_checkpoint import fit_run, write_run

    conf = write_run(tmp_path, tiny_model_dir, total_steps=3, save_freq=0)
    return fit_run(conf, tmp_path / name, "rollout.exact_logprobs=true", *overrides)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_run_reads_no_gap_and_skipping_the_old_pass_changes_nothing(tmp_path, tiny_model_dir, dtype):
    """Three GRPO steps through core's step (one rank, the engine beside the actor): the rollout-vs-trainer gap is
    0 at every step; with the old-log-prob pass skipped (the rollout's log-probs taken as the old ones) every
    metric but the gap's (not measured then) and the timings is the same. bf16: the actor's fp32 master weights
    computed in bf16, the engine's weights synced into bf16."""
    dtypes = f"actor.dtype={dtype}", f"rollout.dtype={dtype}"
    with_pass = run_steps(tmp_path, tiny_model_dir, "pass", *dtypes)
    assert all(with_pass[s]["rollout/logprob_diff_max"] == 0.0 for s in (1, 2, 3)), with_pass
    skipped = run_steps(tmp_path, tiny_model_dir, "skipped", "algo.bypass_mode=true", *dtypes)
    gap = ("rollout/logprob_diff", "timing_s/", "perf/")
    for s in (1, 2, 3):
        want = {k: v for k, v in with_pass[s].items() if not k.startswith(gap)}
        got = {k: v for k, v in skipped[s].items() if not k.startswith(gap)}
        assert got == want, (s, {k: (got.get(k), want.get(k)) for k in want if got.get(k) != want[k]})
    assert with_pass[3]["actor/grad_norm"] > 0 and with_pass[1]["reward/std"] > 0


def test_what_the_exact_forward_does_not_cover_is_refused_before_ray():
    from pathlib import Path

    from core.checks import problems
    from core.run import load_run_config

    grpo = Path(__file__).resolve().parents[2] / "recipes/grpo"
    fp32 = ["rollout.exact_logprobs=true", "actor.dtype=float32", "rollout.dtype=float32"]
    assert problems(load_run_config(grpo, "demo_cpu", fp32)) == []
    assert problems(load_run_config(grpo, "demo_cpu", fp32 + ["algo.sampling.top_p=0.9"])) == []
    for extra, named in ((["actor.dtype=bfloat16"], "actor.dtype=bfloat16"),
                         (["algo.sampling.temperature=0"], "temperature=0"),
                         (["actor.lora.rank=8"], "lora.rank=8"), (["rollout.backend=vllm"], "rollout.backend=vllm")):
        found = [p for p in problems(load_run_config(grpo, "demo_cpu", fp32 + extra)) if "exact_logprobs" in p]
        assert len(found) == 1 and named in found[0], (extra, found)


@pytest.mark.heavy  # a Ray run, ~1 min each
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_two_fsdp_ranks_read_no_gap(tmp_path, tiny_model_dir, dtype):
    """The actor on 2 FSDP2 ranks (each forward gathers the full weights, then runs the exact kernels on its rows),
    the engine beside each: the gap is 0 at every step."""
    from tests.test_checkpoint import fit_run, write_run

    conf = write_run(tmp_path, tiny_model_dir, total_steps=2, save_freq=0, backend="ray")
    got = fit_run(conf, tmp_path / "out", "rollout.exact_logprobs=true", f"actor.dtype={dtype}",
                  f"rollout.dtype={dtype}")
    assert [got[s]["rollout/logprob_diff_max"] for s in (1, 2)] == [0.0, 0.0], got


@pytest.mark.heavy  # two Ray runs, ~1 min each
def test_one_step_off_reads_no_gap_where_the_versions_agree_and_the_staleness_elsewhere(tmp_path, tiny_model_dir):
    """One step off (the actor and the rollout on a pool each): step 1 trains on samples of the weights it starts
    from (gap exactly 0; skipping the pass there changes no metric); later steps' samples are a version behind, so
    the gap is the policy's change alone -- what ``algo.bypass_mode`` then takes as pi_old is the behaviour
    policy's probability, bit for bit."""
    from tests.test_checkpoint import fit_run, write_run

    conf = write_run(tmp_path, tiny_model_dir, total_steps=3, save_freq=0, backend="ray")
    off = ("rollout.exact_logprobs=true", "trainer.async.mode=one_step_off",
           "placement.pools.main={nnodes: 1, slots_per_node: 1}", "+placement.pools.gen={nnodes: 1, slots_per_node: 1}",
           "placement.roles={actor: main, rollout: gen}")
    with_pass = fit_run(conf, tmp_path / "pass", *off)
    skipped = fit_run(conf, tmp_path / "skipped", "algo.bypass_mode=true", *off)
    assert with_pass[1]["rollout/logprob_diff_max"] == 0.0
    assert with_pass[1]["rollout/tis_weight_mean"] == 1.0  # the off-policy correction's weights: exactly 1
    assert with_pass[3]["rollout/logprob_diff_max"] > 0, with_pass[3]
    gap = ("rollout/logprob_diff", "rollout/tis_", "timing_s/", "perf/")  # bypass runs no truncated IS
    want = {k: v for k, v in with_pass[1].items() if not k.startswith(gap)}
    assert {k: v for k, v in skipped[1].items() if not k.startswith(gap)} == want


@pytest.mark.parametrize("family", ["qwen2_vl", pytest.param("smolvlm", marks=pytest.mark.heavy)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_image_prompts_logprobs_are_the_engines_bit_for_bit(tmp_path, family, dtype):
    """Image prompts (one or two images of different sizes), a tiny Qwen2-VL (patches, M-RoPE) and the SmolVLM-class
    model built from SmolLM2-135M: the vision tower's linears on the packed kernel on both sides, its full attention
    on SDPA on both (an image's result does not depend on the images beside it), the language model as for text.
    Each row alone gives the same bits as in the batch."""
    from PIL import Image

    from core.data.vision_inputs import vision_prompt_ids
    from core.vision_models import load_vlm, smolvlm_from_smollm2, tiny_qwen_vl
    from core.vision_processors import processor_for

    path = str(tiny_qwen_vl(tmp_path / "m") if family == "qwen2_vl" else smolvlm_from_smollm2(tmp_path / "m"))
    processor, colours = processor_for(path), [(255, 0, 0), (0, 0, 255), (0, 160, 0)]
    chats, images = [], []
    for i, colour in enumerate(colours):
        imgs = [Image.new("RGB", (64 - 8 * i, 64), colour)] + ([Image.new("RGB", (32, 48), colours[-1 - i])] if i % 2 else [])
        chats.append([{"role": "user", "content": "<image>" * len(imgs) + "What colours?"}])
        images.append(imgs)
    ids, vision = vision_prompt_ids(processor, chats, images)
    engine = RolloutEngine(load_vlm(path, dtype), processor.tokenizer, max_batch_size=4, exact=True)
    out = engine.generate(ids, SamplingParams(n=2, temperature=0.8, max_new_tokens=10, seed=3), vision=vision)
    batch = Batch({k: out[k] for k in KEYS})
    batch["multi_modal_inputs"] = [v for v in vision for _ in range(2)]
    mask, model = out["response_mask"].bool(), load_vlm(path, dtype)
    exact, _ = response_logprobs_exact(model, batch, 0.8)
    assert torch.equal(exact[mask], out["rollout_logprobs"][mask]) and mask.sum() > 40
    alone, _ = response_logprobs_exact(model, batch.index(slice(3, 4)), 0.8)  # the row with two images
    assert torch.equal(alone[0], exact[3])
    with torch.no_grad():
        ordinary, _ = response_logprobs(model, batch, 0.8)
    assert (ordinary[mask] - out["rollout_logprobs"][mask]).abs().max() > 0


@pytest.mark.heavy  # a Ray run of image prompts, ~1 min
def test_image_prompts_on_two_fsdp_ranks_read_no_gap(ray_shared, tmp_path):
    """The tiny Qwen2-VL's image prompts through core's step on 2 Ray ranks (actor FSDP2 world size 2, the rollout
    beside it), rows with one or two images split over the ranks: the gap is 0 before and after an update that
    moves the vision tower."""
    from core.config import ActorConfig, OptimConfig, PlacementConfig, PoolConfig, RolloutConfig
    from core.loop import Roles, prompts_from_rows, step
    from core.placement import place
    from core.rollout.worker import RolloutWorker
    from core.train.fsdp import FSDPActor
    from core.vision_models import tiny_qwen_vl
    from core.worker import RoleSpec
    from tests.test_vlm_step import ALGO, image_rows, length_reward

    path = str(tiny_qwen_vl(tmp_path / "m"))
    actor = ActorConfig(model=path, dtype="float32", ppo_mini_batch_size=8, micro_batch_size=2,
                        optim=OptimConfig(lr=1e-3, warmup_steps=0))
    rollout = RolloutConfig(model=path, dtype="float32", max_prompt_length=96, exact_logprobs=True)
    specs = {"actor": RoleSpec(FSDPActor, {"cfg": actor, "exact": True}),
             "rollout": RoleSpec(RolloutWorker, {"cfg": rollout})}
    placement = place(PlacementConfig({"main": PoolConfig(slots_per_node=2)}, {"actor": "main", "rollout": "main"}),
                      specs)
    try:
        roles, rows = Roles(actor=placement["actor"], rollout=placement["rollout"]), image_rows(tmp_path)
        metrics = [step(roles, prompts_from_rows(rows), ALGO, length_reward)[1] for _ in range(2)]
    finally:
        placement.shutdown()
    assert [m["rollout/logprob_diff_max"] for m in metrics] == [0.0, 0.0], metrics
    assert metrics[1]["actor/grad_norm"] > 0
