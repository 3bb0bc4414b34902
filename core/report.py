"""End-of-run report from ``metrics.jsonl``: reward at start vs end, per-phase time shares, a PNG of the curves.

``python -m core.report outputs/run/metrics.jsonl`` prints it again for any finished (or running) run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# the phases of core.loop.step, in dataflow order (a phase a run did not have is left out)
PHASES = ("gen", "reward", "gen_baseline", "old_logprob", "ref", "teacher", "values", "update_prm", "prm", "adv", "update_critic",
          "update_actor", "gen_wait", "sync_weights")


def read_metrics(path: str | Path) -> list[dict]:
    rows = []
    for i, line in enumerate(Path(path).read_text().splitlines()):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {i + 1} is not JSON: {e}") from None
    return rows


def window(history: list[dict], key: str, first: bool) -> tuple[float, int]:
    """Mean of ``key`` over the first (or last) fifth of the steps, at least 1 and at most 5 steps."""
    k = min(5, max(1, len(history) // 5))
    part = history[:k] if first else history[-k:]
    return sum(m[key] for m in part) / len(part), k


def phase_shares(history: list[dict]) -> dict[str, float]:
    """Fraction of the total step time spent in each phase (the rest is dispatch and bookkeeping)."""
    total = sum(m["timing_s/step"] for m in history)
    return {p: sum(m.get(f"timing_s/{p}", 0.0) for m in history) / total for p in PHASES
            if any(f"timing_s/{p}" in m for m in history)}


def plot_curves(history: list[dict], path: str | Path) -> Path | None:
    """reward/mean (train, and held-out where validated) and response_length/mean per step -- with a reward model the
    trained-on reward against the function's truth, with a critic also its value loss and explained variance, and
    the critic-only steps shaded -- as a PNG; None when matplotlib is missing. The PNG's ``Description`` text chunk
    records how many points each drawn line holds (read back from the figure's lines, not from ``history``), so a
    test can check the picture it was given."""
    plt = _pyplot()
    if plt is None:
        return None
    from matplotlib.ticker import MaxNLocator

    val = [m for m in history if "val/reward/mean" in m]
    train = [m for m in history if "reward/mean" in m]
    steps = [m["step"] for m in train]
    critic = [m for m in train if "critic/vf_loss" in m]
    agent = [m for m in train if "agent/tool_call_rate" in m]
    panels = 2 + bool(critic) + bool(agent)
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 3.6))
    ax1, ax2 = axes[:2]
    if any("reward/function_mean" in m for m in train):
        _model_vs_truth(ax1, train, val)
    else:
        ax1.plot(steps, [m["reward/mean"] for m in train], marker="o", ms=3, label="train (sampled)")
        sources = _val_sources(val)
        if len(sources) > 1:  # several held-out sets (e.g. a control): each its own line, its accuracy
            for key, colour in zip(sources, ("tab:green", "tab:grey", "tab:purple", "tab:brown")):
                have = [m for m in val if key in m]
                ax1.plot([m["step"] for m in have], [m[key] for m in have], marker="s", ms=5, linestyle="--",
                         color=colour, label=f"held-out {key.split('/', 1)[1].rsplit('/', 1)[0]} pass@1")
            ax1.legend(loc="lower right", fontsize=8)
        elif val:
            ax1.plot([m["step"] for m in val], [m["val/reward/mean"] for m in val], marker="s", ms=5, linestyle="--",
                     color="tab:green", label="held-out (greedy)")
            ax1.legend(loc="lower right")
        ax1.set(xlabel="step", ylabel="reward/mean", title="mean reward")
    ax2.plot(steps, [m["response_length/mean"] for m in train], marker="o", ms=3, color="tab:orange",
             label="response length")
    ax2.set(xlabel="step", ylabel="tokens", title="mean response length")
    if agent:  # agent rollouts: how often the policy calls a tool, and how often a call fails
        _tool_use(axes[-1], agent, [m for m in val if "val/agent/tool_call_rate" in m])
    if critic:  # the value model: its loss and how much of the returns' variance it explains
        ax3 = axes[2]
        ax3.plot([m["step"] for m in critic], [m["critic/vf_loss"] for m in critic], marker="o", ms=3,
                 color="tab:red", label="value loss")
        ev = [m for m in critic if "critic/explained_var" in m]
        ax3.plot([m["step"] for m in ev], [m["critic/explained_var"] for m in ev], marker="^", ms=3,
                 color="tab:purple", label="explained variance")
        ax3.axhline(0.0, color="grey", lw=0.8)
        ax3.legend(loc="lower right")
        ax3.set(xlabel="step", title="critic", ylim=(max(-2.0, ax3.get_ylim()[0]), None))
    frozen = [m["step"] for m in train if "timing_s/update_actor" not in m and "critic/vf_loss" in m]
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps: no 0.25 ticks on a short run
        if frozen:  # critic-only steps (value pre-training / critic warm-up): the policy does not move
            ax.axvspan(min(frozen) - 0.5, max(frozen) + 0.5, color="grey", alpha=0.12, lw=0)
    if frozen:
        ax1.text(min(frozen) - 0.4, ax1.get_ylim()[1], " critic only", va="top", fontsize=8, color="dimgrey")
    return _save(plt, fig, path)


def _pyplot():
    """matplotlib's pyplot on the Agg backend, or None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def _save(plt, fig, path: str | Path) -> Path:
    """The figure as a PNG whose ``Description`` text chunk records how many points each labelled line holds."""
    fig.tight_layout()
    points = {line.get_label(): len(line.get_xdata()) for ax in fig.axes for line in ax.get_lines()
              if not line.get_label().startswith("_")}
    path = Path(path)
    fig.savefig(path, dpi=100, metadata={"Description": json.dumps({"points": points})})
    plt.close(fig)
    return path


def _model_vs_truth(ax, train: list[dict], val: list[dict]) -> None:
    """With a reward model: the score the policy is trained on (left axis) against the truth the reward function
    sees (right axis: the training samples' mean, and the held-out score). The reward-hacking picture: the model's
    score rising while the truth stays or falls."""
    steps = [m["step"] for m in train]
    ax.plot(steps, [m["reward/mean"] for m in train], marker="o", ms=3, color="tab:blue", label="trained-on reward")
    ax.set(xlabel="step", ylabel="reward (with the reward model)", title="reward model vs truth")
    truth = ax.twinx()
    truth.plot(steps, [m["reward/function_mean"] for m in train], marker="^", ms=3, color="tab:orange",
               label="truth: train samples")
    if val:
        truth.plot([m["step"] for m in val], [m["val/reward/mean"] for m in val], marker="s", ms=5, linestyle="--",
                   color="tab:green", label="truth: held-out (greedy)")
    truth.set_ylabel("reward function (truth)")
    lines = ax.get_lines() + truth.get_lines()
    ax.legend(lines, [line.get_label() for line in lines], loc="lower right", fontsize=8)


def _val_sources(val: list[dict]) -> list[str]:
    """The ``val/<data_source>/pass@1`` keys the held-out rows carry, in order of appearance."""
    return list(dict.fromkeys(k for m in val for k in m if k.startswith("val/") and k.endswith("/pass@1")))


def _tool_use(ax, agent: list[dict], val: list[dict]) -> None:
    steps = [m["step"] for m in agent]
    ax.plot(steps, [m["agent/tool_call_rate"] for m in agent], marker="o", ms=3, color="tab:blue",
            label="calls a tool: train (sampled)")
    if val:
        ax.plot([m["step"] for m in val], [m["val/agent/tool_call_rate"] for m in val], marker="s", ms=5,
                linestyle="--", color="tab:green", label="calls a tool: held-out (greedy)")
    ax.plot(steps, [m["agent/tool_error_rate"] for m in agent], marker="v", ms=3, color="tab:red",
            label="failed calls per call: train")
    ax.legend(loc="center right", fontsize=8)
    ax.set(xlabel="step", ylabel="fraction", title="tool use", ylim=(-0.03, 1.03))


def plotted_points(png: str | Path) -> dict[str, int]:
    """{line label: number of points} as ``plot_curves`` recorded them in the PNG."""
    from PIL import Image

    with Image.open(png) as im:
        return json.loads(im.info["Description"])["points"]


def report(history: list[dict], png: str | Path | None = None) -> str:
    """The summary text (and the PNG, when ``png`` is given). Rows without ``reward/mean`` (the step-0
    validation before training) count only for the held-out line."""
    val = [m for m in history if "val/reward/mean" in m]
    if any("sft/nll_loss" in m for m in history) and not any("reward/mean" in m for m in history):
        return sft_report(history, png)
    rows, history = history, [m for m in history if "reward/mean" in m]  # rows: everything, for the PNG
    if not history:
        return "no steps were run"
    start, k = window(history, "reward/mean", first=True)
    end, _ = window(history, "reward/mean", first=False)
    total = sum(m["timing_s/step"] for m in history)
    shares = " | ".join(f"{p} {s:.0%}" for p, s in phase_shares(history).items())
    lines = [f"reward/mean: start {start:.3f} -> end {end:.3f} (mean of the first / last {k} steps; "
             f"{len(history)} steps)",
             f"response_length/mean: {window(history, 'response_length/mean', True)[0]:.1f} -> "
             f"{window(history, 'response_length/mean', False)[0]:.1f} tokens",
             f"time: {total:.0f}s in steps ({total / len(history):.1f}s per step): {shares}"]
    for key in ("reward/function_mean", "reward/model_function_corr",  # with a reward model: the truth beside it
                "critic/vf_loss", "critic/explained_var",  # when there is a critic: does it learn?
                "agent/tool_call_rate", "agent/tool_error_rate", "agent/turns_mean"):  # agent rollouts: tool use
        have = [m for m in history if key in m]
        if len(have) >= 2:
            lines.insert(-1, f"{key}: {window(have, key, True)[0]:.4f} -> {window(have, key, False)[0]:.4f}")
    sources = _val_sources(val)
    lines[1:1] = _held_out_lines(val, ("val/reward/mean", *(sources if len(sources) > 1 else ()),
                                       "val/agent/tool_call_rate"))
    if png is not None:
        drawn = plot_curves(rows, png)
        lines.append(f"curves: {drawn}" if drawn else "curves: not drawn (pip install matplotlib)")
    return "\n".join(lines)


def sft_report(history: list[dict], png: str | Path | None = None) -> str:
    """A supervised fine-tuning run's summary (``recipes/sft``): the training NLL, the held-out score and tool use,
    the time; its PNG: the NLL per step beside the held-out lines."""
    train = [m for m in history if "sft/nll_loss" in m]
    val = [m for m in history if "val/reward/mean" in m]
    start, k = window(train, "sft/nll_loss", first=True)
    end, _ = window(train, "sft/nll_loss", first=False)
    total = sum(m["timing_s/step"] for m in train)
    lines = [f"sft/nll_loss: start {start:.3f} -> end {end:.3f} (mean of the first / last {k} steps; {len(train)} "
             f"steps, {sum(m.get('sft/samples', 0) for m in train)} samples)",
             *_held_out_lines(val, ("val/reward/mean", "val/agent/tool_call_rate")),
             f"time: {total:.0f}s in steps ({total / len(train):.1f}s per step)"]
    if png is not None:
        drawn = _plot_sft(train, val, png)
        lines.append(f"curves: {drawn}" if drawn else "curves: not drawn (pip install matplotlib)")
    return "\n".join(lines)


def _held_out_lines(val: list[dict], keys) -> list[str]:
    """'<key> (held-out, greedy): step a x -> step b y' for each of ``keys`` validated at least twice, in order."""
    lines = []
    for key in keys:
        have = [m for m in val if key in m]
        if len(have) >= 2:
            lines.append(f"{key} (held-out, greedy): step {have[0]['step']} {have[0][key]:.3f} -> "
                         f"step {have[-1]['step']} {have[-1][key]:.3f}")
    return lines


def _plot_sft(train: list[dict], val: list[dict], path: str | Path) -> Path | None:
    plt = _pyplot()
    if plt is None:
        return None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    ax1.plot([m["step"] for m in train], [m["sft/nll_loss"] for m in train], marker="o", ms=3,
             label="train NLL of the trained tokens")
    ax1.set(xlabel="step", ylabel="nats per token", title="SFT loss")
    ax1.legend(loc="upper right", fontsize=8)
    for key, colour, label in (("val/reward/mean", "tab:green", "held-out reward (greedy)"),
                               ("val/agent/tool_call_rate", "tab:blue", "held-out: calls a tool")):
        have = [m for m in val if key in m]
        if have:
            ax2.plot([m["step"] for m in have], [m[key] for m in have], marker="s", ms=5, linestyle="--",
                     color=colour, label=label)
    ax2.set(xlabel="step", ylabel="fraction", title="held-out", ylim=(-0.03, 1.03))
    ax2.legend(loc="lower right", fontsize=8)
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    return _save(plt, fig, path)


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m core.report",
                                description="a run's summary, and its curves as curves.png beside the file")
    p.add_argument("metrics", type=Path, help="the run's metrics.jsonl")
    path = p.parse_args(sys.argv[1:] if argv is None else argv).metrics
    if not path.is_file():
        p.error(f"{path}: no such file")
    print(report(read_metrics(path), path.with_name("curves.png")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
