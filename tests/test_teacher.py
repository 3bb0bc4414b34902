"""On-policy distillation's teacher before anything runs: the config sections agree (a distill estimator has a
teacher, a teacher an estimator that reads it), a teacher with another tokenizer stops the run before Ray in one
line naming teacher.model, the planner counts the teacher (frozen fp32 shards by its offload mode, its forward's
bf16 logits over its vocabulary), and Qwen3-32B's shape (head_dim 128 on a hidden size of 5120) is counted right."""

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from core.checks import check_inputs, check_run
from core.config import ConfigError, RunConfig, validate
from core.model_shapes import ModelShape, model_shape
from core.planner import GB, RunShape, plan
from tests.test_critic_tokenizer import save_smollm2, save_words

ROOT = Path(__file__).resolve().parents[1]


def distill(**over) -> RunConfig:
    return validate(RunConfig, {"use_ref": False, "teacher": {"model": over.pop("teacher", "SmolLM2-135M-Instruct")},
                                "algo": {"adv": {"estimator": over.pop("estimator", "distill_reverse_kl")}}, **over})


def test_a_distill_estimator_needs_a_teacher_and_a_teacher_needs_one():
    check_run(distill())
    with pytest.raises(ConfigError, match=r"^algo.adv.estimator=distill_mixed reads a teacher's log-probs, but "
                                          r"teacher.model is empty; set it"):
        check_run(distill(teacher="", estimator="distill_mixed"))
    with pytest.raises(ConfigError, match=r"^teacher.model='SmolLM2-135M-Instruct' is set but algo.adv.estimator=grpo "
                                          r"never reads the teacher's log-probs; pick one that does \(distill_forward_kl, "
                                          r"distill_mixed, distill_reverse_kl\)"):
        check_run(distill(estimator="grpo"))
    with pytest.raises(ConfigError, match=r"^teacher.model is set with actor.strategy=fsdp, actor.ulysses_sp=2: the "
                                          r"teacher runs on the actor's engine settings"):
        check_run(distill(actor={"ulysses_sp": 2}))
    assert set(distill().placed_roles()) == {"actor", "rollout", "teacher"}
    assert "teacher" not in validate(RunConfig, {}).placed_roles()


def test_a_teacher_with_another_tokenizer_is_refused_naming_teacher_model(tmp_path):
    smol, words = save_smollm2(tmp_path / "smol"), save_words(tmp_path / "words", ["[UNK]", "[PAD]", "Hello"])
    with pytest.raises(ConfigError) as e:
        check_inputs(distill(actor={"model": str(smol)}, rollout={"model": str(smol)}, teacher=str(words)), [])
    assert e.value.key == "teacher.model"
    assert str(e.value).startswith(f"teacher.model={words}: its tokenizer differs from actor.model={smol}'s (vocab 3 "
                                   "vs 49152;")
    assert str(e.value).endswith("the teacher scores the student's token ids, so use a model of the same tokenizer "
                                 "family")
    same = save_smollm2(tmp_path / "smol_copy")  # another folder, the same tokenizer: accepted
    check_inputs(distill(actor={"model": str(smol)}, rollout={"model": str(smol)}, teacher=str(same)), [])


