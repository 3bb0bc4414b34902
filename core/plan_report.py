"""The dry-run report of a run config (``hybridrl plan <recipe>``, every run script's ``--dry-run``): which backends
import here, the placement, the model's shape and, per pool holding roles, the per-GPU memory plan of
``core.planner`` with its verdict."""

from __future__ import annotations

from core.config import RunConfig
from core.config.errors import ConfigError
from core.model_shapes import model_shape
from core.planner import GB, RunShape, plan


def importable() -> dict[str, str]:
    """Which optional backends this Python can import (the run's machines may differ: the plan says so)."""
    import importlib.util

    import torch

    def has(module: str) -> bool:
        try:
            return importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # a missing parent package
            return False

    found = {name: ("yes" if has(mod) else "no") for name, mod in (
        ("ray", "ray"), ("vllm", "vllm"), ("sglang", "sglang"), ("megatron", "megatron.core"), ("flash_attn", "flash_attn"))}
    found["cuda"] = f"{torch.cuda.device_count()} GPU(s)" if torch.cuda.is_available() else "no GPU here"
    return found


def _machine_memory_gb() -> tuple[float, float]:
    import os

    import torch

    gpu = torch.cuda.get_device_properties(0).total_memory / GB if torch.cuda.is_available() else 0.0
    return gpu, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GB


def run_shape(cfg, pool_name: str | None = None) -> RunShape:
    """The RunShape of one pool of a validated run config (default: the actor's), with the roles placed on it."""
    pool_name = pool_name or cfg.placement.roles["actor"]
    pool = cfg.placement.pools[pool_name]
    here = {role for role, p in cfg.placed_roles().items() if p == pool_name}
    gpu_here, host_here = _machine_memory_gb()
    max_seq = cfg.rollout.max_prompt_length + cfg.algo.sampling.max_new_tokens
    tokens = cfg.actor.max_tokens_per_micro if cfg.actor.max_tokens_per_micro > 0 else cfg.actor.micro_batch_size * max_seq
    return RunShape(nnodes=pool.nnodes, gpus_per_node=pool.slots_per_node,
                    gpu_memory_gb=pool.gpu_memory_gb or gpu_here, host_memory_gb=pool.host_memory_gb or host_here,
                    offload=cfg.actor.offload,
                    gradient_checkpointing=cfg.actor.gradient_checkpointing, tokens_per_micro=tokens,
                    rollout_tp=cfg.rollout.tensor_parallel_size,
                    gpu_memory_utilization=cfg.rollout.gpu_memory_utilization, max_seq_len=max_seq,
                    max_prompt_len=cfg.rollout.max_prompt_length,
                    rollout_backend=cfg.rollout.backend, reference=cfg.has_reference() and "ref" in here,
                    rollout_batch=cfg.rollout.max_batch_size, actor="actor" in here, rollout="rollout" in here,
                    rollout_sleeps=cfg.rollout.sleep_after_generate, strategy=cfg.actor.strategy,
                    lora_rank=cfg.actor.lora.rank, lora_targets=cfg.actor.lora.target_modules,
                    ulysses_sp=cfg.actor.ulysses_sp,
                    tp=cfg.actor.megatron.tp, pp=cfg.actor.megatron.pp, ep=cfg.actor.megatron.ep,
                    **_critic_shape(cfg, max_seq, "critic" in here),
                    **({"reward_model": model_shape(cfg.reward_model.model), "rm_offload": cfg.reward_model.offload,
                        "rm_tokens_per_micro": cfg.reward_model.max_tokens_per_micro,
                        "rm_dtype_bytes": 4 if cfg.reward_model.dtype == "float32" else 2}
                       if cfg.use_reward_model and "reward_model" in here else {}),
                    **({"prm": True, "prm_offload": cfg.implicit_prm.offload,
                        "prm_checkpointing": cfg.implicit_prm.gradient_checkpointing} if "prm" in here else {}),
                    **({"teacher": model_shape(cfg.teacher.model), "teacher_offload": cfg.teacher.offload,
                        "teacher_tokens_per_micro": cfg.actor.max_tokens_per_micro or
                        (cfg.teacher.micro_batch_size or cfg.actor.micro_batch_size) * max_seq}
                       if "teacher" in here else {}))


