"""Step-time simulator: an RL run's step time, tokens/s per GPU and GPU idle time for ``sync``, ``one_step_off`` and
``streaming``, colocated or split, at any GPU count -- predicted from per-phase costs (``Costs``: a calibration the
bench measures on the machine at hand, or a table for the user's hardware) and a response-length distribution.

Event-driven where it matters (the long tail): each rollout replica is simulated with continuous batching (from one
sequence's end to the next, k decode steps at a time) -- up to ``slots`` sequences at once, a decode step of b sequences costing
``decode_base_s + decode_per_seq_s * b + decode_per_ctx_s * (their context tokens)``, a sequence admitted when a
slot frees (its prompt prefilled at ``prefill_tok_s``) -- so a batch whose last samples are long ends with a few
sequences decoding at a batch size that wastes the replica. An agent sample is turns: a model turn, a tool round of
``tool_s`` seconds (its slot free meanwhile) whose answer's tokens extend the context, the next turn admitted when
the tools answer with its whole context prefilled again (the embedded engine's continuous agent loop). The trainer's phases are throughput-bound: tokens /
(``*_tok_s`` x training ranks x ``scaling``).

    sync          generate (all replicas) -> reward -> old log-probs, reference -> update -> sync weights
    one_step_off  the next batch generates during this step's training (split placement): step = max(gen, train) + sync
    streaming     the rollout decodes continuously, admitting groups up to (v + s + 1) x B; the trainer takes the B
                  first finished groups; a sync pauses the rollout and re-prefills the sequences in flight
                  (``partial_kv: recompute``); colocated: time-sliced, the rollout decodes only while the trainer waits

What it leaves out, stated: data-parallel training scales by ``Costs.scaling`` (one number, not a network model);
replicas are alike (no stragglers but the long tail); rewards cost a fixed ``reward_s`` per batch; weight sync is
``sync_base_s + model bytes / sync_gb_s``; a tool round takes a fixed ``tool_s`` (its CPU contention with the rest
not modelled).
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from dataclasses import dataclass, field

MODES = ("sync", "one_step_off", "streaming")


@dataclass(frozen=True)
class Costs:
    """What one machine kind costs per phase (a rollout replica, a training rank)."""
    decode_base_s: float            # a decode step's fixed part (weights read once per step)
    decode_per_seq_s: float         # ... per sequence in the step
    prefill_tok_s: float            # prompt (or re-prefill) tokens per second, one replica
    forward_tok_s: float            # training forward tokens/s, one rank (old log-probs, reference)
    update_tok_s: float             # forward + backward + optimizer tokens/s, one rank
    decode_per_ctx_s: float = 0.0   # ... per context token of the sequences in the step (reading the KV cache)
    sync_base_s: float = 0.0        # a weight sync's fixed part
    sync_gb_s: float = 1.0          # its bandwidth, GB/s
    reward_s: float = 0.0           # scoring one batch
    tool_s: float = 0.0             # an agent's tool round (the sandbox's latency)
    scaling: float = 1.0            # data-parallel efficiency of the training ranks (1: linear)


@dataclass(frozen=True)
class Workload:
    """One step's work: B prompt groups of n samples, prompts of ``prompt_tokens``, responses whose lengths are
    drawn from ``lengths`` (an empirical sample: a run's, or the user's guess) -- or, for agents, from ``turns``:
    each sample's token runs, model turn and tool answer alternating (``(12, 9, 5)``: 12 model tokens, a tool round
    of ``Costs.tool_s`` answering 9 tokens, 5 model tokens)."""
    prompts_per_step: int
    n: int
    prompt_tokens: int
    lengths: tuple[int, ...]
    model_gb: float = 0.0           # weights sent per sync
    reference: bool = True          # a reference forward each step
    # a distillation teacher's forward each step, as a multiple of the policy's (its parameters / the policy's)
    teacher: float = 0.0
    ppo_epochs: int = 1
    turns: tuple[tuple[int, ...], ...] = ()

    def samples(self) -> tuple[tuple[int, ...], ...]:
        return self.turns or tuple((x,) for x in self.lengths)


@dataclass(frozen=True)
class Layout:
    """Where it runs: ``train_gpus`` training ranks; ``replicas`` rollout replicas of ``gpus_per_replica`` each, on
    GPUs of their own (split) or on the training GPUs (colocated); ``slots`` sequences per replica at once."""
    train_gpus: int
    replicas: int
    gpus_per_replica: int = 1
    colocated: bool = False
    slots: int = 64
    kv_tokens: float = 0.0          # a replica's KV cache, tokens (0: unbounded); a sequence is admitted only with room
                                    # for its whole length (vLLM would preempt instead: an upper bound on the wait)

    @property
    def gpus(self) -> int:
        return self.train_gpus if self.colocated else self.train_gpus + self.replicas * self.gpus_per_replica


@dataclass
class Prediction:
    step_s: float
    samples_per_s: float
    tokens_per_s_per_gpu: float     # response tokens generated and trained, per second, per GPU
    rollout_idle: float             # share of the step the rollout GPUs wait
    train_idle: float               # ... the training GPUs wait
    phases: dict[str, float] = field(default_factory=dict)  # mean seconds per step: gen, train, sync, gen_wait


class Replica:
    """One rollout replica decoding with continuous batching. The sequences in flight are a heap by the decode step
    they end at, so time jumps from one sequence's end to the next (the batch is the same in between): k steps of b
    sequences whose contexts grow by b tokens a step. An agent sample's turn that ends with a tool round waits in
    ``tools`` (its slot free) until ``Costs.tool_s`` later, then queues its next turn on its longer context."""

    def __init__(self, costs: Costs, slots: int, prompt_tokens: int, kv_tokens: float = 0.0):
        self.c, self.slots, self.prompt, self.kv = costs, slots, prompt_tokens, kv_tokens
        self.t = 0.0
        self.reset()

    def reset(self) -> None:
        self.queue: deque[tuple[int, int, tuple[int, ...]]] = deque()  # (group, context, token runs) to start
        self.tools: list[tuple[float, int, int, int, tuple[int, ...]]] = []  # heap: (answers at, id, group, ...)
        self.live: list[tuple[int, int, int, int, int, tuple[int, ...]]] = []  # heap: (end step, id, group, start
        # step, context at start, the runs after this turn)
        self.steps = self.ids = self.starts = 0          # decode steps so far; turns started; sum of live starts
        self.contexts = 0                                # the live sequences' contexts at their start
        self.reserved = 0                                # KV tokens the live sequences will hold at their end
        self.idle = 0.0                                  # seconds waiting for tools with nothing to decode

    def add(self, group: int, runs: tuple[int, ...]) -> None:
        self.queue.append((group, self.prompt, runs))

    def busy(self) -> bool:
        return bool(self.queue or self.live or self.tools)

    def load(self) -> int:
        return len(self.queue) + len(self.live) + len(self.tools)

    def context(self) -> int:
        """The live sequences' context tokens: each its prompt and the tokens it has drawn."""
        return self.contexts + len(self.live) * self.steps - self.starts

    def step(self, until: float | None = None) -> list[int]:
        """Admit what fits, then decode until the next sequence ends (or a tool answers), or fewer steps when the
        clock would pass ``until``; the groups of the samples that finished."""
        if not self.live and not self.queue and self.tools and self.tools[0][0] > self.t:
            self.idle += self.tools[0][0] - self.t  # every sample waits for its tools
            self.t = self.tools[0][0]
        while self.tools and self.tools[0][0] <= self.t:
            _, _, group, ctx, runs = heapq.heappop(self.tools)
            self.queue.append((group, ctx, runs))
        while self.queue and len(self.live) < self.slots and (
                not self.kv or not self.live or self.reserved + self.queue[0][1] + self.queue[0][2][0] <= self.kv):
            group, ctx, (length, *rest) = self.queue.popleft()
            self.t += ctx / self.c.prefill_tok_s
            heapq.heappush(self.live, (self.steps + length, self.ids, group, self.steps, ctx, tuple(rest)))
            self.ids += 1
            self.starts += self.steps
            self.contexts += ctx
            self.reserved += ctx + length
        if not self.live:
            return []
        b, ctx = len(self.live), self.context()
        per_step = self.c.decode_base_s + self.c.decode_per_seq_s * b
        k = self.live[0][0] - self.steps
        stops = [x for x in (until, self.tools[0][0] if self.tools else None) if x is not None]
        if stops and min(stops) > self.t:  # no step past ``until`` or the next tool answer
            k = max(1, min(k, math.ceil((min(stops) - self.t) / (per_step + self.c.decode_per_ctx_s * ctx))))
        self.t += k * per_step + self.c.decode_per_ctx_s * (k * ctx + b * k * (k - 1) / 2)
        self.steps += k
        done = []
        while self.live and self.live[0][0] <= self.steps:
            end, i, group, start, ctx, rest = heapq.heappop(self.live)
            self.starts -= start
            self.contexts -= ctx
            self.reserved -= ctx + end - start
            if rest:  # a tool round, then the next turn on the context with the tools' answer
                heapq.heappush(self.tools, (self.t + self.c.tool_s, i, group, ctx + end - start + rest[0], rest[1:]))
            else:
                done.append(group)
        return done

    def reprefill(self) -> None:
        """A weight update landed: the sequences in flight recompute their KV (partial_kv: recompute)."""
        self.t += self.context() / self.c.prefill_tok_s


