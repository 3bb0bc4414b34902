"""Runs side by side: their held-out score at equal steps and at equal training time, as a table and a PNG.

    hybridrl compare grpo=outputs/a distill=outputs/b/metrics.jsonl --png compare.png   (python -m core.compare)

Time is each run's training time: the sum of ``timing_s/step`` up to a step (validation is not counted: both runs
validate alike). A score "at t seconds" is that of the run's last validation done by then (the step that ended
last within t). Which metric: ``--key`` (default ``val/reward/mean``, the greedy held-out reward)."""

from __future__ import annotations

import sys
from pathlib import Path

from core.report import _pyplot, _save, read_metrics


def held_out_curve(history: list[dict], key: str = "val/reward/mean") -> list[tuple[int, float, float]]:
    """(step, training seconds up to it, score) at each validation of the run, in step order. A step logged twice
    (a resumed run repeats the steps after its checkpoint) counts once, as last logged."""
    timed = {m["step"]: m["timing_s/step"] for m in history if "timing_s/step" in m}
    scores = {m["step"]: m[key] for m in history if key in m}
    return [(s, sum(t for step, t in timed.items() if step <= s), scores[s]) for s in sorted(scores)]


def score_at(curve: list[tuple[int, float, float]], budget: float) -> tuple[int, float] | None:
    """The (step, score) of the curve's last validation within ``budget`` training seconds (None: none yet)."""
    done = [(step, score) for step, t, score in curve if t <= budget + 1e-9]
    return done[-1] if done else None


def compare(runs: dict[str, list[dict]], key: str = "val/reward/mean", png: str | Path | None = None) -> str:
    """A markdown table of each run's held-out ``key`` by step with its training time, the scores at equal
    training time (the shortest run's total, its half and its quarter), the first validation of each run reaching
    the first run's final score (the reference); and, with ``png``, the two curves: by step and by training time."""
    curves = {name: held_out_curve(h, key) for name, h in runs.items()}
    steps = sorted({s for c in curves.values() for s, _, _ in c})
    names = list(curves)
    lines = [f"held-out {key} (greedy) by step; in brackets the training seconds to that step",
             "", "| step | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for s in steps:
        cells = [next((f"{v:.3f} ({t:.0f} s)" for st, t, v in curves[n] if st == s), "") for n in names]
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    shortest = min(c[-1][1] for c in curves.values())
    lines += ["", "at equal training time:"]
    for budget in (shortest / 4, shortest / 2, shortest):
        at = {n: score_at(curves[n], budget) for n in names}
        lines.append(f"  {budget:.0f} s: " + ", ".join(f"{n} {a[1]:.3f} (step {a[0]})" if a else f"{n} none yet"
                                                        for n, a in at.items()))
    ref, target = names[0], curves[names[0]][-1][2]
    firsts = {n: next(((s, t) for s, t, v in curves[n] if v >= target - 1e-9), None) for n in names}
    lines.append(f"first validation at or above {ref}'s final {target:.3f}: " + ", ".join(
        f"{n} step {f[0]} ({f[1]:.0f} s)" if f else f"{n} never" for n, f in firsts.items()))
    if png is not None:
        drawn = _plot(curves, key, png)
        lines.append(f"curves: {drawn}" if drawn else "curves: not drawn (pip install matplotlib)")
    return "\n".join(lines)


def _plot(curves: dict[str, list[tuple[int, float, float]]], key: str, path: str | Path) -> Path | None:
    plt = _pyplot()
    if plt is None:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    for name, curve in curves.items():
        for ax, x in zip(axes, ([s for s, _, _ in curve], [t for _, t, _ in curve])):
            ax.plot(x, [v for _, _, v in curve], marker="o", ms=4, label=name)
    low = min(v for c in curves.values() for _, _, v in c)
    axes[0].set(xlabel="step", ylabel=f"held-out {key.split('/', 1)[-1]} (greedy)", title="by step",
                ylim=(max(0.0, low - 0.05), 1.0))
    axes[1].set(xlabel="training seconds (validation not counted)", title="by training time")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    return _save(plt, fig, path)


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="hybridrl compare", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="name=<the run's folder or its metrics.jsonl>, one per run; the first is "
                                           "the reference")
    p.add_argument("--key", default="val/reward/mean", help="the held-out metric (default: val/reward/mean)")
    p.add_argument("--png", type=Path, help="write the curves here")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    runs = {}
    for spec in args.runs:
        name, sep, path = spec.partition("=")
        path = Path(path) / "metrics.jsonl" if Path(path).is_dir() else Path(path)
        if not sep or not path.is_file():
            p.error(f"{spec!r}: expected name=<a run's folder or its metrics.jsonl> (an existing one)")
        runs[name] = read_metrics(path)
        if not any(args.key in m for m in runs[name]):
            p.error(f"{path}: no {args.key!r} in its metrics (a run with data.val_files)")
    print(compare(runs, args.key, args.png))
    return 0


if __name__ == "__main__":
    sys.exit(main())