def _critic_shape(cfg, max_seq: int, here: bool) -> dict:
    """The critic's part of a RunShape: none without ``use_critic`` or on a pool without it."""
    if not (cfg.use_critic and here):
        return {}
    c = cfg.critic
    tokens = c.max_tokens_per_micro if c.max_tokens_per_micro > 0 else c.micro_batch_size * max_seq
    return {"critic": model_shape(c.model), "critic_offload": c.offload,
            "critic_checkpointing": c.gradient_checkpointing, "critic_tokens_per_micro": tokens,
            "critic_shards": c.megatron.tp * c.megatron.pp if c.strategy == "megatron" else 0}


def _model_line(name: str, m, what: str = "model") -> str:
    """The actor model's (or the teacher's: ``what``) size; ``m`` None: a model that is not there yet (one an earlier stage of the run script
    writes, e.g. recipes/vlm's aligned model), which a CPU-only plan, having no memory terms, does not need."""
    if m is None:
        return f"{what} {name}: not there yet (no config.json); a CPU plan needs no model shape"
    about = [f"{what} {name}: {m.params / 1e9:.2f}B parameters, {m.layers} layers, hidden {m.hidden}, vocab {m.vocab}"]
    if m.experts:
        about.append(f"{m.active_params / 1e9:.2f}B active per token ({m.experts_per_token} of {m.experts} experts)")
    if m.vision_params:
        about.append(f"vision tower + connector {m.vision_params / 1e9:.2f}B ({m.vision_layers} blocks, width "
                     f"{m.vision_hidden})")
    return "; ".join(about)


def plan_run(cfg) -> tuple[str, bool]:
    """The dry-run report of a validated run config: backends, placement, and per pool that holds roles its
    per-GPU memory plan and verdict (colocated: one pool; split placement: each pool on its own GPUs)."""
    found = importable()
    out = ["backends importable here: " + ", ".join(f"{k} {v}" for k, v in found.items())]
    if cfg.rollout.backend != "embedded" and found.get(cfg.rollout.backend) != "yes":
        out.append(f"  note: rollout.backend={cfg.rollout.backend} is not importable on this host; the plan is "
                   f"for the cluster's (pip install -e '.[{cfg.rollout.backend}]' there)")
    placed = cfg.placed_roles()
    used = [name for name in cfg.placement.pools if name in placed.values()]
    roles = ", ".join(f"{role} -> {p}" for role, p in placed.items())
    out.append(f"placement: {roles}; " + "; ".join(
        f"pool {name!r}: {cfg.placement.pools[name].nnodes} node(s) x {cfg.placement.pools[name].slots_per_node} "
        f"{cfg.placement.pools[name].device} rank(s)" for name in used))
    shapes = {}
    for what, model in (("model", cfg.actor.model), ("teacher", cfg.teacher.model if "teacher" in placed else "")):
        if not model:
            continue
        try:
            shapes[what] = model_shape(model)
        except ConfigError:
            if any(cfg.placement.pools[name].device == "cuda" for name in used):
                raise  # a GPU pool's memory plan needs the shape
            shapes[what] = None
        out.append(_model_line(model, shapes[what], what))
    m = shapes["model"]
    from core.tools.isolation import describe
    out.append(f"tools (agent calls, code rewards): {describe(cfg.tools.isolation)}")
    fits = True
    for name in used:
        pool = cfg.placement.pools[name]
        if pool.device != "cuda":
            out.append(f"memory plan of pool {name!r}: only for GPU pools (device cuda); a CPU run keeps everything "
                       "in host memory")
            continue
        r = run_shape(cfg, name)
        here = [role for role, p in placed.items() if p == name]
        if len(used) > 1:
            out.append(f"pool {name!r} ({', '.join(here)}):")
        W = r.nnodes * r.gpus_per_node
        engine = (f"Megatron TP {r.tp} x PP {r.pp}{f' x EP {r.ep}' if r.ep > 1 else ''} x DP {W // (r.tp * r.pp)}"
                  if r.strategy == "megatron" else f"FSDP2 world size {W}")
        parts = [f"{engine}, offload {r.offload}, {r.tokens_per_micro} tokens per micro-batch"
                 ] if r.actor or r.reference else []
        if r.critic is not None:
            engine = (f"critic Megatron TP {cfg.critic.megatron.tp} x PP {cfg.critic.megatron.pp}" if r.critic_shards
                      else f"critic FSDP2 world size {W}")
            parts.append(f"{engine}, offload {r.critic_offload}, {r.critic_tokens_per_micro} tokens per micro-batch")
        if r.reward_model is not None:
            parts.append(f"reward model FSDP2 world size {W}, offload {r.rm_offload}, {r.rm_tokens_per_micro} "
                         "tokens per forward")
        if r.rollout:
            parts.append(f"rollout {r.rollout_backend} TP {r.engine_tp} x {W // r.engine_tp} replicas at "
                         f"{r.gpu_memory_utilization:g} of {r.gpu_memory_gb:g} GB")
        out.append(", ".join(parts) + f"; host {r.host_memory_gb:g} GB per node")
        p = plan(m, r)
        out.append("per-GPU memory plan (GB):")
        known = r.gpu_memory_gb > 0 and r.host_memory_gb > 0   # else nothing to check against: the needs, no verdict
        out.append(p.text(verdict=known))
        if not known:
            out.append(f"no verdict: state placement.pools.{name}.gpu_memory_gb and host_memory_gb (no GPU here)")
        fits = fits and (p.fits or not known)
    return "\n".join(out), fits


