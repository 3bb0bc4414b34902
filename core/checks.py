"""How a run config's sections must agree, checked once before Ray starts (``fit`` and ``--dry-run``).

Each section is validated on its own into frozen dataclasses (``core.config.validate``: unknown keys, types). What
no single section can see is checked here -- every failure names the keys involved and the fix, and all of them
are reported at once:

- ``actor.temperature`` equals ``algo.sampling.temperature`` (the trainer scores the sampled tokens under the
  distribution they were drawn from; a mismatch trained on wrong log-probs silently);
- ``rollout.model`` is ``actor.model`` (the engine receives the actor's weights after every step; the reference
  is built from ``actor.model`` itself; a critic may be another model, e.g. a smaller one);
- every registry name exists: ``algo.adv.estimator``, ``actor.loss.name``, ``actor.loss_agg_mode``,
  ``critic.loss_agg_mode``, ``actor.kl_loss_type``, ``algo.kl_in_reward.kind`` (a typo was found after Ray, model
  loading and a whole generation); a loss that aggregates its own way (``FIXED_AGGREGATION``) with another
  ``actor.loss_agg_mode`` set;
- an estimator that reads values (``VALUE_ESTIMATORS``) has a critic, and a critic has an estimator that reads
  its values; ``data.truncation`` is one of ``error``, ``left``, ``right``;
- a reward model has a model and a pool, and the reward weights are not set without one;
- with the built-in rewards (no ``reward.path``), every ``data_source`` of the data files has a reward
  (``check_data_sources``, once the rows are loaded);
- ``rollout.backend: sglang`` runs on a CUDA pool;
- ``trainer.async.mode: one_step_off``: the rollout on a pool of its own, on Ray; ``streaming``: the embedded
  engine or vLLM (no agent there), text prompts, no greedy-baseline estimator, prompts split evenly over the rollout's replicas;
  ``actor.ulysses_sp`` divides the actor pool's ranks (and, once the model is located, its attention heads);
- ``actor.strategy`` / ``critic.strategy: megatron``: tp x pp divides the role pool's ranks (what this version can
  run of the layout is ``core.train.megatron_actor.run_problem``, checked once the model is located);
- PRIME's implicit PRM (``implicit_prm``) has a pool, starts from ``actor.model`` (the reference's);
  its loss is not the actor's; estimator ``prime`` only with it;
- a ``critic.model`` or ``teacher.model`` other than ``actor.model`` tokenizes as the actor does (``check_inputs``:
  they read the actor's token ids; their tokenizer files are read, no weights, and a hub id not downloaded yet is
  not checked); a distill estimator has a teacher, a teacher a distill estimator (``core.teacher``).
"""

from __future__ import annotations

from collections import Counter

from core import determinism
from core.algos import ADVANTAGES, AGGREGATIONS, KL_KINDS, POLICY_LOSSES
from core.algos.advantages import BASELINE_ESTIMATORS, VALUE_ESTIMATORS
from core.algos.losses import FIXED_AGGREGATION, REWARD_MODEL_LOSSES
from core.config import ActorConfig, RunConfig
from core.config.errors import ConfigError, did_you_mean
from core.data.dataset import TRUNCATIONS
from core.teacher import teacher_problems

DEFAULT_AGG = ActorConfig.loss_agg_mode  # its default: what "not set" reads as


