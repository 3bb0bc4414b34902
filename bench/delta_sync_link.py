"""Delta vs full weight syncs across a rate-limited link between two nodes, over real GRPO runs.

A two-node Ray cluster of network namespaces on one host (``tests/multinode.py``), the bridge between them shaped
with ``tc``'s token bucket (``tbf``) on both nodes' links to a datacenter-like and a slow rate. The CPU demo's GRPO
recipe (SmolLM2-135M-Instruct, fp32 master weights) runs with the actor and reference on one node and the rollout on
the other (split placement: every sync crosses the link), the engine in bf16 and in fp32, once with
``rollout.sync_delta`` (step 1's sync is full, the later ones deltas) and once without (every sync full). From
each run's ``metrics.jsonl``: per step the changed fraction of the engine's weight values, megabytes sent and
seconds per sync. The runs use the same seeds, so the two modes' steps train the same weights.

    PYTHONPATH=. python -m bench.delta_sync_link                     # both links, bf16 and fp32, delta and full
    PYTHONPATH=. python -m bench.delta_sync_link --links slow --dtypes bfloat16 --steps 3

Needs root (network namespaces, ``tc``). Writes ``bench/results/delta_sync_link.json`` and prints a markdown
table. Not collected by pytest.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# rate, burst (bytes: at least a timer tick's worth of the rate)
LINKS = {"datacenter": ("10gbit", "8mb"), "slow": ("100mbit", "256kb")}
SPLIT = ["placement.pools.main={nnodes: 1, slots_per_node: 1, device: cpu, cpus_per_slot: 1.0}",
         "placement.pools.gen={nnodes: 1, slots_per_node: 1, device: cpu, cpus_per_slot: 1.0}",
         "placement.roles={actor: main, ref: main, rollout: gen}", "data.val_files=[]"]


def shape(cluster, rate: str, burst: str) -> None:
    """Both nodes' links from the bridge (each node's inbound traffic) through a token bucket of ``rate``."""
    for i in range(len(cluster.ns)):
        subprocess.run(["tc", "qdisc", "replace", "dev", f"{cluster.tag}h{i}", "root", "tbf", "rate", rate,
                        "burst", burst, "latency", "100ms"], check=True)


def run(cluster, out: Path, steps: int, dtype: str, delta: bool) -> list[dict]:
    cmd = [sys.executable, "-m", "core.cli", "train", str(ROOT / "recipes/grpo"), "--config-name", "demo_cpu",
           f"trainer.output_dir={out}", f"trainer.total_steps={steps}", *SPLIT, f"rollout.dtype={dtype}",
           f"rollout.sync_delta={'auto' if delta else 'never'}"]
    r = cluster.run(cmd, timeout_s=3600)
    if r.returncode:
        raise RuntimeError(f"{' '.join(cmd[2:5])} ... failed:\n{r.stderr[-3000:]}")
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--links", choices=LINKS, nargs="+", default=list(LINKS))
    p.add_argument("--dtypes", choices=["bfloat16", "float32"], nargs="+", default=["bfloat16", "float32"])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--out", type=Path, default=ROOT / "outputs" / "bench_delta_sync")
    a = p.parse_args(argv)
    from bench.regress import machine_kind
    from tests.multinode import Cluster, namespaces_available

    if why := namespaces_available():
        raise SystemExit(f"needs network namespaces: {why}")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    report = {"commit": commit, "machine_kind": machine_kind(), "runs": {}}
    with Cluster(Path(tempfile.mkdtemp(prefix="delta-sync-")), cpus=[1, 1]) as cluster:
        for link in a.links:
            shape(cluster, *LINKS[link])
            for dtype in a.dtypes:
                for delta in (True, False):
                    key = f"{link}/{dtype}/{'delta' if delta else 'full'}"
                    rows = run(cluster, a.out / key.replace("/", "_"), a.steps, dtype, delta)
                    report["runs"][key] = [{k: r[k] for k in r if k.startswith("sync/") or k in
                                            ("step", "timing_s/step", "reward/mean")} for r in rows if "step" in r]
                    print(f"{key}: done", flush=True)
    (ROOT / "bench" / "results").mkdir(exist_ok=True)
    (ROOT / "bench" / "results" / "delta_sync_link.json").write_text(json.dumps(report, indent=1))
    print(table(report))
    return 0


def table(report: dict) -> str:
    lines = [f"machine kind {report['machine_kind']}, commit {report['commit']}; rates: "
             + ", ".join(f"{k} {v[0]}" for k, v in LINKS.items()), "",
             "| link | engine dtype | step | changed fraction | full: MB | full: s | delta: MB | delta: s | "
             "delta / full bytes |", "|---|---|---|---|---|---|---|---|---|"]
    runs = report["runs"]
    for key in runs:
        link, dtype, mode = key.split("/")
        if mode != "delta" or f"{link}/{dtype}/full" not in runs:
            continue
        for d, f in zip(runs[key], runs[f"{link}/{dtype}/full"]):
            lines.append(f"| {link} | {dtype} | {d['step']} | {d['sync/changed_fraction']:.4f} | "
                         f"{f['sync/megabytes']:.1f} | {f['sync/seconds']:.2f} | "
                         f"{d['sync/megabytes']:.1f}{' (full)' if d['sync/full'] else ''} | {d['sync/seconds']:.2f} | "
                         f"{d['sync/megabytes'] / f['sync/megabytes']:.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