def dp_size(cfg: RunConfig) -> int:
    """The actor's data-parallel ranks: its pool's (over Megatron's tp x pp grid), or 1 with the local backend."""
    pool = cfg.placement.pools[cfg.placement.roles["actor"]]
    grid = cfg.actor.megatron.tp * cfg.actor.megatron.pp
    return 1 if cfg.trainer.backend == "local" else pool.nnodes * pool.slots_per_node // grid


def effective_sizes(cfg: RunConfig, dp_size: int) -> str:
    """The batch-size arithmetic in words, printed at start."""
    n, prompts = cfg.algo.sampling.n, cfg.data.train_prompts_per_step or cfg.data.prompts_per_step
    samples = prompts * n
    mini = cfg.actor.ppo_mini_batch_size
    if samples % mini:
        raise ConfigError(f"samples per step ({prompts} prompts x n={n} = {samples}) must be a multiple of "
                          f"actor.ppo_mini_batch_size={mini}", "actor.ppo_mini_batch_size")
    per_rank = mini // dp_size
    micro = (f"up to {cfg.actor.max_tokens_per_micro} tokens" if cfg.actor.max_tokens_per_micro > 0
             else f"{cfg.actor.micro_batch_size} samples")
    return "\n".join([
        f"  prompts per step           {prompts}",
        f"  samples per step           {samples}  (= prompts x n={n})",
        f"  mini-batches per step      {samples // mini} x {mini} samples  (optimizer updates per step: "
        f"{samples // mini * cfg.actor.ppo_epochs}, ppo_epochs={cfg.actor.ppo_epochs})",
        f"  data-parallel ranks        {dp_size}  ({per_rank} samples of each mini-batch per rank)",
        f"  micro-batch per rank       {micro}  (gradient accumulation over {-(-per_rank // cfg.actor.micro_batch_size)}"
        f" micro-batches when by count)",
        f"  response tokens per sample <= {cfg.algo.sampling.max_new_tokens}"])