def problems(cfg: "RunConfig") -> list[str]:
    """Every disagreement between sections of ``cfg``, each naming its keys and the fix (empty: none)."""
    out = []
    a, algo = cfg.actor, cfg.algo
    if algo.sampling.temperature > 0 and a.temperature != algo.sampling.temperature:
        out.append(f"actor.temperature={a.temperature} but algo.sampling.temperature={algo.sampling.temperature}: "
                   "the trainer would score the sampled tokens under another distribution than they were drawn "
                   "from; set both to the same value")
    if cfg.rollout.model != a.model:
        out.append(f"rollout.model={cfg.rollout.model!r} but actor.model={a.model!r}: the rollout engine receives "
                   "the actor's weights after every step; set rollout.model to the actor's (in YAML: "
                   "model: ${actor.model})")
    for key, name, registry in (("algo.adv.estimator", algo.adv.estimator, ADVANTAGES),
                                ("actor.loss.name", a.loss.name, POLICY_LOSSES),
                                ("actor.loss_agg_mode", a.loss_agg_mode, AGGREGATIONS),
                                ("critic.loss_agg_mode", cfg.critic.loss_agg_mode, AGGREGATIONS),
                                ("actor.kl_loss_type", a.kl_loss_type, KL_KINDS),
                                ("algo.kl_in_reward.kind", algo.kl_in_reward.kind, KL_KINDS)):
        if name not in registry:
            out.append(f"{key}={name!r} is no {registry.kind}{did_you_mean(name, registry.names())} (known: "
                       f"{', '.join(registry.names())})")
    if a.loss.name in FIXED_AGGREGATION and a.loss_agg_mode not in (DEFAULT_AGG, FIXED_AGGREGATION[a.loss.name]):
        out.append(f"actor.loss.name={a.loss.name!r} aggregates by {FIXED_AGGREGATION[a.loss.name]} whatever "
                   f"actor.loss_agg_mode says: {a.loss_agg_mode!r} would have no effect; drop actor.loss_agg_mode")
    if a.loss.name == "dro" and a.loss.dro_beta <= 0:
        out.append(f"actor.loss.name=dro needs actor.loss.dro_beta > 0 (its quadratic log-ratio penalty; verl's "
                   f"example uses 0.05), got {a.loss.dro_beta}")
    if a.loss.reinforce_is not in ("", "token", "sequence"):
        out.append(f"actor.loss.reinforce_is={a.loss.reinforce_is!r}: one of '' (none), token, sequence")
    if algo.bypass_mode and algo.tis_cap > 0:
        out.append(f"algo.bypass_mode takes old_logprobs from the rollout, so algo.tis_cap={algo.tis_cap} would weigh "
                   "by pi_rollout / pi_rollout = 1: drop it (the loss corrects the mismatch: actor.loss.name=reinforce "
                   "with actor.loss.reinforce_is / reinforce_is_cap, or vanilla's ratio pi / pi_rollout)")
    if cfg.data.truncation not in TRUNCATIONS:
        out.append(f"data.truncation={cfg.data.truncation!r}: one of {', '.join(TRUNCATIONS)}")
    reads_values = algo.adv.estimator in VALUE_ESTIMATORS
    if reads_values and not cfg.use_critic:
        out.append(f"algo.adv.estimator={algo.adv.estimator!r} reads a critic's values but use_critic is false; "
                   "set use_critic: true (and the critic section), or pick an estimator without values (e.g. grpo)")
    if cfg.use_critic and not reads_values:
        out.append(f"use_critic is true but algo.adv.estimator={algo.adv.estimator!r} never reads the critic's "
                   f"values; set use_critic: false, or an estimator that does ({', '.join(sorted(VALUE_ESTIMATORS))})")
    if cfg.use_critic and reads_values and "critic" not in cfg.placement.roles:
        out.append(f"use_critic is true but placement.roles has no pool for critic (it maps "
                   f"{dict(cfg.placement.roles)}); add critic: <pool>")
    if cfg.use_reward_model and not cfg.reward_model.model:
        out.append("use_reward_model is true but reward_model.model is empty; set it to the reward model's folder "
                   "or HF id (a 1-output sequence classifier)")
    if cfg.use_reward_model and "reward_model" not in cfg.placement.roles:
        out.append(f"use_reward_model is true but placement.roles has no pool for reward_model (it maps "
                   f"{dict(cfg.placement.roles)}); add reward_model: <pool>")
    if not cfg.use_reward_model and (algo.reward_model_sources or algo.reward_function_weight != 1.0):
        out.append("algo.reward_model_sources / reward_function_weight weigh a reward model's scores, but "
                   "use_reward_model is false; drop them or set use_reward_model: true")
    rollout_pool = cfg.placement.pools[cfg.placement.roles["rollout"]] if "rollout" in cfg.placement.roles else None
    if cfg.rollout.backend == "sglang" and rollout_pool is not None and rollout_pool.device != "cuda":
        out.append(f"rollout.backend=sglang needs CUDA GPUs, but the rollout's pool {cfg.placement.roles['rollout']!r} "
                   "has device cpu; use rollout.backend=embedded or vllm there")
    if a.lora.rank and cfg.has_reference() and cfg.placement.roles.get("ref") != cfg.placement.roles["actor"]:
        out.append(f"actor.lora.rank={a.lora.rank}: the reference is the actor's own model with its adapters off, so "
                   f"placement.roles.ref must be the actor's pool {cfg.placement.roles['actor']!r} (it is "
                   f"{cfg.placement.roles.get('ref')!r})")
    actor_pool = cfg.placement.pools.get(cfg.placement.roles["actor"])
    if a.ulysses_sp > 1 and actor_pool is not None and (actor_pool.nnodes * actor_pool.slots_per_node) % a.ulysses_sp:
        out.append(f"actor.ulysses_sp={a.ulysses_sp} does not divide the actor pool's "
                   f"{actor_pool.nnodes * actor_pool.slots_per_node} ranks ({actor_pool.nnodes} x "
                   f"{actor_pool.slots_per_node}): each sequence-parallel group is ulysses_sp of its ranks; change one")
    same_pool = cfg.placement.roles.get("rollout") == cfg.placement.roles["actor"]
    replicas = (rollout_pool.nnodes * rollout_pool.slots_per_node // cfg.rollout.tensor_parallel_size
                if rollout_pool is not None else 0)
    if cfg.rollout.min_replicas > 1 and (same_pool or cfg.rollout.min_replicas > replicas):
        has = "shares the actor's processes (a lost rank stops the run)" if same_pool else f"has {replicas} replicas"
        out.append(f"rollout.min_replicas={cfg.rollout.min_replicas}, but the rollout {has}; set it to at most the "
                   "rollout pool's replicas (nnodes x slots_per_node / rollout.tensor_parallel_size), or 1")
    if cfg.trainer.async_.mode == "one_step_off" and (same_pool or cfg.trainer.backend != "ray"):
        why = (f"placement.roles.rollout is the actor's pool {cfg.placement.roles['actor']!r}" if same_pool
               else f"trainer.backend is {cfg.trainer.backend!r}")
        out.append(f"trainer.async.mode=one_step_off generates the next step's samples while the actor updates, so "
                   f"the rollout needs processes of its own (a pool of its own, trainer.backend=ray), but {why}; add a "
                   "pool for the rollout (placement.pools / placement.roles.rollout), or set trainer.async.mode=sync "
                   "(or streaming, which also runs time-sliced on one pool)")
    if cfg.trainer.async_.mode == "streaming":
        out += _streaming_problems(cfg)
    out += _agent_problems(cfg) + _megatron_problems(cfg) + _implicit_prm_problems(cfg) + teacher_problems(cfg)
    out += determinism.problems(cfg) + _exact_problems(cfg)
    return out


