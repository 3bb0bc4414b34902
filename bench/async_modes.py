"""Sync vs one step off vs streaming (``trainer.async.mode``) on the CPU GRPO and agent workloads, split placement
(the actor and reference on one 1-slot pool, the rollout on another: each on a core of its own), responses with a
long tail (GRPO: up to 96 tokens where most answers take 10-20, or up to 256 (``grpo_tail``), where a few rambling
samples hold a synchronous step; agent: turns and tool rounds of uneven count).

Each mode is one real run of the recipe (``python -m core.cli train``), one after another; from its
``metrics.jsonl``: seconds per step (steps 2 on: step 1 holds the start-up), samples/s and response tokens/s, the
staleness and partial-rollout share, and the held-out score after equal wall time -- the last held-out evaluation
within the fastest mode's whole training time (the sum of its steps' times; evaluations not counted).

    PYTHONPATH=. python -m bench.async_modes                     # both workloads, all three modes
    PYTHONPATH=. python -m bench.async_modes --workload grpo agent --steps 6

Writes ``bench/results/async_modes.json`` and prints a markdown table per workload. Not collected by pytest.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPLIT = ["placement.pools.main={nnodes: 1, slots_per_node: 1, device: cpu, cpus_per_slot: 1.0}",
         "placement.pools.gen={nnodes: 1, slots_per_node: 1, device: cpu, cpus_per_slot: 1.0}"]
WORKLOADS = {
    "grpo": ("recipes/grpo", "demo_cpu", ["placement.roles={actor: main, ref: main, rollout: gen}",
                                          "algo.sampling.max_new_tokens=96", "trainer.test_freq=4"]),
    "grpo_tail": ("recipes/grpo", "demo_cpu", ["placement.roles={actor: main, ref: main, rollout: gen}",
                                               "algo.sampling.max_new_tokens=256", "trainer.test_freq=4"]),
    "agent": ("recipes/agent", "config", ["placement.roles={actor: main, rollout: gen}", "trainer.test_freq=4"]),
}
STEPS = {"grpo": 12, "grpo_tail": 10, "agent": 6}
MODES = {"sync": ["algo.tis_cap=2.0"], "one_step_off": ["trainer.async.mode=one_step_off"],
         "streaming": ["trainer.async.mode=streaming", "trainer.async.max_staleness=1"],
         "streaming_keep_kv": ["trainer.async.mode=streaming", "trainer.async.max_staleness=1",
                               "trainer.async.partial_kv=keep"]}


def run_mode(workload: str, mode: str, steps: int, out: Path) -> list[dict]:
    recipe, config, extra = WORKLOADS[workload]
    cmd = [sys.executable, "-m", "core.cli", "train", str(ROOT / recipe), "--config-name", config,
           f"trainer.output_dir={out}", f"trainer.total_steps={steps}", *SPLIT, *extra, *MODES[mode]]
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def summary(rows: list[dict], budget: float | None) -> dict:
    steps = [r for r in rows if r.get("step", 0) >= 1 and "timing_s/step" in r]
    later = steps[1:] or steps
    s_per_step = sum(r["timing_s/step"] for r in later) / len(later)
    response_tokens = sum(r["response_length/mean"] * r["_samples"] for r in later)
    elapsed, held_out, val_key = 0.0, {}, next((k for k in rows[0] if k.startswith("val/") and k.endswith(
        "/pass@1")), "val/reward/mean")
    for r in rows:
        elapsed += r.get("timing_s/step", 0.0)
        if val_key in r and (budget is None or elapsed <= budget + 1e-9):
            held_out = {"step": r["step"], "score": r[val_key], "at_s": elapsed}
    return {"s_per_step": s_per_step, "samples_per_s": later[0]["_samples"] / s_per_step,
            "response_tokens_per_s": response_tokens / sum(r["timing_s/step"] for r in later),
            "train_time_s": sum(r["timing_s/step"] for r in steps), "held_out": held_out, "val_key": val_key,
            "staleness_mean": sum(r.get("rollout/staleness_mean", 0.0) for r in later) / len(later),
            "partial_frac": sum(r.get("rollout/partial_frac", 0.0) for r in later) / len(later),
            "gen_s": sum(r.get("timing_s/gen", 0.0) for r in later) / len(later),
            "update_s": sum(r.get("timing_s/update_actor", 0.0) for r in later) / len(later),
            "reward_first_last": (steps[0]["reward/mean"], steps[-1]["reward/mean"])}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", choices=[*WORKLOADS, "all"], nargs="+", default=["all"])
    p.add_argument("--steps", type=int, default=0, help="steps per run (default: GRPO 12, its tail 10, agent 6)")
    p.add_argument("--modes", choices=MODES, nargs="+", default=list(MODES))
    p.add_argument("--out", type=Path, default=ROOT / "outputs" / "bench_async")
    a = p.parse_args(argv)
    from bench.regress import machine_kind

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    report = {"commit": commit, "machine_kind": machine_kind(), "workloads": {}}
    for workload in WORKLOADS if "all" in a.workload else a.workload:
        rows = {}
        for mode in a.modes:
            got = run_mode(workload, mode, a.steps or STEPS[workload], a.out / workload / mode)
            for r in got:  # samples per step: prompts x n, from the run's config
                r["_samples"] = samples_per_step(a.out / workload / mode)
            rows[mode] = got
        budget = min(summary(r, None)["train_time_s"] for r in rows.values())
        report["workloads"][workload] = {mode: summary(r, budget) for mode, r in rows.items()}
        print(table(workload, report["workloads"][workload], budget))
    (ROOT / "bench" / "results").mkdir(exist_ok=True)
    path = ROOT / "bench" / "results" / "async_modes.json"  # one file, the workloads of every run kept
    old = json.loads(path.read_text()) if path.is_file() else {}
    if old.get("commit") == commit and old.get("machine_kind") == report["machine_kind"]:
        report["workloads"] = {**old.get("workloads", {}), **report["workloads"]}
    path.write_text(json.dumps(report, indent=1))
    return 0


def samples_per_step(out: Path) -> int:
    cfg = json.loads((out / "config.json").read_text())
    groups = cfg["data"]["train_prompts_per_step"] or cfg["data"]["prompts_per_step"]
    return groups * cfg["algo"]["sampling"]["n"]


def table(workload: str, result: dict, budget: float) -> str:
    lines = [f"\n{workload}: held-out after {budget:.0f} s of training (the fastest mode's whole run)\n",
             "| mode | s / step | samples/s | response tokens/s | gen | update | staleness | partial | "
             "held-out (step) |", "|---|---|---|---|---|---|---|---|---|"]
    for mode, r in result.items():
        h = r["held_out"]
        lines.append(f"| {mode} | {r['s_per_step']:.2f} | {r['samples_per_s']:.2f} | "
                     f"{r['response_tokens_per_s']:.1f} | {r['gen_s']:.2f} | {r['update_s']:.2f} | "
                     f"{r['staleness_mean']:.2f} | {r['partial_frac']:.2f} | "
                     f"{h.get('score', float('nan')):.3f} ({h.get('step', '-')}) |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
