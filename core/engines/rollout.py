"""The embedded rollout engine: runs a transformers causal LM's own modules with a KV cache, batched.

``generate(prompt_ids, params)`` returns one ``Batch`` (vocabulary in ``core.protocol``) with, for each of the
``n`` samples of every prompt (interleaved: the n samples of a prompt are adjacent, sharing a ``uid``):

    prompts (B, Tp) left-padded | responses (B, Tr) right-padded | response_mask (B, Tr) | rollout_logprobs (B, Tr)
    input_ids, attention_mask, position_ids (B, Tp + Tr)

``rollout_logprobs`` are the sampled tokens' log-probs under ``logits / temperature`` (raw logits when greedy),
the same distribution the trainer recomputes, so the two can be compared token by token.
"""

from __future__ import annotations

from collections import deque
from typing import Iterable, Sequence

import torch

from core.config import SamplingParams
from core.engines import attention, cpu_kernels, gpu_kernels
from core.engines.decode_graphs import DecodeGraphs
from core.engines.forward import keeps_logits
from core.engines.kv_cache import SlotKVCache
from core.engines.packed import PackedLinears, can_pack
from core.engines.rollout_batch import assemble, chat_prompt_ids, decode_responses
from core.engines.sampling import RowGenerators, filter_logits, sample_inverse_cdf, uniforms, unnormalised_probs_
from core.engines.vision_inputs import collate, mrope_positions, never_sampled
from core.protocol import Batch