def _exact_problems(cfg: "RunConfig") -> list[str]:
    """``rollout.exact_logprobs``: what the actor's forward on the engine's CPU kernels covers (core/train/exact.py)."""
    if not cfg.rollout.exact_logprobs:
        return []
    a, s, why = cfg.actor, cfg.algo.sampling, "rollout.exact_logprobs=true runs the actor's forward on the embedded "
    pools = {role: cfg.placement.pools[cfg.placement.roles[role]].device for role in ("actor", "rollout")
             if role in cfg.placement.roles and cfg.placement.roles[role] in cfg.placement.pools}
    wants = [(cfg.rollout.backend != "embedded", f"rollout.backend={cfg.rollout.backend}", "rollout.backend=embedded"),
             (any(d != "cpu" for d in pools.values()), f"pool devices {pools}", "CPU pools for actor and rollout"),
             (a.dtype != cfg.rollout.dtype or a.dtype not in ("auto", "float32", "bfloat16"),
              f"actor.dtype={a.dtype}, rollout.dtype={cfg.rollout.dtype}",
              "one dtype for actor and rollout, float32 or bfloat16"),
             (a.strategy != "fsdp" or a.ulysses_sp != 1 or a.lora.rank > 0,
              f"actor.strategy={a.strategy}, ulysses_sp={a.ulysses_sp}, lora.rank={a.lora.rank}",
              "the FSDP actor without Ulysses or LoRA"),
             (s.temperature <= 0, f"algo.sampling.temperature={s.temperature}", "temperature sampling"),
             (cfg.rollout.agent.enable, "rollout.agent.enable=true", "single-turn rollouts")]
    return [f"{why}engine's CPU kernels, which need {need}; got {got}" for bad, got, need in wants if bad]