def train_s(costs: Costs, work: Workload, layout: Layout, response_tokens: float) -> float:
    """Old log-probs (+ reference, + teacher) forwards and the update, throughput-bound over the training ranks."""
    tokens = work.prompts_per_step * work.n * work.prompt_tokens + response_tokens
    ranks = layout.train_gpus * costs.scaling
    forwards = 1 + work.reference + work.teacher
    return tokens * (forwards / costs.forward_tok_s + work.ppo_epochs / costs.update_tok_s) / ranks


def sync_s(costs: Costs, work: Workload) -> float:
    return costs.sync_base_s + work.model_gb / costs.sync_gb_s


def simulate(costs: Costs, work: Workload, layout: Layout, mode: str = "sync", steps: int = 20,
             max_staleness: int = 1, seed: int = 0) -> Prediction:
    """Predicted mean step of ``steps`` (the first left out: it starts cold in every mode)."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: one of {', '.join(MODES)}")
    if mode == "one_step_off" and layout.colocated:
        raise ValueError("one_step_off generates during training: it needs the rollout on GPUs of its own")
    rng, drawn = random.Random(seed), work.samples()
    draw = lambda: rng.choice(drawn)  # noqa: E731
    reps = [Replica(costs, layout.slots, work.prompt_tokens, layout.kv_tokens) for _ in range(layout.replicas)]
    run = _streaming if mode == "streaming" else _batched
    ends, gen_busy, phases = run(costs, work, layout, reps, draw, steps + 1, mode, max_staleness)
    span = ends[-1] - ends[0]
    step = span / steps
    samples = work.prompts_per_step * work.n
    mean_len = sum(map(sum, drawn)) / len(drawn)
    train = phases["train"] / steps
    return Prediction(step_s=step, samples_per_s=samples / step,
                      tokens_per_s_per_gpu=samples * mean_len / step / layout.gpus,
                      rollout_idle=max(0.0, 1 - gen_busy / (layout.replicas * ends[-1])) if not layout.colocated
                      else 0.0,
                      train_idle=max(0.0, 1 - train / step),
                      phases={k: v / steps for k, v in phases.items()})


def _generate(reps: list[Replica], groups: list[tuple[int, list[tuple[int, ...]]]], start: float) -> tuple[float, float]:
    """Every group's samples over the replicas (a group's n samples on one, groups dealt in turn), all from
    ``start``: when the last sample ends, and the replicas' busy seconds."""
    for r in reps:
        r.t = start
        r.reset()
    for i, (g, samples) in enumerate(groups):
        for runs in samples:
            reps[i % len(reps)].add(g, runs)
    for r in reps:
        while r.busy():
            r.step()
    return max(r.t for r in reps), sum(r.t - start - r.idle for r in reps)


