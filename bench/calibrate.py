"""Calibrate the step-time simulator (``core.simulate``) on one measured run, then predict others measured
independently and report the error -- the check that ``hybridrl plan --time`` is not circular.

A: the CPU GRPO recipe (responses up to 256 tokens), rollout on a pool of its own, ``sync``: its phase times give the
costs -- a decode step's fixed and per-sequence parts and the prefill (least squares over its steps' generation
times against each step's longest response and total response tokens, from ``lengths.jsonl``), the training
forward and update tokens/s, the sync and reward times. B, C, D: the same recipe one step off, streaming, and
colocated on 2 ranks (``sync``), each predicted from A's costs and its own response lengths (an input, as a user
gives ``--lengths``), against its measured seconds per step (steps 2 on). E: another workload, the agent recipe's
CPU tier (multi-turn calculator calls, colocated on 2 ranks): its samples replayed turn by turn from its
``lengths.jsonl``, each tool round taking the calculator's latency measured alone (``tool_latency``: the sandbox
started for one call, as the agent loop does). F: A's placement across two nodes (a Ray cluster of two network
namespaces on this host, one core each: the weights cross a network at every sync), where the host can build
namespaces (root).

    PYTHONPATH=. python -m bench.calibrate              # the five runs (about 20 min on 2 cores), then the table
    PYTHONPATH=. python -m bench.calibrate --no-run     # the table from the runs already in --out
    PYTHONPATH=. python -m bench.calibrate --runs F_two_nodes_split_sync   # one run again, then the table

Writes ``bench/results/costs.yaml`` (A's costs, with the commit and machine kind) and prints the table. Not collected
by pytest.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from core.config import RunConfig, validate
from core.model_shapes import model_shape
from core.simulate import Costs, Workload, simulate
from core.time_plan import layout_of, run_prompt_tokens, run_turns

ROOT = Path(__file__).resolve().parents[1]
SPLIT = ["placement.pools.main={nnodes: 1, slots_per_node: 1, device: cpu, cpus_per_slot: 1.0}",
         "placement.pools.gen={nnodes: 1, slots_per_node: 1, device: cpu, cpus_per_slot: 1.0}",
         "placement.roles={actor: main, ref: main, rollout: gen}"]
GRPO = ["recipes/grpo", "--config-name", "demo_cpu", "algo.sampling.max_new_tokens=256"]
RUNS = {"A_split_sync": [*GRPO, *SPLIT], "B_split_one_step_off": [*GRPO, *SPLIT, "trainer.async.mode=one_step_off"],
        "C_split_streaming": [*GRPO, *SPLIT, "trainer.async.mode=streaming"], "D_colocated_sync": GRPO,
        "E_agent_colocated_sync": ["recipes/agent"], "F_two_nodes_split_sync": [*GRPO, *SPLIT]}
TWO_NODES = {"F_two_nodes_split_sync"}


def train(name: str, out: Path, steps: int) -> None:
    cmd = [sys.executable, "-m", "core.cli", "train", *RUNS[name], f"trainer.output_dir={out / name}",
           f"trainer.total_steps={steps}", "trainer.test_freq=0"]
    if name not in TWO_NODES:
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        return
    from tests.multinode import Cluster, namespaces_available

    if why := namespaces_available():
        print(f"{name}: not run ({why}: a two-node cluster needs network namespaces)")
        return
    with Cluster(out / "cluster", cpus=[1, 1]) as cluster:  # the driver on node 0, each pool on a node of its own
        r = cluster.run(cmd, timeout_s=3600)
    if r.returncode:
        raise RuntimeError(f"{name}: exit {r.returncode}\n{r.stderr[-3000:]}")


def tool_latency(calls: int = 20) -> float:
    """The median seconds of one calculator call in the sandbox, with the agent recipe's limits."""
    import time

    from core.config import AgentConfig
    from core.rollout.agent_loop import run_tool
    from core.tools.parsers import ToolCall

    cfg, times = AgentConfig(enable=True, tool_max_output_bytes=256), []
    for i in range(calls):
        t = time.perf_counter()
        assert run_tool(ToolCall("calculator", {"expression": f"{123 + i} * 456"}), cfg).ok
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def measured(run: Path) -> tuple[dict, list[dict], dict[int, list[int]]]:
    """The run's config, its steps from the second on, and each step's response lengths."""
    cfg = json.loads((run / "config.json").read_text())
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r.get("step", 0) >= 2 and "timing_s/step" in r]
    lengths = {r["step"]: r["response_lengths"] for r in map(json.loads, (run / "lengths.jsonl").read_text().splitlines())}
    return cfg, rows, lengths


