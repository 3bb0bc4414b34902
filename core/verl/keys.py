"""verl's config keys and what each is here: the one table ``hybridrl train --verl`` and ``convert-verl`` translate
with, and the docs page ``docs/coming-from-verl.md`` is generated from (``python -m core.verl.docs``).

Each ``Key`` row: verl's dotted key (``.*``: every key under it), verl's default (applied when a command line
leaves the key out, as verl would), our key(s), how the value converts (``RULES``), and a note. Its kind says what
a user gets: ``same`` (the value carries over), ``converted`` (units or meaning differ: the rule converts),
``not_applicable`` (a knob of verl's machinery that has no job here -- accepted, listed, changes nothing) or
``unsupported`` (a feature this framework does not have: a run refuses it, naming why). Keys are verl's at
verl-project/verl 1dda039 (Aug 2026, ``verl/trainer/config/_generated_ppo_trainer.yaml``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_NONE = object()  # no default: verl's key is optional or mandatory

A = "actor_rollout_ref."
R, REF, ACT = A + "rollout.", A + "ref.", A + "actor."


@dataclass(frozen=True)
class Key:
    verl: str
    ours: tuple[str, ...] = ()
    default: Any = _NONE
    rule: str = "same"
    note: str = ""
    # values of an unsupported key that are what happens here anyway (data.prompt_key=prompt): accepted
    accepts: tuple = ()

    @property
    def kind(self) -> str:
        if self.rule == "n/a":
            return "not_applicable"
        if self.rule == "unsupported":
            return "unsupported"
        return "same" if self.rule == "same" else "converted"


def K(verl: str, ours: str | tuple[str, ...] = (), default: Any = _NONE, rule: str = "same", note: str = "") -> Key:
    return Key(verl, (ours,) if isinstance(ours, str) else tuple(ours), default, rule, note)


def NA(verl: str, note: str) -> Key:
    return Key(verl, (), _NONE, "n/a", note)


def NO(verl: str, note: str, accepts: tuple = ()) -> Key:
    return Key(verl, (), _NONE, "unsupported", note, accepts)


# how a value converts (the rule names used below); the conversions themselves: core/verl/translate.py
RULES = {
    "same": "the value as it is",
    "times_n": "verl counts prompts, we count samples: the value x rollout.n",
    "list": "one file or a list -> a list",
    "gpus": "the cluster's shape -> the pool (placement.pools.main): nodes, ranks per node, device",
    "freq": "<= 0 disables verl's periodic save / validation; ours: 0 (ours still scores the held-out set before the "
            "first and after the last step)",
    "kl_loss": "actor.use_kl_loss and kl_loss_coef -> actor.kl_loss_coef (0 when off); the reference exists when a KL "
               "needs it, as in verl",
    "kl_reward": "algorithm.use_kl_in_reward and kl_ctrl.kl_coef -> algo.kl_in_reward.coef (0 when off)",
    "kl_ctrl": "fixed | adaptive -> algo.kl_in_reward.adaptive",
    "critic": "a critic when critic.enable, else when adv_estimator is gae (verl's rule)",
    "estimator": "verl's name -> ours (the same names; *_vectorized are the same math)",
    "micro": "samples per GPU per forward -> micro_batch_size, used unless use_dynamic_bsz",
    "dynamic": "use_dynamic_bsz with ppo_max_token_len_per_gpu -> max_tokens_per_micro (tokens per micro-batch)",
    "offload": "param_offload / optimizer_offload -> offload: idle (host memory while the role is idle)",
    "strategy": "fsdp | fsdp2 -> fsdp; megatron -> megatron",
    "not": "the opposite boolean",
    "greedy": "do_sample false -> temperature 0",
    "modules": "all-linear: ours' default list (every linear layer of the blocks); a name: a list of one",
    "warmup": "verl's scheduler steps once per RL step, ours once per optimizer step: steps x updates per step "
              "(ceil(train_batch_size / ppo_mini_batch_size) x ppo_epochs); <= 0: none",
    "ulysses": "actor.ulysses_sequence_parallel_size when > 1, else fsdp_config's (verl's precedence)",
    "gen_batch": "prompts drawn per step -> data.prompts_per_step; train_batch_size -> data.train_prompts_per_step",
    "epochs": "passes over the training data: trainer.total_epochs (steps = epochs x floor(rows / prompts per step), "
              "counted when the data is loaded, as verl's drop_last dataloader); total_training_steps, when set, is the run's "
              "length (verl stops at whichever of the two comes first)",
    "resume": "auto | disable | resume_path (with trainer.resume_from_path) -> trainer.resume_mode",
    "rollout_name": "vllm | sglang -> rollout.backend (embedded: our own engine, an extension)",
    "output": "the checkpoint folder -> trainer.output_dir (metrics, checkpoints and curves go there)",
    "n/a": "accepted and listed; changes nothing here",
    "unsupported": "refused by a run, naming why",
}

TABLE: tuple[Key, ...] = (
    # data
    K("data.train_files", "data.train_files", "~/data/rlhf/gsm8k/train.parquet", "list", "verl-schema parquet, as is"),
    K("data.val_files", "data.val_files", "~/data/rlhf/gsm8k/test.parquet", "list"),
    K("data.train_batch_size", "data.prompts_per_step", 1024, "same", "prompts per step, in both"),
    K("data.max_prompt_length", "rollout.max_prompt_length", 512),
    K("data.max_response_length", "algo.sampling.max_new_tokens", 512),
    K("data.filter_overlong_prompts", "data.filter_overlong_prompts", False),
    K("data.truncation", "data.truncation", "error", "same", "error | left | right (verl's middle: unsupported)"),
    K("data.shuffle", "data.shuffle", True),
    K("data.seed", "trainer.seed"),
    K("data.train_max_samples", "data.limit", -1, "same", "-1 = all; ours takes the first N rows, verl a random N"),
    K("data.val_max_samples", "data.val_limit", -1, "same", "-1 = all"),
    K("data.gen_batch_size", ("data.prompts_per_step", "data.train_prompts_per_step"), rule="gen_batch",
      note="prompts drawn per step; the step trains train_batch_size of them (a recipe that filters: DAPO)"),
    NA("data.return_raw_chat", "prompts are chat lists here always"),
    NA("data.return_raw_input_ids", "a reward model re-tokenizes with its own template here always"),
    NA("data.filter_overlong_prompts_workers", "the length filter runs once, before Ray"),
    NA("data.dataloader_num_workers", "prompts are streamed from memory"),
    NA("data.use_shm", "prompts are streamed from memory"),
    NA("data.trust_remote_code", "models load with transformers' own classes"),
    NA("data.image_patch_size", "images are cut into patches by the model's own processor"),
    NO("data.prompt_key", "the prompt is the row's `prompt` column (verl's default); another column: rename it",
       ("prompt",)),
    NO("data.reward_fn_key", "rewards are chosen by `data_source` (verl's default)", ("data_source",)),
    NO("data.image_key", "images are the row's `images` column (verl's default)", ("images",)),
    NO("data.custom_cls.*", "no custom dataset classes: verl-schema parquet"),
    NO("data.apply_chat_template_kwargs.*", "the tokenizer's chat template is applied as it is"),
    NO("data.tool_config_path", "tools are named in rollout.agent.tools"),
    # the model
    K(A + "model.path", ("actor.model", "rollout.model"), "~/models/deepseek-llm-7b-chat", "same",
      "the actor, its rollout copy and the reference"),
    K(A + "model.enable_gradient_checkpointing", "actor.gradient_checkpointing", True),
    K(A + "model.use_remove_padding", "actor.remove_padding", True),
    K(A + "model.lora_rank", "actor.lora.rank", 0),
    K(A + "model.lora_alpha", "actor.lora.alpha", 16),
    K(A + "model.target_modules", "actor.lora.target_modules", rule="modules", note="all-linear: ours' default list"),
    NA(A + "model.use_fused_kernels", "our CPU and GPU kernels are chosen by the machine"),
    NA(A + "model.trust_remote_code", "models load with transformers' own classes"),
    NA(A + "model.use_shm", "models load from disk"),
    NA(A + "model.enable_activation_offload", "not needed at the sizes this runs"),
    NO(A + "model.override_config.*", "the model's own config.json is used"),
    NO(A + "model.mtp.*", "no multi-token prediction"),
    NA(A + "hybrid_engine", "the rollout is colocated with the actor when they share a pool (the default)"),
    NA(A + "nccl_timeout", "trainer.call_timeout_s bounds every worker call"),
    # the actor
    K(ACT + "strategy", "actor.strategy", "fsdp", "strategy"),
    K(ACT + "optim.lr", "actor.optim.lr", 1e-6),
    K(ACT + "optim.weight_decay", "actor.optim.weight_decay", 0.01),
    K(ACT + "optim.clip_grad", "actor.optim.grad_clip", 1.0),
    K(ACT + "optim.betas", "actor.optim.betas", (0.9, 0.999)),
    K(ACT + "optim.lr_warmup_steps", "actor.optim.warmup_steps", -1, "warmup", "-1: none (verl then uses the ratio)"),
    NO(ACT + "optim.lr_warmup_steps_ratio", "warmup is in steps here: set lr_warmup_steps", (0, 0.0)),
    NO(ACT + "optim.lr_scheduler_type", "the learning rate is constant after its linear warmup (verl's constant)",
       ("constant",)),
    NO(ACT + "optim.warmup_style", "the learning rate is constant after its linear warmup (verl's constant)",
       ("constant",)),
    NO(ACT + "optim.min_lr_ratio", "the learning rate is constant after its linear warmup", (0, 0.0, None)),
    NA(ACT + "optim.optimizer", "AdamW"),
    NO(ACT + "optim.override_optimizer_config.*",
       "Megatron's distributed-optimizer options (CPU offload, precision-aware): not in this version's Megatron path"),
    K(ACT + "ppo_mini_batch_size", "actor.ppo_mini_batch_size", 256, "times_n", "verl: prompts; ours: samples"),
    K(ACT + "ppo_micro_batch_size_per_gpu", "actor.micro_batch_size", rule="micro"),
    K(ACT + "use_dynamic_bsz", "actor.max_tokens_per_micro", False, "dynamic"),
    K(ACT + "ppo_max_token_len_per_gpu", "actor.max_tokens_per_micro", 16384, "dynamic"),
    K(ACT + "ppo_epochs", "actor.ppo_epochs", 1),
    NA(ACT + "shuffle", "mini-batches are taken in order"),
    NA(ACT + "clip_ratio", "verl's clip_ratio_low / clip_ratio_high (both 0.2 unless set) win over it: set those"),
    K(ACT + "clip_ratio_low", "actor.loss.clip_low", 0.2),
    K(ACT + "clip_ratio_high", "actor.loss.clip_high", 0.2),
    K(ACT + "clip_ratio_c", "actor.loss.dual_clip_c", 3.0),
    K(ACT + "loss_agg_mode", "actor.loss_agg_mode", "token-mean"),
    K(ACT + "entropy_coeff", "actor.entropy_coef", 0.0),
    K(ACT + "use_kl_loss", "actor.kl_loss_coef", False, "kl_loss"),
    K(ACT + "kl_loss_coef", "actor.kl_loss_coef", 0.001, "kl_loss"),
    K(ACT + "kl_loss_type", "actor.kl_loss_type", "low_var_kl"),
    K(ACT + "policy_loss.loss_mode", "actor.loss.name", "vanilla"),
    K(ACT + "policy_loss.clip_cov_ratio", "actor.loss.clip_cov_ratio", 0.0002),
    K(ACT + "policy_loss.clip_cov_lb", "actor.loss.clip_cov_lb", 1.0),
    K(ACT + "policy_loss.clip_cov_ub", "actor.loss.clip_cov_ub", 5.0),
    K(ACT + "policy_loss.kl_cov_ratio", "actor.loss.kl_cov_ratio", 0.0002),
    K(ACT + "policy_loss.ppo_kl_coef", "actor.loss.kl_cov_coef", 0.1),
    K(ACT + "tau_pos", "actor.loss.sapo_tau_pos", 1.0),
    K(ACT + "tau_neg", "actor.loss.sapo_tau_neg", 1.05),
    K(ACT + "policy_loss.tau_pos", "actor.loss.sapo_tau_pos"),
    K(ACT + "policy_loss.tau_neg", "actor.loss.sapo_tau_neg"),
    K(ACT + "fsdp_config.param_offload", "actor.offload", False, "offload"),
    K(ACT + "fsdp_config.optimizer_offload", "actor.offload", False, "offload"),
    K(ACT + "fsdp_config.ulysses_sequence_parallel_size", "actor.ulysses_sp", 1, "ulysses"),
    K(ACT + "ulysses_sequence_parallel_size", "actor.ulysses_sp", 1, "ulysses"),
    NA(ACT + "fsdp_config.*", "FSDP2's sharding, prefetch and precision are set by the engine"),
    NA(ACT + "use_torch_compile", "the engine decides what it compiles"),
    NO(ACT + "calculate_sum_pi_squared",
       "no optimal-token-baseline estimator (it needs the sum of squared probabilities)", (False,)),
    NA(ACT + "entropy_from_logits_with_chunking", "entropy is computed in chunks always"),
    NA(ACT + "entropy_checkpointing", "entropy is computed in chunks always"),
    NA(ACT + "checkpoint.*", "a checkpoint holds the model, optimizer and RNG of every rank always"),
    NA(ACT + "profiler.*", "profiling: bench/"),
    K(ACT + "megatron.tensor_model_parallel_size", "actor.megatron.tp", 1),
    K(ACT + "megatron.pipeline_model_parallel_size", "actor.megatron.pp", 1),
    K(ACT + "megatron.expert_model_parallel_size", "actor.megatron.ep", 1),
    NO(ACT + "megatron.*", "Megatron-core runs here with tp, pp and ep only (README, Megatron-core)", (False, None)),
    NO(ACT + "veomni.*", "no VeOmni engine"),
    NO(ACT + "engine.*", "the engine is actor.strategy"),
    # the rollout
    K(R + "name", "rollout.backend", rule="rollout_name"),
    K(R + "n", "algo.sampling.n", 1),
    K(R + "temperature", ("algo.sampling.temperature", "actor.temperature"), 1.0, "same",
      "the trainer scores log-probs at the sampling temperature, as verl"),
    K(R + "top_p", "algo.sampling.top_p", 1.0),
    K(R + "top_k", "algo.sampling.top_k", -1),
    K(R + "ignore_eos", "algo.sampling.ignore_eos", False),
    K(R + "prompt_length", "rollout.max_prompt_length"),
    K(R + "response_length", "algo.sampling.max_new_tokens"),
    K(R + "dtype", "rollout.dtype"),
    K(R + "tensor_model_parallel_size", "rollout.tensor_parallel_size", 2),
    K(R + "gpu_memory_utilization", "rollout.gpu_memory_utilization", 0.5),
    K(R + "enforce_eager", "rollout.cuda_graphs", False, "not"),
    K(R + "free_cache_engine", "rollout.sleep_after_generate", True),
    K(R + "max_num_seqs", "rollout.max_batch_size"),
    K(R + "checkpoint_engine.update_weights_bucket_megabytes", "rollout.sync_bucket_megabytes"),
    K(R + "val_kwargs.n", "algo.val_sampling.n", 1),
    K(R + "val_kwargs.temperature", "algo.val_sampling.temperature", 0),
    K(R + "val_kwargs.top_p", "algo.val_sampling.top_p", 1.0),
    K(R + "val_kwargs.top_k", "algo.val_sampling.top_k", -1),
    K(R + "val_kwargs.do_sample", "algo.val_sampling.temperature", False, "greedy"),
    K(R + "multi_turn.enable", "rollout.agent.enable", False),
    K(R + "multi_turn.max_assistant_turns", "rollout.agent.max_turns"),
    NO(R + "multi_turn.*", "tools are named in rollout.agent.tools (README, Agent RL)"),
    NA(R + "mode", "one rollout mode here: the engine generates while the trainer waits"),
    NA(R + "log_prob_micro_batch_size_per_gpu", "log-probs use the actor's micro-batching"),
    NA(R + "log_prob_use_dynamic_bsz", "log-probs use the actor's micro-batching"),
    NA(R + "log_prob_max_token_len_per_gpu", "log-probs use the actor's micro-batching"),
    NA(R + "calculate_log_probs", "the rollout's log-probs are taken when a correction needs them"),
    NA(R + "enable_chunked_prefill", "the engine's own scheduling"),
    NA(R + "enable_prefix_caching", "the engine's own scheduling (one prompt's samples share its cache)"),
    NA(R + "max_num_batched_tokens", "the engine's own scheduling"),
    NA(R + "max_model_len", "prompt + response lengths bound it"),
    NA(R + "load_format", "weights come from the actor"),
    NA(R + "layered_summon", "weights sync bucket by bucket always"),
    NA(R + "disable_log_stats", "the engine logs nothing per request"),
    NA(R + "multi_stage_wake_up", "the engine wakes in one stage, weights then cache"),
    NA(R + "engine_kwargs.*", "engine-specific tuning"),
    NA(R + "agent.*", "the agent loop: rollout.agent"),
    NA(R + "profiler.*", "profiling: bench/"),
    NA(R + "prometheus.*", "metrics go to the run's trackers"),
    NO(R + "data_parallel_size", "rollout replicas follow the pool: ranks / tensor_parallel_size", (1,)),
    NO(R + "expert_parallel_size", "no expert parallelism in the rollout", (1,)),
    NO(R + "quantization", "the rollout runs the actor's dtype"),
    NO(R + "enable_rollout_routing_replay", "no MoE routing replay"),
    # the reference
    NA(REF + "log_prob_micro_batch_size_per_gpu", "the reference uses the actor's micro-batching"),
    NA(REF + "log_prob_use_dynamic_bsz", "the reference uses the actor's micro-batching"),
    NA(REF + "log_prob_max_token_len_per_gpu", "the reference uses the actor's micro-batching"),
    NA(REF + "fsdp_config.*", "the reference is sharded as the actor"),
    NA(REF + "ulysses_sequence_parallel_size", "the reference uses actor.ulysses_sp"),
    NA(REF + "use_torch_compile", "the engine decides what it compiles"),
    NA(REF + "entropy_from_logits_with_chunking", "entropy is computed in chunks always"),
    NA(REF + "entropy_checkpointing", "entropy is computed in chunks always"),
    NA(REF + "strategy", "the reference runs on the actor's engine"),
    NA(REF + "megatron.*", "the reference runs on the actor's layout"),
    NA(REF + "veomni.*", "no VeOmni engine"),
    NA(REF + "profiler.*", "profiling: bench/"),
    # the algorithm
    K("algorithm.adv_estimator", "algo.adv.estimator", "gae", "estimator"),
    K("algorithm.gamma", "algo.adv.gamma", 1.0),
    K("algorithm.lam", "algo.adv.lam", 1.0),
    K("algorithm.norm_adv_by_std_in_grpo", "algo.adv.norm_by_std", True),
    K("algorithm.use_kl_in_reward", "algo.kl_in_reward.coef", False, "kl_reward"),
    K("algorithm.kl_penalty", "algo.kl_in_reward.kind", "kl"),
    K("algorithm.kl_ctrl.kl_coef", "algo.kl_in_reward.coef", 0.001, "kl_reward"),
    K("algorithm.kl_ctrl.type", "algo.kl_in_reward.adaptive", "fixed", "kl_ctrl"),
    K("algorithm.kl_ctrl.target_kl", "algo.kl_in_reward.target_kl", 0.1),
    K("algorithm.kl_ctrl.horizon", "algo.kl_in_reward.horizon", 10000),
    NO("algorithm.rollout_correction.*", "the rollout/trainer mismatch correction here is algo.tis_cap (truncated IS)",
       (None, False)),
    NO("algorithm.gdpo_reward_keys", "no GDPO estimator"),
    NO("algorithm.pf_ppo.*", "PF-PPO is algo.pf_ppo (its own keys)"),
    # the critic
    K("critic.enable", "use_critic", rule="critic"),
    K("critic.model.path", "critic.model"),
    K("critic.model.enable_gradient_checkpointing", "critic.gradient_checkpointing", True),
    K("critic.model.use_remove_padding", "critic.remove_padding", True),
    K("critic.optim.lr", "critic.optim.lr", 1e-5),
    K("critic.optim.weight_decay", "critic.optim.weight_decay", 0.01),
    K("critic.optim.clip_grad", "critic.optim.grad_clip", 1.0),
    K("critic.optim.lr_warmup_steps", "critic.optim.warmup_steps", -1, "warmup", "-1: none"),
    K("critic.ppo_mini_batch_size", "critic.ppo_mini_batch_size", rule="times_n",
      note="verl: prompts; ours: samples; absent: the actor's"),
    K("critic.ppo_micro_batch_size_per_gpu", "critic.micro_batch_size", rule="micro"),
    K("critic.use_dynamic_bsz", "critic.max_tokens_per_micro", rule="dynamic", note="absent: the actor's"),
    K("critic.ppo_max_token_len_per_gpu", "critic.max_tokens_per_micro", 32768, "dynamic"),
    K("critic.ppo_epochs", "critic.ppo_epochs", 1),
    K("critic.cliprange_value", "critic.cliprange_value", 0.5),
    K("critic.loss_agg_mode", "critic.loss_agg_mode", note="absent: the actor's"),
    K("critic.fsdp.param_offload", "critic.offload", False, "offload"),
    K("critic.fsdp.optimizer_offload", "critic.offload", False, "offload"),
    K("critic.strategy", "critic.strategy", "fsdp", "strategy"),
    NA("critic.fsdp.*", "FSDP2's sharding, prefetch and precision are set by the engine"),
    NA("critic.ppo_micro_batch_size", "deprecated in verl"),
    NO("critic.megatron.*", "the critic runs on FSDP2 or Megatron-core with critic.megatron.tp/pp"),
    # rewards
    K("custom_reward_function.path", "reward.path"),
    K("custom_reward_function.name", "reward.name", "compute_score"),
    K("reward.custom_reward_function.path", "reward.path"),
    K("reward.custom_reward_function.name", "reward.name", "compute_score"),
    K("reward.reward_model.enable", "use_reward_model", False),
    K("reward.reward_model.model_path", "reward_model.model"),
    K("reward_model.enable", "use_reward_model", False),
    K("reward_model.model.path", "reward_model.model"),
    NA("reward.num_workers", "algo.reward_workers sets the reward processes"),
    NA("reward.reward_manager.name", "naive: the default here (one reward call per sample)"),
    NA("reward_model.reward_manager", "naive: the default here (one reward call per sample)"),
    NO("reward.reward_kwargs.*", "DAPO's overlong penalty is the dapo recipe's (recipes/dapo)"),
    NO("reward_model.reward_kwargs.*", "DAPO's overlong penalty is the dapo recipe's (recipes/dapo)"),
    NO("reward.reward_model.rollout.*", "a reward model scores with the trainer's engine here"),
    NO("reward_model.*", "a reward model is reward_model.model on its pool"),
    NO("sandbox_fusion.*", "code runs in the sandbox of core.tools (tools.isolation)"),
    # the trainer
    K("trainer.total_epochs", "trainer.total_epochs", 30, "epochs"),
    K("trainer.total_training_steps", "trainer.total_steps", rule="epochs"),
    K("trainer.project_name", "trainer.project_name", "verl_examples"),
    K("trainer.experiment_name", "trainer.experiment_name", "gsm8k"),
    K("trainer.logger", "trainer.logger", ("console", "wandb"), "same", "console, wandb, swanlab, tensorboard"),
    K("trainer.nnodes", "placement.pools.main.nnodes", 1, "gpus"),
    K("trainer.n_gpus_per_node", "placement.pools.main.slots_per_node", 8, "gpus"),
    K("trainer.device", "placement.pools.main.device", "cuda", "gpus"),
    K("trainer.save_freq", "trainer.save_freq", -1, "freq"),
    K("trainer.test_freq", "trainer.test_freq", -1, "freq"),
    K("trainer.critic_warmup", "trainer.critic_warmup", 0),
    K("trainer.default_local_dir", "trainer.output_dir",
      "checkpoints/${trainer.project_name}/${trainer.experiment_name}", "output"),
    K("trainer.resume_mode", "trainer.resume_mode", "auto", "resume"),
    K("trainer.resume_from_path", "trainer.resume_mode", rule="resume"),
    K("trainer.max_actor_ckpt_to_keep", "trainer.save_keep", note="null: all (ours 0)"),
    K("trainer.log_val_generations", "trainer.log_val_generations", 0),
    NA("trainer.val_before_train", "the held-out set is scored before the first step whenever data.val_files is set"),
    NA("trainer.balance_batch", "every data-parallel rank gets the same number of samples"),
    NA("trainer.max_critic_ckpt_to_keep", "trainer.save_keep counts whole checkpoints"),
    NA("trainer.del_local_ckpt_after_load", "checkpoints stay"),
    NA("trainer.ray_wait_register_center_timeout", "trainer.call_timeout_s bounds every worker call"),
    NA("trainer.use_v1", "one trainer"),
    NA("trainer.use_legacy_worker_impl", "one worker implementation"),
    NA("trainer.v1.*", "one trainer: synchronous, or trainer.async.mode=one_step_off"),
    NA("trainer.profile_steps", "profiling: bench/"),
    NA("ray_kwargs.*", "Ray is started (or joined: trainer.ray_address) by the run"),
    NA("transfer_queue.*", "batches travel through Ray's object store"),
    NA("global_profiler.*", "profiling: bench/"),
    NA("model_engine", "actor.strategy (dp: fsdp)"),
    NO("actor@actor_rollout_ref.actor", "a Hydra config group choosing verl's engine: actor.strategy here"),
    NA("hydra.*", "Hydra's own settings"),
    NA("--config-path", "verl's config folder"),
    NA("--config-name", "verl's config file (ppo_megatron_trainer: actor.strategy megatron)"),
    NO("trainer.default_hdfs_dir", "checkpoints go to trainer.output_dir (a shared mount on several nodes)"),
    NO("trainer.val_only", "score a model with hybridrl eval"),
    NO("trainer.esi_redundant_time", "no elastic server instances"),
    NO("distillation.*", "no on-policy distillation"),
    NO("async_training.*", "one-step-off async is trainer.async.mode=one_step_off"),
    NO("rollout.*", "a rollout pool of its own is placement.pools and placement.roles.rollout"),
)

BY_KEY = {k.verl: k for k in TABLE if not k.verl.endswith(".*")}
PREFIXES = sorted((k for k in TABLE if k.verl.endswith(".*")), key=lambda k: -len(k.verl))


def lookup(key: str) -> Key | None:
    """The row of a verl key: its own, else the longest ``prefix.*`` row that holds it."""
    key = key.lstrip("+~")
    if key in BY_KEY:
        return BY_KEY[key]
    return next((k for k in PREFIXES if key.startswith(k.verl[:-1])), None)
