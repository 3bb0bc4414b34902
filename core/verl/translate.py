"""A verl command line's overrides -> ours, with verl's semantics (``core.verl.keys``: the table, the rules).

    tr = translate(["data.train_batch_size=8", "actor_rollout_ref.rollout.n=4",
                    "actor_rollout_ref.actor.ppo_mini_batch_size=4", ...])
    tr.ours["actor.ppo_mini_batch_size"]  # 16: verl's 4 prompts x n=4 samples
    tr.unsupported                         # verl keys with no counterpart, one line each, with why

Keys a command line leaves out take verl's defaults (``Key.default``), as verl's own run would.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from core.config.errors import did_you_mean
from core.verl.keys import _NONE, ACT, BY_KEY, R, TABLE, Key, lookup

ESTIMATORS = {"grpo_vectorized": "grpo", "rloo_vectorized": "rloo"}
LOGGERS = {"console": "console", "wandb": "wandb", "swanlab": "swanlab", "tensorboard": "tensorboard",
           "file": "jsonl"}


@dataclass
class Translation:
    # our keys whose values the verl line gives, or differ from our defaults (a config states only those)
    ours: dict[str, Any] = field(default_factory=dict)
    # every our-key the translation sets, our defaults' equals included
    full: dict[str, Any] = field(default_factory=dict)
    # our keys set by a verl key the command line gave (the rest follow from verl's defaults)
    from_given: set[str] = field(default_factory=set)
    # (verl key, value, what it became) for every key the command line gave
    lines: list[tuple[str, Any, str]] = field(default_factory=list)
    not_applicable: list[str] = field(default_factory=list)
    unsupported: list[str] = field(default_factory=list)

    def overrides(self, given: bool | None = None) -> list[str]:
        """Our Hydra overrides (``++``: whether or not the base config spells the key out); ``given``: only those a
        verl key of the command line set (True) or only those verl's defaults imply (False)."""
        return [f"++{k}={_hydra(v)}" for k, v in self.ours.items()
                if given is None or (k in self.from_given) == given]

    def tree(self) -> dict:
        """Our keys as one nested mapping (what ``validate`` and a config.yaml take)."""
        tree: dict = {}
        for key, value in self.ours.items():
            *parents, leaf = key.split(".")
            node = tree
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = list(value) if isinstance(value, tuple) else value
        return tree

    def yaml(self) -> str:
        """Our keys as one nested yaml (a recipe folder's config.yaml)."""
        return yaml.safe_dump(self.tree(), sort_keys=False, width=120).rstrip()


def _hydra(value: Any) -> str:
    """A value in Hydra's override grammar: a string quoted unless it is a plain word, path or id that Hydra reads
    back as the same string (``~/x``, ``qwen3(8b)``, ``20240601`` as a name are quoted)."""
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_hydra(v) for v in value) + "]"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if not isinstance(value, str):
        return str(value)
    plain = re.fullmatch(r"[A-Za-z_/.][\w./-]*", value) and value.lower() not in ("true", "false", "null", "none")
    return value if plain else "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def parse(overrides: list[str]) -> dict[str, Any]:
    """``key=value`` (Hydra's ``+`` / ``++`` prefixes dropped) -> {key: value parsed as YAML}."""
    out = {}
    for o in overrides:
        if "=" not in o or o.startswith("~"):
            continue
        key, text = o.split("=", 1)
        try:
            value = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError:
            value = text
        out[key.lstrip("+")] = _number(value)
    return out


def _number(value: Any) -> Any:
    """YAML 1.1 reads 1e-6 as a string; Hydra (and verl) read it as a float."""
    if isinstance(value, str):
        for kind in (int, float):
            try:
                return kind(value)
            except ValueError:
                pass
    return [_number(x) for x in value] if isinstance(value, list) else value


