"""Interleaved A/B of the GRPO step's training phases on one fixed batch, in one process.

A shared CPU machine's speed drifts by +-10-15% within minutes, so two bench runs cannot tell a 3% change from
noise, and ``torch.profiler`` overstates small elementwise ops on CPU (it once put ~7 s of a 56 s update in ops that
cost far less). This harness generates one batch once (the bench's model, prompts and schedule), then times the
``old_logprob``, ``ref`` and ``update_actor`` phases round after round, switching between variants inside each
round, so drift hits every variant alike. The update's weights move between rounds; the shapes do not.

    PYTHONPATH=. python -m bench.phases_ab --workload short --rounds 4            # the phases, no variants
    PYTHONPATH=. python -m bench.phases_ab --workload long --rounds 2 --breakdown  # + forward / backward / optimizer per update
    PYTHONPATH=. python -m bench.phases_ab --workload long --rounds 3 --leave-to-update  # old log-probs left / computed

A variant is a ``(name, context manager factory)`` pair; ``run(variants=...)`` from an ad-hoc script compares them
(e.g. a kernel switched off by patching its ``_on_kernels`` test). Not collected by pytest (no ``test_`` prefix).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from typing import Callable, ContextManager

import torch

from bench.test_grpo_step import arith_rows, grpo_specs, grpo_step_config, gsm8k_rows, reward
from core import loop
from core.loop import Roles, Timer, advantages, generate, logprobs, prompts_from_rows, score
from core.models import default_dtype, resolve_model
from core.worker_group import LocalWorkerGroup

WORKLOADS = {"short": (8, 4, 32), "long": (16, 8, 128)}


def _timed_breakdown(actor, seconds: dict[str, float]) -> Callable[[], None]:
    """Wrap the actor's forward and optimizer step with timers (into ``seconds``); returns the undo."""
    forward, step = actor._forward, actor._step

    def timed_forward(mb, with_entropy):
        t = time.perf_counter()
        out = forward(mb, with_entropy)
        seconds["forward"] = seconds.get("forward", 0.0) + time.perf_counter() - t
        return out

    def timed_step():
        t = time.perf_counter()
        out = step()
        seconds["optimizer"] = seconds.get("optimizer", 0.0) + time.perf_counter() - t
        return out

    actor._forward, actor._step = timed_forward, timed_step
    return lambda: (delattr(actor, "_forward"), delattr(actor, "_step"))


def run(workload: str = "short", rounds: int = 4, variants: list[tuple[str, Callable[[], ContextManager]]] | None = None,
        breakdown: bool = False, model: str = "SmolLM2-135M-Instruct") -> dict[str, dict[str, list[float]]]:
    """Seconds of each phase per round, per variant: ``{variant: {phase: [s, ...]}}`` (printed as it goes)."""
    variants = variants or [("as is", contextlib.nullcontext)]
    prompts, n, new = WORKLOADS[workload]
    rows = arith_rows(prompts) if workload == "short" else gsm8k_rows(prompts)[0]
    path = resolve_model(model)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = "bfloat16" if default_dtype(device) == torch.bfloat16 else "float32"  # as the bench: the CPU's flags; CUDA: bf16
    group = LocalWorkerGroup(grpo_specs(path, dtype, prompts * n), device=device)
    cfg = grpo_step_config(n, new)
    roles = Roles(actor=group.role("actor"), rollout=group.role("rollout"), ref=group.role("ref"))
    actor = group._host.roles["actor"]
    out: dict[str, dict[str, list[float]]] = {name: {} for name, _ in variants}
    try:
        timer = Timer()
        batch = generate(roles, prompts_from_rows(rows), cfg.sampling, timer)
        score(roles, batch, cfg, reward, timer)
        print(f"{workload}: {len(batch)} rows, mean response {float(batch['response_mask'].sum(-1).mean()):.1f} "
              f"tokens, dtype {dtype}; gen {timer.seconds['gen']:.2f} s, reward {timer.seconds['reward']:.2f} s",
              flush=True)
        for r in range(rounds + 1):  # round 0 warms every variant up and is not kept
            for name, make in (variants if r % 2 else variants[::-1]):  # the order alternates by round
                timer, parts = Timer(), {}
                with make():
                    b = logprobs(roles, batch.clone(), cfg, timer)
                    advantages(b, cfg, timer)
                    undo = _timed_breakdown(actor, parts) if breakdown else (lambda: None)
                    try:
                        with timer("update_actor"):
                            roles.actor.dp_split(type(actor).update, b)
                    finally:
                        undo()
                got = {k: timer.seconds[k] for k in ("old_logprob", "ref", "update_actor")} | parts
                if breakdown:
                    got["backward+rest"] = got["update_actor"] - parts["forward"] - parts["optimizer"]
                if r:
                    for k, v in got.items():
                        out[name].setdefault(k, []).append(v)
                print(f"round {r} {name:>12}: " + "  ".join(f"{k} {v:.2f}" for k, v in got.items()), flush=True)
    finally:
        group.shutdown()
    for name, phases in out.items():
        print(f"median {name:>12}: " + "  ".join(f"{k} {statistics.median(v):.2f}" for k, v in phases.items()))
    return out


@contextlib.contextmanager
def old_logprobs_computed():
    """The variant where the actor computes every row's old log-probs (none left to the update's forward)."""
    saved = loop._old_left_to_update
    loop._old_left_to_update = lambda *a, **k: False
    try:
        yield
    finally:
        loop._old_left_to_update = saved


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="short")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--breakdown", action="store_true", help="split the update into forward / optimizer / the rest")
    p.add_argument("--model", default="SmolLM2-135M-Instruct", help="a model name or folder (random weights: a GPU run)")
    p.add_argument("--leave-to-update", action="store_true",
                   help="compare old log-probs left to the update's first forward (core's) with all computed first")
    a = p.parse_args()
    run(a.workload, a.rounds, breakdown=a.breakdown, model=a.model, variants=[("left", contextlib.nullcontext),
        ("computed", old_logprobs_computed)] if a.leave_to_update else None)