def prompt_tokens(rows: list[dict], lengths: dict[int, list[int]]) -> float:
    """Mean prompt tokens per sample: a step's tokens (throughput x time) less its response tokens."""
    per = [(r["perf/throughput_tokens_per_s"] * r["timing_s/step"] - sum(lengths[r["step"]])) / len(lengths[r["step"]])
           for r in rows]
    return float(np.mean(per))


def fit(run: Path) -> Costs:
    """A's costs from its phase times (one rollout replica whose slots hold the whole batch: a step's generation
    is its longest response's decode steps, each of every sequence still running, plus the prefills)."""
    cfg, rows, lengths = measured(run)
    P = prompt_tokens(rows, lengths)
    X = np.array([[max(lengths[r["step"]]), sum(lengths[r["step"]]), 1.0] for r in rows])
    y = np.array([r["timing_s/gen"] for r in rows])
    (base, per_seq, fixed), *_ = np.linalg.lstsq(X, y, rcond=None)
    samples = len(lengths[rows[0]["step"]])
    tokens = [samples * P + sum(lengths[r["step"]]) for r in rows]
    fwd = np.mean([t / r["timing_s/old_logprob"] for t, r in zip(tokens, rows)] +
                  [t / r["timing_s/ref"] for t, r in zip(tokens, rows) if "timing_s/ref" in r])
    upd = np.mean([t / r["timing_s/update_actor"] for t, r in zip(tokens, rows)])
    return Costs(decode_base_s=float(max(base, 1e-6)), decode_per_seq_s=float(max(per_seq, 0.0)),
                 prefill_tok_s=float(samples * P / fixed) if fixed > 0 else 1e9, forward_tok_s=float(fwd),
                 update_tok_s=float(upd), sync_base_s=float(np.mean([r["timing_s/sync_weights"] for r in rows])),
                 reward_s=float(np.mean([r["timing_s/reward"] for r in rows])))


def predict(costs: Costs, run: Path) -> tuple[float, float]:
    """(predicted, measured) seconds per step of ``run`` from ``costs`` and its own response lengths (an agent
    run's: its samples' turns and tool answers) and prompt lengths, as ``hybridrl plan --time`` reads them."""
    tree, rows, lengths = measured(run)
    cfg = validate(RunConfig, tree, str(run / "config.json"))
    layout, _ = layout_of(cfg, model_shape(cfg.actor.model))  # the placement as `hybridrl plan --time` reads it
    s = cfg.algo.sampling
    work = Workload(cfg.data.prompts_per_step, s.n, round(run_prompt_tokens(str(run))),
                    tuple(x for k in sorted(lengths) if k >= 2 for x in lengths[k]), reference=cfg.has_reference(),
                    ppo_epochs=cfg.actor.ppo_epochs, turns=run_turns(str(run)))
    p = simulate(costs, work, layout, cfg.trainer.async_.mode, steps=40, max_staleness=cfg.trainer.async_.max_staleness)
    return p.step_s, float(np.mean([r["timing_s/step"] for r in rows]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "outputs" / "bench_calibrate")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--no-run", action="store_true", help="use the runs already in --out")
    ap.add_argument("--runs", nargs="+", choices=list(RUNS), default=list(RUNS),
                    help="run these only (the table reads every run in --out)")
    a = ap.parse_args(argv)
    from bench.regress import machine_kind

    if not a.no_run:
        for name in a.runs:
            train(name, a.out, a.steps)
    costs = replace(fit(a.out / "A_split_sync"), tool_s=tool_latency())
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    (ROOT / "bench" / "results").mkdir(exist_ok=True)
    lines = [f"# A's costs (bench/calibrate.py), commit {commit.strip()}, machine kind {machine_kind()}"]
    lines += [f"{k}: {v:.6g}" for k, v in asdict(costs).items()]
    (ROOT / "bench" / "results" / "costs.yaml").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print("\n| run | predicted s / step | measured s / step | error |\n|---|---|---|---|")
    for name in RUNS:
        if not (a.out / name / "lengths.jsonl").is_file():
            continue
        pred, meas = predict(costs, a.out / name)
        print(f"| {name} | {pred:.2f} | {meas:.2f} | {100 * (pred - meas) / meas:+.0f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
