"""The embedded rollout engine: runs a transformers causal LM's own modules with a KV cache, batched.

``generate(prompt_ids, params)`` returns one ``Batch`` (vocabulary in ``core.protocol``) with, for each of the
``n`` samples of every prompt (interleaved: the n samples of a prompt are adjacent, sharing a ``uid``):

    prompts (B, Tp) left-padded | responses (B, Tr) right-padded | response_mask (B, Tr) | rollout_logprobs (B, Tr)
    input_ids, attention_mask, position_ids (B, Tp + Tr)

``rollout_logprobs`` are the sampled tokens' log-probs under ``logits / temperature`` (raw logits when greedy),
the same distribution the trainer recomputes, so the two can be compared token by token.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import torch

from core.config import SamplingParams
from core.rollout import attention
from core.kernels import cpu as cpu_kernels
from core.rollout import gpu_kernels
from core.rollout.decode_graphs import DecodeGraphs
from core.rollout.kv_cache import SlotKVCache
from core.rollout.packed import PackedLinears, can_pack
from core.rollout.batch import decode_responses
from core.rollout.run import Run
from core.rollout.sampling import filter_logits, sample_inverse_cdf, unnormalised_probs_
from core.data.vision_inputs import never_sampled
from core.models import chat_prompt_ids, keeps_logits
from core.protocol import Batch


def eos_ids_of(generation_config, tokenizer) -> list[int]:
    """The ids that end a sequence: the model's generation config's (one or a list) and the tokenizer's EOS."""
    ids = generation_config.eos_token_id if generation_config is not None else None
    ids = list(ids) if isinstance(ids, list) else [ids] if ids is not None else []
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return sorted(set(ids))


