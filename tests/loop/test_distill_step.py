"""On-policy distillation through core's step, in one process (local backend) on tiny real models: the teacher role
(built from ``teacher:`` by ``core.roles.role_specs``, a model of another size than the student's, with its
tokenizer) scores the student's own samples exactly as a plain transformers forward of the teacher does, the
advantage is the teacher - student gap on every response token, the old log-probs are computed before the update
(the estimator reads them), and a few steps of it bring the student closer to the teacher."""

import pytest
import torch

from core.config import RunConfig, validate
from core.loop import Roles, prompts_from_rows, step
from core.placement import place
from core.roles import role_specs

TEMPERATURE = 0.8
ROWS = [{"prompt": [{"role": "user", "content": f"{a} + {a} ="}], "data_source": "toy", "ground_truth": str(2 * a),
         "extra_info": {}} for a in range(4)]


def digits(data_source, solution_str, ground_truth, extra_info=None):
    return float(ground_truth in solution_str)


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    from core.models import tiny_random_model

    # the student's character tokenizer, another depth and seed: another model
    return tiny_random_model(tmp_path_factory.mktemp("teacher") / "model", layers=3, seed=7)


def distill_config(student, teacher) -> RunConfig:
    return validate(RunConfig, {
        "trainer": {"backend": "local"}, "use_ref": False,
        "actor": {"model": str(student), "dtype": "float32", "temperature": TEMPERATURE, "optim": {"lr": 3e-3},
                  "ppo_mini_batch_size": 16, "micro_batch_size": 16},
        "rollout": {"model": str(student), "dtype": "float32", "max_prompt_length": 32},
        "teacher": {"model": str(teacher), "dtype": "float32"},
        "algo": {"adv": {"estimator": "distill_reverse_kl"},
                 "sampling": {"n": 4, "temperature": TEMPERATURE, "max_new_tokens": 8, "seed": 0}}})


def hf_logprobs(model_dir, batch) -> torch.Tensor:
    """Each row unpadded (its prompt tokens, then its valid response tokens) through transformers, at the
    temperature: the log-prob of every valid response token; 0 elsewhere."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    P = batch["prompts"].shape[1]
    out = torch.zeros_like(batch["response_mask"], dtype=torch.float32)
    for i in range(len(batch["prompts"])):
        prompt = batch["prompts"][i][batch["attention_mask"][i, :P] > 0]
        n = int(batch["response_mask"][i].sum())
        ids = torch.cat([prompt, batch["responses"][i, :n]])[None]
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1:-1].float() / TEMPERATURE
        out[i, :n] = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt):, None])[:, 0]
    return out


def test_the_teacher_scores_the_students_samples_and_the_gap_is_the_advantage(tiny_model_dir, teacher_dir):
    cfg = distill_config(tiny_model_dir, teacher_dir)
    assert set(cfg.placed_roles()) == {"actor", "rollout", "teacher"}  # no reference: use_ref false, no KL
    placement = place(cfg.placement, role_specs(cfg), backend="local")
    try:
        roles = Roles(actor=placement["actor"], rollout=placement["rollout"], teacher=placement["teacher"])
        batch, metrics = step(roles, prompts_from_rows(ROWS), cfg.algo, digits)
    finally:
        placement.shutdown()
    mask = batch["response_mask"]
    assert mask.sum() > 0 and "old_from_update" not in batch  # the estimator reads the old log-probs: all computed
    torch.testing.assert_close(batch["teacher_logprobs"] * mask, hf_logprobs(teacher_dir, batch), rtol=0, atol=1e-5)
    torch.testing.assert_close(batch["old_logprobs"] * mask, hf_logprobs(tiny_model_dir, batch), rtol=0, atol=1e-5)
    gap = (batch["teacher_logprobs"] - batch["old_logprobs"]) * mask
    assert torch.equal(batch["advantages"], gap)
    assert metrics["distill/reverse_kl"] == pytest.approx(float(-gap.sum() / mask.sum()), rel=1e-6)
    assert metrics["timing_s/teacher"] > 0 and "timing_s/ref" not in metrics


def test_distillation_steps_bring_the_student_toward_the_teacher(tiny_model_dir, teacher_dir):
    """The sampled reverse KL of the student's own tokens falls over 8 steps on the same prompts (fixed seeds)."""
    cfg = distill_config(tiny_model_dir, teacher_dir)
    placement = place(cfg.placement, role_specs(cfg), backend="local")
    try:
        roles = Roles(actor=placement["actor"], rollout=placement["rollout"], teacher=placement["teacher"])
        kl = [step(roles, prompts_from_rows(ROWS), cfg.algo, digits)[1]["distill/reverse_kl"] for _ in range(8)]
    finally:
        placement.shutdown()
    print("reverse KL per step:", [round(k, 3) for k in kl])
    assert sum(kl[-3:]) / 3 < 0.5 * sum(kl[:3]) / 3, kl