def _batched(costs, work, layout, reps, draw, steps, mode, _s):
    """sync and one_step_off: whole batches, one at a time (one_step_off: the next during this one's training)."""
    B, n = work.prompts_per_step, work.n
    t, ends, busy = 0.0, [], 0.0
    phases = {"gen": 0.0, "train": 0.0, "sync": 0.0, "gen_wait": 0.0}
    ahead = None  # one_step_off: (batch lengths, when its generation ends)
    for k in range(steps):
        if ahead is None:
            batch = [[draw() for _ in range(n)] for _ in range(B)]
            done, used = _generate(reps, list(enumerate(batch)), t)
            busy += used
            phases["gen"] += done - t
            t = done
        else:
            batch, done = ahead
            phases["gen_wait"] += max(0.0, done - t)
            t = max(t, done)
        tokens = sum(sum(runs) for group in batch for runs in group)
        if mode == "one_step_off":  # the next batch generates now, with the weights before this update
            nxt = [[draw() for _ in range(n)] for _ in range(B)]
            end, used = _generate(reps, list(enumerate(nxt)), t)
            busy += used
            ahead = (nxt, end)
        tr = costs.reward_s + train_s(costs, work, layout, tokens)
        t += tr
        phases["train"] += tr
        sy = sync_s(costs, work)
        t += sy
        phases["sync"] += sy
        ends.append(t)
        if k == 0:  # the first step starts cold: left out of the means
            phases = dict.fromkeys(phases, 0.0)
    return ends, busy, phases