def translate(overrides: list[str]) -> Translation:
    """verl's ``key=value`` overrides -> ``Translation``; every key given is in ``lines`` and, when it has no job
    here, in ``not_applicable`` or ``unsupported`` (never dropped silently)."""
    given, tr = parse(overrides), Translation()
    given = {k: v for k, v in given.items() if v is not None or lookup(k) is None or lookup(k).rule == "list"
             or lookup(k).default is _NONE}  # key=null: verl's default (verl reads null as "not set")
    megatron = str(given.get("--config-name", "")).startswith("ppo_megatron_trainer")
    if megatron or given.get("model_engine") == "megatron":
        given.setdefault(ACT + "strategy", "megatron")
    v = {k.verl: k.default for k in TABLE if k.default is not _NONE and not k.verl.endswith(".*")} | given
    for key, value in given.items():
        row = lookup(key)
        if row is None:
            tr.unsupported.append(f"{key}: no such verl key here{did_you_mean(key, BY_KEY)} (core/verl/keys.py "
                                  "lists verl's keys and what each is here)")
            tr.lines.append((key, value, "unsupported"))
        elif row.kind == "not_applicable":
            tr.not_applicable.append(f"{key}: {row.note}")
            tr.lines.append((key, value, f"not applicable: {row.note}"))
        elif row.kind == "unsupported" and value not in row.accepts:
            tr.unsupported.append(f"{key}={value}: {row.note}")
            tr.lines.append((key, value, "unsupported"))
        else:
            tr.lines.append((key, value, ", ".join(row.ours) or "(what happens here anyway)"))
    targets_given = {k for row in map(lookup, given) if row is not None for k in row.ours}
    defaults = _our_defaults()
    for row in TABLE:
        if row.kind in ("same", "converted") and row.verl in v and row.rule in SIMPLE:
            if row.verl not in given and (row.verl in _SECONDARY or set(row.ours) & targets_given):
                continue  # an absent key's default never overrides a key given for the same target
            value = SIMPLE[row.rule](v[row.verl])
            if value is None and row.rule == "modules":
                continue  # all-linear: ours' default list
            for key in row.ours:  # a string field gets a string (experiment_name=20240601 is a name)
                stringly = isinstance(defaults.get(key), str) and not isinstance(value, str)
                tr.ours[key] = str(value) if stringly else value
    _derived(v, given, tr)
    tr.from_given = {k for row in map(lookup, given) if row is not None for k in row.ours}
    tr.full = dict(tr.ours)
    tr.ours = {k: x for k, x in tr.ours.items()  # placement.roles is one map: stated whole when at all
               if k in tr.from_given or defaults.get(k, _NONE) != x or k.startswith("placement.roles.")}
    return tr


def _our_defaults() -> dict[str, Any]:
    """Our config's defaults by dotted key (a translated value equal to one, from a verl default, is not stated)."""
    import dataclasses

    from core.config import RunConfig

    def flat(tree: Any, key: str = "") -> dict[str, Any]:
        if isinstance(tree, dict):
            return {k: x for name, sub in tree.items()
                    for k, x in flat(sub, f"{key}.{name.rstrip('_')}" if key else name.rstrip("_")).items()}
        return {key: list(tree) if isinstance(tree, tuple) else tree}

    return flat(dataclasses.asdict(RunConfig()))


# a key whose value another key's default already gives (rollout.response_length follows data.max_response_length)
_SECONDARY = {R + "prompt_length", R + "response_length", ACT + "ulysses_sequence_parallel_size",
              "reward.custom_reward_function.name", "custom_reward_function.name"}

SIMPLE = {
    "same": lambda x: list(x) if isinstance(x, tuple) else x,
    "list": lambda x: [] if x is None else [x] if isinstance(x, str) else list(x),
    "modules": lambda x: None if x in (None, "all-linear") else [x] if isinstance(x, str) else list(x),
    "not": lambda x: not x,
    "strategy": lambda x: "megatron" if str(x).startswith("megatron") else "fsdp",
    "freq": lambda x: max(0, int(x)),
    "estimator": lambda x: ESTIMATORS.get(x, x),
    "rollout_name": lambda x: x,
}


