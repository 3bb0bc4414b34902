"""One whole GRPO step, ours vs TRL's ``GRPOTrainer``, on the same model, prompts, n, lengths and batch, in one run.

A step = generate n samples for each of P prompts -> reward -> old and reference log-probs -> GRPO advantages ->
2 optimizer updates of half the samples each (micro-batches of a quarter) -> (ours) weight sync to the rollout engine.
Ours runs in this process, TRL in a fresh one (``trl_in_own_process``), world size 1, on the machine's threads,
with bf16 compute where the hardware has it, temperature 1, KL coefficient 0.001 against a reference model, no
gradient checkpointing.

TRL: ``per_device_train_batch_size`` P x n / 4, ``gradient_accumulation_steps`` 2, ``steps_per_generation`` 4 -- one
generation of P x n completions feeds 4 micro-steps = 2 optimizer steps, the same schedule as ours. TRL generates
with transformers ``generate``. Its time per step is measured between its own step-end callbacks (2 optimizer
steps = one of ours), after a warm-up step, so model loading and start-up are outside both.

Full size (``--benchmark``), SmolLM2-135M-Instruct, two workloads (EOS ignored by neither side: both stop at EOS,
so both report tokens generated):
- ``short``: 8 arithmetic prompts x n=4, 32 new tokens, 3 timed steps (``grpo_step_vs_trl``);
- ``long``: 16 GSM8K questions (``../shared/data/gsm8k/train.jsonl``; synthetic word problems of the same length
  where that file is absent) x n=8, 128 new tokens, 2 timed steps (``grpo_step_vs_trl_long``).
Our per-phase split (median seconds of gen, old_logprob, ref, update_actor, sync_weights) is in each record.
The dtype is the machine kind's (bf16 where the CPU has it; ``HYBRIDRL_CPU_BF16=0`` for fp32 there).
Smoke size: the tiny random model, the short workload at 2 x 4 x 8, 1 step.
``grpo_step_exact_vs_trl``: the short workload before and after ``rollout.exact_logprobs`` with the old-log-prob
pass skipped, and TRL, in one run.
TRL is an optional bench dependency (``pip install -e .[bench]``); without it this bench is skipped.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from pathlib import Path

import pytest
import torch

from core.config import ActorConfig, AdvantageConfig, AlgoConfig, OptimConfig, RolloutConfig, SamplingParams
from core.train.fsdp import FSDPActor
from core.loop import Roles, prompts_from_rows, step
from core.models import default_dtype, resolve_model
from core.rollout.worker import RolloutWorker
from core.worker import RoleSpec
from core.worker_group import LocalWorkerGroup

KL, LR = 0.001, 1e-6


def arith_rows(count: int) -> list[dict]:
    rows = []
    for i in range(count):
        a, b = 3 + i % 7, 2 + (i * 5) % 8
        rows.append({"prompt": [{"role": "user", "content": f"What is {a} + {b}? Answer with the number."}],
                     "data_source": "bench_arith", "ground_truth": str(a + b), "extra_info": {}})
    return rows


GSM8K = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "gsm8k" / "train.jsonl"


def gsm8k_rows(count: int) -> tuple[list[dict], str]:
    """``count`` GSM8K training questions with their answers, and where they came from: the shared data file, or
    synthetic multi-step word problems of GSM8K's length (~45-60 words) where it is absent."""
    instruction = " Let's think step by step and output the final answer after \"####\"."
    if GSM8K.exists():
        with GSM8K.open() as f:
            items = [json.loads(line) for _, line in zip(range(count), f)]
        return [{"prompt": [{"role": "user", "content": it["question"] + instruction}], "data_source": "bench_gsm8k",
                 "ground_truth": it["answer"].rsplit("####", 1)[-1].strip(), "extra_info": {}} for it in items], "gsm8k"
    rows = []
    for i in range(count):
        a, b, c = 12 + i, 3 + i % 5, 2 + i % 4
        q = (f"A farmer has {a} crates of apples. Each crate holds {b} dozen apples. On Monday she sells {c} crates "
             f"at the market and gives away half of one crate to her neighbour. On Tuesday a storm damages another "
             f"crate, and she throws away every apple in it. How many apples does she have left at the end of Tuesday?")
        rows.append({"prompt": [{"role": "user", "content": q + instruction}], "data_source": "bench_gsm8k",
                     "ground_truth": str((a - c - 1) * 12 * b - 6 * b), "extra_info": {}})
    return rows, "synthetic"


def contains_answer(text: str, answer: str) -> float:
    return float(answer in re.findall(r"-?\d+", text))


