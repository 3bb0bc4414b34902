"""On-policy distillation's teacher (``teacher:``; the estimators in ``core.algos.distill``): what a run with one must
agree on, checked before anything loads. Its tokenizer is checked against the student's with the data, before Ray
(``core.checks.tokenizer_problem``: the teacher scores the student's token ids)."""

from __future__ import annotations

from core.algos.distill import DISTILL_ESTIMATORS


def teacher_problems(cfg) -> list[str]:
    """A distill estimator has a teacher to read, and a teacher has an estimator that reads it."""
    estimator, model = cfg.algo.adv.estimator, cfg.teacher.model
    if estimator in DISTILL_ESTIMATORS and not model:
        return [f"algo.adv.estimator={estimator} reads a teacher's log-probs, but teacher.model is empty; set it to "
                "the teacher's folder or HF id (it must share the student's tokenizer)"]
    if model and estimator not in DISTILL_ESTIMATORS:
        return [f"teacher.model={model!r} is set but algo.adv.estimator={estimator} never reads the teacher's "
                f"log-probs; pick one that does ({', '.join(sorted(DISTILL_ESTIMATORS))}) or leave teacher.model empty"]
    return []
