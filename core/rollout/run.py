"""One ``RolloutEngine.generate`` call (or agent ``session``) as it runs: a queue of prompts, the sequences in the KV
cache's slots, admission (prefill, the shared prefix once), one decode step for every live slot, the result batch.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Protocol, Sequence

import torch

from core.config import SamplingParams
from core.rollout.batch import assemble
from core.rollout.sampling import sequence_seeds, token_uniforms
from core.data.vision_inputs import collate, mrope_positions
from core.protocol import Batch

STOP_WINDOW = 16  # the last tokens decoded to look for a stop string (more than any stop string takes)


def ends_in_stop(tokenizer, tokens: list[int], stops) -> bool:
    """Whether the text of a response's last STOP_WINDOW tokens holds a stop string: checked after each token, the
    response ends at the token that completes one (the stop string kept in the output)."""
    text = tokenizer.decode(tokens[-STOP_WINDOW:], skip_special_tokens=True)
    return any(stop in text for stop in stops)


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

    def sample(self, logits: torch.Tensor, params: SamplingParams, u: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]: ...


@dataclass
class Cohort:
    """Prompts added together (a ``generate`` call's, a stream's batch): the token prefix they share is prefilled
    once (``kv``: its keys and values, computed at the cohort's first admission and again after a weight update)."""
    P: int
    prefix: list[int]
    kv: list | None = None


class Run:
    """The state of one ``generate`` call, session or stream: a queue of prompts and per-slot sequences; live slots
    are [0, live). Sequence ``i * n + j`` is sample j of prompt i; it draws token t with
    ``token_uniforms(seeds[i * n + j], t)``, and ``versions`` records the weight version (``version`` when it was
    drawn) of each of its tokens."""

    def __init__(self, engine: Engine, prompts: list[list[int]], params: SamplingParams, session: bool = False,
                 vision: Sequence[dict] | None = None, seeds: Sequence[int] | None = None):
        self.e, self.p, self.vision = engine, params, vision
        self.prompts: list[list[int]] = []
        self.cohort: list[int] = []                                  # each prompt's, in self.cohorts
        self.cohorts: list[Cohort] = []
        self.queue: deque[int] = deque()
        self.seeds: list[int] = []                                   # per sequence
        self.tokens: list[list[int]] = []
        self.logps: list[list[float]] = []
        self.versions: list[list[int]] = []
        self.max_new: list[int] = []
        self.stops: dict[int, tuple[str, ...]] = {}                   # sequence -> its own stop strings (a server's)
        self.version = 0                                             # of the weights the next tokens come from
        self.finished: list[int] = []                               # sequences finished since the last step()
        S, dev = engine.max_batch_size, engine.device
        self.live = 0
        self.sample = [-1] * S                                       # sequence of each slot
        self.plen = torch.zeros(S, dtype=torch.long, device=dev)    # the shared prefix's length in the slot
        self.start = torch.zeros(S, dtype=torch.long, device=dev)   # first column of the slot's own prompt part
        self.pos = torch.zeros(S, dtype=torch.long, device=dev)     # where the slot's next token is written
        self.delta = torch.zeros(S, dtype=torch.long, device=dev)   # M-RoPE: text position - token index
        self.last = torch.zeros(S, dtype=torch.long, device=dev)    # the slot's last sampled token
        self.eos = set() if params.ignore_eos else set(engine.eos_ids)
        if session:  # later prompts (``add``) extend these prompts' shared prefix
            P = shared_prefix_length(prompts) if engine.share_prefix else 0
            self.cohorts.append(Cohort(P, prompts[0][:P] if prompts else []))
        elif prompts:
            seeds = sequence_seeds(params.seed, len(prompts) * params.n) if seeds is None else list(seeds)
            self.add_prompts(prompts, seeds, params.max_new_tokens)

    # ---------------------------------------------------------------------------------------- queueing
    def add_prompts(self, prompts: list[list[int]], seeds: list[int], max_new_tokens: int) -> list[int]:
        """Queue prompts as one cohort (their shared prefix prefilled once), n sequences each with ``seeds``
        (n per prompt); returns their prompt indices."""
        n = self.p.n
        if len(seeds) != len(prompts) * n:
            raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts x n={n}")
        P = shared_prefix_length(prompts) if self.e.share_prefix and not self.vision else 0
        self.cohorts.append(Cohort(P, prompts[0][:P]))
        first = len(self.prompts)
        for k, ids in enumerate(prompts):
            self._queue(list(ids), seeds[k * n:(k + 1) * n], max_new_tokens)
        return list(range(first, len(self.prompts)))

    def add_cohort(self, prompts: list[list[int]]) -> int:
        """A cohort for sequences ``add`` queues later, each extending one of these prompts (an agent's turns): the
        prompts' shared prefix -- a single prompt's: all of it but its last token -- is prefilled once per weight
        version. Returns its index."""
        P = shared_prefix_length(prompts) if len(prompts) > 1 else len(prompts[0]) - 1
        P = P if self.e.share_prefix and not self.vision and P >= MIN_SHARED_PREFIX else 0
        self.cohorts.append(Cohort(P, prompts[0][:P]))
        return len(self.cohorts) - 1

    def add(self, ids: list[int], max_new_tokens: int, seed: int, cohort: int = -1,
            stop: Sequence[str] | None = None) -> int:
        """Queue one more sequence (n = 1) extending a cohort's prompts (a session's first prompts; an agent's turn
        in a stream: its trajectory's cohort); returns its index (``step`` reports it when it finishes). ``stop``:
        its stop strings instead of the run's."""
        c = self.cohorts[cohort]
        if self.p.n != 1:
            raise ValueError(f"a session samples each added prompt once (n = 1), got n = {self.p.n}")
        if list(ids[:c.P]) != c.prefix or len(ids) <= c.P:
            raise ValueError(f"a sequence added to a cohort must extend its {c.P}-token prefix")
        if max_new_tokens < 1 or len(ids) + max_new_tokens > self.e.cache.max_len:
            raise ValueError(f"{len(ids)} prompt + {max_new_tokens} new tokens do not fit the session's "
                             f"{self.e.cache.max_len} (or no new token asked)")
        i = self._queue(list(ids), [seed], max_new_tokens, cohort % len(self.cohorts))
        if stop is not None:
            self.stops[i] = tuple(stop)
        return i

    def _queue(self, ids: list[int], seeds: list[int], max_new_tokens: int, cohort: int = -1) -> int:
        i = len(self.prompts)
        self.prompts.append(ids)
        self.cohort.append(cohort % len(self.cohorts))
        for seed in seeds:
            self.seeds.append(seed)
            self.tokens.append([])
            self.logps.append([])
            self.versions.append([])
            self.max_new.append(max_new_tokens)
        self.queue.append(i)
        return i

    @torch.no_grad()
    def step(self) -> list[int]:
        """One step of a session or stream: admit what fits, one token for every live slot; the sequences that
        finished."""
        self.admit()
        self.decode_step()
        done, self.finished = self.finished, []
        return done

    # ---------------------------------------------------------------------------------------- admission
    def _prefill_prefix(self, c: Cohort, slot: int | None = None) -> None:
        """A cohort's shared prefix through the model once, at ``slot`` (default the first free one); its KV kept
        aside."""
        P, dev, slot = c.P, self.e.device, self.live if slot is None else slot
        ar = torch.arange(P)
        self.e.cache.prefill_into(torch.tensor([slot], device=dev))
        causal = (ar[None, :] <= ar[:, None])[None, None]
        self.e.last_logits(torch.tensor([c.prefix], device=dev), ar[None].to(dev),
                           _additive(causal, self.e.dtype).to(dev))
        c.kv = self.e.cache.read(slot, P)

    def admit(self) -> None:
        """Prefill as many whole prompt groups of one cohort as free slots allow, one forward for all of them."""
        n, S = self.p.n, self.e.max_batch_size
        take = []
        while (self.queue and self.live + (len(take) + 1) * n <= S
               and self.cohort[self.queue[0]] == self.cohort[take[0] if take else self.queue[0]]):
            take.append(self.queue.popleft())
        if not take:
            return
        c = self.cohorts[self.cohort[take[0]]]
        dev, m, P = self.e.device, len(take), c.P
        if P and c.kv is None:
            self._prefill_prefix(c)
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
            self.e.cache.write(rows, c.kv)
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
        self.plen[slots] = P
        self.start[slots] = start.repeat_interleave(n).to(dev)
        self.pos[slots] = q
        self.delta[slots] = delta.repeat_interleave(n).to(dev)
        self.sample[slots] = [i * n + j for i in take for j in range(n)]
        self.live += m * n
        live = range(slots.start, slots.stop)
        tok, logp = self.e.sample(logits.repeat_interleave(n, 0), self.p, self._uniforms(live))
        self._record(live, tok, logp)

    # ---------------------------------------------------------------------------------------- decoding
    def decode_step(self) -> None:
        """One token for every live slot."""
        L = self.live
        if L == 0:
            return
        pos, start, plen = self.pos[:L], self.start[:L], self.plen[:L]
        rope = pos - start + plen + self.delta[:L]                   # each token's position (M-RoPE: + delta)
        # fixed shapes (CUDA graphs) attend over the whole cache, masked; else up to the furthest position
        kv_len = self.e.cache.max_len if self.e.graphs is not None else int(pos.max()) + 1
        ar = torch.arange(kv_len, device=pos.device)
        allowed = (((ar[None, :] >= start[:, None]) | (ar[None, :] < plen[:, None]))
                   & (ar[None, :] <= pos[:, None]))
        mask = _additive(allowed[:, None, None], self.e.dtype)
        if self.e.graphs is not None:
            logits = self.e.graphs.decode(self.last[:L, None], pos, rope[:, None], mask)
        else:
            self.e.cache.decode_at(pos, kv_len)
            logits = self.e.last_logits(self.last[:L, None], rope[:, None], mask)
        self.pos[:L] += 1
        tok, logp = self.e.sample(logits, self.p, self._uniforms(range(L)))
        self._record(range(L), tok, logp)

    def _uniforms(self, slots: range) -> torch.Tensor:
        seqs = [self.sample[s] for s in slots]
        return token_uniforms([self.seeds[i] for i in seqs], [len(self.tokens[i]) for i in seqs])

    def _record(self, slots: range, tok: torch.Tensor, logp: torch.Tensor) -> None:
        """Append each slot's token; retire finished slots (EOS, length, stop string)."""
        self.last[slots.start:slots.stop] = tok
        finished = []
        for k, (t, lp) in enumerate(zip(tok.tolist(), logp.tolist())):
            s = slots.start + k
            i = self.sample[s]
            out = self.tokens[i]
            out.append(t)
            self.logps[i].append(lp)
            self.versions[i].append(self.version)
            stop = self.stops.get(i, self.p.stop)
            if t in self.eos or len(out) >= self.max_new[i] or (stop and ends_in_stop(self.e.tokenizer, out, stop)):
                finished.append(s)
                self.finished.append(i)
        self._retire(finished)

    def _retire(self, slots: list[int]) -> None:
        """Free these slots, moving the last live slot into each hole so that live slots stay [0, live)."""
        for s in sorted(slots, reverse=True):
            last = self.live - 1
            if s != last:
                self.e.cache.copy(last, s, int(self.pos[last]))
                for t in (self.plen, self.start, self.pos, self.last, self.delta):
                    t[s] = t[last]
                self.sample[s] = self.sample[last]
            self.live -= 1

    # ---------------------------------------------------------------------------------------- a stream's controls
    @torch.no_grad()
    def reprefill(self) -> None:
        """Recompute the KV of every live sequence (its prompt and the tokens drawn so far, all but the last, which
        the next decode step feeds) with the weights the model holds now -- after a weight update, so the next
        tokens come from the new weights alone (their log-probs are the new policy's on the whole prefix), or
        after the cache was freed or used by another call. Per cohort: its shared prefix once, copied to its slots,
        then the rest of each row from column P, right-padded (a row's columns past its own length hold padding's
        KV, which no later step attends: it writes there first)."""
        if self.vision:
            raise ValueError("a run with image prompts cannot recompute its sequences' KV (their vision inputs are "
                             "given to the first prefill only)")
        for c in self.cohorts:
            c.kv = None  # a later admission prefills the prefix again, with these weights
        by_cohort: dict[int, list[int]] = {}
        for s in range(self.live):
            by_cohort.setdefault(self.cohort[self.sample[s] // self.p.n], []).append(s)
        dev = self.e.device
        for c, slots in by_cohort.items():
            cohort = self.cohorts[c]
            P = cohort.P
            rows = [(self.prompts[self.sample[s] // self.p.n] + self.tokens[self.sample[s]][:-1])[P:] for s in slots]
            at = torch.tensor(slots, device=dev)
            if P:
                self._prefill_prefix(cohort, slots[0])
                self.e.cache.write(at, cohort.kv)
            q = max(map(len, rows))
            ids = torch.full((len(rows), q), self.e.pad_id, dtype=torch.long)
            for r, row in enumerate(rows):
                ids[r, :len(row)] = torch.tensor(row)
            col = torch.arange(P + q)                                # key columns; queries are columns [P, P + q)
            allowed = col[None, None, :] <= col[None, P:, None]
            self.e.cache.prefill_into(at, offset=P)
            self.e.last_logits(ids.to(dev), col[None, P:].expand(len(rows), q).to(dev),
                               _additive(allowed[:, None].expand(len(rows), 1, q, P + q), self.e.dtype).to(dev))
            self.plen[at], self.start[at] = P, P
            self.pos[at] = torch.tensor([P + len(r) for r in rows], device=dev)

    def abort(self, prompts: set[int]) -> None:
        """Drop these prompts' sequences, queued or live (a stream's group that can no longer be used)."""
        n = self.p.n
        self.queue = deque(i for i in self.queue if i not in prompts)
        self._retire([s for s in range(self.live) if self.sample[s] // n in prompts])

    def pop(self, i: int) -> tuple[list[int], list[list[int]], list[list[float]], list[list[int]], list[int]]:
        """Prompt ``i``'s ids and its n sequences' tokens, log-probs, versions and seeds, forgotten here (a stream's
        finished group, handed out)."""
        seqs = range(i * self.p.n, (i + 1) * self.p.n)
        out = (self.prompts[i], [self.tokens[k] for k in seqs], [self.logps[k] for k in seqs],
               [self.versions[k] for k in seqs], [self.seeds[k] for k in seqs])
        self.prompts[i] = []
        for k in seqs:
            self.tokens[k], self.logps[k], self.versions[k] = [], [], []
            self.stops.pop(k, None)
        return out

    def state_dict(self) -> dict:
        """What a checkpoint keeps of a stream's run: every sequence so far and the order of the live ones (their KV
        is not kept: ``load_state_dict`` leaves it to ``reprefill``, which the stream runs before its next step)."""
        return {"prompts": self.prompts, "cohort": self.cohort, "cohorts": [(c.P, c.prefix) for c in self.cohorts],
                "queue": list(self.queue), "seeds": self.seeds, "tokens": self.tokens, "logps": self.logps,
                "versions": self.versions, "max_new": self.max_new, "version": self.version,
                "live": self.sample[:self.live]}

    def load_state_dict(self, state: dict) -> None:
        """A run as ``state_dict`` left it, its live sequences back in their slots in the same order; call
        ``reprefill`` before the next step."""
        for key in ("prompts", "cohort", "seeds", "tokens", "logps", "versions", "max_new", "version"):
            setattr(self, key, state[key])
        self.cohorts = [Cohort(P, prefix) for P, prefix in state["cohorts"]]
        self.queue = deque(state["queue"])
        self.live = len(state["live"])
        self.sample[:self.live] = state["live"]
        self.last[:self.live] = torch.tensor([self.tokens[i][-1] for i in state["live"]], dtype=torch.long)

    def result(self) -> Batch:
        """The generate() Batch, with each sample's seed (``rollout_seeds``: its draws are token_uniforms(seed, t))."""
        out = assemble(self.prompts, self.tokens, self.logps, self.p.n, self.e.pad_id)
        out["rollout_seeds"] = torch.tensor(self.seeds, dtype=torch.long)
        return out


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