def _streaming_problems(cfg: "RunConfig") -> list[str]:
    """``trainer.async.mode: streaming`` (``core.streaming``): what its rollout stream runs on."""
    out, r = [], cfg.rollout
    if r.backend == "sglang":
        out.append("trainer.async.mode=streaming runs on rollout.backend=embedded (updates between decode steps) or "
                   "vllm (between chunks of trainer.async.chunk_steps tokens), got sglang; use "
                   "trainer.async.mode=one_step_off with sglang")
    if r.backend == "vllm" and r.agent.enable:
        out.append("trainer.async.mode=streaming with rollout.agent needs rollout.backend=embedded (an agent's turns "
                   "are sequences of one engine run); use trainer.async.mode=one_step_off with vllm")
    if cfg.algo.adv.estimator in BASELINE_ESTIMATORS:
        out.append(f"algo.adv.estimator={cfg.algo.adv.estimator} generates a greedy baseline for the step's prompts, "
                   "which a stream's batch does not have as one draw; use trainer.async.mode=sync")
    pool = cfg.placement.pools.get(cfg.placement.roles.get("rollout", cfg.placement.roles["actor"]))
    replicas = pool.nnodes * pool.slots_per_node // max(r.tensor_parallel_size, 1) if pool is not None else 0
    if replicas and cfg.data.prompts_per_step % replicas:
        out.append(f"trainer.async.mode=streaming adds each step's prompts evenly over the rollout's {replicas} "
                   f"replicas: data.prompts_per_step={cfg.data.prompts_per_step} must divide by {replicas}")
    return out


def _implicit_prm_problems(cfg: "RunConfig") -> list[str]:
    """PRIME: the implicit PRM has a pool and starts from the reference's model; its loss and the estimator that
    reads its rewards go with it, not without."""
    p, out = cfg.implicit_prm, []
    if cfg.actor.loss.name in REWARD_MODEL_LOSSES:
        out.append(f"actor.loss.name={cfg.actor.loss.name!r} is the implicit PRM's loss (it reads no advantages): the "
                   "prm role trains with it when implicit_prm.enable is true; pick a policy loss for the actor")
    if cfg.algo.adv.estimator == "prime" and not p.enable:
        out.append("algo.adv.estimator=prime reads the implicit PRM's process_rewards, but implicit_prm.enable is "
                   "false; set it true (and placement.roles.prm), or pick another estimator (e.g. rloo)")
    if not p.enable:
        return out
    if p.model and p.model != cfg.actor.model:
        out.append(f"implicit_prm.model={p.model!r} but actor.model={cfg.actor.model!r}: its rewards are log-ratios "
                   "to the reference policy, which is actor.model, so it must start from that model; leave it empty")
    if "prm" not in cfg.placement.roles:
        out.append(f"implicit_prm.enable is true but placement.roles has no pool for prm (it maps "
                   f"{dict(cfg.placement.roles)}); add prm: <pool>")
    return out


def _megatron_problems(cfg: "RunConfig") -> list[str]:
    """A Megatron layout fits its role's pool: tp x pp divides the ranks (each DP replica is one TP x PP grid)."""
    out = []
    for name, role in (("actor", cfg.actor), ("critic", cfg.critic if cfg.use_critic else None)):
        if role is None or role.strategy != "megatron" or name not in cfg.placement.roles:
            continue
        pool = cfg.placement.pools[cfg.placement.roles[name]]
        ranks, grid = pool.nnodes * pool.slots_per_node, role.megatron.tp * role.megatron.pp
        if ranks % grid:
            out.append(f"{name}.megatron tp={role.megatron.tp} x pp={role.megatron.pp} = {grid} ranks per model "
                       f"replica does not divide the {name} pool's {ranks} ranks ({pool.nnodes} x "
                       f"{pool.slots_per_node}); change tp / pp or the pool")
    return out