def replica_seed(rank: int, tensor_parallel_size: int, base: int = 0) -> int:
    """The sampling seed of the engine replica that holds ``rank``: equal across its tensor-parallel ranks (they
    must sample alike), distinct across replicas (one seed everywhere would draw the same uniforms on each)."""
    return base + 1_000_003 * (rank // tensor_parallel_size)


class RolloutEngine:
    """Generation with a transformers model in this process (colocated with the trainer or standalone)."""

    def __init__(self, model, tokenizer, max_batch_size: int = 64, decode_attention: bool = True,
                 share_prefix: bool = True, pack_weights: bool | None = None, decode_graphs: bool | None = None,
                 single_copy: bool = False):
        """``decode_attention``: switch the model to ``core.engines.attention`` (batched matmuls for one-token
        decode steps, SDPA for everything else) -- the model object itself is switched, for every caller.
        ``share_prefix``: prefill the token prefix common to all prompts of a call once (a chat template's
        system prompt: 25 of the bench's 43 prompt tokens) and copy its KV into each slot.
        ``pack_weights``: run the linears on packed (and sibling-fused) weights, ``core.engines.packed``; None =
        wherever it applies (``packed.can_pack``: bf16 on a CPU with native bf16, fp32 with AVX2 + FMA).
        ``decode_graphs``: decode steps at fixed shapes (``core.engines.decode_graphs``), replayed as CUDA graphs
        on a GPU and run eagerly elsewhere (tests); None = on a GPU only.
        ``single_copy``: for an engine that owns its model -- each packed linear's weight is kept only in its packed
        rows (``PackedLinears.release_weights``: about half the weight memory, and a sync writes each weight once);
        ``weights`` still gives every weight's values."""
        self.model, self.tokenizer, self.max_batch_size = model.eval(), tokenizer, max_batch_size
        self.share_prefix = share_prefix
        if decode_attention:
            model.set_attn_implementation(attention.NAME)
        self.eos_ids = self._eos_ids()
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
        if pack_weights or (pack_weights is None and can_pack(model)):
            calibrate = lambda: model(input_ids=torch.tensor([[self.pad_id] * 2], device=self.device), use_cache=False)
            self.packed = PackedLinears(model, calibrate, rows_hint=max_batch_size)
        # bf16 or fp32 on CPU: norms, gated MLPs and rotary on fused kernels where they reproduce them (cpu_kernels)
        # on a GPU: norms as one kernel each (a graphed decode step there is bound by kernel count: gpu_kernels)
        self.fused = (cpu_kernels.install(model) if self.device.type == "cpu"
                      and self.dtype in cpu_kernels.KERNEL_DTYPES and cpu_kernels.available()
                      else gpu_kernels.install(model) if self.device.type == "cuda" else {})
        if single_copy and self.packed is not None:
            self.packed.release_weights()
            self.params = dict(model.named_parameters())

    def _eos_ids(self) -> list[int]:
        ids = self.model.generation_config.eos_token_id if self.model.generation_config else None
        ids = ids if isinstance(ids, list) else [ids] if ids is not None else []
        if self.tokenizer.eos_token_id is not None:
            ids.append(self.tokenizer.eos_token_id)
        return sorted(set(ids))

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

    def weights(self) -> dict[str, torch.Tensor]:
        """Every weight's current values by name (a released linear's unpacked from its packed rows)."""
        return {name: self.packed.weight(p) if self.packed is not None else p for name, p in self.params.items()}

    @torch.no_grad()
    def verify_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Raise if any of these tensors differs from the engine's copy (``rollout.debug_sync``)."""
        params = self.params
        for name, full in named_tensors:
            mine = self.packed.weight(params[name]) if self.packed is not None else params[name]
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
                 vision: Sequence[dict] | None = None) -> Batch:
        """n samples of every prompt by continuous batching over ``max_batch_size`` slots of a preallocated KV
        cache. A prompt is admitted when n slots are free: it is prefilled once (with the other admitted prompts)
        and its KV copied to its n slots; a finished sequence frees its slot at once for the queue. ``vision``:
        each prompt's vision inputs (``core.engines.vision_inputs``), given to its prefill; no prefix is shared
        then (equal image-token ids stand for different images)."""
        prompts = [list(p) for p in prompt_ids]
        n, S = params.n, self.max_batch_size
        if n > S:
            raise ValueError(f"n={n} samples per prompt exceed the engine's max_batch_size={S} slots")
        if any(len(p) == 0 for p in prompts):
            raise ValueError(f"prompt {next(i for i, p in enumerate(prompts) if not p)} is empty")
        self.wake(max(map(len, prompts)) + params.max_new_tokens)
        run = _Run(self, prompts, params, vision=vision)
        while run.queue or run.live:
            run.admit()
            run.decode_step()
        return run.result()

    @torch.no_grad()
    def session(self, prompts: Sequence[Sequence[int]], params: SamplingParams, max_len: int) -> "_Run":
        """A generate call that takes new prompts while it runs (the agent loop's continuous batching across turns):
        ``add(ids, max_new_tokens, seed)`` queues one sequence (n = 1) with its own generator, ``step()`` admits
        what fits, decodes one token for every live slot and returns the sequences that finished. ``prompts``:
        the call's first prompts (every later one must extend one of them: their common prefix is prefilled once);
        ``max_len``: the longest sequence (prompt + response) the KV cache must hold."""
        if params.n != 1:
            raise ValueError(f"a session samples each added prompt once (n = 1), got n = {params.n}")
        self.wake(max_len)
        return _Run(self, [list(p) for p in prompts], params, session=True)

    def _forward(self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, **vision) -> torch.Tensor:
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

    def _sample(self, logits: torch.Tensor, params: SamplingParams, gen: torch.Generator
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Next tokens (B,) and their log-probs under logits / temperature (raw logits when greedy); ``logits``
        (B, V) in the model's dtype, left unmodified. Top-k / top-p restrict what is drawn, never the log-probs:
        those are under the full distribution, as the trainer recomputes them."""
        banned = self.never_sample
        if params.temperature <= 0:
            x = self._fp32(logits)
            tok = (x if banned is None else x.index_fill(-1, banned, float("-inf"))).argmax(-1)
            return tok, x.gather(-1, tok[:, None]).squeeze(-1) - x.logsumexp(-1)
        filtered = (0 < params.top_k < logits.shape[-1]) or params.top_p < 1.0 or banned is not None
        if not filtered and logits.device.type == "cpu" and cpu_kernels.available():
            # one fused pass per row over the logits as they are (no fp32 copy): max, exp-sum, inverse-CDF scan
            u = uniforms(gen, len(logits))
            return cpu_kernels.sample_rows(logits, 1.0 / params.temperature, u)
        x = self._fp32(logits)
        x = x.div_(params.temperature) if params.temperature != 1.0 else x
        keep = filter_logits(x, params.top_k, params.top_p).isfinite() if filtered else None
        if banned is not None:
            keep[:, banned] = False
        weights, total = unnormalised_probs_(x)  # x is gone from here on
        tok = sample_inverse_cdf(weights if keep is None else weights * keep, gen)
        return tok, (weights.gather(-1, tok[:, None]).squeeze(-1) / total).log()


class _Run:
    """The state of one ``generate`` call (or ``session``): a queue of prompts and per-slot sequences; live slots
    are [0, live). In a session the queue starts empty and each added sequence draws from its own generator."""

    def __init__(self, engine: RolloutEngine, prompts: list[list[int]], params: SamplingParams, session: bool = False,
                 vision: Sequence[dict] | None = None):
        self.e, self.p, self.vision = engine, params, vision
        # columns [0, P) of every slot; none with images (the same image-token ids stand for different images)
        self.P = shared_prefix_length(prompts) if engine.share_prefix and not vision else 0
        self.prefix = prompts[0][:self.P] if prompts else []
        self.prompts = [] if session else prompts
        self.queue = deque(range(len(self.prompts)))
        self.gen: torch.Generator | RowGenerators = (RowGenerators() if session
                                                     else torch.Generator().manual_seed(params.seed))
        self.seq_gens: list[torch.Generator] = []                   # a session's generator of each sequence
        self.finished: list[int] = []                               # a session's sequences finished this step
        S, dev = engine.max_batch_size, engine.device
        self.live = 0
        self.sample = [-1] * S                                       # output row of each slot
        self.start = torch.zeros(S, dtype=torch.long, device=dev)   # first real prompt position in the slot
        self.pos = torch.zeros(S, dtype=torch.long, device=dev)     # where the slot's next token is written
        self.delta = torch.zeros(S, dtype=torch.long, device=dev)   # M-RoPE: text position - token index
        self.last = torch.zeros(S, dtype=torch.long, device=dev)    # the slot's last sampled token
        self.tokens: list[list[int]] = [[] for _ in range(len(self.prompts) * params.n)]
        self.logps: list[list[float]] = [[] for _ in range(len(self.prompts) * params.n)]
        self.max_new = [params.max_new_tokens] * len(self.tokens)    # per sequence
        self.eos = set() if params.ignore_eos else set(engine.eos_ids)
        self.prefix_kv: list | None = None

    def add(self, ids: list[int], max_new_tokens: int, seed: int) -> int:
        """Queue one more sequence in a session; returns its index (``step`` reports it when it finishes)."""
        if list(ids[:self.P]) != self.prefix or len(ids) <= self.P:
            raise ValueError(f"a session's prompt must extend the {self.P}-token prefix of its first prompts")
        if max_new_tokens < 1 or len(ids) + max_new_tokens > self.e.cache.max_len:
            raise ValueError(f"{len(ids)} prompt + {max_new_tokens} new tokens do not fit the session's "
                             f"{self.e.cache.max_len} (or no new token asked)")
        i = len(self.prompts)
        self.prompts.append(list(ids))
        self.tokens.append([])
        self.logps.append([])
        self.max_new.append(max_new_tokens)
        self.seq_gens.append(torch.Generator().manual_seed(seed))
        self.queue.append(i)
        return i

    @torch.no_grad()
    def step(self) -> list[int]:
        """A session's step: admit what fits, one token for every live slot; the sequences that finished."""
        self.admit()
        self.decode_step()
        done, self.finished = self.finished, []
        return done

    def _draw_for(self, slots: range) -> None:
        if isinstance(self.gen, RowGenerators):  # each row draws from its own sequence's generator
            self.gen.rows = [self.seq_gens[self.sample[s]] for s in slots]

    def _prefill_prefix(self) -> None:
        """The shared prefix through the model once, at slot 0 (free: nothing is live yet); its KV kept aside."""
        P, dev = self.P, self.e.device
        ar = torch.arange(P)
        self.e.cache.prefill_into(torch.zeros(1, dtype=torch.long, device=dev))
        causal = (ar[None, :] <= ar[:, None])[None, None]
        self.e._forward(torch.tensor([self.prefix], device=dev), ar[None].to(dev),
                        _additive(causal, self.e.dtype).to(dev))
        self.prefix_kv = self.e.cache.read(0, P)

    def admit(self) -> None:
        """Prefill as many whole prompt groups as free slots allow, one forward for all of them."""
        n, S = self.p.n, self.e.max_batch_size
        take = []
        while self.queue and self.live + (len(take) + 1) * n <= S:
            take.append(self.queue.popleft())
        if not take:
            return
        dev, m, P = self.e.device, len(take), self.P
        if P and self.prefix_kv is None:
            self._prefill_prefix()
        q = max(len(self.prompts[i]) for i in take)                  # prefix + the longest rest
        ids = torch.full((m, q - P), self.e.pad_id, dtype=torch.long)
        start = torch.tensor([q - len(self.prompts[i]) + P for i in take])  # first column of each rest
        for r, i in enumerate(take):
            ids[r, start[r] - P:] = torch.tensor(self.prompts[i][P:])
        col = torch.arange(q)                                        # key columns; queries are columns [P, q)
        pos = (col[None, P:] - start[:, None] + P).clamp(min=0)
        allowed = (((col[None, None, :] >= start[:, None, None]) | (col[None, None, :] < P))
                   & (col[None, None, :] <= col[None, P:, None]))
        first = self.live + torch.arange(m) * n                     # the slot that holds each prompt's prefill
        # n = 1: the slots are one range, and a slice writes (and hands attention) views, not index_put copies
        rows = slice(self.live, self.live + m) if n == 1 else first.to(dev)
        if P:
            self.e.cache.write(rows, self.prefix_kv)
        self.e.cache.prefill_into(rows, offset=P)
        vision = ({k: v.to(dev) for k, v in collate([self.vision[i] for i in take]).items()}
                  if self.vision else {})
        delta = torch.zeros(m, dtype=torch.long)
        if mrope := mrope_positions(self.e.model, ids, col[None, P:] >= start[:, None], vision):  # P = 0 here
            pos, delta = mrope
        logits = self.e._forward(ids.to(dev), pos.to(dev), _additive(allowed[:, None], self.e.dtype).to(dev),
                                 **vision)
        if n > 1:
            for r in range(m):
                self.e.cache.copy(int(first[r]), slice(int(first[r]) + 1, int(first[r]) + n), q)
        slots = slice(self.live, self.live + m * n)
        self.start[slots] = start.repeat_interleave(n).to(dev)
        self.pos[slots] = q
        self.delta[slots] = delta.repeat_interleave(n).to(dev)
        self.sample[slots] = [i * n + j for i in take for j in range(n)]
        self.live += m * n
        self._draw_for(range(slots.start, slots.stop))
        tok, logp = self.e._sample(logits.repeat_interleave(n, 0), self.p, self.gen)
        self._record(range(slots.start, slots.stop), tok, logp)

    def decode_step(self) -> None:
        """One token for every live slot."""
        L = self.live
        if L == 0:
            return
        pos, start = self.pos[:L], self.start[:L]
        rope = pos - start + self.P + self.delta[:L]                 # each token's position (M-RoPE: + delta)
        # fixed shapes (CUDA graphs) attend over the whole cache, masked; else up to the furthest position
        kv_len = self.e.cache.max_len if self.e.graphs is not None else int(pos.max()) + 1
        ar = torch.arange(kv_len, device=pos.device)
        allowed = ((ar[None, :] >= start[:, None]) | (ar[None, :] < self.P)) & (ar[None, :] <= pos[:, None])
        mask = _additive(allowed[:, None, None], self.e.dtype)
        if self.e.graphs is not None:
            logits = self.e.graphs.decode(self.last[:L, None], pos, rope[:, None], mask)
        else:
            self.e.cache.decode_at(pos, kv_len)
            logits = self.e._forward(self.last[:L, None], rope[:, None], mask)
        self.pos[:L] += 1
        self._draw_for(range(L))
        tok, logp = self.e._sample(logits, self.p, self.gen)
        self._record(range(L), tok, logp)

    def _record(self, slots: range, tok: torch.Tensor, logp: torch.Tensor) -> None:
        """Append each slot's token; retire finished slots (EOS, length, stop string), moving the last live slot
        into each hole so that live slots stay [0, live)."""
        self.last[slots.start:slots.stop] = tok
        finished = []
        for k, (t, lp) in enumerate(zip(tok.tolist(), logp.tolist())):
            s = slots.start + k
            out = self.tokens[self.sample[s]]
            out.append(t)
            self.logps[self.sample[s]].append(lp)
            if t in self.eos or len(out) >= self.max_new[self.sample[s]] or (self.p.stop and self._hit_stop(out)):
                finished.append(s)
                self.finished.append(self.sample[s])
        for s in sorted(finished, reverse=True):
            last = self.live - 1
            if s != last:
                self.e.cache.copy(last, s, int(self.pos[last]))
                for t in (self.start, self.pos, self.last, self.delta):
                    t[s] = t[last]
                self.sample[s] = self.sample[last]
            self.live -= 1

    def _hit_stop(self, out: list[int]) -> bool:
        text = self.e.tokenizer.decode(out[-16:], skip_special_tokens=True)
        return any(stop in text for stop in self.p.stop)

    def result(self) -> Batch:
        return assemble(self.prompts, self.tokens, self.logps, self.p.n, self.e.pad_id)


MIN_SHARED_PREFIX = 8


def shared_prefix_length(prompts: list[list[int]]) -> int:
    """Tokens common to the start of every prompt, leaving each at least one of its own (0 below
    ``MIN_SHARED_PREFIX`` tokens or for a single prompt, whose n samples share its prefill anyway)."""
    if len(prompts) < 2:
        return 0
    first, limit = prompts[0], min(map(len, prompts)) - 1
    n = 0
    while n < limit and all(p[n] == first[n] for p in prompts):
        n += 1
    return n if n >= MIN_SHARED_PREFIX else 0


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean attention mask as the additive float mask every attention implementation accepts, on the
    boolean mask's device (decode builds it on the engine's device; prefill on CPU, then moves it)."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, torch.finfo(dtype).min)