def _derived(v: dict, given: dict, tr: Translation) -> None:
    """The rules that read several keys: units, switches, the pool, the reference and the critic."""
    o, problems = tr.ours, tr.unsupported
    n = int(v[R + "n"])
    for key in ("ppo_mini_batch_size", "use_dynamic_bsz", "loss_agg_mode"):  # verl's critic follows the actor's
        if v.get("critic." + key) is None:
            v["critic." + key] = v[ACT + key]
            if key == "loss_agg_mode":
                o["critic.loss_agg_mode"] = v[ACT + key]
    o["actor.ppo_mini_batch_size"] = int(v[ACT + "ppo_mini_batch_size"]) * n  # verl: prompts; ours: samples
    for role, prefix in (("actor", ACT), ("critic", "critic.")):
        # verl's scheduler steps once per RL step, ours once per optimizer step: warmup x updates per step
        updates = -(-int(v["data.train_batch_size"]) // int(v[prefix + "ppo_mini_batch_size"])) * int(
            v.get(prefix + "ppo_epochs") or 1)
        warmup = v.get(prefix + "optim.lr_warmup_steps")
        o[f"{role}.optim.warmup_steps"] = int(warmup) * updates if warmup and int(warmup) > 0 else 0
        dynamic = bool(v.get(prefix + "use_dynamic_bsz"))
        o[f"{role}.max_tokens_per_micro"] = int(v[prefix + "ppo_max_token_len_per_gpu"]) if dynamic else 0
        if v.get(prefix + "ppo_micro_batch_size_per_gpu") is not None:
            o[f"{role}.micro_batch_size"] = int(v[prefix + "ppo_micro_batch_size_per_gpu"])
        fsdp = prefix + ("fsdp_config." if role == "actor" else "fsdp.")
        o[f"{role}.offload"] = "idle" if v.get(fsdp + "param_offload") or v.get(fsdp + "optimizer_offload") else "none"
    o["actor.kl_loss_coef"] = float(v[ACT + "kl_loss_coef"]) if v[ACT + "use_kl_loss"] else 0.0
    o["algo.kl_in_reward.coef"] = float(v["algorithm.kl_ctrl.kl_coef"]) if v["algorithm.use_kl_in_reward"] else 0.0
    o["algo.kl_in_reward.adaptive"] = v["algorithm.kl_ctrl.type"] == "adaptive"
    o["use_ref"] = bool(v[ACT + "use_kl_loss"] or v["algorithm.use_kl_in_reward"])  # verl's need_reference_policy
    if v.get("data.gen_batch_size"):  # prompts drawn per step; the step trains train_batch_size of them (DAPO)
        o["data.prompts_per_step"], o["data.train_prompts_per_step"] = int(v["data.gen_batch_size"]), \
            int(v["data.train_batch_size"])
    from core.algos import ADVANTAGES

    if o["algo.adv.estimator"] not in ADVANTAGES.names():
        problems.append(f"algorithm.adv_estimator={v['algorithm.adv_estimator']}: no such estimator here "
                        f"(here: {', '.join(sorted(ADVANTAGES.names()))})")
    critic = v.get("critic.enable")
    o["use_critic"] = bool(critic) if critic is not None else o["algo.adv.estimator"] == "gae"
    if o["use_critic"]:
        o["critic.ppo_mini_batch_size"] = int(v["critic.ppo_mini_batch_size"]) * n
        o.setdefault("critic.model", v[f"{ACT[:-6]}model.path"])
        o["placement.roles.critic"] = "main"  # every role on verl's one pool
    else:
        o = {k: val for k, val in o.items() if not k.startswith("critic.")}
        tr.ours = o
    if v.get(R + "val_kwargs.do_sample") is False and R + "val_kwargs.temperature" not in given:
        o["algo.val_sampling.temperature"] = 0.0
    # the cluster: one pool for every role (verl's global_pool)
    o["placement.pools.main.nnodes"], o["placement.pools.main.slots_per_node"] = int(v["trainer.nnodes"]), \
        int(v["trainer.n_gpus_per_node"])
    o["placement.pools.main.device"] = v["trainer.device"]
    if o.get("use_reward_model"):
        o["placement.roles.reward_model"] = "main"
    if any(k.startswith("placement.roles.") for k in o):  # a roles map replaces ours whole: name every role
        o.update({f"placement.roles.{r}": "main" for r in ("actor", "rollout", "ref")})
    sp = [v.get(ACT + "ulysses_sequence_parallel_size"), v.get(ACT + "fsdp_config.ulysses_sequence_parallel_size")]
    o["actor.ulysses_sp"] = int(sp[0]) if sp[0] and int(sp[0]) > 1 else int(sp[1] or 1)  # verl: the actor's if > 1
    if v["trainer.device"] not in ("cuda", "cpu"):
        problems.append(f"trainer.device={v['trainer.device']}: pools run on cuda or cpu")
    # the run's length: epochs over the data (counted when it is loaded), or verl's total_training_steps
    if v.get("trainer.total_training_steps") is not None:
        o["trainer.total_steps"], o["trainer.total_epochs"] = int(v["trainer.total_training_steps"]), 0
    else:
        o["trainer.total_epochs"] = int(v["trainer.total_epochs"])
        o.pop("trainer.total_steps", None)
    o["trainer.output_dir"] = str(v["trainer.default_local_dir"]).replace(
        "${trainer.project_name}", str(v["trainer.project_name"])).replace(
        "${trainer.experiment_name}", str(v["trainer.experiment_name"]))
    mode = v["trainer.resume_mode"]
    o["trainer.resume_mode"] = v.get("trainer.resume_from_path") if mode == "resume_path" else mode
    o["trainer.save_keep"] = int(v.get("trainer.max_actor_ckpt_to_keep") or 0)
    for key in ("actor.optim.warmup_steps", "critic.optim.warmup_steps", "data.limit", "data.val_limit"):
        if key in o and o[key] is not None and o[key] < 0:
            o[key] = 0
    loggers = [v["trainer.logger"]] if isinstance(v["trainer.logger"], str) else list(v["trainer.logger"])
    unknown = [x for x in loggers if x not in LOGGERS]
    if unknown:
        problems.append(f"trainer.logger: {', '.join(unknown)}: trackers here are {', '.join(LOGGERS)}")
    o["trainer.logger"] = [LOGGERS[x] for x in loggers if x in LOGGERS]
    if v.get("data.truncation") == "middle":
        problems.append("data.truncation=middle: a long prompt is an error, or cut left or right")
    backend = v.get(R + "name")
    if backend is None:
        problems.append(f"{R}name: verl needs it (vllm | sglang); here also embedded, our own engine")
    elif backend not in ("vllm", "sglang", "embedded"):
        problems.append(f"{R}name={backend}: rollout engines here are vllm, sglang and embedded")
    elif backend == "embedded":
        o["rollout.tensor_parallel_size"] = 1  # verl's default TP 2 is an engine's; ours has none
    else:
        o.setdefault("rollout.tensor_parallel_size", 2)


def unused_rows() -> list[Key]:
    """Rows whose rule nothing converts (a table entry that would be silently dropped): must be empty."""
    handled = set(SIMPLE) | {"greedy", "gen_batch", "warmup", "ulysses", "times_n", "micro", "dynamic", "offload",
                             "kl_loss", "kl_reward",
                             "kl_ctrl", "critic", "gpus", "epochs", "output", "resume", "n/a", "unsupported"}
    return [k for k in TABLE if k.rule not in handled]