def _agent_problems(cfg: "RunConfig") -> list[str]:
    """Multi-turn agent rollouts: known tools and parser, a response budget that holds one whole turn."""
    from core.tools.builtin import TOOLS
    from core.tools.parsers import TOOL_CALL_PARSERS

    agent, out = cfg.rollout.agent, []
    if not agent.enable:
        return out
    unknown = [t for t in agent.tools if t not in TOOLS]
    if unknown:
        out.append(f"rollout.agent.tools names unknown tool(s) {unknown}{did_you_mean(unknown[0], TOOLS.names())} "
                   f"(known: {', '.join(TOOLS.names())})")
    if agent.tool_parser not in TOOL_CALL_PARSERS:
        out.append(f"rollout.agent.tool_parser={agent.tool_parser!r} is no tool-call parser"
                   f"{did_you_mean(agent.tool_parser, TOOL_CALL_PARSERS.names())} (known: "
                   f"{', '.join(TOOL_CALL_PARSERS.names())})")
    if agent.runner and cfg.rollout.backend == "sglang":
        out.append("rollout.agent.runner serves the embedded engine or vLLM; rollout.backend=sglang has no rollout "
                   "server (set rollout.backend=embedded or vllm, or drop the runner for the built-in loop)")
    if agent.runner and cfg.trainer.async_.mode == "streaming":
        out.append("rollout.agent.runner runs whole agents per rollout call: trainer.async.mode=streaming is not "
                   "supported with it (sync or one_step_off)")
    if agent.max_response_tokens < cfg.algo.sampling.max_new_tokens:
        out.append(f"rollout.agent.max_response_tokens={agent.max_response_tokens} is less than one turn "
                   f"(algo.sampling.max_new_tokens={cfg.algo.sampling.max_new_tokens}): the first turn would be cut; "
                   "raise max_response_tokens (all turns and tool answers) or lower max_new_tokens (one turn)")
    return out


def check_run(cfg: "RunConfig", own_step: bool = False) -> None:
    """Raise ``ConfigError`` listing every problem of ``problems(cfg)``. ``own_step``: the run's step is a recipe's
    copy (``fit``'s ``step_fn``), not core's."""
    found = problems(cfg)
    if not own_step and cfg.data.train_prompts_per_step not in (0, cfg.data.prompts_per_step):
        found.append(f"data.train_prompts_per_step={cfg.data.train_prompts_per_step} differs from "
                     f"data.prompts_per_step={cfg.data.prompts_per_step}, but core's step trains every prompt it "
                     "draws; it is for a recipe's step that filters (e.g. DAPO's): drop it, or run that recipe")
    raise_problems(found)


def raise_problems(found: list[str]) -> None:
    """``ConfigError`` for what a check found: one problem as its own line, several as a list under a count."""
    if len(found) == 1:
        raise ConfigError(found[0])
    if found:
        raise ConfigError(f"{len(found)} problems in the run config:\n" + "\n".join(f"- {p}" for p in found))


def check_data_sources(rows: list[dict], where: str, custom_reward: bool) -> None:
    """With the built-in rewards, every row's ``data_source`` must have one; the error names the first row of
    each unknown source in ``where`` (the data files) and how many rows have it."""
    if custom_reward:
        return
    from core.rewards import REWARDS

    counts, known = Counter(r["data_source"] for r in rows), set(REWARDS.names())
    unknown = sorted(s for s in counts if s not in known)
    if unknown:
        first = {s: next(i for i, r in enumerate(rows) if r["data_source"] == s) for s in unknown}
        raise ConfigError(f"{where}: no reward for data_source " + "; ".join(
            f"{s!r} ({counts[s]} rows, the first is row {first[s] + 1})" for s in unknown)
            + f". Known: {', '.join(REWARDS.names())}. Set reward.path to a file with a compute_score for them, "
            "or register one (core.rewards.REWARDS)")


def check_inputs(cfg: "RunConfig", rows: list[dict]) -> None:
    """What the data and the models' own configs must agree with (before Ray; ``rows``: train and val): image
    prompts need an engine that takes images, a critic and a teacher read the actor's token ids so they need the
    actor's tokenizer, Ulysses groups must divide the heads, a Megatron layout must fit the model, code that a policy writes
    needs the isolation the run asks for."""
    from core.data.vision_inputs import image_prompt_problem

    pictured = next((r for r in rows if "images" in r), None)
    if pictured is not None and (problem := image_prompt_problem(cfg.rollout)):
        raise ConfigError(f"{pictured['where']}: {problem}")
    if problem := tokenizer_problem(cfg):
        raise ConfigError(problem, key=problem.split("=", 1)[0])  # critic.model or teacher.model
    if cfg.actor.ulysses_sp > 1:
        heads = _model_config(cfg.actor.model).num_attention_heads
        if heads % cfg.actor.ulysses_sp:
            raise ConfigError(f"actor.ulysses_sp={cfg.actor.ulysses_sp} must divide {cfg.actor.model}'s {heads} "
                              "attention heads (each rank of a group attends for its share of them)")
    for name, role in (("actor", cfg.actor), ("critic", cfg.critic if cfg.use_critic else None)):
        if role is not None and role.strategy == "megatron":
            from core.train.megatron_actor import run_problem

            c = _model_config(role.model)
            mixed = getattr(c, "decoder_sparse_step", 1) != 1 or bool(getattr(c, "mlp_only_layers", None))
            if problem := run_problem(role, c.model_type, c.num_attention_heads, pictured is not None, name,
                                      c.num_hidden_layers, mixed):
                raise ConfigError(problem)
    check_tools_isolation(cfg, rows)


