"""Capacity planner: per-GPU and per-node memory of an RL run (FSDP2 or Megatron training + a rollout engine), before it
starts, one plan per resource pool (colocated roles: one pool; split placement: each pool counts its roles).
``hybridrl plan <recipe>`` (and every recipe's run script with ``--dry-run``) prints it for the resolved config and
exits non-zero when the run does not fit.

Every term is a formula of the model's shape and the run's settings (bytes; P = parameters, W = FSDP world
size, T = tokens per micro-batch, h = hidden size, i = MLP width, kvd = kv_heads x head_dim, L = layers,
V = vocabulary, t = rollout tensor parallel size, k = 1 for tied embeddings else 2). They describe *our*
implementation (core/train): a rank never holds the full fp32 model, even while loading (meta-device build,
then each rank reads its own rows: ``sharding.load_sharded_causal_lm``, the critic's value model too).

training phase, per GPU (``offload``: none | idle | full, ``core.config.OFFLOAD_MODES``)
    fp32 master weights        4P / W            (full: on the host)
    fp32 gradients             4P / W            (full: on the host: FSDP2 offloads them together)
    AdamW moments (fp32 m, v)  8P / W            (full: on the host)
    gathered bf16 layers       2 x 2 P_layer     (the layer being computed and the one prefetched; on one rank
                                                 without offload or checkpointing: a whole bf16 copy, 2P per
                                                 model, kept, in its place: ``core.train.one_rank``)
    embeddings + LM head       2 k V h + 2 V h   (the root module stays gathered in bf16 for forward and
                                                 backward, plus the LM head's bf16 gradient)
    activations                2 T h L           (checkpointed: each layer's bf16 input) + one layer recomputed
                                                 (T: a micro-batch's tokens / actor.ulysses_sp):
                               T (14 h + 4 kvd + 8 i) (bf16: 7 h-wide tensors -- norm in/out, q, attention out,
                               ... -- 2 kv-wide (k, v) and 4 i-wide (gate, up, act, product); flash attention: no
                               T^2 term). Without checkpointing: L times the layer term.
    vision encoder             (vision-language models) checkpointed: 2 Tv hv Lv + Tv (18 hv + 8 iv), else Lv times
    activations                the second term; Tv = patches of a micro-batch, at most m x its prompt tokens (m patches
                               per image token; every prompt token an image token: an upper bound). The tower's
                               parameters are in P (``core.model_shapes.vision_shape``)
    logits                     6 T V + 3 GiB     (bf16 logits, their bf16 gradient and its concatenation; fp32
                                                 normalisation in 2^28-value chunks: ``forward.normalised_logprobs``)
    reference policy           4P / W            (frozen fp32 shards, when the run has one; full: on the host;
                                                 LoRA: none, the actor with its adapters off)
    LoRA (actor.lora)          fp32 base + adapters 4(P + Pa)/W, gradients 4Pa/W and moments 8Pa/W of the
                               adapters only (Pa = r (in + out) per adapted linear: ``lora_params``)
    critic (use_critic)        4Pc/W + 4Pc/W + 8Pc/W  (its fp32 weights, gradients and moments, by critic.offload as
                               above) + its update's gathered layers, embeddings (4 V h) and activations where they
                               exceed the actor's (the updates take turns); kept during rollout with offload none
    teacher (distillation)     4Pt/W             (frozen fp32 shards of the teacher's model, by teacher.offload) + one
                               forward's gathered layers, activations and bf16 logits 2 T Vt beyond the actor's
                               transients
    implicit PRM (PRIME)       4P/W + 4P/W + 8P/W  (a trained copy of the policy, by implicit_prm.offload; one rank: +
                               2P bf16 copy); its update's transients are the actor's (same model; they take turns)
Megatron (actor.strategy megatron; G = tp x pp GPUs per model replica): fp32 weights, gradients and AdamW moments
    of 1/G of the model each (4 + 4 + 8) P / G, a bf16 autocast copy 2P / G, the reference 4P / G; activations with
    the TP split and pp micro-batches in flight; vocab-parallel logits; one layer gathered for the weight sync
    (``_megatron_policy_terms``)
rollout phase, per GPU
    the engine's share         gpu_memory_utilization x GPU memory (weights 2P / t, the rest its KV cache)
    what training keeps        offload none: the sharded states above (colocated: phases alternate); idle: none
                               (weights and moments parked on the host: 12P / W, + 4P / W of reference; gradients
                               are freed after each optimizer step); full: none
    embedded engine            weights 2P (no tensor parallelism), kept through the training phase too, + a KV
                               cache of max_batch_size slots x the longest sequence + fp32 logits (slots x V x 4),
                               freed after each rollout; vLLM / SGLang release the GPU while training (sleep;
                               weights kept in host memory)
KV cache per token             2 (K and V) x L x kvd x 2 bytes / t

Split placement (roles on several pools): each pool's plan counts its own roles -- a pool without the rollout has
no rollout phase, a rollout-only pool no training state, a critic alone counts its whole update, a reference alone
the actor's transient terms (an upper bound: it runs forward only).

Host memory per node: the offloaded (full) or parked (idle) states of its GPUs, plus the sleeping vLLM / SGLang
weights (2P / t per GPU). ``fits`` checks each phase against the GPU memory (minus a reserve for the CUDA context and
fragmentation) and the host total against the node's memory. Unit tests check the arithmetic by hand
(tests/test_planner.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from core.config import check_offload_mode
from core.model_shapes import ModelShape

GB = 1e9


@dataclass(frozen=True)
class RunShape:
    nnodes: int
    gpus_per_node: int
    gpu_memory_gb: float
    host_memory_gb: float = 1000.0
    # none | idle | full (core.config.OFFLOAD_MODES)
    offload: str = "none"
    gradient_checkpointing: bool = True
    # tokens of one micro-batch (the token budget with dynamic batching)
    tokens_per_micro: int = 16384
    rollout_tp: int = 1
    gpu_memory_utilization: float = 0.5
    # the longest sequence the rollout must hold (prompt + response), and its prompt part (0: all of it)
    max_seq_len: int = 4096
    max_prompt_len: int = 0
    # GB per GPU kept free for the CUDA context, NCCL buffers and fragmentation
    reserve_gb: float = 4.0
    # embedded (weights stay on the GPU through training, no TP), vllm or sglang (they sleep while training)
    rollout_backend: str = "vllm"
    # a frozen reference policy on the same GPUs
    reference: bool = False
    # embedded engine: sequences decoded together (rollout.max_batch_size): its KV cache has that many slots
    rollout_batch: int = 64
    # a value model (use_critic) on the same GPUs: its shape, offload mode, checkpointing and micro-batch tokens
    critic: ModelShape | None = None
    critic_offload: str = "none"
    critic_checkpointing: bool = True
    critic_tokens_per_micro: int = 16384
    # critic.strategy megatron: GPUs its model is split over (tp x pp; 0 = FSDP2 over the whole pool)
    critic_shards: int = 0
    # a reward model (use_reward_model) on the same GPUs: its shape, offload mode, tokens per forward
    reward_model: ModelShape | None = None
    rm_offload: str = "none"
    rm_tokens_per_micro: int = 8192
    # bytes per reward-model weight: its compute dtype (2: bf16, 4: float32)
    rm_dtype_bytes: int = 2
    # PRIME's implicit PRM (implicit_prm) on the same GPUs: a trained copy of the policy, its offload mode and
    # activation checkpointing
    prm: bool = False
    prm_offload: str = "none"
    prm_checkpointing: bool = True
    # on-policy distillation's teacher (teacher.model) on the same GPUs: its shape, offload mode, tokens per forward
    teacher: ModelShape | None = None
    teacher_offload: str = "none"
    teacher_tokens_per_micro: int = 16384
    # which other roles this pool holds (split placement: a plan per pool)
    actor: bool = True
    rollout: bool = True
    # vLLM / SGLang sleep after each generate (rollout.sleep_after_generate): their weights wait on the host
    rollout_sleeps: bool = True
    # LoRA (actor.lora): adapter rank (0 = full fine-tuning) and the adapted linears
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    # Ulysses sequence parallelism (actor.ulysses_sp): a micro-batch's tokens are spread over this many GPUs
    ulysses_sp: int = 1
    # the policy's training engine (actor.strategy): fsdp, or megatron with its tensor / pipeline / expert layout
    strategy: str = "fsdp"
    tp: int = 1
    pp: int = 1
    ep: int = 1

    @property
    def engine_tp(self) -> int:
        """GPUs per rollout replica: the embedded engine has no tensor parallelism."""
        return 1 if self.rollout_backend == "embedded" else self.rollout_tp


@dataclass
class Plan:
    lines: list[tuple[str, float, str]] = field(default_factory=list)   # (item, bytes per GPU, phase / note)
    problems: list[str] = field(default_factory=list)
    # what would make a plan that does not fit fit (printed after the problems)
    hints: list[str] = field(default_factory=list)
    kv_tokens: float = 0.0
    host_per_node: float = 0.0

    @property
    def fits(self) -> bool:
        return not self.problems

    def total(self, phase: str) -> float:
        return sum(b for _, b, p in self.lines if p == phase)

    def text(self, verdict: bool = True) -> str:
        out = [f"  {item:<50} {b / GB:9.2f} GB   {phase}" for item, b, phase in self.lines]
        if self.total("train"):  # a rollout-only pool (split placement) has no training phase
            out.append(f"  {'training phase total':<50} {self.total('train') / GB:9.2f} GB")
        if self.total("rollout"):  # a pool without the rollout (split placement) has no rollout phase
            out.append(f"  {'rollout phase total':<50} {self.total('rollout') / GB:9.2f} GB")
        out.append(f"  {'host memory per node':<50} {self.host_per_node / GB:9.2f} GB")
        if self.kv_tokens:
            out.append(f"  {'KV cache holds':<50} {self.kv_tokens:9.0f} tokens per rollout replica")
        if verdict:
            out.append("fits" if self.fits else "DOES NOT FIT:\n" + "\n".join(f"  - {p}" for p in self.problems))
            out.extend(f"  hint: {h}" for h in self.hints if not self.fits)
        return "\n".join(out)


# fp32 work of one chunk of the log-prob normalisation (core.train.forward.CHUNK_VALUES = 2^28 values): the
# fp32 copy, the exp and the softmax gradient
CHUNK_WORK = 3 * (1 << 28) * 4


def plan(m: ModelShape, r: RunShape) -> Plan:
    """The per-GPU memory of one pool, for the roles ``r`` puts on it (colocated: all of them; split placement:
    one plan per pool). ``m`` is the policy's shape (actor, reference, rollout); the critic's is ``r.critic``."""
    check_offload_mode(r.offload, "actor")
    p = Plan()
    W = r.nnodes * r.gpus_per_node
    host, parked, resident = _policy_terms(m, r, W, p)
    if r.critic is not None:
        host, parked, resident = (a + b for a, b in zip((host, parked, resident), _critic_terms(r, W, p)))
    if r.reward_model is not None:
        host, parked, resident = (a + b for a, b in zip((host, parked, resident), _reward_model_terms(r, W, p)))
    if r.prm:
        host, parked, resident = (a + b for a, b in zip((host, parked, resident), _prm_terms(m, r, W, p)))
    if r.teacher is not None:
        host, parked, resident = (a + b for a, b in zip((host, parked, resident), _teacher_terms(r, W, p)))
    weights = _rollout_terms(m, r, resident, p) if r.rollout else 0.0
    gpu = r.gpu_memory_gb * GB
    limit = gpu - r.reserve_gb * GB
    for phase in ("train", "rollout"):
        if p.total(phase) > limit:
            p.problems.append(f"{phase} phase needs {p.total(phase) / GB:.1f} GB per GPU, more than the "
                              f"{limit / GB:.1f} GB available ({r.gpu_memory_gb:g} GB - {r.reserve_gb:g} GB reserve)")
    state = host + parked
    kind = "parked while idle" if r.offload == "idle" else "offloaded"
    p.lines.append((f"({kind} training state, host, per GPU)", state, "host"))
    asleep = weights if r.rollout and r.rollout_backend != "embedded" and r.rollout_sleeps else 0.0
    p.lines.append(("(sleeping engine weights, host, per GPU)", asleep, "host"))
    node = (state + asleep) * r.gpus_per_node
    p.host_per_node = node
    if node > r.host_memory_gb * GB:
        p.problems.append(f"host memory: {node / GB:.0f} GB per node ({r.gpus_per_node} GPUs x ({state / GB:.1f} GB "
                          f"{kind} training state + {asleep / GB:.1f} GB sleeping engine weights)) exceeds the "
                          f"node's {r.host_memory_gb:g} GB")
    if not p.fits and r.offload != "full" and (r.actor or r.reference) and r.strategy == "fsdp":
        full = plan(m, replace(r, offload="full"))
        p.hints.append(f"with offload=full (every shard on the host, the optimizer stepping on the CPU: slower) "
                       f"the plan needs {full.total('train') / GB:.1f} GB per GPU training, "
                       f"{full.total('rollout') / GB:.1f} GB rollout, {full.host_per_node / GB:.0f} GB host per node"
                       f": {'it fits' if full.fits else 'it does not fit either'}")
    return p


def _policy_terms(m: ModelShape, r: RunShape, W: int, p: Plan) -> tuple[float, float, float]:
    """The actor's and the reference's lines; returns bytes per GPU (on the host for good, parked while idle,
    kept on the GPU through the rollout)."""
    if r.strategy == "megatron":
        return _megatron_policy_terms(m, r, W, p)
    sharded = {"fp32 master weights (4P/W)": 4 * m.params / W, "fp32 gradients (4P/W)": 4 * m.params / W,
               "AdamW moments (8P/W)": 8 * m.params / W} if r.actor else {}
    if r.lora_rank and r.actor:  # frozen base, trainable adapters; the reference is the actor with them off
        Pa = lora_params(m, r.lora_rank, r.lora_targets)
        sharded = {"fp32 weights, base + adapters ((P + Pa)/W x 4)": 4 * (m.params + Pa) / W,
                   "fp32 gradients, adapters only (4Pa/W)": 4 * Pa / W, "AdamW moments, adapters (8Pa/W)": 8 * Pa / W}
    elif r.reference:
        sharded["reference fp32 shards (4P/W)"] = 4 * m.params / W
    host, parked, resident = _place_states(sharded, r.offload, p)
    copies = 0.0
    if r.actor or r.reference:  # a reference alone on its pool: the same terms, an upper bound (forward only)
        if one_rank(W, r.offload, r.gradient_checkpointing):
            copies = 2 * m.params * (int(r.actor) + int(r.reference and not r.lora_rank))
            p.lines.append(("bf16 compute copies, one rank (2P per policy model)", copies, "train"))
            p.lines.append(("LM head bf16 gradient (2Vh)", 2 * m.vocab * m.hidden, "train"))
        else:
            p.lines.append(("gathered bf16 layers (2 x 2 P_layer)", 4 * m.layer_params, "train"))
            k = 1 if m.tied else 2
            p.lines.append(("embeddings + LM head, bf16 + grad (2kVh + 2Vh)", (2 * k + 2) * m.vocab * m.hidden,
                            "train"))
        T = r.tokens_per_micro / r.ulysses_sp  # Ulysses: each GPU of a group holds 1/N of the positions
        layer = T * (14 * m.hidden + 4 * m.kv_heads * m.head_dim + 8 * m.intermediate)
        act = (2 * T * m.hidden * m.layers + layer) if r.gradient_checkpointing else layer * m.layers
        p.lines.append(("activations" + (" (checkpointed)" if r.gradient_checkpointing else ""), act, "train"))
        if m.vision_params:
            Tv = m.vision_merge * T * (r.max_prompt_len or r.max_seq_len) / r.max_seq_len
            v_layer = Tv * (18 * m.vision_hidden + 8 * m.vision_intermediate)
            v_act = (2 * Tv * m.vision_hidden * m.vision_layers + v_layer if r.gradient_checkpointing
                     else v_layer * m.vision_layers)
            p.lines.append(("vision encoder activations" + (" (checkpointed)" if r.gradient_checkpointing else ""),
                            v_act, "train"))
        p.lines.append(("logits (6 T V + chunk work)", 6 * T * m.vocab + CHUNK_WORK, "train"))
    return host, parked, resident + (copies if r.offload == "none" else 0.0)


def _megatron_policy_terms(m: ModelShape, r: RunShape, W: int, p: Plan) -> tuple[float, float, float]:
    """The actor's and the reference's lines on Megatron-core (``core.train.megatron_actor``): each rank holds
    1/G of the model, G = tp x pp (an MoE model's experts also split over ep), in fp32 with fp32 gradients and a
    plain AdamW (moments not sharded over DP: no distributed optimizer), on the host between calls with offload
    idle; autocast keeps a bf16 copy of the weights it casts during a forward. Activations: the h-wide
    residual-stream tensors (4 of the 7) stay whole on a TP rank, q, attention out, k, v and the MLP's i-wide
    tensors are split over TP; a pipeline's first stage holds pp micro-batches in flight (1F1B), each of L / pp
    layers. Logits: the last stage's, each TP rank its vocabulary slice (``megatron_actor.vocab_parallel_logprobs``)."""
    if r.offload == "full":
        p.problems.append("actor.offload=full is FSDP2's; the Megatron actor offers none or idle")
    G = r.tp * r.pp
    if W % G:
        p.problems.append(f"Megatron tp {r.tp} x pp {r.pp} = {G} GPUs per model replica does not divide the pool's {W}")
    expert = (m.params - m.active_params) * m.experts / (m.experts - m.experts_per_token) if m.experts else 0.0
    share = (m.params - expert) / G + expert / (G * r.ep)        # parameters one rank holds
    states = {"fp32 master weights (4P/G)": 4 * share, "fp32 gradients (4P/G)": 4 * share,
              "AdamW moments (8P/G, not sharded over DP)": 8 * share} if r.actor else {}
    if r.reference:
        states["reference fp32 weights (4P/G)"] = 4 * share
    parked = 0.0
    for item, b in states.items():
        p.lines.append((item, b, "train"))
        if r.offload == "idle" and not item.startswith("fp32 gradients"):
            parked += b   # on the host between calls (sharding.IdleOffload); gradients are freed after each step
    if not (r.actor or r.reference):
        return 0.0, parked, 0.0
    T, Ls, h = r.tokens_per_micro, m.layers / r.pp, m.hidden
    p.lines.append(("bf16 autocast weight copies (2P/G)", 2 * share, "train"))
    layer = T * (8 * h + (6 * h + 4 * m.kv_heads * m.head_dim + 8 * m.intermediate) / r.tp)
    act = (r.pp * 2 * T * h * Ls + layer) if r.gradient_checkpointing else r.pp * layer * Ls
    p.lines.append((f"activations, {r.pp} micro-batch(es) in flight" + (" (recomputed)" if r.gradient_checkpointing
                                                                        else ""), act, "train"))
    # the output layer's bf16 slice and its gradient, the fp32 scaled copy, exp and their gradients (4 x 4 bytes)
    p.lines.append(("vocab-parallel logits (16 T V / tp)", 16 * T * m.vocab / r.tp, "train"))
    p.lines.append(("weight sync: one layer gathered in fp32, HF layout (8 P_layer)", 8 * m.layer_params, "train"))
    return 0.0, parked, sum(states.values()) if r.offload == "none" else 0.0


def lora_params(m: ModelShape, rank: int, targets: tuple[str, ...]) -> float:
    """Adapter parameters: r (in + out) per adapted linear per layer. Example, h 896, kv 128, i 4864, 24 layers, r 32,
    all seven targets: 32 x (9 x 896 + 2 x 128 + 3 x 4864) x 24 = 17.6M."""
    h, qd, kvd, i = m.hidden, m.heads * m.head_dim, m.kv_heads * m.head_dim, m.intermediate
    sizes = {"q_proj": (h, qd), "k_proj": (h, kvd), "v_proj": (h, kvd), "o_proj": (qd, h), "gate_proj": (h, i),
             "up_proj": (h, i), "down_proj": (i, h)}
    return float(rank * m.layers * sum(sum(sizes[t]) for t in targets if t in sizes))


def one_rank(W: int, offload: str, checkpointing: bool) -> bool:
    """No FSDP2 on one rank without offload or checkpointing (``sharding.unsharded``): each model keeps a bf16 copy
    of all its weights (``core.train.one_rank``) instead of gathering layers one at a time."""
    return W == 1 and offload == "none" and not checkpointing


def _critic_terms(r: RunShape, W: int, p: Plan) -> tuple[float, float, float]:
    """The critic's lines (FSDP2 like the actor, or Megatron split over ``critic_shards`` GPUs with unsharded AdamW
    moments; its update runs after the actor's, never beside it)."""
    c = r.critic
    check_offload_mode(r.critic_offload, "critic")
    W, g = (r.critic_shards, "G") if r.critic_shards else (W, "W")
    host, parked, resident = _trained_states("critic", f"Pc/{g}", c.params / W, r.critic_offload, p)
    Tc = r.critic_tokens_per_micro
    c_layer = Tc * (14 * c.hidden + 4 * c.kv_heads * c.head_dim + 8 * c.intermediate)
    c_act = (2 * Tc * c.hidden * c.layers + c_layer) if r.critic_checkpointing else c_layer * c.layers
    # gathered layers, embeddings (no LM head: a 1-wide value head) and activations of the critic's update,
    # counted where they exceed the actor's on this pool (the two updates take turns)
    c_transient = 4 * c.layer_params + 4 * c.vocab * c.hidden + c_act
    if one_rank(W, r.critic_offload, r.critic_checkpointing):
        p.lines.append(("critic bf16 compute copy, one rank (2Pc)", 2 * c.params, "train"))
        resident += 2 * c.params
        c_transient = c_act
    a_transient = sum(b for item, b, ph in p.lines if ph == "train" and item.startswith(
        ("gathered bf16", "embeddings + LM head", "activations", "logits")))
    p.lines.append(("critic update, beyond the actor's transient terms" if a_transient else
                    "critic update (layers, embeddings, activations)", max(0.0, c_transient - a_transient),
                    "train"))
    return host, parked, resident


def _place_states(items: dict[str, float], offload: str, p: Plan) -> tuple[float, float, float]:
    """Sharded training states (line -> bytes per GPU) placed by an FSDP2 offload mode: full on the host for good,
    idle parked on the host between calls (gradients are freed after each step: nothing of them to park), none on
    the GPU throughout. Adds the lines; returns (host, parked, resident) bytes."""
    host = parked = resident = 0.0
    for item, b in items.items():
        if offload == "full":
            host += b
            continue
        p.lines.append((item, b, "train"))
        if offload == "none":
            resident += b
        elif "gradients" not in item:
            parked += b
    return host, parked, resident


def _trained_states(role: str, unit: str, params: float, offload: str, p: Plan) -> tuple[float, float, float]:
    """A trained model's fp32 weights, gradients and AdamW moments (4 + 4 + 8 bytes per parameter of the share
    ``params``), placed by its offload mode (``_place_states``)."""
    return _place_states({f"{role} fp32 master weights (4{unit})": 4 * params,
                          f"{role} fp32 gradients (4{unit})": 4 * params,
                          f"{role} AdamW moments (8{unit})": 8 * params}, offload, p)


def _prm_terms(m: ModelShape, r: RunShape, W: int, p: Plan) -> tuple[float, float, float]:
    """The implicit PRM's lines (PRIME; a copy of the policy, FSDP2): its trained states by implicit_prm.offload and,
    on one rank, its bf16 copy. Its update's gathered layers, logits and activations are the actor's terms (the
    same model and engine; the two updates take turns), counted once with the actor's on its pool."""
    check_offload_mode(r.prm_offload, "implicit_prm")
    host, parked, resident = _trained_states("implicit PRM", "P/W", m.params / W, r.prm_offload, p)
    if one_rank(W, r.prm_offload, r.prm_checkpointing):
        p.lines.append(("implicit PRM bf16 compute copy, one rank (2P)", 2 * m.params, "train"))
        resident += 2 * m.params
    return host, parked, resident


def _reward_model_terms(r: RunShape, W: int, p: Plan) -> tuple[float, float, float]:
    """The reward model's lines: shards in its compute dtype (no fp32 master: it is never trained in a run)."""
    check_offload_mode(r.rm_offload, "reward_model")
    return _frozen_terms("reward model", "Prm", r.reward_model, r.rm_offload, r.rm_tokens_per_micro,
                         r.rm_dtype_bytes, r.rm_dtype_bytes, 0, W, p, gathers=not one_rank(W, r.rm_offload, False),
                         bf16_copy=False)


def _teacher_terms(r: RunShape, W: int, p: Plan) -> tuple[float, float, float]:
    """The distillation teacher's lines: frozen fp32 shards (as the reference's), kept whole in bf16 on one rank
    without offload or checkpointing (the actor's: the teacher's engine settings are the actor's), and one forward in
    bf16, its log-probs over its own vocabulary included (bf16 logits of a micro-batch)."""
    check_offload_mode(r.teacher_offload, "teacher")
    unwrapped = one_rank(W, r.teacher_offload, r.gradient_checkpointing)
    return _frozen_terms("teacher", "Pt", r.teacher, r.teacher_offload, r.teacher_tokens_per_micro, 4, 2,
                         2 * r.teacher_tokens_per_micro * r.teacher.vocab, W, p, gathers=not unwrapped,
                         bf16_copy=unwrapped)


def _frozen_terms(name: str, short: str, m: ModelShape, offload: str, T: int, shard_bytes: int, nbytes: int,
                  logits: float, W: int, p: Plan, gathers: bool, bf16_copy: bool) -> tuple[float, float, float]:
    """A frozen model's lines (reward model, teacher): its shards by its offload mode (``bf16_copy``: plus a whole
    bf16 copy, a one-rank fp32 model's ``core.train.one_rank``), and one forward's layers FSDP2 gathers (two and
    the embeddings, when ``gathers``), activations (and ``logits``), counted where they exceed the actor's
    transient terms (its forward comes between the rollout and the training passes, never beside them)."""
    shards = shard_bytes * m.params / W
    host = parked = resident = 0.0
    if offload == "full":
        host = shards
    else:
        p.lines.append((f"{name} shards ({shard_bytes}{short}/W)", shards, "train"))
        parked, resident = (shards, 0.0) if offload == "idle" else (0.0, shards)
    if bf16_copy:
        p.lines.append((f"{name} bf16 compute copy, one rank (2{short})", 2 * m.params, "train"))
        resident += 2 * m.params
    act = (T * (14 * m.hidden + 4 * m.kv_heads * m.head_dim + 8 * m.intermediate) + 2 * T * m.hidden) * nbytes // 2
    gathered = nbytes * (2 * m.layer_params + m.vocab * m.hidden) if gathers else 0.0
    transient = gathered + act + logits
    a_transient = sum(b for item, b, ph in p.lines if ph == "train" and item.startswith(
        ("gathered bf16", "embeddings + LM head", "activations", "logits", "critic update")))
    p.lines.append((f"{name} forward, beyond the training transients" if a_transient else
                    f"{name} forward (layers, embeddings, activations)", max(0.0, transient - a_transient), "train"))
    return host, parked, resident


def _rollout_terms(m: ModelShape, r: RunShape, resident: float, p: Plan) -> float:
    """The rollout engine's lines and problems; returns its weights per GPU."""
    embedded, tp, gpu = r.rollout_backend == "embedded", r.engine_tp, r.gpu_memory_gb * GB
    weights = 2 * m.params / tp
    if embedded and (r.actor or r.reference or r.critic is not None):
        p.lines.append(("embedded engine weights (2P, kept)", weights, "train"))
    kv_per_token = 2 * m.layers * m.kv_heads * m.head_dim * 2 / tp
    if embedded:
        p.kv_tokens = float(r.rollout_batch * r.max_seq_len)
        engine = weights + p.kv_tokens * kv_per_token + r.rollout_batch * m.vocab * 4
        p.lines.append((f"embedded engine: weights + KV {r.rollout_batch} x {r.max_seq_len} + logits", engine, "rollout"))
    else:
        engine = r.gpu_memory_utilization * gpu
        p.lines.append((f"rollout engine ({r.gpu_memory_utilization:g} x GPU; weights 2P/{tp})", engine, "rollout"))
        p.kv_tokens = max(0.0, engine - weights - 0.05 * gpu) / kv_per_token  # 5% of the GPU: engine activations
    if resident:
        p.lines.append(("training state kept during rollout", resident, "rollout"))
    if not embedded and weights > engine:
        p.problems.append(f"rollout weights {weights / GB:.1f} GB per GPU (TP {tp}) exceed the engine's "
                          f"{engine / GB:.1f} GB (gpu_memory_utilization {r.gpu_memory_utilization})")
    elif p.kv_tokens < r.max_seq_len:
        p.problems.append(f"the KV cache holds {p.kv_tokens:.0f} tokens, less than one {r.max_seq_len}-token sequence")
    return weights
