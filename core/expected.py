"""A recipe's ``expected.yaml``: score tiers, the figures a run's metrics give, and the check of one against the other.

    cpu:                      # checked in CI-class machines: `make test-slow`, `pytest bench/ --benchmark`
      run: run_smollm2_cpu.sh # in the recipe folder; gets trainer.output_dir=<dir>
      hardware: {gpus: 0}
      steps: 20
      bounds: {reward_end: {min: 0.8}, val_gain: {min: 0.2}, ...}
    cpu_vllm:                 # the same run with Hydra overrides after the script's; skipped without the packages
      run: run_smollm2_cpu.sh
      args: [rollout.backend=vllm]
      hardware: {gpus: 0, packages: [vllm]}
      ...
    full_scale:               # the published numbers, checked only where the hardware exists
      source: <url of the published table>
      run: run_qwen2_7b_gsm8k.sh
      hardware: {gpus: 8, gpu_memory_gb: 80}
      bounds: {val_end: {min: 0.87}}
      timeout_s: 3600         # optional: seconds the score bench gives the run (default: pytest's 600)

A bound is ``{min: x}``, ``{max: x}`` or both, on a figure that ``run_figures`` computes, or on any logged metric
as ``first:<key>`` / ``last:<key>`` (its first / last logged value) or ``max:<key>`` (its largest), e.g.
``last:val/aime24/avg@32``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from core.report import window

TIER_KEYS = {"run", "args", "hardware", "steps", "bounds", "source", "model", "published", "note", "timeout_s"}


def load_expected(recipe_dir: str | Path) -> dict:
    """The tiers of ``<recipe_dir>/expected.yaml``, checked for shape (a clear error names the file and key)."""
    import yaml

    path = Path(recipe_dir) / "expected.yaml"
    tiers = yaml.safe_load(path.read_text()) or {}
    for name, tier in tiers.items():
        unknown = set(tier) - TIER_KEYS
        if unknown or "bounds" not in tier or "hardware" not in tier:
            raise ValueError(f"{path}: tier {name!r} needs 'bounds' and 'hardware'"
                             + (f"; unknown keys {sorted(unknown)}" if unknown else ""))
        for key, bound in tier["bounds"].items():
            if not isinstance(bound, dict) or not bound or set(bound) - {"min", "max"}:
                raise ValueError(f"{path}: tiers.{name}.bounds.{key} must be {{min: x}} and/or {{max: x}}, got {bound!r}")
    return tiers


def metric_figures(history: list[dict], names) -> dict[str, float]:
    """``first:<key>``, ``last:<key>`` and ``max:<key>`` figures of the run's logged metrics, for the names asked
    (absent keys are left out, so ``check`` reports them)."""
    out = {}
    for name in names:
        how, _, key = name.partition(":")
        values = [m[key] for m in history if key in m]
        if how in ("first", "last", "max") and values:
            out[name] = {"first": values[0], "last": values[-1], "max": max(values)}[how]
    return out


def run_figures(history: list[dict]) -> dict[str, float]:
    """From a run's metrics rows: train reward at the start / end (mean over a window of steps) and their gain (a
    supervised run: its loss at the start / end; a distillation: its sampled KL to the teacher at the start / end), held-out score before / after and its gain, the largest per-step
    rollout-vs-trainer log-prob gap, and with a critic its value loss and explained variance at the start / end."""
    train = [m for m in history if "reward/mean" in m]
    val = [m for m in history if "val/reward/mean" in m]
    sft = [m for m in history if "sft/nll_loss" in m]  # a supervised run (recipes/sft): its loss at start / end
    out: dict[str, float] = {"steps": float(len(train) or len(sft))}
    if sft:
        out["sft_loss_start"], _ = window(sft, "sft/nll_loss", first=True)
        out["sft_loss_end"], _ = window(sft, "sft/nll_loss", first=False)
    distill = [m for m in history if "distill/reverse_kl" in m]  # with a teacher: the student's KL to it
    if distill:
        out["distill_kl_start"], _ = window(distill, "distill/reverse_kl", first=True)
        out["distill_kl_end"], _ = window(distill, "distill/reverse_kl", first=False)
    if train:
        out["reward_start"], _ = window(train, "reward/mean", first=True)
        out["reward_end"], _ = window(train, "reward/mean", first=False)
        out["reward_gain"] = out["reward_end"] - out["reward_start"]
        if all("rollout/logprob_diff_mean" in m for m in train):
            out["rollout/logprob_diff_mean"] = max(m["rollout/logprob_diff_mean"] for m in train)
        for key in ("critic/vf_loss", "critic/explained_var"):  # with a critic: start / end windows over the
            rows = [m for m in train if key in m]                  # steps that have it (EV is undefined on a
            if len(rows) >= 2:                                       # step whose returns all agree)
                out[f"{key}_start"], _ = window(rows, key, first=True)
                out[f"{key}_end"], _ = window(rows, key, first=False)
        if "critic/vf_loss_start" in out:
            out["critic/vf_loss_drop"] = out["critic/vf_loss_start"] - out["critic/vf_loss_end"]
        if "critic/explained_var_start" in out:
            out["critic/explained_var_gain"] = out["critic/explained_var_end"] - out["critic/explained_var_start"]
    if val:
        out["val_start"], out["val_end"] = val[0]["val/reward/mean"], val[-1]["val/reward/mean"]
        out["val_gain"] = out["val_end"] - out["val_start"]
    return out


def tier_figures(history: list[dict], tier: dict) -> dict[str, float]:
    """The figures a tier's bounds read: ``run_figures`` and the ``first:`` / ``last:`` / ``max:`` metrics it names."""
    return run_figures(history) | metric_figures(history, tier["bounds"])


def check(figures: dict[str, float], tier: dict, where: str = "tier") -> list[str]:
    """Every bound the figures break (or lack), as 'figure = value, bound' lines; empty when all hold."""
    failures = []
    for key, bound in tier["bounds"].items():
        if key not in figures:
            failures.append(f"{where}: figure {key!r} is not in the run's metrics (have {sorted(figures)})")
            continue
        v = figures[key]
        if "min" in bound and v < bound["min"]:
            failures.append(f"{where}: {key} = {v:.4g} < min {bound['min']}")
        if "max" in bound and v > bound["max"]:
            failures.append(f"{where}: {key} = {v:.4g} > max {bound['max']}")
    if "steps" in tier and figures.get("steps") != tier["steps"]:
        failures.append(f"{where}: ran {figures.get('steps')} steps, the tier is for {tier['steps']}")
    return failures


def hardware_missing(tier: dict) -> str | None:
    """Why the host cannot run the tier (None when it can): GPU count and memory, Python packages."""
    import importlib.util

    import torch

    absent = [p for p in tier["hardware"].get("packages", []) if importlib.util.find_spec(p) is None]
    if absent:
        return (f"needs the package(s) {absent} in this Python ({sys.executable})"
                + ("; on a CPU, `make test-vllm` builds .venv-vllm: run from it" if "vllm" in absent else ""))

    need = tier["hardware"].get("gpus", 0)
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if have < need:
        return f"needs {need} GPUs, the host has {have}"
    mem = tier["hardware"].get("gpu_memory_gb", 0)
    if need and mem and torch.cuda.get_device_properties(0).total_memory < mem * 0.9 * 2**30:
        return f"needs {mem} GB per GPU, the host's have {torch.cuda.get_device_properties(0).total_memory / 2**30:.0f}"
    return None
