"""One ``RolloutEngine.generate`` call (or agent ``session``) as it runs: a queue of prompts, the sequences in the KV
cache's slots, admission (prefill, the shared prefix once), one decode step for every live slot, the result batch.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol, Sequence

import torch

from core.config import SamplingParams
from core.rollout.batch import assemble
from core.rollout.sampling import RowGenerators
from core.data.vision_inputs import collate, mrope_positions
from core.protocol import Batch


class Engine(Protocol):
    """What a ``Run`` reads of its engine (``core.rollout.engine.RolloutEngine``): the model, its KV cache (and the
    recorded decode steps on a GPU), the sizes, and the two calls of a step."""
    model: torch.nn.Module
    tokenizer: object
    cache: object                  # core.rollout.kv_cache.SlotKVCache
    graphs: object | None          # core.rollout.decode_graphs.DecodeGraphs
    device: torch.device
    dtype: torch.dtype
    max_batch_size: int
    share_prefix: bool
    eos_ids: list[int]
    pad_id: int

    def last_logits(self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, **vision) -> torch.Tensor: ...

    def sample(self, logits: torch.Tensor, params: SamplingParams, gen: torch.Generator
               ) -> tuple[torch.Tensor, torch.Tensor]: ...


class Run:
    """The state of one ``generate`` call (or ``session``): a queue of prompts and per-slot sequences; live slots
    are [0, live). In a session the queue starts empty and each added sequence draws from its own generator."""

    def __init__(self, engine: Engine, prompts: list[list[int]], params: SamplingParams, session: bool = False,
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
        self.e.last_logits(torch.tensor([self.prefix], device=dev), ar[None].to(dev),
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
        logits = self.e.last_logits(ids.to(dev), pos.to(dev), _additive(allowed[:, None], self.e.dtype).to(dev),
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
        tok, logp = self.e.sample(logits.repeat_interleave(n, 0), self.p, self.gen)
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
            logits = self.e.last_logits(self.last[:L, None], rope[:, None], mask)
        self.pos[:L] += 1
        self._draw_for(range(L))
        tok, logp = self.e.sample(logits, self.p, self.gen)
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
