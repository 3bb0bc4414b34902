"""``hybridrl plan <recipe> --time HARDWARE``: the step time of a run config on hardware it may never have run on --
the three ``trainer.async.mode`` values, the config's placement -- from ``core.simulate``.

Costs come from a data sheet (``HARDWARE``: peak bf16 FLOP/s, memory bandwidth, the link the weights cross, and the
efficiencies assumed, stated in each entry) turned into per-phase costs for the config's model (``costs_for``), or
from a yaml of ``core.simulate.Costs`` measured on the machine at hand (``bench/calibrate.py`` writes one).
Response lengths: ``--lengths`` (a distribution: ``lognormal:median=4000,sigma=0.9``, clipped to the config's
``algo.sampling.max_new_tokens``; a file of one length per line; or a run's output folder, whose ``lengths.jsonl``
holds every step's -- an agent run's samples replayed turn by turn, each tool round taking ``Costs.tool_s``), by
default a lognormal whose median is an eighth of the limit.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, fields
from pathlib import Path

from core.config.errors import ConfigError
from core.model_shapes import ModelShape, model_shape
from core.simulate import MODES, Costs, Layout, Workload, simulate


@dataclass(frozen=True)
class Hardware:
    """One accelerator kind from its data sheet, and the shares of it the costs assume."""
    peak_tflops: float          # dense bf16
    memory_gb_s: float          # HBM
    link_gb_s: float            # what a weight sync from the training pool to the rollout pool gets
    decode_bw_eff: float = 0.6  # share of the memory bandwidth a decode step reaches (weights + KV read per step)
    prefill_mfu: float = 0.5    # model FLOPs utilisation of prefill and of a decode step's per-sequence work
    train_mfu: float = 0.4      # ... of training (forward, backward with activation recompute)
    scaling: float = 0.9        # data-parallel efficiency of the training ranks
    sync_base_s: float = 2.0    # a sync's fixed part (gathering, the engine's reload)
    source: str = ""


# data sheets (dense bf16 without sparsity; memory bandwidth; per-GPU network); the efficiencies are the defaults above
HARDWARE = {
    "h100": Hardware(989.0, 3350.0, 50.0, source="H100 SXM5: 989 TFLOP/s bf16, 3.35 TB/s HBM3, 400 Gb/s InfiniBand "
                                                  "per GPU"),
    "h200": Hardware(989.0, 4800.0, 50.0, source="H200 SXM: 989 TFLOP/s bf16, 4.8 TB/s HBM3e, 400 Gb/s InfiniBand "
                                                  "per GPU"),
    "a100": Hardware(312.0, 2039.0, 25.0, source="A100 SXM 80GB: 312 TFLOP/s bf16, 2.04 TB/s HBM2e, 200 Gb/s "
                                                  "InfiniBand per GPU"),
}


def costs_for(hw: Hardware, shape: ModelShape, tp: int = 1) -> Costs:
    """Per-phase costs of ``shape`` on ``hw`` (a rollout replica of ``tp`` GPUs): a decode step reads the bf16
    weights once (2P bytes over tp GPUs' bandwidth) and each sequence's KV (2 L kv_heads head_dim x 2 bytes per
    context token), and computes 2 P FLOPs per sequence; prefill and the training forward 2 P FLOPs per token; the
    update 8 P (forward 2, backward 4, recomputed forward 2)."""
    p = shape.active_params or shape.params
    bw = hw.memory_gb_s * 1e9 * hw.decode_bw_eff * tp
    flops = hw.peak_tflops * 1e12
    kv_bytes = 2 * shape.layers * shape.kv_heads * shape.head_dim * 2
    return Costs(decode_base_s=2 * shape.params / bw, decode_per_seq_s=2 * p / (flops * hw.prefill_mfu * tp),
                 decode_per_ctx_s=kv_bytes / bw, prefill_tok_s=flops * hw.prefill_mfu * tp / (2 * p),
                 forward_tok_s=flops * hw.train_mfu / (2 * p), update_tok_s=flops * hw.train_mfu / (8 * p),
                 sync_base_s=hw.sync_base_s, sync_gb_s=hw.link_gb_s, scaling=hw.scaling)


def read_costs(path: Path) -> Costs:
    """A yaml (or json) of ``Costs`` fields; a key that is none is named."""
    import yaml

    data = yaml.safe_load(path.read_text()) or {}
    known = {f.name for f in fields(Costs)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{path}: {unknown[0]!r} is no cost (known: {', '.join(sorted(known))})")
    return Costs(**{k: float(v) for k, v in data.items()})


def lengths_from(spec: str, limit: int, count: int = 4000, seed: int = 0) -> tuple[int, ...]:
    """Response lengths: ``lognormal:median=M,sigma=S`` (clipped to ``limit``), or a file of one length per line."""
    if spec.startswith("lognormal"):
        args = dict(kv.split("=", 1) for kv in spec.partition(":")[2].split(",") if kv)
        median, sigma = float(args.get("median", limit / 8)), float(args.get("sigma", 1.0))
        rng = random.Random(seed)
        return tuple(min(limit, max(1, round(rng.lognormvariate(math.log(median), sigma)))) for _ in range(count))
    path = Path(spec)
    if path.is_dir():  # a run's output folder: its lengths.jsonl
        path = path / "lengths.jsonl"
    if not path.is_file():
        raise ConfigError(f"--lengths {spec!r}: neither lognormal:median=M,sigma=S, a file of lengths nor a run's "
                          "output folder (its lengths.jsonl)")
    if path.suffix == ".jsonl":  # a run's: every step's samples, the later line of a step logged twice
        steps = {row["step"]: row["response_lengths"] for row in map(json.loads, path.read_text().splitlines())}
        return tuple(min(limit, int(x)) for s in sorted(steps) for x in steps[s])
    out = tuple(min(limit, int(x)) for x in path.read_text().split())
    if not out:
        raise ConfigError(f"--lengths {spec}: no lengths in the file")
    return out


def run_turns(spec: str) -> tuple[tuple[int, ...], ...]:
    """An agent run's samples as token runs (model turn, tool answer, ...), from the folder (or lengths.jsonl)
    ``spec`` names; () for anything else."""
    path = Path(spec) / "lengths.jsonl" if Path(spec).is_dir() else Path(spec)
    if path.suffix != ".jsonl" or not path.is_file():
        return ()
    steps = {row["step"]: row.get("turns", []) for row in map(json.loads, path.read_text().splitlines())}
    return tuple(tuple(runs) for s in sorted(steps) for runs in steps[s])


def run_prompt_tokens(spec: str) -> float | None:
    """The mean prompt length of a run whose folder (or lengths.jsonl) ``spec`` names, None otherwise."""
    path = Path(spec) / "lengths.jsonl" if Path(spec).is_dir() else Path(spec)
    if path.suffix != ".jsonl" or not path.is_file():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    lengths = [x for row in rows for x in row.get("prompt_lengths", [])]
    return sum(lengths) / len(lengths) if lengths else None


def layout_of(cfg, shape: ModelShape) -> tuple[Layout, int]:
    """The config's placement: training ranks (the actor's pool), rollout replicas, colocated or not, and a replica's
    KV cache from the memory plan (GPU pools); and tp."""
    from core.plan_report import run_shape
    from core.planner import plan

    pools, roles = cfg.placement.pools, cfg.placement.roles
    size = lambda name: pools[name].nnodes * pools[name].slots_per_node  # noqa: E731
    tp = cfg.rollout.tensor_parallel_size
    colocated = roles["rollout"] == roles["actor"]
    kv = plan(shape, run_shape(cfg, roles["rollout"])).kv_tokens if pools[roles["rollout"]].device == "cuda" else 0.0
    return Layout(train_gpus=size(roles["actor"]), replicas=max(1, size(roles["rollout"]) // tp), gpus_per_replica=tp,
                  colocated=colocated, slots=cfg.rollout.max_batch_size, kv_tokens=kv), tp


def time_report(cfg, hardware: str, lengths: str = "", steps: int = 8) -> str:
    """The predicted step of each mode, on the config's placement and, where it is colocated, split in two."""
    shape = model_shape(cfg.actor.model)
    layout, tp = layout_of(cfg, shape)
    if hardware in HARDWARE:
        hw = HARDWARE[hardware]
        costs, where = costs_for(hw, shape, tp), f"{hardware} ({hw.source}; efficiencies: decode {hw.decode_bw_eff:g} " \
            f"of bandwidth, prefill {hw.prefill_mfu:g} and training {hw.train_mfu:g} MFU, data-parallel {hw.scaling:g})"
    elif Path(hardware).is_file():
        costs, where = read_costs(Path(hardware)), f"the costs in {hardware}"
    else:
        raise ConfigError(f"--time {hardware!r}: a hardware name ({', '.join(HARDWARE)}) or a yaml of costs")
    s = cfg.algo.sampling
    dist = lengths_from(lengths or f"lognormal:median={max(1, s.max_new_tokens // 8)},sigma=1.0", s.max_new_tokens)
    measured = run_prompt_tokens(lengths) if lengths else None  # a run's prompts, else the limit (an upper bound)
    turns = run_turns(lengths) if lengths else ()  # an agent run's: model turns and tool answers
    work = Workload(cfg.data.prompts_per_step, s.n, round(measured or cfg.rollout.max_prompt_length), dist,
                    model_gb=2 * shape.params / 1e9, reference=cfg.has_reference(), ppo_epochs=cfg.actor.ppo_epochs,
                    turns=turns, teacher=model_shape(cfg.teacher.model).params / shape.params if cfg.teacher.model else 0.0)
    layouts = [layout]
    if layout.colocated and layout.train_gpus >= 2:  # the same GPUs split in half between training and rollout
        half = layout.train_gpus // 2
        layouts.append(Layout(half, max(1, (layout.train_gpus - half) // tp), tp, False, layout.slots, layout.kv_tokens))
    sizes = sorted(map(sum, work.samples()))  # an agent's: its model turns and tool answers
    mean = sum(sizes) / len(sizes)
    lines = [f"step time on {where}",
             f"{cfg.actor.model}: {shape.params / 1e9:.2f}B parameters; {work.prompts_per_step} prompts x {work.n} "
             f"samples of prompts {'of the run: mean' if measured else '<='} {work.prompt_tokens} tokens, responses "
             f"mean {mean:.0f}, p99 "
             f"{sizes[int(0.99 * len(sizes))]}{' (model and tool tokens)' if turns else ''}, limit {s.max_new_tokens} tokens"
             f"{' a turn' if turns else ''}; up to {layout.slots} sequences "
             f"a replica" + (f", its KV cache {layout.kv_tokens:.0f} tokens (the memory plan)" if layout.kv_tokens else "")
             + (f"; agent samples of the run: {sum((len(t) + 1) // 2 for t in turns) / len(turns):.2f} model turns, "
                f"tool rounds of {costs.tool_s:.3g} s" if turns else ""),
             "| placement | mode | s / step | samples/s | tokens/s/GPU | rollout idle | training idle |",
             "|---|---|---|---|---|---|---|"]
    for lay in layouts:
        name = (f"colocated, {lay.train_gpus} GPUs" if lay.colocated else
                f"split, {lay.train_gpus} training + {lay.replicas * lay.gpus_per_replica} rollout GPUs")
        for mode in MODES:
            if mode == "one_step_off" and lay.colocated:
                continue
            p = simulate(costs, work, lay, mode, steps=steps, max_staleness=cfg.trainer.async_.max_staleness)
            lines.append(f"| {name} | {mode} | {p.step_s:.1f} | {p.samples_per_s:.2f} | {p.tokens_per_s_per_gpu:.0f} | "
                         f"{p.rollout_idle:.0%} | {p.train_idle:.0%} |")
    return "\n".join(lines)