def replica_seed(rank: int, tensor_parallel_size: int, base: int = 0) -> int:
    """The sampling seed of the engine replica that holds ``rank``: equal across its tensor-parallel ranks (they
    must sample alike), distinct across replicas (one seed everywhere would draw the same uniforms on each)."""
    return base + 1_000_003 * (rank // tensor_parallel_size)


class RolloutEngine:
    """Generation with a transformers model in this process (colocated with the trainer or standalone)."""

    def __init__(self, model, tokenizer, max_batch_size: int = 64, decode_attention: bool = True,
                 share_prefix: bool = True, pack_weights: bool | None = None, decode_graphs: bool | None = None,
                 single_copy: bool = False, exact: bool = False):
        """``decode_attention``: switch the model to ``core.rollout.attention`` (batched matmuls for one-token
        decode steps, SDPA for everything else) -- the model object itself is switched, for every caller.
        ``share_prefix``: prefill the token prefix common to all prompts of a call once (a chat template's
        system prompt: 25 of the bench's 43 prompt tokens) and copy its KV into each slot.
        ``pack_weights``: run the linears on packed (and sibling-fused) weights, ``core.rollout.packed``; None =
        wherever it applies (``packed.can_pack``: bf16 on a CPU with native bf16, fp32 with AVX2 + FMA).
        ``decode_graphs``: decode steps at fixed shapes (``core.rollout.decode_graphs``), replayed as CUDA graphs
        on a GPU and run eagerly elsewhere (tests); None = on a GPU only.
        ``single_copy``: for an engine that owns its model -- each packed linear's weight is kept only in its packed
        rows (``PackedLinears.release_weights``: about half the weight memory, and a sync writes each weight once);
        ``weights`` still gives every weight's values.
        ``exact``: every linear on our packed kernel wherever it builds, even where oneDNN's is faster (bf16 on AVX2):
        the arithmetic the trainer's exact forward reproduces (``rollout.exact_logprobs``, ``core.train.exact``)."""
        self.model, self.tokenizer, self.max_batch_size = model.eval(), tokenizer, max_batch_size
        self.share_prefix = share_prefix
        if decode_attention:
            model.set_attn_implementation(attention.NAME)
        self.eos_ids = eos_ids_of(model.generation_config, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        self.cache: SlotKVCache | None = None
        self._fp32_logits: torch.Tensor | None = None
        self._keeps_logits = keeps_logits(model)
        # a vision-language model's image tokens are never drawn (their log-probs stay under the full distribution)
        banned = never_sampled(model)
        self.never_sample = torch.tensor(banned, device=self.device) if banned else None
        self.packed: PackedLinears | None = None
        use_graphs = self.device.type == "cuda" if decode_graphs is None else decode_graphs
        self.graphs = DecodeGraphs(self) if use_graphs else None
        # by name, walked once: walking the module tree takes ~2 ms, and a weight sync looks names up per bucket
        self.params = dict(model.named_parameters())
        if pack_weights or exact or (pack_weights is None and can_pack(model)):
            calibrate = lambda: model(input_ids=torch.tensor([[self.pad_id] * 2], device=self.device), use_cache=False)
            self.packed = PackedLinears(model, calibrate, rows_hint=max_batch_size, exact=exact)
        # bf16 or fp32 on CPU: norms, gated MLPs and rotary on fused kernels where they reproduce them (cpu_kernels)
        # on a GPU: norms as one kernel each (a graphed decode step there is bound by kernel count: gpu_kernels)
        self.fused = (cpu_kernels.install(model) if self.device.type == "cpu"
                      and self.dtype in cpu_kernels.KERNEL_DTYPES and cpu_kernels.available()
                      else gpu_kernels.install(model) if self.device.type == "cuda" else {})
        if single_copy and self.packed is not None:
            self.packed.release_weights()
            self.params = dict(model.named_parameters())

    @property
    def device(self) -> torch.device:
        return next(p for p in self.model.parameters() if not p.is_meta).device  # not a released weight

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    # ----------------------------------------------------------------------------------------- weights
    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copy full tensors into the engine's parameters by name (a bucket at a time), cast to the engine's
        dtype by the copy itself; returns the bytes written, in the engine's dtype."""
        params = self.params
        copied = 0
        for name, tensor in named_tensors:
            if name not in params:
                raise KeyError(f"rollout engine has no parameter {name!r}")
            if params[name].shape != tensor.shape:
                raise ValueError(f"weight {name}: engine shape {tuple(params[name].shape)} != sent {tuple(tensor.shape)}")
            # a packed linear's weight: cast into the parameter and packed in one pass (packed.PackedLinears.load)
            if self.packed is None or not self.packed.load(params[name], tensor):
                params[name].copy_(tensor)
                if self.packed is not None:  # a bias, or oneDNN's format: re-packed from the parameter
                    self.packed.refresh([params[name]])
            copied += params[name].numel() * params[name].element_size()
        return copied

    def finish_update(self) -> None:
        """The end of a weight sync: nothing waits here (each bucket is copied in as it comes)."""

    # ----------------------------------------------------------------------------------------- generation
    def decode(self, batch: Batch) -> list[str]:
        """Response texts of a generated batch (valid tokens only, special tokens dropped)."""
        return decode_responses(self.tokenizer, batch)

    def chat_prompt_ids(self, prompts: Sequence[list[dict]]) -> list[list[int]]:
        """Token ids of chat prompts with the generation prompt appended (the model's chat template)."""
        return chat_prompt_ids(self.tokenizer, prompts)

    def weight_names(self) -> list[str]:
        """The names ``update_weights`` takes: the model's parameters."""
        return list(self.params)

    def weight(self, name: str) -> torch.Tensor:
        """A weight's current values (a released linear's unpacked from its packed rows)."""
        p = self.params[name]
        return self.packed.weight(p) if self.packed is not None else p

    def weights(self) -> dict[str, torch.Tensor]:
        return {name: self.weight(name) for name in self.params}

    @torch.no_grad()
    def verify_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Raise if any of these tensors differs from the engine's copy (``rollout.debug_sync``)."""
        for name, full in named_tensors:
            mine = self.weight(name)
            if not torch.equal(mine, full.to(mine.dtype)):
                raise ValueError(f"checksum mismatch on {name} after copy")

    # ----------------------------------------------------------------------------------------- memory
    def sleep(self) -> int:
        """Free the KV cache (between rollouts, so the colocated trainer gets the memory); returns bytes freed.
        The next ``generate`` (or ``wake``) allocates it again. On CPU a worker keeps freed pages for its own reuse
        (``core.memory.keep_freed_memory``: the trainer in the same process takes them without page faults);
        ``core.memory.release_freed_memory`` hands them to the OS."""
        freed = self.cache.nbytes if self.cache is not None else 0
        if self.graphs is not None:
            self.graphs.drop()  # they hold the cache's memory
        self.cache = self._fp32_logits = None
        return freed

    def wake(self, max_len: int) -> int:
        """Allocate the KV cache for sequences of up to ``max_len`` tokens now; returns its bytes."""
        if self.graphs is not None:  # fixed shapes attend over the whole cache: keep its rows aligned for SDPA
            max_len = -(-max_len // 64) * 64
        if self.cache is None or self.cache.max_len < max_len:
            self.cache = None  # free the old one before allocating the new one
            if self.graphs is not None:
                self.graphs.drop()
            self.cache = SlotKVCache.for_model(self.model, self.max_batch_size, max_len)
        return self.cache.nbytes

    # ----------------------------------------------------------------------------------------- generation
    @torch.no_grad()
    def generate(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams,
                 vision: Sequence[dict] | None = None, seeds: Sequence[int] | None = None) -> Batch:
        """n samples of every prompt by continuous batching over ``max_batch_size`` slots of a preallocated KV
        cache. A prompt is admitted when n slots are free: it is prefilled once (with the other admitted prompts)
        and its KV copied to its n slots; a finished sequence frees its slot at once for the queue. ``vision``:
        each prompt's vision inputs (``core.data.vision_inputs``), given to its prefill; no prefix is shared
        then (equal image-token ids stand for different images). ``seeds``: each sample's (``token_uniforms``);
        default ``sequence_seeds(params.seed, samples)``."""
        prompts = [list(p) for p in prompt_ids]
        n, S = params.n, self.max_batch_size
        if n > S:
            raise ValueError(f"n={n} samples per prompt exceed the engine's max_batch_size={S} slots")
        if any(len(p) == 0 for p in prompts):
            raise ValueError(f"prompt {next(i for i, p in enumerate(prompts) if not p)} is empty")
        self.wake(max(map(len, prompts)) + params.max_new_tokens)
        run = Run(self, prompts, params, vision=vision, seeds=seeds)
        while run.queue or run.live:
            run.admit()
            run.decode_step()
        return run.result()

    @torch.no_grad()
    def session(self, prompts: Sequence[Sequence[int]], params: SamplingParams, max_len: int) -> "Run":
        """A generate call that takes new prompts while it runs (the agent loop's continuous batching across turns):
        ``add(ids, max_new_tokens, seed)`` queues one sequence (n = 1) with its own seed, ``step()`` admits
        what fits, decodes one token for every live slot and returns the sequences that finished. ``prompts``:
        the call's first prompts (every later one must extend one of them: their common prefix is prefilled once);
        ``max_len``: the longest sequence (prompt + response) the KV cache must hold."""
        if params.n != 1:
            raise ValueError(f"a session samples each added prompt once (n = 1), got n = {params.n}")
        self.wake(max_len)
        return Run(self, [list(p) for p in prompts], params, session=True)

    @torch.no_grad()
    def stream(self, params: SamplingParams, max_len: int) -> "Run":
        """A generation that runs across weight updates (``core.rollout.stream``): ``add_prompts(ids, seeds,
        max_new_tokens)`` queues a cohort of prompt groups (n samples each), ``step()`` admits and decodes one
        token; after ``update_weights`` the caller sets ``version`` and calls ``reprefill()``, and the in-flight
        sequences go on under the new weights. ``max_len``: the longest prompt + response."""
        self.wake(max_len)
        return Run(self, [], params)

    def last_logits(self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, **vision) -> torch.Tensor:
        """Last-position logits (B, V) in the model's dtype; the cache already knows where this forward writes.
        ``vision``: a prefill's collated vision inputs (pixel values for its image tokens)."""
        keep = {"logits_to_keep": 1} if self._keeps_logits else {}
        out = self.model(input_ids=ids, position_ids=pos, attention_mask=mask, past_key_values=self.cache,
                         use_cache=True, **keep, **vision)
        return out.logits[:, -1]

    def _fp32(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` copied into an fp32 buffer kept across steps: a fresh (64, 49,152) fp32 tensor per step
        measured 2.4 ms in page faults."""
        if self._fp32_logits is None or self._fp32_logits.shape[0] < len(logits):
            self._fp32_logits = torch.empty(max(len(logits), self.max_batch_size), logits.shape[-1],
                                            device=logits.device)
        return self._fp32_logits[:len(logits)].copy_(logits)

    def sample(self, logits: torch.Tensor, params: SamplingParams, u: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Next tokens (B,) and their log-probs under logits / temperature (raw logits when greedy); ``logits``
        (B, V) in the model's dtype, left unmodified; ``u`` (B,): each row's uniform (``sampling.token_uniforms``). Top-k / top-p restrict what is drawn, never the log-probs:
        those are under the full distribution, as the trainer recomputes them."""
        banned = self.never_sample
        if params.temperature <= 0:
            x = self._fp32(logits)
            tok = (x if banned is None else x.index_fill(-1, banned, float("-inf"))).argmax(-1)
            return tok, x.gather(-1, tok[:, None]).squeeze(-1) - x.logsumexp(-1)
        filtered = (0 < params.top_k < logits.shape[-1]) or params.top_p < 1.0 or banned is not None
        if not filtered and logits.device.type == "cpu" and cpu_kernels.available():
            # one fused pass per row over the logits as they are (no fp32 copy): max, exp-sum, inverse-CDF scan
            return cpu_kernels.sample_rows(logits, 1.0 / params.temperature, u)
        x = self._fp32(logits)
        x = x.div_(params.temperature) if params.temperature != 1.0 else x
        keep = filter_logits(x, params.top_k, params.top_p).isfinite() if filtered else None
        if banned is not None:
            keep[:, banned] = False
        weights, total = unnormalised_probs_(x)  # x is gone from here on
        tok = sample_inverse_cdf(weights if keep is None else weights * keep, u)
        if logits.device.type == "cpu" and cpu_kernels.available():
            # under the full distribution on the sampler kernel's arithmetic: what the trainer's exact forward gives
            return tok, torch.ops.hybridrl_cpu.token_logprobs(logits.contiguous(), 1.0 / params.temperature, tok)
        return tok, (weights.gather(-1, tok[:, None]).squeeze(-1) / total).log()