def check_tools_isolation(cfg: "RunConfig", rows: list[dict]) -> None:
    """A run that executes model-written code (agent tools, a code reward's data source) with
    ``tools.isolation: namespaces`` where namespaces cannot be made fails here, before Ray, with what allows it."""
    from core.rewards.code_tests import SOURCES
    from core.tools import isolation

    runs_code = cfg.rollout.agent.enable or any(r.get("data_source") in SOURCES for r in rows)
    if runs_code and cfg.tools.isolation == "namespaces" and (why := isolation.probe()):
        raise ConfigError(isolation.refusal(why))


# texts whose token ids two tokenizers must agree on to share ids (words, digits, punctuation, spaces, a newline)
TOKENIZER_PROBES = ("Hello world", "The answer is 42.", "Let's think step by step: 3 + 4 = 7\n", "  x=[1, 2]; y")


def tokenizer_problem(cfg: "RunConfig") -> str:
    """A role on another model than the actor's that is fed the actor's token ids -- a critic (it values them), a
    distillation teacher (it scores them) -- must tokenize as the actor does: the same vocabulary size and the same
    ids for ``TOKENIZER_PROBES``. The problem starts with the role's key (``critic.model=...``); "" when each does,
    when a role is on the actor's model, or when a tokenizer is not here to read (a hub id not downloaded yet: not
    checked)."""
    readers = [("critic.model", cfg.critic.model if cfg.use_critic else "", "the critic reads the actor's token ids"),
               ("teacher.model", cfg.teacher.model, "the teacher scores the student's token ids")]
    actor = None  # the actor's tokenizer, read once, when a role needs it
    for key, model, why in readers:
        if not model or model == cfg.actor.model:
            continue
        role, actor = _local_tokenizer(model), actor or _local_tokenizer(cfg.actor.model)
        if role is None or actor is None:
            continue
        ids = [(text, role.encode(text, add_special_tokens=False), actor.encode(text, add_special_tokens=False))
               for text in TOKENIZER_PROBES]
        differ = [probe for probe in ids if probe[1] != probe[2]]
        if len(role) == len(actor) and not differ:
            continue
        text, role_ids, actor_ids = (differ or ids)[0]
        return (f"{key}={model}: its tokenizer differs from actor.model={cfg.actor.model}'s (vocab "
                f"{len(role)} vs {len(actor)}; {text!r} -> {_ids(role_ids)} vs {_ids(actor_ids)}); {why}, so use a "
                "model of the same tokenizer family")
    return ""


def _ids(ids: list[int], most: int = 12) -> str:
    return "[" + ", ".join(map(str, ids[:most])) + (", ...]" if len(ids) > most else "]")


def _local_tokenizer(model: str):
    """``model``'s tokenizer from files already here (a folder, core's SmolLM2 conversion, the HF cache), never
    the network; None where it cannot be read so (the roles' own loading says why, if it is missing for good)."""
    from transformers import AutoTokenizer

    from core.models import resolve_model

    try:
        return AutoTokenizer.from_pretrained(resolve_model(model), local_files_only=True)
    except Exception:  # noqa: BLE001 -- not downloaded, no tokenizer files, a tokenizer this install cannot build
        return None


def _model_config(model: str):
    from transformers import AutoConfig

    from core.models import resolve_model

    return AutoConfig.from_pretrained(resolve_model(model))