def _streaming(costs, work, layout, reps, draw, steps, _mode, s):
    """The rollout decodes continuously; the trainer takes the B first finished groups (admission bound
    (v + s + 1) x B); each sync pauses the rollout and re-prefills what is in flight. Colocated: the rollout
    decodes only while the trainer waits for its batch."""
    B, n = work.prompts_per_step, work.n
    left: dict[int, int] = {}           # group -> samples not finished
    finished: list[tuple[float, int]] = []  # (when, group) of the groups ready
    admitted = 0
    t, ends, busy = 0.0, [], 0.0
    phases = {"gen": 0.0, "train": 0.0, "sync": 0.0, "gen_wait": 0.0}
    lengths: dict[int, list[tuple[int, ...]]] = {}

    def admit(limit: int) -> None:
        nonlocal admitted
        while admitted < limit:
            g = admitted
            lengths[g] = [draw() for _ in range(n)]
            left[g] = n
            r = min(reps, key=Replica.load)
            for runs in lengths[g]:
                r.add(g, runs)
            admitted += 1

    def decode_until(t_end: float | None) -> None:
        """Step the replicas (earliest first) until each passes ``t_end``, or (None) until B groups are ready."""
        nonlocal busy
        heap = [(r.t, i) for i, r in enumerate(reps)]
        heapq.heapify(heap)
        while heap:
            rt, i = heapq.heappop(heap)
            r = reps[i]
            if (t_end is not None and rt >= t_end) or (t_end is None and len(finished) >= B) or not r.busy():
                if not r.busy() and t_end is not None:
                    r.t = max(r.t, t_end)  # idle until then
                continue
            before = r.t - r.idle
            # no further than the next replica's clock: groups finish in time order
            for g in r.step(t_end if t_end is not None else (heap[0][0] if heap else None)):
                left[g] -= 1
                if left[g] == 0:
                    finished.append((r.t, g))
            busy += r.t - r.idle - before
            heapq.heappush(heap, (r.t, i))

    for k in range(steps):                             # step k trains version v = k (the syncs so far)
        admit((k + s + 1) * B)                         # the bound: what steps up to v + s + 1 take
        start = t
        decode_until(None)                             # the take waits for B finished groups
        if len(finished) < B:
            raise RuntimeError("the stream stalled")
        finished.sort()
        batch = finished[:B]
        del finished[:B]
        t = max(t, batch[-1][0])                       # when the B-th group finished
        phases["gen_wait"] += t - start
        tokens = sum(sum(runs) for _, g in batch for runs in lengths.pop(g))
        tr = costs.reward_s + train_s(costs, work, layout, tokens)
        if not layout.colocated:                       # the rollout decodes during the trainer's phases
            decode_until(t + tr)
        t += tr
        phases["train"] += tr
        sy = sync_s(costs, work)
        t += sy
        phases["sync"] += sy
        for r in reps:                                 # the update lands between two decode steps
            r.t = max(r.t, t)
            r.reprefill()
        ends.append(t)
        if k == 0:
            phases = dict.fromkeys(phases, 0.0)
    phases["gen"] = phases["gen_wait"]
    return ends, busy, phases

