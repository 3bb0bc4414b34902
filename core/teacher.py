"""On-policy distillation's teacher (``teacher:``; the estimators in ``core.algos.distill``): what a run with one must
agree on, checked before anything loads. Its tokenizer is checked against the student's with the data, before Ray
(``core.checks.tokenizer_problem``: the teacher scores the student's token ids)."""

from __future__ import annotations

from core.algos.distill import DISTILL_ESTIMATORS


def teacher_problems(cfg) -> list[str]:
    """A distill estimator has a teacher to read, a teacher has an estimator that reads it, and the actor's engine
    settings (which the teacher takes) are FSDP2 without sequence parallelism."""
    estimator, model = cfg.algo.adv.estimator, cfg.teacher.model
    if estimator in DISTILL_ESTIMATORS and not model:
        return [f"algo.adv.estimator={estimator} reads a teacher's log-probs, but teacher.model is empty; set it to "
                "the teacher's folder or HF id (it must share the student's tokenizer)"]
    if model and estimator not in DISTILL_ESTIMATORS:
        return [f"teacher.model={model!r} is set but algo.adv.estimator={estimator} never reads the teacher's "
                f"log-probs; pick one that does ({', '.join(sorted(DISTILL_ESTIMATORS))}) or leave teacher.model empty"]
    a = cfg.actor
    if model and (a.strategy != "fsdp" or a.ulysses_sp != 1):
        # the teacher takes the actor's engine settings; a Megatron layout or a Ulysses group would have to fit the
        # teacher's shape too, which nothing checks: refused rather than run unchecked
        return [f"teacher.model is set with actor.strategy={a.strategy}, actor.ulysses_sp={a.ulysses_sp}: the teacher "
                "runs on the actor's engine settings, supported on FSDP2 without sequence parallelism; set "
                "actor.strategy=fsdp and actor.ulysses_sp=1"]
    return []