def _looks_local(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~"))


def runner_problems(cfg: "RunConfig") -> list[str]:
    """``rollout.agent.runner``: its file exists and defines the async function it names (read, not run), and the
    rollout server's packages are installed."""
    import ast
    import importlib.util
    from pathlib import Path

    spec = cfg.rollout.agent.runner if cfg.rollout.agent.enable else ""
    if not spec:
        return []
    where, _, name = spec.rpartition(":")
    if not where or not name:
        return [f"rollout.agent.runner={spec!r}: write FILE.py:FUNCTION or MODULE:FUNCTION"]
    missing = [m for m in ("fastapi", "uvicorn", "openai") if importlib.util.find_spec(m) is None]
    if missing:
        return [f"rollout.agent.runner needs {', '.join(missing)}: pip install -e '.[serve]'"]
    if not where.endswith(".py"):
        return [] if importlib.util.find_spec(where) else [f"rollout.agent.runner: no module {where!r}"]
    path = Path(where)
    if not path.is_file():
        return [f"rollout.agent.runner: {path} not found"]
    try:
        tree = ast.parse(path.read_text(), str(path))
    except SyntaxError as e:
        return [f"rollout.agent.runner: {path}:{e.lineno}: {e.msg} (the file does not parse)"]
    found = {n.name: isinstance(n, ast.AsyncFunctionDef) for n in tree.body
             if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    if name not in found:
        return [f"rollout.agent.runner: {name!r} is not defined in {path}{did_you_mean(name, list(found))}"]
    return [] if found[name] else [f"rollout.agent.runner: {name} in {path} must be async (async def {name}(client, "
                                   "row))"]


def file_problems(cfg: "RunConfig") -> tuple[list[str], list[str]]:
    """What the run's files say before anything loads: (problems, missing data files). Problems: a reward file that
    is missing, does not parse (file:line) or lacks ``reward.name``; an output dir that is a file or cannot be
    written; a model given as a local path that does not exist. Missing data files are returned apart: a run stops
    on them, a plan only warns (a full-scale plan is read where its data is not)."""
    import ast
    import os
    from pathlib import Path

    out, missing = [], []
    for key, files in (("data.train_files", cfg.data.train_files), ("data.val_files", cfg.data.val_files)):
        missing += [f"{key}: {f} not found" for f in files if not Path(f).is_file()]
    if cfg.reward.path:
        path = Path(cfg.reward.path)
        if not path.is_file():
            out.append(f"reward.path: {path} not found")
        else:
            try:
                tree = ast.parse(path.read_text(), str(path))
                names = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))] + [
                    t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)]
                if cfg.reward.name not in names and not any(isinstance(n, (ast.Import, ast.ImportFrom)) and any(
                        (a.asname or a.name) == cfg.reward.name for a in n.names) for n in tree.body):
                    out.append(f"reward.name: {cfg.reward.name!r} is not defined in {path}"
                               f"{did_you_mean(cfg.reward.name, names)}")
            except SyntaxError as e:
                out.append(f"reward.path: {path}:{e.lineno}: {e.msg} (the reward file does not parse)")
    out += runner_problems(cfg)
    o = Path(cfg.trainer.output_dir)
    if o.exists() and not o.is_dir():
        out.append(f"trainer.output_dir: {o} is a file, not a folder; name another output_dir")
    else:
        parent = next(p for p in (o, *o.absolute().parents) if p.exists())
        if not os.access(parent, os.W_OK):
            out.append(f"trainer.output_dir: {o} cannot be written ({parent} is not writable)")
    models = [("actor.model", cfg.actor.model), ("rollout.model", cfg.rollout.model)]
    models += [("critic.model", cfg.critic.model)] if cfg.use_critic else []
    models += [("reward_model.model", cfg.reward_model.model)] if cfg.use_reward_model else []
    models += [("teacher.model", cfg.teacher.model)]
    out += [f"{key}: {m} not found (a model folder with config.json, or a hub id such as Qwen/Qwen2.5-7B-Instruct)"
            for key, m in models if m and _looks_local(m) and not Path(m).expanduser().exists()]
    return out, missing


def check_files(cfg: "RunConfig", missing_data_ok: bool = False, data_hint: str = "") -> list[str]:
    """Raise ``ConfigError`` with ``file_problems``' problems (missing data too, unless ``missing_data_ok``: then
    they are returned, for a plan to print as warnings). ``data_hint``: how the recipe makes its data."""
    found, missing = file_problems(cfg)
    if missing and data_hint:
        missing = [f"{m}; {data_hint}" for m in missing]
    raise_problems(found + ([] if missing_data_ok else missing))
    return missing