def test_the_distill_recipe_stops_before_ray_in_one_line(tmp_path):
    """``hybridrl train distill`` with a teacher of another tokenizer, in a fresh interpreter: exit 2, one line on
    stderr naming teacher.model, Ray never started, nothing trained."""
    from core.scaffold import tiny_data

    words = save_words(tmp_path / "words", ["[UNK]", "[PAD]", "Hello"])
    tiny_data(tmp_path)  # 8 arithmetic rows
    code = ("import sys, ray\nfrom core.cli import main\n"
            f"rc = main(['train', 'distill', 'teacher.model={words}', 'trainer.output_dir={tmp_path / 'out'}', "
            f"'data.train_files=[{tmp_path / 'train.parquet'}]', 'data.val_files=[]'])\n"
            "print(rc, ray.is_initialized())\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.stdout.split()[-2:] == ["2", "False"], r.stdout + r.stderr[-3000:]
    assert r.stderr.startswith(f"hybridrl: teacher.model={words}: its tokenizer differs from "
                               "actor.model=SmolLM2-135M-Instruct's (vocab 3 vs 49152;"), r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr


def test_the_planner_counts_the_teacher_by_its_offload_mode_and_its_forward_peak():
    """An 8B student and a 32B teacher on 16 GPUs: the teacher's frozen fp32 shards are 4 x 32e9 / 16 = 8 GB per GPU,
    kept through the rollout with offload none, parked on the host with idle, there for good with full; its forward
    (two gathered bf16 layers and its embeddings, activations, bf16 logits 2 T V) counts beyond the actor's
    transients only."""
    actor = ModelShape(params=8e9, layers=36, hidden=4096, intermediate=12288, heads=32, kv_heads=8, vocab=151936)
    teacher = ModelShape(params=32e9, layers=64, hidden=5120, intermediate=25600, heads=64, kv_heads=8, vocab=151936,
                         attention_head_dim=128)
    base = RunShape(nnodes=2, gpus_per_node=8, gpu_memory_gb=80, teacher=teacher, tokens_per_micro=8192,
                    teacher_tokens_per_micro=8192)
    got = {item: b for item, b, _ in plan(actor, base).lines}
    assert got["teacher shards (4Pt/W)"] == pytest.approx(8 * GB)
    assert got["training state kept during rollout"] == pytest.approx((16 * 8 / 16 + 8) * GB)
    idle = {item: b for item, b, _ in plan(actor, replace(base, offload="idle", teacher_offload="idle")).lines}
    assert idle["(parked while idle training state, host, per GPU)"] == pytest.approx((12 * 8 / 16 + 8) * GB)
    full = {item: b for item, b, _ in plan(actor, replace(base, teacher_offload="full")).lines}
    assert "teacher shards (4Pt/W)" not in full and full["(offloaded training state, host, per GPU)"] == pytest.approx(
        8 * GB)
    # one rank without offload or checkpointing: the teacher is kept whole in bf16 beside its fp32 weights, nothing
    # gathered (core.train.one_rank)
    solo = {item: b for item, b, _ in plan(actor, replace(base, nnodes=1, gpus_per_node=1, gpu_memory_gb=1000,
                                                        gradient_checkpointing=False)).lines}
    assert solo["teacher shards (4Pt/W)"] == pytest.approx(4 * 32e9) and solo[
        "teacher bf16 compute copy, one rank (2Pt)"] == pytest.approx(2 * 32e9)
    T = 8192
    transient = (2 * (2 * teacher.layer_params + teacher.vocab * teacher.hidden) + 2 * T * teacher.vocab
                 + T * (14 * 5120 + 4 * 8 * 128 + 8 * 25600) + 2 * T * 5120)
    a_transient = sum(b for k, b in got.items() if k.startswith(("gathered bf16", "embeddings + LM head",
                                                                 "activations", "logits")))
    assert got["teacher forward, beyond the training transients"] == pytest.approx(max(0.0, transient - a_transient))


def test_qwen3_32b_counts_its_64_heads_of_128():
    """q and o are h x (64 x 128) = 5120 x 8192 each, k and v 5120 x (8 x 128): per layer 2 x 41,943,040 +
    2 x 5,242,880 + 3 x 5120 x 25600 (393,216,000) + 2 x 5120 = 487,598,080; x 64 = 31,206,277,120, + untied
    embeddings 2 x 151,936 x 5120 = 1,555,824,640, + the final norm 5,120 = 32,762,106,880 (Qwen reports 32.8B; its
    q/k norms, 16k, are not counted)."""
    m = model_shape("Qwen/Qwen3-32B")
    assert m.head_dim == 128 and m.layer_params == 487_598_080
    assert m.params == 32_762_106_880