def grpo_specs(path: str, dtype: str, samples: int, exact: bool = False) -> dict[str, RoleSpec]:
    """Actor (2 updates of half the samples, micro-batches of a quarter, KL loss), reference and rollout; ``exact``:
    the actor's forward on the engine's kernels (``rollout.exact_logprobs``)."""
    actor = ActorConfig(model=path, dtype=dtype, ppo_mini_batch_size=samples // 2, micro_batch_size=samples // 4,
                        kl_loss_coef=KL, optim=OptimConfig(lr=LR, warmup_steps=0))
    ref = ActorConfig(model=path, dtype=dtype, trainable=False, micro_batch_size=samples // 4)
    rollout = RolloutConfig(model=path, dtype=dtype, max_batch_size=samples, max_prompt_length=256, exact_logprobs=exact)
    return {"actor": RoleSpec(FSDPActor, {"cfg": actor, "exact": exact}), "ref": RoleSpec(FSDPActor, {"cfg": ref}),
            "rollout": RoleSpec(RolloutWorker, {"cfg": rollout})}


def grpo_step_config(n: int, new: int, bypass: bool = False) -> AlgoConfig:
    """``bypass``: no old-log-prob pass, the rollout's log-probs are the old ones (``algo.bypass_mode``)."""
    return AlgoConfig(sampling=SamplingParams(n=n, temperature=1.0, max_new_tokens=new),
                      adv=AdvantageConfig(estimator="grpo"), bypass_mode=bypass)


def reward(source, text, truth, extra=None) -> float:
    return contains_answer(text, truth)


PHASES = ("gen", "reward", "old_logprob", "ref", "adv", "update_actor", "sync_weights")


def ours_step_seconds(path: str, dtype: str, rows: list[dict], n: int, new: int, steps: int, exact: bool = False
                      ) -> tuple[float, float, dict[str, float]]:
    """Median seconds per step after one warm-up step, the mean response length, and each phase's median seconds.
    ``exact``: the actor's forward on the engine's kernels and the old-log-prob pass skipped (the rollout's
    log-probs are then the trainer's, bit for bit)."""
    group = LocalWorkerGroup(grpo_specs(path, dtype, len(rows) * n, exact))
    cfg = grpo_step_config(n, new, bypass=exact)
    roles = Roles(actor=group.role("actor"), rollout=group.role("rollout"), ref=group.role("ref"))
    times, lengths, phases = [], [], {k: [] for k in PHASES}
    try:
        for i in range(steps + 1):
            batch = prompts_from_rows(rows)
            t = time.perf_counter()
            _, metrics = step(roles, batch, cfg, reward)
            if i:
                times.append(time.perf_counter() - t)
                lengths.append(metrics["response_length/mean"])
                for k in PHASES:
                    phases[k].append(metrics.get(f"timing_s/{k}", 0.0))
    finally:
        group.shutdown()
    return statistics.median(times), sum(lengths) / len(lengths), {k: statistics.median(v) for k, v in phases.items()}


def release_host_memory() -> None:
    """Hand the heap our side freed back to the OS before TRL runs in this process: glibc keeps freed blocks in its
    arenas (after our long workload the process held 9.6 GB, of which 1.3 GB live; TRL on top of that was killed
    for memory on the 24 GB machine)."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def trl_step_seconds(path: str, bf16: bool, rows: list[dict], n: int, new: int, steps: int, out) -> tuple[float, float]:
    """TRL's median seconds per GRPO step (2 optimizer steps) after a warm-up step, and its mean completion length."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    class StepTimes(TrainerCallback):
        def __init__(self):
            self.ends, self.lengths = [], []

        def on_step_end(self, args, state, control, **kw):
            self.ends.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                self.lengths.append(logs["completions/mean_length"])

    data = Dataset.from_list([{"prompt": r["prompt"], "answer": r["ground_truth"]} for r in rows] * (steps + 2))

    def reward(completions, answer, **kw):
        return [contains_answer(c[-1]["content"], a) for c, a in zip(completions, answer)]

    args = GRPOConfig(output_dir=str(out), per_device_train_batch_size=len(rows) * n // 4, gradient_accumulation_steps=2,
                      steps_per_generation=4, num_generations=n, max_completion_length=new, temperature=1.0,
                      beta=KL, learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0,
                      max_steps=2 * (steps + 1), gradient_checkpointing=False, bf16=bf16, use_cpu=True,
                      logging_steps=1, report_to="none", save_strategy="no", shuffle_dataset=False, seed=0,
                      dataloader_num_workers=0, disable_tqdm=True)
    timer = StepTimes()
    trainer = GRPOTrainer(model=path, reward_funcs=reward, args=args, train_dataset=data, callbacks=[timer])
    trainer.train()
    ends = timer.ends[1::2]  # the end of every second optimizer step closes one GRPO step
    per_step = [b - a for a, b in zip(ends, ends[1:])]
    return sorted(per_step)[len(per_step) // 2], sum(timer.lengths) / max(len(timer.lengths), 1)


def _trl_child(queue, *args) -> None:
    queue.put(trl_step_seconds(*args))


def trl_in_own_process(*args) -> tuple[float, float]:
    """``trl_step_seconds(*args)`` in a fresh process: TRL's long workload in fp32 did not fit a 24 GB machine, and
    the kernel's OOM kill took the whole pytest run with it. Now that ends this bench with a message that says so."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_trl_child, args=(queue, *args))
    proc.start()
    proc.join()
    if proc.exitcode != 0:
        why = " (killed: most likely out of memory on the host)" if proc.exitcode == -9 else ""
        pytest.fail(f"TRL's side of the GRPO step bench ended with exit code {proc.exitcode}{why}; ours was measured")
    return queue.get(timeout=60)


@pytest.mark.parametrize("workload", ["short", "long"])
def test_whole_grpo_step_vs_trl(full_size, report, tiny_model_dir, tmp_path, workload):
    pytest.importorskip("trl", reason="TRL is an optional bench dependency: pip install -e '.[bench]'")
    if workload == "long" and not full_size:
        pytest.skip("the long workload runs at full size only (--benchmark)")
    path = resolve_model("SmolLM2-135M-Instruct") if full_size else str(tiny_model_dir)
    if workload == "short":
        (P, n, new, steps), source = (8, 4, 32, 3) if full_size else (2, 4, 8, 1), "arith"
        rows = arith_rows(P)
    else:
        P, n, new, steps = 16, 8, 128, 2
        rows, source = gsm8k_rows(P)
    bf16 = default_dtype() == torch.bfloat16  # from the CPU's flags, as `dtype: auto`
    ours_s, ours_len, phases = ours_step_seconds(path, "bfloat16" if bf16 else "float32", rows, n, new, steps)
    release_host_memory()
    trl_s, trl_len = trl_in_own_process(path, bf16, rows, n, new, steps, tmp_path / "trl")
    name = "grpo_step_vs_trl" + ("" if workload == "short" else "_long")
    rec = report(name, tracked={"speedup_vs_trl": "higher"} if full_size else None,
                 model=path.rsplit("/", 1)[-1], bf16=bf16, prompts=P, n=n, max_new_tokens=new, data=source,
                 ours_step_s=ours_s, trl_step_s=trl_s, ours_response_len=ours_len, trl_response_len=trl_len,
                 speedup_vs_trl=trl_s / ours_s, **{f"ours_{k}_s": v for k, v in phases.items()})
    assert rec["ours_step_s"] > 0 and rec["trl_step_s"] > 0


def test_whole_grpo_step_with_the_old_pass_skipped_exactly_vs_trl(full_size, report, tiny_model_dir, tmp_path):
    """The short workload three ways in one run: ours as above (before), ours with ``rollout.exact_logprobs`` and
    the old-log-prob pass skipped (after: ``algo.bypass_mode``, exact because the trainer's log-probs are the
    rollout's bit for bit), and TRL. The machine kind's dtype for all three."""
    pytest.importorskip("trl", reason="TRL is an optional bench dependency: pip install -e '.[bench]'")
    from core.train.exact import available

    bf16 = default_dtype() == torch.bfloat16
    if why := available(default_dtype()):
        pytest.skip(f"the exact forward: {why}")
    path = resolve_model("SmolLM2-135M-Instruct") if full_size else str(tiny_model_dir)
    (P, n, new, steps) = (8, 4, 32, 3) if full_size else (2, 4, 8, 1)
    rows, name = arith_rows(P), "bfloat16" if bf16 else "float32"
    before_s, before_len, before = ours_step_seconds(path, name, rows, n, new, steps)
    after_s, after_len, after = ours_step_seconds(path, name, rows, n, new, steps, exact=True)
    release_host_memory()
    trl_s, trl_len = trl_in_own_process(path, bf16, rows, n, new, steps, tmp_path / "trl")
    rec = report("grpo_step_exact_vs_trl", tracked={"speedup_vs_trl_exact": "higher"} if full_size else None,
                 model=path.rsplit("/", 1)[-1], bf16=bf16, prompts=P, n=n, max_new_tokens=new,
                 ours_step_s=before_s, ours_exact_step_s=after_s, trl_step_s=trl_s, ours_response_len=before_len,
                 ours_exact_response_len=after_len, trl_response_len=trl_len, speedup_vs_trl=trl_s / before_s,
                 speedup_vs_trl_exact=trl_s / after_s, exact_vs_ordinary=before_s / after_s,
                 **{f"ours_{k}_s": v for k, v in before.items()}, **{f"ours_exact_{k}_s": v for k, v in after.items()})
    assert rec["ours_old_logprob_s"] > 100 * rec["ours_exact_old_logprob_s"]  # the pass skipped: its phase is a no-op
